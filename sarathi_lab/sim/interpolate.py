"""Piecewise-linear interpolation on measured grids, monotone and honest about extrapolation:
measured times are made non-decreasing first by isotonic regression (a measured dip is noise, which
a running maximum would bias upwards); outside the grid the end segment's slope carries on, and
the caller is told.
"""
from __future__ import annotations

import bisect


def isotonic(ys: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``ys`` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for y in ys:
        blocks.append([y, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(n)]


def _segment(xs: list[float], x: float) -> tuple[int, bool]:
    """Index i of the segment [xs[i], xs[i+1]] to use for x, and whether x lies outside xs."""
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
    """``x`` moved up to the next point of ``xs`` where points lie at most ``within`` apart, else
    ``x``: on a fine grid of token counts a batch costs as the next count measured, because a
    GEMM's tile step sits just past a multiple of the tile (one token past 256 costs as 264, not
    1/8 of the way from 256's time to 264's); on a coarse grid, where the steps are small next to
    the batch, linear interpolation stays closer."""
    j = bisect.bisect_left(xs, x)
    if 0 < j < len(xs) and xs[j] != x and xs[j] - xs[j - 1] <= within:
        return xs[j]
    return x


class Curve:
    """y(x) through measured points; ``(value, extrapolated) = curve(x)``."""

    def __init__(self, points: dict[float, float]):
        if not points:
            raise ValueError("a curve needs at least one measured point")
        self.xs = sorted(points)
        self.ys = isotonic([points[x] for x in self.xs])

    def __call__(self, x: float) -> tuple[float, bool]:
        return _lerp(self.xs, self.ys, x)


class Surface:
    """z(x, y) on a rectangular grid of measured points (every x with every y)."""

    def __init__(self, points: dict[tuple[float, float], float]):
        self.xs = sorted({x for x, _ in points})
        self.ys = sorted({y for _, y in points})
        missing = [(x, y) for x in self.xs for y in self.ys if (x, y) not in points]
        if missing:
            raise ValueError(f"the grid is not rectangular: no point at {missing[0]}")
        # Monotone along y in every row, then along x in every column (each pass keeps the other's
        # order: averaging non-decreasing columns element-wise keeps the rows non-decreasing).
        rows = [isotonic([points[x, y] for y in self.ys]) for x in self.xs]
        columns = [isotonic([row[j] for row in rows]) for j in range(len(self.ys))]
        self.rows = [[columns[j][i] for j in range(len(self.ys))] for i in range(len(self.xs))]

    def __call__(self, x: float, y: float) -> tuple[float, bool]:
        if len(self.xs) == 1:
            return _lerp(self.ys, self.rows[0], y)[0], x != self.xs[0] or not self.ys[0] <= y <= self.ys[-1]
        i, x_out = _segment(self.xs, x)
        z0, y_out = _lerp(self.ys, self.rows[i], y)
        z1, _ = _lerp(self.ys, self.rows[i + 1], y)
        return _lerp([self.xs[i], self.xs[i + 1]], [z0, z1], x)[0], x_out or y_out


class RaggedSurface:
    """z(x, y) measured along y at a few x, each x at its own y points (a measured grid with holes):
    within a row, the Curve through its points; between rows, linear in x. ``None`` where (x, y)
    lies outside the measured rows (x beyond the first or last row, or y beyond the range of
    either row it lies between), so that the caller models it rather than extrapolating."""

    def __init__(self, points: dict[tuple[float, float], float]):
        if not points:
            raise ValueError("a surface needs at least one measured point")
        by_x: dict[float, dict[float, float]] = {}
        for (x, y), z in points.items():
            by_x.setdefault(x, {})[y] = z
        self.xs = sorted(by_x)
        self.rows = [Curve(by_x[x]) for x in self.xs]

    def __call__(self, x: float, y: float) -> float | None:
        if not self.xs[0] <= x <= self.xs[-1]:
            return None
        i = bisect.bisect_left(self.xs, x)
        rows = [self.rows[i]] if self.xs[i] == x else [self.rows[i - 1], self.rows[i]]
        if not all(row.xs[0] <= y <= row.xs[-1] for row in rows):
            return None
        if len(rows) == 1:
            return rows[0](y)[0]
        (z0, _), (z1, _) = rows[0](y), rows[1](y)
        return _lerp([self.xs[i - 1], self.xs[i]], [z0, z1], x)[0]
