"""The ray kind's `fleet-tui host check`: a Ray cluster through its Jobs address's REST
API (its version, its alive nodes and their resources), this machine's Jobs client, and
(`--probe`) what a node has, read by one short job placed as an attempt's would be."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fleet_tui import CLAUDE_CODE_VERSION
from fleet_tui.execution.probe import (
    CLAUDE_PACKAGE,
    MIN_GIT,
    MIN_PYTHON,
    Check,
    at_least,
    cage_check,
    claude_check,
    contain_check,
    probe_script,
    values_of,
)
from fleet_tui.execution.ray.config import options

if TYPE_CHECKING:
    from fleet_tui.settings.config import Settings
    from fleet_tui.settings.hosts import HostConfig

RAY_TIMEOUT = 15.0


def _get_json(url: str, timeout: float) -> object:
    import json
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


def ray_nodes(address: str, *, timeout: float = RAY_TIMEOUT) -> list[dict[str, object]]:
    """The cluster's alive nodes (the state API), each with its resources: the Ray
    host's own reading (imported here when a Ray host is checked)."""
    from fleet_tui.execution.ray.host import ray_nodes as alive  # the client's modules

    return alive(address, timeout=timeout)


def check_ray_host(host: HostConfig, *, timeout: float = RAY_TIMEOUT,
                   probe: bool = False, env: Mapping[str, str] | None = None) -> list[Check]:
    """A Ray host's checks: the Jobs address answers (and its Ray's version), its alive
    nodes, whether one of them has every resource the host's jobs ask for, this machine's
    Jobs client; then what a node needs (git, python, the pinned claude): said, or with
    `probe` read on a node by one short job placed as an attempt's would be."""
    own = options(host)
    address = own.ray
    try:
        version = _get_json(f"{address}/api/version", timeout)
    except (OSError, ValueError) as exc:
        return [Check("reachable", False, f"{address} does not answer: {exc}",
                      "check the address (the head's dashboard, `ray start --head "
                      "--dashboard-host=...`, port 8265 by default) and that this machine "
                      "reaches it")]
    ray_version = version.get("ray_version") if isinstance(version, dict) else None
    checks = [Check("reachable", True, f"{address} (Ray {ray_version or 'unknown'})")]
    try:
        nodes = ray_nodes(address, timeout=timeout)
    except (OSError, ValueError) as exc:
        checks.append(Check("nodes", False, f"the state API did not answer: {exc}",
                            "the cluster needs ray[default] on its head (the dashboard)"))
        return checks
    shown = []
    for node in nodes:
        total = node.get("resources_total")
        total = total if isinstance(total, dict) else {}
        names = sorted(k for k in total if isinstance(k, str) and not k.startswith("node:"))
        shown.append(f"{node.get('node_ip')} ({', '.join(names)})")
    checks.append(Check("nodes", bool(nodes), f"{len(nodes)} alive: " + "; ".join(shown)
                        if nodes else "no node is alive", "start a node: `ray start "
                        "--address=HEAD:6379` on each machine"))
    wanted = own.resources or {}
    if wanted:
        def has(node: dict[str, object], name: str) -> float:
            total = node.get("resources_total")
            value = total.get(name, 0) if isinstance(total, dict) else 0
            return float(value) if isinstance(value, (int, float)) else 0.0

        fits = [n for n in nodes if all(has(n, k) >= v for k, v in wanted.items())]
        asked = ", ".join(f"{k}={v:g}" for k, v in wanted.items())
        checks.append(Check("resources", bool(fits),
                            f"{len(fits)} node(s) have {asked}" if fits else
                            f"no node has {asked}",
                            "start a node with them: `ray start ... --resources='"
                            + "{" + ", ".join(f'"{k}": {v:g}' for k, v in wanted.items())
                            + "}'`, or change resources in [hosts." + host.name + "]"))
    try:
        from importlib.metadata import version as dist_version

        client = dist_version("ray")
    except Exception:
        client = None
    if client is None:
        checks.append(Check("client", False, "this machine has no ray",
                            "pip install 'fleet-tui[ray]'"))
    else:
        same = ray_version in (None, client)
        checks.append(Check("client", same, f"ray {client} here" + (
            "" if same else f", Ray {ray_version} there"),
            f"use the cluster's version here: pip install 'ray[default]=={ray_version}'"))
    key = (f"the key from ${own.key_env} of each node's environment" if own.key_env
           else "this machine's gateway, with each attempt's token (gateway = true; "
                "the nodes must reach this machine"
                + (f" as {own.gateway_host})" if own.gateway_host else ")"))
    if probe and all(c.ok for c in checks):
        return checks + _probe_ray(host, env)
    checks.append(Check("node needs", True,
                        f"git 2.38+, {own.python or 'python3'} 3.11+ (Ray's own), "
                        f"{own.claude or 'claude'} {CLAUDE_CODE_VERSION}, "
                        f"{own.data_dir or '/var/tmp/fleet-tui-ray'} writable; the key: "
                        f"{key}" + ("" if probe else " (`--probe` reads them on a node)")))
    return checks


