"""fleet-tui key set|delete|status: keep the API key in the OS keyring, not in a file.

The key is read without echo (getpass) from a terminal, or from stdin when piped, so it
never lands in shell history or argv. Where no keyring backend works (a headless Linux box
has no Secret Service), `set` says so before it asks for the key, and what to do instead.
"""

from __future__ import annotations

import argparse
import sys

from fleet_tui.settings.config import ConfigError, Settings, load_settings
from fleet_tui.settings.credentials import (
    check_sources,
    endpoint_sources,
    keyring_failure_reason,
)
from fleet_tui.settings.endpoints import DEFAULT, Endpoint

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NO_KEY = 5
EXIT_NO_BACKEND = 6

USAGE_EPILOG = """\
Where the key comes from (first found wins; FLEET_WORKER_KEY_SOURCES narrows it):
  ANTHROPIC_AUTH_TOKEN, the OS keyring entry FLEET_WORKER_KEYRING_SERVICE /
  FLEET_WORKER_KEYRING_KEY (fleet-worker / api-key), ZHIPU_API_KEY, GLM_API_KEY.

A named endpoint of config.toml (--endpoint NAME) has its own key when its table says
where: `key_keyring = "ENTRY"` (set/delete/status use the keyring entry
FLEET_WORKER_KEYRING_SERVICE / ENTRY) or `key_env = "VARIABLE"` (export it; status says
whether it is set). An endpoint with neither uses the sources above, so `set --endpoint`
refuses it and says what to add to its table.

exit codes: 0 ok; 2 usage; 5 (status) no key found; 6 no usable OS keyring backend.
"""

ENV_ADVICE = ("Use an environment variable instead, e.g. `export ZHIPU_API_KEY=...` in your "
              "shell profile (or GLM_API_KEY / ANTHROPIC_AUTH_TOKEN).")

