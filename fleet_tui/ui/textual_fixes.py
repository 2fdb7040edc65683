"""What the pinned Textual (8.2.8) gets wrong that the panel cannot avoid from outside,
mended where it goes wrong, once, when the panel is imported. Each mend keeps what Textual
draws exactly as it was (the snapshots hold it); each says why, and goes when Textual
mends it.

- ``Strip.divide``: a strip divided at its own end (one region across the whole line, as
  every line of a screen that no other widget overlaps) answers ``[self]`` and caches that
  answer in the strip itself: a reference cycle, so the strip is never freed by its count
  but only by the cyclic collector. The compositor divides every line of every full frame
  that way: opening and closing the help left ~30 such strips a frame (each with its seven
  caches: ~25 objects), which reached the oldest generation and made its collections walk
  and free 5,000 to 12,000 objects, 18 to 28 ms with the event loop stopped, every few key
  presses (its slow tail, in a browser). The answer is returned as before, uncached: it
  costs nothing to make again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from textual.strip import Strip

_divide = Strip.divide


def _divide_without_cycle(self: Strip, cuts: Iterable[int]) -> Sequence[Strip]:
    cell_length = self.cell_length
    cuts = [cut for cut in cuts if cut <= cell_length]
    if cuts == [cell_length]:
        return [self]  # uncached: the cache would hold the strip itself
    return _divide(self, cuts)


def apply() -> None:
    """Mend what is listed above (idempotent)."""
    if Strip.divide is not _divide_without_cycle:
        Strip.divide = _divide_without_cycle  # type: ignore[method-assign]
