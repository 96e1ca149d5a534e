"""Piecewise-linear interpolation on measured grids, monotone (isotonic, pooled by the median: a dip
is noise, and a stall would lift every later point of a least-squares fit); past the grid the end
segment's slope carries on, and the caller is told."""
from __future__ import annotations

import bisect
import statistics


def isotonic(ys: list[float], centre=statistics.fmean) -> list[float]:
    """Pool adjacent violators; a median ``centre`` moves a block by an outlier's rank, not size."""
    blocks: list[tuple[float, list[float]]] = []
    for y in ys:
        blocks.append((y, [y]))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (_, a), (_, b) = blocks.pop(-2), blocks.pop()
            blocks.append((centre(a + b), a + b))
    return [c for c, members in blocks for _ in members]


def _segment(xs: list[float], x: float) -> tuple[int, bool]:
    outside = x < xs[0] or x > xs[-1]
    i = bisect.bisect_right(xs, x) - 1
    return min(max(i, 0), len(xs) - 2), outside


def _lerp(xs: list[float], ys: list[float], x: float) -> tuple[float, bool]:
    if len(xs) == 1:
        return ys[0], x != xs[0]
    i, outside = _segment(xs, x)
    x0, x1 = xs[i], xs[i + 1]
    value = ys[i] + (ys[i + 1] - ys[i]) * (x - x0) / (x1 - x0)
    return max(value, 0.0), outside


def up_to_point(xs: list[float], x: float, within: float) -> float:
    """On a fine grid a batch costs as the next count (tile steps sit just past multiples)."""
    j = bisect.bisect_left(xs, x)
    if 0 < j < len(xs) and xs[j] != x and xs[j] - xs[j - 1] <= within:
        return xs[j]
    return x


class Curve:
    """``(value, extrapolated) = curve(x)``."""

    def __init__(self, points: dict[float, float]):
        if not points:
            raise ValueError("a curve needs at least one measured point")
        self.xs = sorted(points)
        self.ys = isotonic([points[x] for x in self.xs], statistics.median)

    def __call__(self, x: float) -> tuple[float, bool]:
        return _lerp(self.xs, self.ys, x)


class Surface:
    """z(x, y) through measured rows; linear in x, monotone along y (and x on a grid)."""

    def __init__(self, points: dict[tuple[float, float], float]):
        if not points:
            raise ValueError("a surface needs at least one measured point")
        by_x: dict[float, dict[float, float]] = {}
        for (x, y), z in points.items():
            by_x.setdefault(x, {})[y] = z
        self.xs = sorted(by_x)
        ys = [sorted(by_x[x]) for x in self.xs]
        rows = [isotonic([by_x[x][y] for y in row_ys], statistics.median)
                for x, row_ys in zip(self.xs, ys)]
        if all(row_ys == ys[0] for row_ys in ys):
            # Pooling columns that are element-wise non-decreasing keeps the rows non-decreasing.
            columns = [isotonic([row[j] for row in rows], statistics.median)
                       for j in range(len(ys[0]))]
            rows = [[column[i] for column in columns] for i in range(len(self.xs))]
        self.rows = [Curve(dict(zip(row_ys, row))) for row_ys, row in zip(ys, rows)]

    def __call__(self, x: float, y: float) -> tuple[float, bool]:
        i = bisect.bisect_left(self.xs, x)
        if i < len(self.xs) and self.xs[i] == x:
            return self.rows[i](y)
        if len(self.xs) == 1:
            return self.rows[0](y)[0], True
        i, x_out = _segment(self.xs, x)
        (z0, out0), (z1, out1) = self.rows[i](y), self.rows[i + 1](y)
        return _lerp([self.xs[i], self.xs[i + 1]], [z0, z1], x)[0], x_out or out0 or out1
