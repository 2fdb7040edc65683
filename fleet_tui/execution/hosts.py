"""Which host runs an attempt: the engine's registry of hosts by name (issue 20).

The engine knows only the seam (`execution.host`); this is the one place that names a
host's code, so that nothing above `execution/` imports `execution.local` (an import
contract says so). `local` is this machine (`LocalHost`); a `[hosts.NAME]` table of
config.toml with `ssh = TARGET` is an SSH host (`execution.ssh.host.SshHost`, imported
only when such a host is first used: a build without it says so, for that host only);
one with `ray = ADDRESS` is a Ray cluster (`execution.ray.host.RayHost`, issue 21: each
attempt a Ray job; imported when first used too, and this machine needs the `ray` extra).

A task's host is its name in config.toml (`tasks.host`); an attempt records the name of
the host it ran on (`attempts.host`: `Host.name`), and is found again by it. A host given
to the engine (`Fleet(..., host=...)` for `local`, `hosts={name: host}`) stands for that
name whatever its own name is (the in-memory host of the tests).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from fleet_tui.core.errors import FleetError
from fleet_tui.execution.host import Host
from fleet_tui.settings.hosts import LOCAL, HostConfig

if TYPE_CHECKING:
    from fleet_tui.store.db import Attempt

SSH_MODULE = "fleet_tui.execution.ssh.host"
RAY_MODULE = "fleet_tui.execution.ray.host"


class HostUnavailable(FleetError):
    """A configured host this build or this machine cannot use (said with the fix)."""


class HostUnknown(FleetError):
    """A host name this engine's settings do not have: config.toml gained it after they
    were read (another engine knows it), or lost it."""


def default_host(*, env: Mapping[str, str], python: str) -> Host:
    """This machine: each attempt a detached runner process."""
    from fleet_tui.execution.local.host import LocalHost

    return LocalHost(env=env, python=python)


def build_host(config: HostConfig, *, env: Mapping[str, str], python: str) -> Host:
    """The host of one `[hosts.NAME]` table (HostUnavailable: not in this build)."""
    if config.is_local:
        return default_host(env=env, python=python)
    if config.is_ray:
        return _ray_host(config, env=env)
    import importlib

    try:
        module = importlib.import_module(SSH_MODULE)
    except ImportError as exc:
        if exc.name is not None and not SSH_MODULE.startswith(exc.name):
            raise  # the module is there, something it needs is broken: say that
        raise HostUnavailable(
            f"the host {config.name!r} is an ssh host, and ssh hosts are not available in "
            "this build of fleet-tui; run the task on `local` (--host local), or upgrade "
            "fleet-tui") from None
    # the host's own python and claude are its own (python3 and claude on its PATH)
    host: Host = module.SshHost(name=config.name, target=config.ssh, port=config.port,
                                env=env, key_on_host=config.key_on_host, cage=config.cage)
    return host


def _ray_host(config: HostConfig, *, env: Mapping[str, str]) -> Host:
    """A Ray cluster's host; HostUnavailable when this machine has no ray (the extra)."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise HostUnavailable(
            f"the host {config.name!r} is a Ray cluster, and this machine has no ray: "
            "pip install 'fleet-tui[ray]' (the Jobs client), or run the task on `local` "
            "(--host local)")
    module = importlib.import_module(RAY_MODULE)
    options: dict[str, object] = {}
    for key in ("data_dir", "python", "claude", "key_env", "gateway_host", "cage", "srt"):
        if getattr(config, key) is not None:
            options[key] = getattr(config, key)
    host: Host = module.RayHost(name=config.name, address=config.ray, env=env,
                                resources=config.resources, **options)
    return host


