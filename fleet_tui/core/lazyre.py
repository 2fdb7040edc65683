"""A regular expression compiled at its first use.

A table of a provider's refusals, or of the lines of a crash, is dozens of patterns that a
process reads only when a run ends badly; compiled at import they were ~5 % of the start of
every command (131 patterns, ~9 ms). `Lazy` holds the pattern and compiles it, once, when
it is first searched; afterwards it costs one attribute look-up more than the pattern.
"""

from __future__ import annotations

import re
from collections.abc import Iterator


class Lazy:
    """`re.compile(pattern, flags)`, done at the first call of a method."""

    __slots__ = ("_compiled", "flags", "pattern")

    def __init__(self, pattern: str, flags: int | re.RegexFlag = 0) -> None:
        self.pattern = pattern
        self.flags = flags
        self._compiled: re.Pattern[str] | None = None

    @property
    def compiled(self) -> re.Pattern[str]:
        if self._compiled is None:
            self._compiled = re.compile(self.pattern, self.flags)
        return self._compiled

    def search(self, text: str) -> re.Match[str] | None:
        return self.compiled.search(text)

    def match(self, text: str) -> re.Match[str] | None:
        return self.compiled.match(text)

    def fullmatch(self, text: str) -> re.Match[str] | None:
        return self.compiled.fullmatch(text)

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        return self.compiled.finditer(text)

    def sub(self, repl: str, text: str, count: int = 0) -> str:
        return self.compiled.sub(repl, text, count)

    def __repr__(self) -> str:
        return f"Lazy({self.pattern!r}, {self.flags!r})"
