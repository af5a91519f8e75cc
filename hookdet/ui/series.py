"""A metric's curve in bounded memory, for ``hookdet ui``'s charts.

:class:`BoundedSeries` keeps a metric's points for a chart in at most ``2 * limit`` points
whatever the file's length, as the lowest and the highest point of each *bucket* of consecutive
reports (min/max down-sampling): at first a bucket is one report, and each time the series is
full, pairs of neighbouring buckets become one of twice the reports (again its lowest and
highest point), so a curve of 5,000 or 5,000,000 reports costs the same, still spans the whole
run, and keeps every spike and dip a chart should show (and the best value a table reads from
it). Each series counts its *epoch*: a client that holds points of an older epoch gets them all
again, otherwise only the new ones.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

#: Points a chart's series keeps at most (twice this, just before it thins).
SERIES_LIMIT = 1000

Point = Tuple[float, float]


def lowest_and_highest(points: List[Point]) -> Tuple[Point, Point]:
    """The point of ``points`` with the lowest y and the one with the highest (the first of equals)."""
    return min(points, key=lambda point: point[1]), max(points, key=lambda point: point[1])


def in_order(low: Point, high: Point) -> List[Point]:
    """A bucket's lowest and highest point in the order of x; one point when it is both."""
    return [low] if low is high else sorted([low, high])


class BoundedSeries:
    """``(x, y)`` points in order, down-sampled to stay within ``2 * limit`` (see the module)."""

    def __init__(self, limit: int = SERIES_LIMIT) -> None:
        self.limit = limit
        self.xs: List[float] = []
        self.ys: List[float] = []
        self.epoch = 0
        self._reports_a_bucket = 1
        self._points_a_bucket: List[int] = []  # how many of xs/ys each kept bucket holds (1 or 2)
        # the bucket being filled: its lowest and highest point so far, and how many reports it has
        self._low: Point = (0.0, 0.0)
        self._high: Point = (0.0, 0.0)
        self._filled = 0
        self._last: Optional[Point] = None

    def add(self, x: float, y: float) -> None:
        """Take the point: kept once its bucket is full if it is the bucket's lowest or highest,
        and remembered as the latest either way."""
        self._last = point = (x, y)
        if not self._filled:
            self._low = self._high = point
        elif y < self._low[1]:
            self._low = point
        elif y > self._high[1]:
            self._high = point
        self._filled += 1
        if self._filled < self._reports_a_bucket:
            return
        self._keep(in_order(self._low, self._high))
        self._filled = 0
        while len(self.xs) >= 2 * self.limit:  # twice, the first time: buckets of 2 reports keep both
            self._merge_neighbours()

    def _keep(self, points: List[Point]) -> None:
        self.xs += [x for x, _ in points]
        self.ys += [y for _, y in points]
        self._points_a_bucket.append(len(points))

    def _merge_neighbours(self) -> None:
        """Each pair of neighbouring buckets becomes one of twice the reports: a new epoch. An odd
        last bucket becomes the start of the bucket being filled."""
        points = list(zip(self.xs, self.ys))
        sizes, self.xs, self.ys, self._points_a_bucket = self._points_a_bucket, [], [], []
        start = 0
        for pair in range(0, len(sizes) - 1, 2):
            count = sizes[pair] + sizes[pair + 1]
            self._keep(in_order(*lowest_and_highest(points[start:start + count])))
            start += count
        if len(sizes) % 2:
            self._low, self._high = lowest_and_highest(points[start:])
            self._filled = self._reports_a_bucket
        self._reports_a_bucket *= 2
        self.epoch += 1

    @property
    def kept(self) -> int:
        """How many points are kept."""
        return len(self.xs)

    @property
    def tail(self) -> Optional[Point]:
        """The latest point when it is not (yet) kept (a chart shows it after the kept ones)."""
        if self._last is None or (self.xs and self.xs[-1] == self._last[0]):
            return None
        return self._last
