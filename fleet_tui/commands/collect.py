"""fleet-collect [-q] [--json] [FILE|-]: gate on a finished worker's result.

A drop-in for the original script, without its defects: it reads `--output-format json`
and stream-json alike (the last result line, not every line), and it passes a run only
when the verdict is ok (a run that ran out of turns or returned nothing fails).
Exit codes: 0 ok, 10 not ok, 2 usage, 3 missing file, 4 no result object in the input.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from fleet_tui.core import providers
from fleet_tui.core.outcome import Outcome, classify, find_result
from fleet_tui.core.terminal import visible

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_MISSING = 3
EXIT_MALFORMED = 4
EXIT_FAILED = 10

USAGE = """\
usage: fleet-collect [-q] [--json] [FILE|-]

Read a finished worker's output (claude --output-format json or stream-json) from FILE or
stdin, and pass it only when the run really succeeded.

  -q, --quiet   do not print OK on stderr
  --json        print {verdict, message, is_error, api_error_status, num_turns, session_id,
                usage, provider} instead of the result text (provider: the refusal the
                endpoint gave, {name, code, what, reset}, or null)
  -h, --help    show this help

exit: 0 ok (the result text on stdout), 10 the run failed (the reason on stderr),
      2 bad usage, 3 FILE missing or unreadable, 4 no result object in the input
"""


def _write(stream: TextIO, text: str) -> None:
    """Write text that came from a run: what the stream's encoding cannot hold (an ASCII
    locale, say) is replaced rather than raised."""
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = stream.encoding or "utf-8"
        stream.write(text.encode(encoding, "replace").decode(encoding, "replace"))


def _err(text: str) -> None:
    _write(sys.stderr, f"fleet-collect: {text}\n")


def _parse(argv: list[str]) -> tuple[bool, bool, str] | int:
    quiet = as_json = False
    source: str | None = None
    only_files = False
    for arg in argv:
        if not only_files and arg in ("-h", "--help"):
            sys.stdout.write(USAGE)
            return EXIT_OK
        if not only_files and arg in ("-q", "--quiet"):
            quiet = True
        elif not only_files and arg == "--json":
            as_json = True
        elif not only_files and arg == "--":
            only_files = True
        elif not only_files and arg.startswith("-") and arg != "-":
            _err(f"unknown option {arg!r}\n{USAGE}".rstrip())
            return EXIT_USAGE
        elif source is None:
            source = arg
        else:
            _err(f"expected one FILE, got {source!r} and {arg!r}\n{USAGE}".rstrip())
            return EXIT_USAGE
    return quiet, as_json, source or "-"


def _read(source: str) -> bytes | int:
    if source == "-":
        return sys.stdin.buffer.read()
    try:
        with open(source, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        _err(f"no such file: {source}")
    except IsADirectoryError:
        _err(f"{source} is a directory, not a result file")
    except OSError as exc:
        _err(f"cannot read {source}: {exc.strerror or exc}")
    return EXIT_MISSING


def _provider(outcome: Outcome) -> dict[str, Any] | None:
    """The provider's refusal a failed run met, named by the one table (providers.py):
    its code, what it is and, for a usage window, the reset time as written."""
    if outcome.ok or outcome.api_error_status is None:
        return None
    signal = providers.identify(outcome.result_text, outcome.api_error_status)
    if signal is None:
        return None
    return {"name": signal.code.provider, "code": signal.code.code,
            "what": signal.label or signal.code.what, "reset": signal.reset}


def main(argv: list[str]) -> int:
    parsed = _parse(argv)
    if isinstance(parsed, int):
        return parsed
    quiet, as_json, source = parsed
    data = _read(source)
    if isinstance(data, int):
        return data
    name = "stdin" if source == "-" else source
    if not data.strip():
        _err(f"{name} is empty: no result object (was the worker run with "
             "--output-format json or stream-json?)")
        return EXIT_MALFORMED
    result = find_result(data)
    if result is None:
        _err(f"{name} holds no result object (expected claude's --output-format json or "
             "stream-json output)")
        return EXIT_MALFORMED
    # The original run's exit code is not known here: exit_code=None means unknown.
    outcome = classify(exit_code=None, result=result)
    if as_json:
        payload: dict[str, Any] = {
            "verdict": str(outcome.verdict), "message": outcome.message,
            "is_error": outcome.is_error, "api_error_status": outcome.api_error_status,
            "num_turns": outcome.num_turns, "session_id": outcome.session_id,
            "usage": outcome.usage, "provider": _provider(outcome),
        }
        _write(sys.stdout, json.dumps(payload, ensure_ascii=False) + "\n")
    elif outcome.ok:
        text = outcome.result_text or ""
        if sys.stdout.isatty():  # the model's words to a person: no escapes; a pipe: as is
            text = visible(text)
        _write(sys.stdout, text if text.endswith("\n") else text + "\n")
    if outcome.ok:
        if not quiet:
            sys.stderr.write("OK\n")
        return EXIT_OK
    _write(sys.stderr, f"FAILED ({outcome.verdict}): {outcome.message}\n")
    return EXIT_FAILED
