"""The attempt folder: the one module that knows its layout.

Every attempt of a task has a folder (`<repo>/.fleet-work/.logs/<task>/<n>/`) that outlives
any fleet-tui process: the runner writes it, the engine follows and finishes it, the panel
and `fleet-tui logs` read it. Before this module each of them knew the file names and read
`events.jsonl` its own way, with three different rules for a last line without a newline;
a second copy of such a rule drifts, so here is the only one:

    a line without its newline is part of the stream only once the attempt has finished
    (a running claude may be half way through writing it).

Cheap to import (os, json, fcntl): every runner imports it. Parsing (`stream`) is imported
only by the methods that parse.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
import time
from pathlib import Path

from fleet_tui.core import redaction
from fleet_tui.core.states import StopReason
from fleet_tui.system import files

TYPE_CHECKING = False
if TYPE_CHECKING:  # a runner imports this module: typing would cost each one ~5 ms
    from collections.abc import Iterator, Mapping
    from typing import Any

    from fleet_tui.core import stream

SPEC_FILE = "spec.json"  # what to run (no secret), by the engine
LAUNCH_FILE = "launch.json"  # the engine's record of the runner it started
RUNNER_FILE = "runner.json"  # the runner's pids and /proc start times, before claude starts
EVENTS_FILE = "events.jsonl"  # claude's stdout, byte for byte
STDERR_FILE = "stderr.log"  # claude's stderr
EXIT_FILE = "exit.json"  # how it ended (atomic)
RUNNER_LOG = "runner.log"  # the runner's own output
KILL_FILE = "kill.json"  # why it was stopped (kill, timeout, stall, error, endpoint), before
# the signal
LOCK_FILE = ".lock"  # flock'ed by the attempt's runner (and its starter) while it lives
RESERVE_FILE = ".exit.reserve"  # room for the exit record, written while the disk had room

# The steering channel (messages for a running worker; see "The input channel" below)
INPUT_DIR = "input"  # messages waiting for the runner, one file each
INPUT_FIFO = "input.fifo"  # exists while the runner takes messages; a byte wakes it up
INPUT_LOCK = ".input.lock"  # senders and the runner's open/close take turns on it
INPUT_LOG = "input.jsonl"  # every message the runner gave claude, and when
SETUP_LOG = "setup.log"  # the output of the repository's setup command (new worktrees)

STDERR_TAIL = 4000  # bytes of stderr a verdict looks at
# what a new attempt's start clears from its folder (a retried start may find them)
_PER_RUN = (EXIT_FILE, RUNNER_FILE, KILL_FILE, LAUNCH_FILE, RESERVE_FILE)
LOCK_WAIT = 1.0  # a lock held this long by someone else is a live runner, not a passing check
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL}


# --- records (small JSON files) --------------------------------------------------------------


def write_json_atomic(path: Path, data: Mapping[str, Any], *, sync: bool = True) -> None:
    """A record of the attempt folder written whole (system.files: 0600, indented, sorted
    keys; a temporary file of this writer's own renamed over `path`, removed on failure).
    `sync`: fsync before the rename (a record that must survive a power cut)."""
    files.write_json_atomic(path, data, sync=sync, indent=2, sort_keys=True)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from path, or None when missing or unreadable (e.g. being replaced)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


# --- the attempt's lock ------------------------------------------------------------------------


def open_lock(attempt_dir: Path, *, create: bool = True) -> int | None:
    """An fd on the attempt's lock file (None: no lock file and create is False)."""
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        return os.open(attempt_dir / LOCK_FILE, flags, 0o600)
    except FileNotFoundError:
        if create:
            raise
        return None


def acquire_lock(attempt_dir: Path, wait: float = LOCK_WAIT) -> int | None:
    """Take the attempt's lock: the fd to keep open for as long as it is held, or None
    when another process held it for all of `wait` seconds (a live runner, or its starter).
    A look by `lock_held` holds it for microseconds, hence the wait."""
    fd = open_lock(attempt_dir)
    assert fd is not None
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.005)
        except OSError as exc:
            if exc.errno in _NO_LOCKS:  # a file system without flock: go on unguarded
                return fd  # (the engine falls back to pid and start time: lock_held None)
            os.close(fd)
            raise
        except BaseException:
            os.close(fd)
            raise


