"""The kinds of host: the one table that names them.

A kind is a folder, `fleet_tui/execution/KIND/`, holding everything of that kind:

    config.py   its `[hosts.NAME]` table: the fields, their parsing and writing back
                (`SCHEMA`, a `KindSchema`; settings-level code: it imports nothing above
                `settings/`, an import contract says so)
    options.py  its options of `fleet-tui host add` (`OPTIONS`; argparse and settings only)
    check.py    its `fleet-tui host check` (`CHECKS`)
    host.py     its `Host` (`build(config, env=..., python=...)`)

Everything that reads hosts (settings/hosts.py, the engine's host checks, `fleet-tui
host`, execution/hosts.py) goes through `KINDS` and never names a kind: adding a kind is
its folder and one line here. A kind's parts are imported by name when first needed (as
entry points are), so that `settings/` reads a kind's table without importing anything
above itself and a build without a kind's folder says so for that kind's hosts only.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    import argparse

    from fleet_tui.settings.hosts import HostConfig


class KindSchema(Protocol):
    """What `settings/` needs of a kind: its table in config.toml."""

    #: the key of a `[hosts.NAME]` table that makes the host this kind (`ssh = TARGET`);
    #: None: never written so (local: by its name; memory: built in code only)
    mark: str | None
    #: how the kind is called in messages ("ssh", "Ray")
    label: str
    fields: tuple[str, ...]

    def parse(self, name: str, table: dict[str, Any], where: str,
              default_cap: int) -> HostConfig:
        """The host of one table (its fields checked: ConfigError saying what is
        accepted)."""
        ...

    def table(self, host: HostConfig) -> dict[str, object]:
        """The host back as its table (what `parse` reads)."""
        ...

    def target(self, host: HostConfig) -> str:
        """Where the host is, as the user wrote it."""
        ...


class KindOptions(Protocol):
    """What a kind gives `fleet-tui host add` and `host ls` (its options.py's `OPTIONS`)."""

    #: the option that picks this kind (`--ray`); None: picked by its arguments alone
    flag: str | None
    #: how the kind is asked for, in a message listing them ("--ray ADDRESS")
    how: str

    def add_arguments(self, add: argparse.ArgumentParser) -> None:
        """Its options on `host add`'s parser."""
        ...

    def picks(self, args: argparse.Namespace) -> bool:
        """The arguments ask for a host of this kind."""
        ...

    def refuse_stray(self, args: argparse.Namespace, flag: str | None, label: str) -> None:
        """ConfigError when one of its options is given for a host of another kind (that
        kind's `flag` and `label`)."""
        ...

    def table(self, args: argparse.Namespace) -> dict[str, object]:
        """The `[hosts.NAME]` table the arguments ask for (without max_workers)."""
        ...

    def added(self, host: HostConfig) -> str:
        """What `host add` says of the new host ("ssh box, max_workers 2")."""
        ...

    def blank_row(self) -> dict[str, object]:
        """Its columns of `host ls --json`, empty (every row has every kind's)."""
        ...

    def row(self, host: HostConfig) -> dict[str, object]:
        """Its columns of `host ls --json` for one of its hosts."""
        ...

    def key_shown(self, host: HostConfig) -> str:
        """Where the host's workers get the key, for `host ls`."""
        ...


class NoOptions:
    """The options of a kind that `host add` never adds (local: this machine is always a
    host; memory: built in code): none, and no columns of its own in `host ls`."""

    flag = None
    how = ""

    def __init__(self, key_shown: str) -> None:
        self._key_shown = key_shown  # what `host ls` says of where its key is

    def add_arguments(self, add: argparse.ArgumentParser) -> None:
        return None

    def picks(self, args: argparse.Namespace) -> bool:
        return False

    def refuse_stray(self, args: argparse.Namespace, flag: str | None, label: str) -> None:
        return None

    def table(self, args: argparse.Namespace) -> dict[str, object]:
        return {}

    def added(self, host: HostConfig) -> str:
        return f"max_workers {host.max_workers}"

    def blank_row(self) -> dict[str, object]:
        return {}

    def row(self, host: HostConfig) -> dict[str, object]:
        return {}

    def key_shown(self, host: HostConfig) -> str:
        return self._key_shown


@dataclass(frozen=True)
class Kind:
    """One kind of host: its name and the package of its folder."""

    name: str
    package: str

    def part(self, part: str) -> ModuleType:
        """One module of the kind's folder (ImportError: this build has no such part)."""
        return importlib.import_module(f"{self.package}.{part}")

    def schema(self) -> KindSchema:
        return cast("KindSchema", self.part("config").SCHEMA)

    def options(self) -> KindOptions:
        return cast("KindOptions", self.part("options").OPTIONS)


# The table. Order matters once: a `[hosts.NAME]` table naming no kind is read as the first
# kind with a mark (its parser says what is missing).
KINDS: tuple[Kind, ...] = (
    Kind("local", "fleet_tui.execution.local"),
    Kind("ssh", "fleet_tui.execution.ssh"),
    Kind("ray", "fleet_tui.execution.ray"),
    Kind("memory", "fleet_tui.execution.memory"),
)


def kind(name: str) -> Kind:
    """The kind of that name (KeyError: none such)."""
    for known in KINDS:
        if known.name == name:
            return known
    raise KeyError(name)


def schema(name: str) -> KindSchema:
    return kind(name).schema()


def marked() -> list[tuple[Kind, KindSchema]]:
    """The kinds a `[hosts.NAME]` table may name, in the table's order."""
    out = []
    for known in KINDS:
        found = known.schema()
        if found.mark is not None:
            out.append((known, found))
    return out


__all__ = ["KINDS", "Kind", "KindOptions", "KindSchema", "kind", "marked", "schema"]