class Hosts:
    """The engine's hosts by name, each built when first used (thread-safe)."""

    def __init__(self, configs: tuple[HostConfig, ...], *, env: Mapping[str, str],
                 python: str, local: Host | None = None,
                 given: Mapping[str, Host] | None = None) -> None:
        self.env = env
        self.python = python
        self._configs = {c.name: c for c in configs}
        self._built: dict[str, Host] = dict(given or {})
        self._given = set(self._built)
        self._unusable: dict[str, HostUnavailable] = {}  # until the settings change
        if local is not None:
            self._built[LOCAL] = local
            self._given.add(LOCAL)
        self._lock = threading.Lock()

    def configure(self, configs: tuple[HostConfig, ...]) -> None:
        """The hosts of new settings: an ssh host whose target changed is built again when
        next used (its runs are attached again through the new one). A cap is the
        scheduler's, not the host's: a changed max_workers keeps the host as it is, and
        so does `local` always (it holds the runners it started, to reap them)."""
        def reached(config: HostConfig | None) -> object:
            if config is None:
                return None
            return (config.ssh, config.port, config.key_on_host, config.ray,
                    config.resources, config.data_dir, config.python, config.claude,
                    config.key_env, config.gateway_host)

        with self._lock:
            new = {c.name: c for c in configs}
            for name in list(self._built):
                if name in self._given or name == LOCAL:
                    continue
                if reached(self._configs.get(name)) != reached(new.get(name)):
                    del self._built[name]
            self._configs = new
            self._unusable.clear()

    @property
    def local(self) -> Host:
        return self.get(LOCAL)

    def get(self, name: str | None) -> Host:
        """The host of that name (None: local). FleetError for a name config.toml does not
        have; HostUnavailable for one this build cannot use."""
        wanted = name or LOCAL
        with self._lock:
            host = self._built.get(wanted)
            if host is not None:
                return host
            config = self._configs.get(wanted)
            if config is None and wanted == LOCAL:
                config = HostConfig(LOCAL, 4)
            if wanted in self._unusable:
                raise self._unusable[wanted]
            if config is None:
                known = ", ".join(sorted({LOCAL, *self._configs, *self._built}))
                raise HostUnknown(f"its host {wanted!r} is not in config.toml any more (the "
                                 f"hosts are: {known}); add [hosts.{wanted}] back and retry "
                                 "it, or run it again on another host")
            try:
                host = build_host(config, env=self.env, python=self.python)
            except HostUnavailable as exc:
                self._unusable[wanted] = exc
                raise
            self._built[wanted] = host
            return host

    def knows(self, name: str) -> bool:
        """The name is a host of these settings (or one given, or `local`)."""
        with self._lock:
            return name == LOCAL or name in self._configs or name in self._built

    def why_not(self, name: str) -> str | None:
        """Why the host of that name cannot be used now (None: it can)."""
        try:
            self.get(name)
        except FleetError as exc:
            return str(exc)
        return None

    def for_attempt(self, attempt: Attempt) -> Host:
        """The host an attempt ran on, by the name it recorded (a host's own name, or the
        name it stands for; attempts from before hosts say local). FleetError when that
        host is gone from config.toml: never another host's idea of its runner."""
        recorded = attempt.host or LOCAL
        with self._lock:
            if recorded in self._built:
                return self._built[recorded]
            for host in self._built.values():
                if host.name == recorded:
                    return host
        return self.get(recorded)

    def named(self, name: str) -> Host:
        """The host of that name: a built host's own name or the name it stands for,
        else config.toml's (FleetError: none)."""
        with self._lock:
            if name in self._built:
                return self._built[name]
            for host in self._built.values():
                if host.name == name:
                    return host
        return self.get(name)

    def built(self) -> Iterator[Host]:
        """The hosts in use so far (each once)."""
        with self._lock:
            hosts = list(self._built.values())
        seen: set[int] = set()
        for host in hosts:
            if id(host) not in seen:
                seen.add(id(host))
                yield host

    def names(self) -> tuple[str, ...]:
        """Every host's name, local first, then config.toml's, then the ones given."""
        with self._lock:
            return tuple(dict.fromkeys([LOCAL, *self._configs, *self._given]))


__all__ = ["RAY_MODULE", "SSH_MODULE", "HostUnavailable", "HostUnknown", "Hosts", "build_host",
           "default_host"]