def lock_held(attempt_dir: Path) -> bool | None:
    """True: a runner of this attempt lives (or its starter is spawning it); False: none
    does; None: the folder has no lock file (an attempt started before locks existed)."""
    try:
        fd = open_lock(attempt_dir, create=False)
    except OSError:
        return None
    if fd is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no flock here: unknown (the caller uses pid and start time)
        return None
    finally:
        os.close(fd)  # releases the lock if this look took it
    return False


# --- the input channel ------------------------------------------------------------------------
# A running worker takes more user messages (claude reads stream-json on its stdin, which the
# runner holds open). The channel lives in the attempt folder, so it outlives any panel and
# any number of fleet-tui processes can send: a sender leaves one file per message in
# `input/` and writes a byte to `input.fifo` to wake the runner, which feeds the message to
# claude. `input.fifo` exists exactly while the runner takes messages; the runner itself
# holds it open for reading, so a sender that finds no reader (ENXIO) knows the runner is
# gone. Senders and the runner's "take and maybe close" take turns on `.input.lock`: a
# message accepted while the channel was open is always taken before it closes.

INPUT_LOCK_WAIT = 5.0  # a sender waits this long for the runner's (microsecond) turn


MESSAGE_ID = re.compile(r"[0-9]{20}-[0-9a-f]{8}")  # a message's id: its file's name in input/


def new_message_id() -> str:
    """A message's id: ordered by time, unique."""
    return f"{time.time_ns():020d}-{os.urandom(4).hex()}"


class InputClosed(Exception):
    """The attempt's runner takes no message now; the text says why (one phrase)."""