def _probe_ray(host: HostConfig, env: Mapping[str, str] | None) -> list[Check]:
    """git, python, claude, how a worker's processes are contained and what its cage
    needs, read on a node by one short job (`probe_script`)."""
    import os

    from fleet_tui.execution.ray.host import DEFAULT_DATA_DIR, probe_job

    own = options(host)
    python = own.python or "python3"
    script = probe_script((own.claude or "claude",), python=python,
                          cage=own.data_dir or DEFAULT_DATA_DIR, srt=own.srt)
    try:
        status, text, node = probe_job(own.ray, script, resources=own.resources,
                                       env=os.environ if env is None else env)
    except Exception as exc:  # the client's own errors: said in the check
        return [Check("probe", False, str(exc), "check the cluster with `ray job list`")]
    values = values_of(text)
    if status != "SUCCEEDED" or values.get("reached") != "yes":
        last = (text.strip().splitlines() or [status])[-1][:300]
        return [Check("probe", False, f"the probe job ended {status}: {last}",
                      "check that a node with the host's resources is alive and runs jobs")]
    where = f"node {node[:12]}" if node else "a node"
    fix_python = (f"install Python 3.10 or newer on the nodes as `{python}`, or set python "
                  f"in [hosts.{host.name}] to its path there")
    checks = [Check("probe", True, f"one job on {where}")]
    checks.append(at_least("python", values.get("python", ""), MIN_PYTHON, fix_python))
    checks.append(at_least("git", values.get("git", ""), MIN_GIT,
                            "install git 2.38 or newer on the nodes"))
    found = claude_check(values, None, "on the nodes")
    if not found.ok:
        found = Check("claude", False, found.found,
                      f"install Claude Code {CLAUDE_CODE_VERSION} on the nodes ({CLAUDE_PACKAGE} "
                      f"with npm) and set claude in [hosts.{host.name}] to its path there")
    checks.append(found)
    # how an attempt's processes are held on the node: its runner's job starts them there
    checks.append(contain_check(values.get("contain", "")))
    checks.append(cage_check(host.name, values, setting=own.cage, ray=True))
    return checks


class RayChecks:
    probes = True
    records = False

    def describe(self, host: HostConfig) -> str:
        return f"Ray {host.target}"

    def shell(self, host: HostConfig) -> list[str] | None:
        return None  # a node is reached by a job, not a shell

    def claude_where(self, settings: Settings,
                     host: HostConfig) -> tuple[tuple[str, ...], str | None]:
        return (), None

    def run(self, host: HostConfig, *, claude: tuple[str, ...], install_to: str | None,
            probe: bool, env: Mapping[str, str] | None = None
            ) -> tuple[list[Check], dict[str, str]]:
        return check_ray_host(host, probe=probe, env=env), {}


CHECKS = RayChecks()

__all__ = ["CHECKS", "check_ray_host", "ray_nodes"]