# What to do where no keyring backend works (a headless Linux box has no Secret Service).
NO_BACKEND_ADVICE = """Instead, either:
  - export ANTHROPIC_AUTH_TOKEN=... (or ZHIPU_API_KEY / GLM_API_KEY) in your shell profile;
  - install and unlock a Secret Service such as gnome-keyring (on a headless box it
    needs a D-Bus session, e.g. a shell started with `dbus-run-session`);
  - or, at your own risk, keyrings.alt's file backend (`pip install keyrings.alt`, then
    PYTHON_KEYRING_BACKEND=keyrings.alt.file.PlaintextKeyring): it keeps the key
    unencrypted in a file under your home."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleet-tui key", description="Store, remove or locate the endpoint's API key.",
        epilog=USAGE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--service", help="keyring service (default: FLEET_WORKER_KEYRING_SERVICE"
                        " or fleet-worker)")
    parser.add_argument("--name", help="keyring entry name (default: FLEET_WORKER_KEYRING_KEY"
                        " or api-key)")
    parser.add_argument("--endpoint", metavar="NAME",
                        help="the key of the endpoint NAME of config.toml (its key_keyring "
                        "entry; default: the top-level settings' key)")
    sub = parser.add_subparsers(dest="action", metavar="set|delete|status")
    for name, what in (("set", "store the key (prompted without echo, or read from stdin)"),
                       ("delete", "remove the stored key"),
                       ("status", "say which source the key would come from (never the "
                                  "key)")):
        action = sub.add_parser(name, help=what, description=what[0].upper() + what[1:] + ".")
        # `key set --endpoint NAME` as well as `key --endpoint NAME set`
        action.add_argument("--endpoint", metavar="NAME", default=argparse.SUPPRESS,
                            help="the key of the endpoint NAME of config.toml")
    return parser


def _read_secret() -> str:
    """The key from a terminal (no echo) or from piped stdin."""
    if sys.stdin is not None and sys.stdin.isatty():
        import getpass

        return getpass.getpass("API key (input hidden): ")
    return sys.stdin.read() if sys.stdin is not None else ""


def _no_backend(action: str, exc: BaseException, advice: str = ENV_ADVICE) -> int:
    sys.stderr.write(f"fleet-tui key {action}: the OS keyring cannot be used here: "
                     f"{keyring_failure_reason(exc)}.\n{advice}\n")
    return EXIT_NO_BACKEND


def _backend_problem(service: str, name: str) -> BaseException | None:
    """Why the keyring cannot store a key here (None: it can). Asked before the key is
    read, so nobody types a secret only to be told it cannot be kept. A read of the entry
    is the probe: it fails the way a write would (no backend, a locked or broken one)."""
    import keyring

    try:
        keyring.get_password(service, name)
    except Exception as exc:  # every backend raises its own types
        return exc
    return None


def _set(service: str, name: str, env_token_set: bool) -> int:
    problem = _backend_problem(service, name)
    if problem is not None:
        sys.stderr.write(f"fleet-tui key set: the OS keyring cannot be used here: "
                         f"{keyring_failure_reason(problem)}; nothing was asked or stored.\n"
                         f"{NO_BACKEND_ADVICE}\n")
        return EXIT_NO_BACKEND
    try:
        secret = _read_secret().strip()
    except (EOFError, KeyboardInterrupt):
        sys.stderr.write("\nfleet-tui key set: cancelled; nothing stored.\n")
        return EXIT_USAGE
    if not secret:
        sys.stderr.write("fleet-tui key set: no key given; nothing stored.\n")
        return EXIT_USAGE
    if any(ch.isspace() for ch in secret):
        sys.stderr.write("fleet-tui key set: the key contains whitespace or a line break "
                         "inside it, which no API key does; nothing stored.\n")
        return EXIT_USAGE
    import keyring

    try:
        keyring.set_password(service, name, secret)
    except Exception as exc:  # every backend raises its own types
        return _no_backend("set", exc, NO_BACKEND_ADVICE)
    print(f"stored the key in the OS keyring as {service}/{name}.")
    if env_token_set:
        print("note: ANTHROPIC_AUTH_TOKEN is set in this environment and is used before the "
              "keyring; unset it (or set FLEET_WORKER_KEY_SOURCES=keyring) to use this key.")
    return EXIT_OK


def _delete(service: str, name: str) -> int:
    import keyring

    try:
        existing = keyring.get_password(service, name)
        if existing is None:
            print(f"no key stored as {service}/{name}; nothing to delete.")
            return EXIT_OK
        keyring.delete_password(service, name)
    except Exception as exc:
        return _no_backend("delete", exc)
    print(f"deleted the key {service}/{name} from the OS keyring.")
    return EXIT_OK


def _status(settings_env: dict[str, str], overrides: dict[str, object]) -> int:
    try:
        settings = load_settings(env=settings_env, overrides=overrides)
    except ConfigError as exc:
        sys.stderr.write(f"fleet-tui key status: {exc}\n")
        return EXIT_USAGE
    found, checks = check_sources(settings, settings_env, stop_at_first=False)
    for check in checks:
        marker = "->" if found is not None and check.label == found.source else "  "
        print(f"{marker} {check.label}: {check.reason}")
    if found is None:
        print("no key found. Store one with `fleet-tui key set`, or "
              "`export ZHIPU_API_KEY=...`.")
        if any(c.kind == "keyring" and c.reason not in ("no entry", "entry is empty")
               for c in checks):
            print(ENV_ADVICE)
        return EXIT_NO_KEY
    print(f"the key would come from {found.source}.")
    return EXIT_OK


def _endpoint_status(settings: Settings, endpoint: Endpoint, env: dict[str, str]) -> int:
    """`status --endpoint NAME` for an endpoint with a key of its own."""
    found, checks = endpoint_sources(settings, endpoint, env)
    for check in checks:
        print(f"{'->' if found is not None else '  '} {check.label}: {check.reason}")
    if found is None:
        how = (f"`export {endpoint.key_env}=...` where fleet-tui runs" if endpoint.key_env
               else f"`fleet-tui key set --endpoint {endpoint.name}`")
        print(f"no key found for the endpoint {endpoint.name!r}. Set it with {how}.")
        return EXIT_NO_KEY
    print(f"the key of the endpoint {endpoint.name!r} would come from {found.source}.")
    return EXIT_OK


def _entry_of(action: str, settings: Settings, endpoint: Endpoint) -> str | None:
    """The keyring entry `set`/`delete` use for a named endpoint (None: said why not)."""
    if endpoint.key_keyring is not None:
        return endpoint.key_keyring
    if endpoint.key_env is not None:
        sys.stderr.write(f"fleet-tui key {action}: the endpoint {endpoint.name!r} takes its "
                         f"key from the environment variable {endpoint.key_env} (key_env), "
                         f"not the keyring: `export {endpoint.key_env}=...` where fleet-tui "
                         "runs, or replace key_env by key_keyring in its table.\n")
    else:
        sys.stderr.write(f"fleet-tui key {action}: the endpoint {endpoint.name!r} has no key "
                         "of its own (it uses the usual sources); to keep one in the keyring "
                         f"add to its table in config.toml:\n  [endpoints.{endpoint.name}]\n"
                         f"  key_keyring = \"{endpoint.name}\"\nthen run `fleet-tui key set "
                         f"--endpoint {endpoint.name}` again.\n")
    return None


def _env_token_wins(sources: tuple[str, ...], env: dict[str, str]) -> bool:
    """True when an exported ANTHROPIC_AUTH_TOKEN would be used before the keyring."""
    if "env" not in sources or not env.get("ANTHROPIC_AUTH_TOKEN", "").strip():
        return False
    return "keyring" not in sources or sources.index("env") < sources.index("keyring")


def main(argv: list[str]) -> int:
    import os

    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    if args.action is None:
        parser.print_help()
        return EXIT_USAGE
    env = dict(os.environ)
    overrides: dict[str, object] = {"keyring_service": args.service, "keyring_key": args.name}
    if args.action == "status" and args.endpoint is None:
        return _status(env, overrides)
    try:
        settings = load_settings(env=env, overrides=overrides)
        endpoint = settings.endpoint(args.endpoint)
    except ConfigError as exc:
        sys.stderr.write(f"fleet-tui key {args.action}: {exc}\n")
        return EXIT_USAGE
    if endpoint.name != DEFAULT:
        if args.action == "status":
            if not endpoint.own_key:
                print(f"the endpoint {endpoint.name!r} uses the usual sources:")
                return _status(env, overrides)
            return _endpoint_status(settings, endpoint, env)
        entry = _entry_of(args.action, settings, endpoint)
        if entry is None:
            return EXIT_USAGE
        if args.action == "set":
            return _set(settings.keyring_service, entry, False)
        return _delete(settings.keyring_service, entry)
    if args.action == "status":
        return _status(env, overrides)
    if args.action == "set":
        return _set(settings.keyring_service, settings.keyring_key,
                    _env_token_wins(settings.key_sources, env))
    return _delete(settings.keyring_service, settings.keyring_key)