@contextlib.contextmanager
def _input_lock(folder: Path, wait: float = INPUT_LOCK_WAIT) -> Iterator[None]:
    fd = os.open(folder / INPUT_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise InputClosed(f"its input channel is busy ({folder / INPUT_LOCK} "
                                      "stayed locked)") from None
                time.sleep(0.002)
            except OSError as exc:
                if exc.errno in _NO_LOCKS:
                    break  # no flock on this file system: go on unguarded
                raise
        yield
    finally:
        os.close(fd)


def _append_line(path: Path, data: Mapping[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        blob = (json.dumps(dict(data), sort_keys=True) + "\n").encode("utf-8", "replace")
        view = memoryview(blob)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


# --- the one partial-line rule ----------------------------------------------------------------


def usable_end(data: bytes, *, at_eof: bool, finished: bool) -> int:
    """How much of `data` (read from a line start) belongs to the stream now: up to its
    last newline, or all of it when it reaches the end of a finished attempt's file."""
    if at_eof and finished:
        return len(data)
    return data.rfind(b"\n") + 1


class AttemptLog:
    """One attempt folder: its file paths, records, and every read of its streams.

    Readers ask for bytes, lines or events from an offset and get the offset to go on
    from; `finished` says whether the attempt has ended (the caller knows: the store or the
    exit record), which decides whether a last line without newline counts."""

    __slots__ = ("dir",)

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.dir = Path(folder)

    def __repr__(self) -> str:
        return f"AttemptLog({str(self.dir)!r})"

    def path(self, name: str) -> Path:
        return self.dir / name

    @property
    def events(self) -> Path:
        return self.dir / EVENTS_FILE

    @property
    def stderr(self) -> Path:
        return self.dir / STDERR_FILE

    @property
    def spec_path(self) -> Path:
        return self.dir / SPEC_FILE

    @property
    def runner_record_path(self) -> Path:
        return self.dir / RUNNER_FILE

    @property
    def exit_path(self) -> Path:
        return self.dir / EXIT_FILE

    @property
    def reserve_path(self) -> Path:
        return self.dir / RESERVE_FILE

    @property
    def lock_path(self) -> Path:
        return self.dir / LOCK_FILE

    @property
    def runner_log(self) -> Path:
        return self.dir / RUNNER_LOG

    # records
    def record(self, name: str) -> dict[str, Any] | None:
        return read_json(self.dir / name)

    def write_record(self, name: str, data: Mapping[str, Any]) -> None:
        write_json_atomic(self.dir / name, data)

    def has(self, name: str) -> bool:
        return (self.dir / name).exists()

    @property
    def exited(self) -> bool:
        """The runner wrote its exit record."""
        return (self.dir / EXIT_FILE).exists()

    def read_spec(self) -> str:
        """spec.json's text (what the runner is to run); OSError when it cannot be read."""
        return (self.dir / SPEC_FILE).read_text(encoding="utf-8")

    def write_spec(self, data: Mapping[str, Any]) -> None:
        """spec.json, written by the engine before it spawns the runner (no secret in it)."""
        write_json_atomic(self.dir / SPEC_FILE, data, sync=False)

    def launch_record(self) -> dict[str, Any] | None:
        """The engine's record of the runner it spawned (pid, start time, owner)."""
        return read_json(self.dir / LAUNCH_FILE)

    def write_launch_record(self, data: Mapping[str, Any]) -> None:
        write_json_atomic(self.dir / LAUNCH_FILE, data)

    def runner_record(self) -> dict[str, Any] | None:
        """The runner's own record: its pid and start time, claude's once it runs."""
        return read_json(self.dir / RUNNER_FILE)

    def write_runner_record(self, data: Mapping[str, Any]) -> None:
        write_json_atomic(self.dir / RUNNER_FILE, data)

    def has_runner_record(self) -> bool:
        return (self.dir / RUNNER_FILE).exists()

    def has_run(self) -> bool:
        """A runner was spawned for this attempt at some time (any of its traces)."""
        return any((self.dir / name).exists() for name in (EXIT_FILE, RUNNER_FILE, LAUNCH_FILE))

    def spec_token(self) -> str | None:
        """The attempt's FLEET_ATTEMPT_TOKEN from its spec (None: none, an older attempt)."""
        spec = read_json(self.dir / SPEC_FILE)
        token = spec.get("token") if spec else None
        return token if isinstance(token, str) and token else None

    def clear_run_records(self) -> None:
        """Remove what an earlier start of this attempt left (exit, runner, stop and launch
        records, the reserve), so that none of it is taken for the new run's."""
        for name in _PER_RUN:
            with contextlib.suppress(FileNotFoundError):
                (self.dir / name).unlink()

    def stop_request(self) -> dict[str, Any]:
        """Why a stop was asked ({} when none was, or the record is unusable): `reason`
        (a StopReason), `message` (str or None), `at`, `by`."""
        rec = read_json(self.dir / KILL_FILE)
        if not rec:
            return {}
        try:
            rec["reason"] = StopReason(str(rec.get("reason")))
        except ValueError:  # none, or not a reason (a tampered or foreign file)
            return {}
        if not isinstance(rec.get("message"), (str, type(None))):
            rec["message"] = None
        return rec

    def request_stop(self, reason: StopReason, message: str, *, at: float, by: str) -> bool:
        """Record why the run is being stopped (before the signal, so whoever finishes the
        attempt classifies it right), unless a usable request is there already: the first
        reason stands. True when this call wrote it."""
        if self.stop_request():
            return False
        write_json_atomic(self.dir / KILL_FILE,
                          {"reason": reason, "message": message, "at": at, "by": by})
        return True

    def exit_record(self) -> tuple[dict[str, Any] | None, str | None]:
        """The runner's exit record, or (None, why it is unreadable); (None, None): there is
        none. Each field the engine uses is checked, so bad data is reported, never raised."""
        try:
            raw = (self.dir / EXIT_FILE).read_bytes()
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return None, exc.strerror or str(exc)
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            return None, "it is not JSON"
        if not isinstance(data, dict):
            return None, f"it holds a JSON {type(data).__name__}, not an object"
        for key, kinds in (("exit_code", (int, type(None))), ("signal", (int, type(None))),
                           ("error", (str, type(None)))):
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, kinds):
                shown = " ".join(repr(value)[:160].split())
                if len(shown) > 40:
                    shown = shown[:39].rstrip() + "…"
                return None, f"its {key} holds {shown}"
        return data, None

    def remove_exit_strays(self) -> list[str]:
        """Remove the temporary files of an exit record whose writer died half way (half a
        record helps nobody); their names, sorted."""
        strays = sorted(self.dir.glob(f".{EXIT_FILE}.*.tmp"))
        for stray in strays:
            with contextlib.suppress(OSError):
                stray.unlink()
        return [stray.name for stray in strays]

    def write_problem(self) -> str | None:
        """Why nothing can be written in the folder (e.g. "No space left on device"), or
        None: a probe of 4 KiB is written, synced and removed."""
        probe = self.dir / f".probe.{os.getpid()}.{os.urandom(3).hex()}"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, b"\0" * 4096)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            return exc.strerror or str(exc)
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()
        return None

    def runner_logged(self) -> bool:
        """The runner wrote something to its own log."""
        try:
            return (self.dir / RUNNER_LOG).stat().st_size > 0
        except OSError:
            return False

    # the lock
    def acquire_lock(self, wait: float = LOCK_WAIT) -> int | None:
        return acquire_lock(self.dir, wait)

    def lock_held(self) -> bool | None:
        return lock_held(self.dir)

    # the input channel (see "The input channel" above)
    @property
    def input_fifo(self) -> Path:
        return self.dir / INPUT_FIFO

    @property
    def input_dir(self) -> Path:
        return self.dir / INPUT_DIR

    @property
    def input_log(self) -> Path:
        return self.dir / INPUT_LOG

    @property
    def setup_log(self) -> Path:
        return self.dir / SETUP_LOG

    def input_open(self) -> bool:
        """The runner takes messages now (its wake-up pipe exists)."""
        try:
            return stat.S_ISFIFO(os.lstat(self.dir / INPUT_FIFO).st_mode)
        except OSError:
            return False

    def open_input(self) -> int:
        """The runner opens the channel: `input/` and the wake-up pipe, held open for
        reading and writing (so it never reads an end of file); the fd to select on."""
        with _input_lock(self.dir):
            os.makedirs(self.dir / INPUT_DIR, mode=0o700, exist_ok=True)
            fifo = self.dir / INPUT_FIFO
            with contextlib.suppress(FileNotFoundError):
                os.unlink(fifo)  # a dead runner's: nobody reads it
            os.mkfifo(fifo, 0o600)
            return os.open(fifo, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)

    def take_input(self, *, close: bool = False, close_if_empty: bool = False,
                   wait: float = INPUT_LOCK_WAIT) -> tuple[list[str], bool]:
        """The runner takes every waiting message (oldest first; each is logged in
        input.jsonl and its file removed) and, with `close`, closes the channel, or with
        `close_if_empty`, closes it when there was none. (messages, whether it is closed
        now). One turn of the lock: a sender either got its message in before, or finds
        the channel closed. InputClosed when the lock stayed busy for `wait` seconds."""
        with _input_lock(self.dir, wait):
            messages = self._take_waiting()
            if close or (close_if_empty and not messages):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.dir / INPUT_FIFO)
                with contextlib.suppress(OSError):
                    os.rmdir(self.dir / INPUT_DIR)  # only when empty
                return messages, True
            return messages, not self.input_open()

    def _take_waiting(self) -> list[str]:
        folder = self.dir / INPUT_DIR
        try:
            names = sorted(n for n in os.listdir(folder)
                           if n.endswith(".json") and not n.startswith("."))
        except FileNotFoundError:
            return []
        texts: list[str] = []
        for name in names:
            data = read_json(folder / name)
            text = data.get("text") if data else None
            if isinstance(text, str) and text:
                texts.append(text)
                _append_line(self.dir / INPUT_LOG, {"id": name.removesuffix(".json"),
                                                    "at": time.time(), "text": text,
                                                    "by": data.get("by") if data else None})
            with contextlib.suppress(FileNotFoundError):
                os.unlink(folder / name)
        return texts

    def send_input(self, text: str, *, by: str = "", message_id: str | None = None) -> str:
        """Leave a message for the running worker and wake its runner; the message's id
        (`input_waiting(id)` says whether the runner has taken it yet; `message_id`: the
        id it was given elsewhere, a remote host's mailbox). InputClosed when the runner
        takes no message: none runs yet, or its run is over (or being stopped)."""
        if message_id is not None and not MESSAGE_ID.fullmatch(message_id):
            raise ValueError(f"not a message id: {message_id!r}")
        with _input_lock(self.dir):
            if not self.input_open():
                raise InputClosed("its worker is not taking messages")
            try:
                wake = os.open(self.dir / INPUT_FIFO, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:  # ENXIO: nobody reads it, the runner is gone
                raise InputClosed("its worker is gone") from exc
            try:
                name = message_id or new_message_id()
                write_json_atomic(self.dir / INPUT_DIR / f"{name}.json",
                                  {"text": text, "at": time.time(), "by": by}, sync=False)
            except BaseException:
                os.close(wake)
                raise
        try:
            os.write(wake, b"\n")
        except OSError:  # a full pipe has its wake-up already
            pass
        finally:
            os.close(wake)
        return name

    def input_waiting(self, message_id: str) -> bool:
        """The message is still waiting for the runner (not taken yet)."""
        return (self.dir / INPUT_DIR / f"{message_id}.json").exists()

    def input_messages(self) -> list[dict[str, Any]]:
        """What the runner gave claude, in order (input.jsonl; unreadable lines skipped)."""
        try:
            raw = (self.dir / INPUT_LOG).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        out: list[dict[str, Any]] = []
        for line in raw.splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict):
                out.append(item)
        return out

    # events.jsonl
    def size(self) -> int:
        try:
            return os.stat(self.events).st_size
        except OSError:
            return 0

    def read_bytes(self, offset: int = 0, max_bytes: int | None = None, *,
                   finished: bool) -> tuple[bytes, int]:
        """Whole lines of events.jsonl from `offset` (a line start), at most about
        `max_bytes` (None: to the end), and the offset to go on from. One line longer than
        `max_bytes` is read whole, so a caller reading chunk by chunk always moves on.
        The API key, where the worker said it, reads as redaction.MARK (the file keeps
        claude's bytes; offsets are the file's)."""
        data, end = self._read_raw(offset, max_bytes, finished=finished)
        return redaction.redact_bytes(data), end

    def _read_raw(self, offset: int, max_bytes: int | None, *,
                  finished: bool) -> tuple[bytes, int]:
        try:
            with open(self.events, "rb") as fh:
                fh.seek(offset)
                if max_bytes is None:
                    data = fh.read()
                    at_eof = True
                else:
                    step = max(1, max_bytes)
                    data = fh.read(step)
                    at_eof = len(data) < step
                    while not at_eof and b"\n" not in data:
                        more = fh.read(step)
                        at_eof = len(more) < step
                        data += more
        except FileNotFoundError:
            return b"", offset
        data = data[: usable_end(data, at_eof=at_eof, finished=finished)]
        return data, offset + len(data)

    def read_lines(self, offset: int = 0, max_bytes: int | None = None, *,
                   finished: bool) -> tuple[list[str], int, bool]:
        """Raw lines (decoded, invalid bytes replaced) from `offset`: (lines, new offset,
        whether more may follow at once)."""
        data, end = self._read_raw(offset, max_bytes, finished=finished)
        more = max_bytes is not None and len(data) >= max_bytes
        text = data.decode("utf-8", errors="replace")
        return redaction.redact(text).splitlines(), end, more

    def read_events(self, offset: int = 0, max_bytes: int | None = None, *, finished: bool,
                    cwd: str | None = None) -> tuple[list[stream.Event], int]:
        """Parsed events from `offset` and the offset to go on from (see read_bytes)."""
        from fleet_tui.core import stream

        data, end = self.read_bytes(offset, max_bytes, finished=finished)
        decoder = stream.StreamDecoder(cwd)
        events = decoder.feed(data)
        if data and not data.endswith(b"\n"):
            events += decoder.finish()
        return events, end

    def tool_call(self, tool_use_id: str) -> tuple[stream.ToolUse | None,
                                                    stream.ToolResult | None]:
        """A tool call and its result, whole (input, full output, a Bash step's exit
        status), found by the call's id wherever it is in events.jsonl (the file is
        searched for the id, only the lines that hold it are decoded)."""
        import mmap

        from fleet_tui.core import stream

        use: stream.ToolUse | None = None
        result: stream.ToolResult | None = None
        needle = json.dumps(tool_use_id).encode()
        if not tool_use_id or len(needle) < 4:
            return None, None
        try:
            with open(self.events, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size == 0:
                    return None, None
                with mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as data:
                    at = data.find(needle)
                    while at >= 0 and (use is None or result is None):
                        start = data.rfind(b"\n", 0, at) + 1
                        end = data.find(b"\n", at)
                        end = size if end < 0 else end
                        line = redaction.redact_bytes(data[start:end] + b"\n")
                        for event in stream.StreamDecoder().feed(line):
                            if isinstance(event, stream.ToolUse) and event.id == tool_use_id:
                                use = event
                            elif isinstance(event, stream.ToolResult) \
                                    and event.tool_use_id == tool_use_id:
                                result = event
                        at = data.find(needle, end)
        except (OSError, ValueError):
            return use, result
        if use is not None and result is not None:
            result.tool_name = use.name
            if use.name == "Bash":
                result.exit_code = stream.bash_exit_code(result.content, result.is_error)
        return use, result

    def setup_steps(self) -> list[stream.Setup]:
        """The setup step's lines (start, end) of events.jsonl, found by their subtype."""
        from fleet_tui.core import stream

        return [e for e in self._marked_events(b'"fleet_setup"') if isinstance(e, stream.Setup)]

    def blocked(self) -> list[stream.Blocked]:
        """What the worker's cage refused (events.jsonl's `system/fleet_blocked` lines)."""
        from fleet_tui.core import stream

        return [e for e in self._marked_events(b'"fleet_blocked"')
                if isinstance(e, stream.Blocked)]

    def _marked_events(self, needle: bytes) -> list[stream.Event]:
        """The events of the lines of events.jsonl that hold `needle`, each line redacted,
        found without reading the whole file into memory."""
        import mmap

        from fleet_tui.core import stream

        found: list[stream.Event] = []
        try:
            with open(self.events, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size == 0:
                    return []
                with mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as data:
                    at = data.find(needle)
                    while at >= 0:
                        start = data.rfind(b"\n", 0, at) + 1
                        end = data.find(b"\n", at)
                        end = size if end < 0 else end
                        line = redaction.redact_bytes(data[start:end] + b"\n")
                        found += stream.StreamDecoder().feed(line)
                        at = data.find(needle, end)
        except (OSError, ValueError):
            pass
        return found

    @property
    def cage_policy(self) -> Path:
        """The cage's rules for this attempt (written by the runner when it is caged)."""
        return self.dir / "cage.json"

    def tail_start(self, tail: int, *, end: int | None = None) -> int:
        """Where to start reading to get the last `tail` bytes before `end` (default: the
        end of the file) as whole lines: the first line start in that window, or the start
        of the one long line that covers it; 0 when the window reaches the file's start."""
        try:
            with open(self.events, "rb") as fh:
                if end is None:
                    end = fh.seek(0, os.SEEK_END)
                at = end - tail
                if at <= 0:
                    return 0
                fh.seek(at - 1)  # a newline just before `at` makes `at` a line start
                cut = fh.read(end - at + 1).find(b"\n")
                if 0 <= cut < end - at:
                    return at + cut
                while at > 0:  # no line starts in the window: back to the long line's start
                    step = min(tail, at)
                    fh.seek(at - step)
                    newline = fh.read(step).rfind(b"\n")
                    if newline >= 0:
                        return at - step + newline + 1
                    at -= step
                return 0
        except FileNotFoundError:
            return 0

    # stderr.log
    def stderr_tail(self, size: int = STDERR_TAIL) -> str:
        """The last `size` bytes of claude's stderr, decoded ("" when there is none)."""
        try:
            with open(self.stderr, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                end = fh.tell()
                fh.seek(max(0, end - size))
                return redaction.redact(fh.read().decode("utf-8", "replace"))
        except OSError:
            return ""
