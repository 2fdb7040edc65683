"""fleet-tui gateway status|stop: the local gateway the workers go through.

`status` says whether it runs (pid, port, uptime) and, per endpoint, the requests in flight
and waiting for a slot (and by which tasks), those served, those it answered itself while
the endpoint was parked or held (gated) and those it refused (no token, a revoked one);
the refusals of the endpoint itself, by code, and a gate the gateway shut on a closed
window or account.
`stop` ends it: any engine with attempts through it starts it again. Read from its own
records (gateway.json, status.json): nothing here holds or shows a key or a token.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from fleet_tui.gateway import control

EXIT_OK = 0
EXIT_NOT_RUNNING = 1

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleet-tui gateway",
        description="The local gateway between the workers and the endpoints.")
    sub = parser.add_subparsers(dest="action", metavar="status|stop")
    status = sub.add_parser("status", help="pid, port, uptime, and per endpoint the requests "
                            "in flight, waiting, served and gated")
    status.add_argument("--json", action="store_true", help="the status as JSON")
    sub.add_parser("stop", help="stop the gateway (an engine with workers starts it again)")
    return parser


def _uptime(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _status(as_json: bool) -> int:
    info = control.read_info()
    if info is None:
        if as_json:
            print(json.dumps({"running": False}))
        else:
            print("the gateway is not running (an engine starts it with the first worker "
                  "that goes through it; the `gateway` setting is "
                  "FLEET_WORKER_GATEWAY / gateway in config.toml)")
        return EXIT_NOT_RUNNING
    status = control.read_status() or {}
    endpoints = status.get("endpoints", {}) if isinstance(status, dict) else {}
    if as_json:
        print(json.dumps({"running": True, "pid": info.pid, "port": info.port,
                          "started_at": info.started_at, "endpoints": endpoints},
                         sort_keys=True))
        return EXIT_OK
    uptime = _uptime(max(0.0, time.time() - info.started_at))
    print(f"gateway: pid {info.pid}, {info.url}, up {uptime}")
    if not endpoints:
        print("  no endpoint yet")
    for name, ep in sorted(endpoints.items()):
        cap = ep.get("max_requests")
        line = (f"  {name}: {ep.get('in_flight', 0)}{f'/{cap}' if cap else ''} in flight, "
                f"{ep.get('waiting', 0)} waiting, {ep.get('served', 0)} served, "
                f"{ep.get('gated', 0)} gated, {ep.get('refused', 0)} refused")
        if ep.get("failed"):
            line += f", {ep['failed']} failed"
        print(line)
        if ep.get("rejected"):  # the provider's own refusals, by code
            codes = ep.get("rejected_codes") or {}
            print(f"    refused by the endpoint: {ep['rejected']} ("
                  + ", ".join(f"{code}: {n}" for code, n in sorted(codes.items())) + ")")
        shut = ep.get("shut")
        if isinstance(shut, dict):
            print(f"    shut by the gateway until {shut.get('until_text', '?')}: "
                  f"{shut.get('reason', '')} (it answers the workers itself)")
        tasks = ep.get("waiting_tasks") or {}
        if tasks:
            print("    waiting for a slot: " + ", ".join(
                f"{task} ({n})" if n > 1 else task for task, n in sorted(tasks.items())))
    return EXIT_OK


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.action == "status":
        return _status(args.json)
    if args.action == "stop":
        if control.stop():
            print("the gateway stopped")
            return EXIT_OK
        print("the gateway was not running")
        return EXIT_NOT_RUNNING
    parser.print_help(sys.stderr)
    return 2
