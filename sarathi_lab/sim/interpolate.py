"""Piecewise-linear interpolation on measured grids, monotone and honest about extrapolation:
measured times are made non-decreasing first by isotonic regression (a measured dip is noise, which
a running maximum would bias upwards), pooled by the median (a slow outlier, a stall or a device's
launch jitter, would lift every later point of a least-squares fit); outside the grid the end
segment's slope carries on, and the caller is told.
"""
from __future__ import annotations

import bisect
import statistics


def isotonic(ys: list[float], centre=statistics.fmean) -> list[float]:
    """The non-decreasing sequence closest to ``ys`` (pool adjacent violators): in least squares with
    the mean as ``centre``; in absolute error with statistics.median, each pooled block at its median,
    so that one outlier moves a block by a rank, not by its size."""
    blocks: list[tuple[float, list[float]]] = []  # (centre, members)
    for y in ys:
        blocks.append((y, [y]))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (_, a), (_, b) = blocks.pop(-2), blocks.pop()
            blocks.append((centre(a + b), a + b))
    return [c for c, members in blocks for _ in members]


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
        self.ys = isotonic([points[x] for x in self.xs], statistics.median)

    def __call__(self, x: float) -> tuple[float, bool]:
        return _lerp(self.xs, self.ys, x)


class Surface:
    """z(x, y) through measured rows: each x measured along y at its own points (each chunk after the
    prefixes that fit beside it), or every x at the same ones (a rectangular grid). On a measured row,
    the Curve through its points; between two rows, linear in x. ``(value, extrapolated)``:
    extrapolated where x lies beyond the first or last row, or y beyond a row read from (where the
    row's end slope carries on). Monotone along y in every row and, on a rectangular grid, along x in
    every column too."""

    def __init__(self, points: dict[tuple[float, float], float]):
        if not points:
            raise ValueError("a surface needs at least one measured point")
        by_x: dict[float, dict[float, float]] = {}
        for (x, y), z in points.items():
            by_x.setdefault(x, {})[y] = z
        self.xs = sorted(by_x)
        ys = [sorted(by_x[x]) for x in self.xs]
        rows = [isotonic([by_x[x][y] for y in row_ys], statistics.median) for x, row_ys in zip(self.xs, ys)]
        if all(row_ys == ys[0] for row_ys in ys):
            # Each pass keeps the other's order: pooling columns that are element-wise non-decreasing
            # from one to the next keeps them so, hence the rows non-decreasing.
            columns = [isotonic([row[j] for row in rows], statistics.median) for j in range(len(ys[0]))]
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
