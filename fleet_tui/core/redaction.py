"""The one rule for hiding the API key in what fleet-tui writes or shows.

A worker sees the key (or a determined one finds it) and may say it: in a Bash step's
command or output, a file's name, its result text. Its own record, events.jsonl, keeps
what claude wrote byte for byte (ARCHITECTURE.md); everything fleet-tui makes of it is
redacted at the boundary that writes or prints: the store (`Store` writes free text through
`redact`), the attempt folder's readers (`AttemptLog`: events, lines, a tool call, the
stderr tail, which the CLI's `logs`, the panel's stream and the follower's summary read),
the diff and the merge's key scan (`git`), and the CLI's error line.

The key is known to a process once the engine resolved it (`SecretCache.get` calls
`remember`): the readers and the store use what is known and never look a key up
themselves (no keyring call inside a store transaction or a panel read). Keys shorter than
`MIN_LENGTH` are not looked for: a short stand-in would match everywhere.

No imports: the runner and fleet-worker may load it for nothing.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["MARK", "MIN_LENGTH", "forget_all", "known", "needles", "redact", "redact_bytes",
           "remember"]

MARK = "[API key hidden]"
MIN_LENGTH = 8

_known: tuple[str, ...] = ()


def needles(secrets: Iterable[str]) -> list[str]:
    """The secrets worth looking for, longest first (one may contain another)."""
    return sorted({s for s in secrets if isinstance(s, str) and len(s) >= MIN_LENGTH},
                  key=len, reverse=True)


def remember(secrets: Iterable[str]) -> None:
    """Hide these from now on in this process (the engine calls it with the key it
    resolved; a key replaced later stays hidden as well)."""
    global _known
    found = needles([*_known, *secrets])
    if found != list(_known):
        _known = tuple(found)


def forget_all() -> None:
    """Forget every remembered key (tests)."""
    global _known
    _known = ()


def known() -> tuple[str, ...]:
    return _known


def redact(text: str, secrets: Iterable[str] | None = None) -> str:
    """`text` with each secret (None: the ones remembered) replaced by MARK."""
    for needle in (_known if secrets is None else needles(secrets)):
        if needle in text:
            text = text.replace(needle, MARK)
    return text


def redact_bytes(data: bytes, secrets: Iterable[str] | None = None) -> bytes:
    """`data` with each secret (None: the ones remembered) replaced by MARK. The secrets
    and MARK hold no character JSON escapes, so a JSON line stays a JSON line."""
    for needle in (_known if secrets is None else needles(secrets)):
        raw = needle.encode("utf-8")
        if raw in data:
            data = data.replace(raw, MARK.encode())
    return data
