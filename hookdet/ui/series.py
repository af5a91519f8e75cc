"""A metric's curve in bounded memory, for ``hookdet ui``'s charts.

:class:`BoundedSeries` keeps a metric's points for a chart in at most ``2 * limit`` points
whatever the file's length: when full, it keeps every other point and from then on takes one
point in two (and so on), so a curve of 5,000 or 5,000,000 reports costs the same and still
spans the whole run. Each series counts its *epoch*: a client that holds points of an older
epoch gets them all again, otherwise only the new ones.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

#: Points a chart's series keeps at most (twice this, just before it thins).
SERIES_LIMIT = 1000


class BoundedSeries:
    """``(x, y)`` points in order, thinned to stay within ``2 * limit`` (see the module)."""

    def __init__(self, limit: int = SERIES_LIMIT) -> None:
        self.limit = limit
        self.xs: List[float] = []
        self.ys: List[float] = []
        self.epoch = 0
        self._stride = 1
        self._seen = 0
        self._last: Optional[Tuple[float, float]] = None

    def add(self, x: float, y: float) -> None:
        """Keep the point, or (thinned) only remember it as the latest."""
        self._seen += 1
        self._last = (x, y)
        if (self._seen - 1) % self._stride:
            return
        self.xs.append(x)
        self.ys.append(y)
        if len(self.xs) >= 2 * self.limit:
            self.xs, self.ys = self.xs[::2], self.ys[::2]
            self._stride *= 2
            self.epoch += 1

    @property
    def kept(self) -> int:
        """How many points are kept."""
        return len(self.xs)

    @property
    def tail(self) -> Optional[Tuple[float, float]]:
        """The latest point when thinning did not keep it (a chart shows it after the kept ones)."""
        if self._last is None or (self.xs and self.xs[-1] == self._last[0]):
            return None
        return self._last
