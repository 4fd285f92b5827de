"""The tree-cost curve: what one verification pass of ``T`` tokens costs a model on a device.

The engine measures the target's forward time for a few input sizes at load time (`COST_SIZES`: T = 1,
2, 3, 4, 6, 8, ... 64 tokens) and builds a `CostModel`. A pass over more tokens never really costs less,
so the measured seconds are first made non-decreasing by isotonic regression (pooling adjacent
violators: a noisy spike is averaged with its neighbours instead of reading as a wall; on a GPU, where a
pass of 64 tokens costs about what one token does, timing noise is as large as the trend). ``c(T)`` then
interpolates the fitted points linearly, is clamped below the first point and extrapolated with the last
segment's slope beyond the last one.

**Flat curves** (`CostModel.flat_extent`). Where the whole curve stays within its own measurement noise
of a one-token pass (twice the largest gap between a measured point and the fit, at least
`FLAT_TOLERANCE` of ``c(1)``), a bigger tree costs nothing measurable: the drafter then grows the tree
to the cap, and the cap follows the device: the largest size still flat, up to twice the largest
measured size (the fit's last slope is not trusted further).

**Measuring it steadily** (`steady_curve`). On a shared CPU a burst of load during the passes of one
size makes that size look dear and the whole curve steep, so the budget keeps trees small for the
whole life of the process. So the curve is measured in several quick sweeps over all sizes (each
sweep one pass per size, back to back) and each size keeps its fastest pass: load only ever adds
time, and a burst rarely covers every sweep of a size.

**Replaying a curve** (`load_curve`): a curve measured on one device (e.g. the ``cost_curve_ms`` a
benchmark run records in ``results.json``) drives the budget on another, so that a GPU's regime can be
reproduced and tested on a CPU (``python -m recap.bench --cost-curve FILE``).

The budget rule that reads the curve is the drafter's: `recap.drafters.recap.budget`.

Example (cost 1 s up to 8 tokens, then 1 s more per 8 tokens)::

    model = CostModel([(1, 1.0), (8, 1.0), (16, 2.0)])
    model.cost(4)                                   # 1.0
    model.cost(12)                                  # 1.5
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: Smallest relative rise of ``c(T)`` over ``c(1)`` that still counts as flat (timer resolution).
FLAT_TOLERANCE = 0.05
#: Largest tree a flat curve lets the budget grow to (also `recap.runtime.parse_budget`'s limit).
MAX_TREE = 256

#: Tree sizes (input tokens per pass) at which the curve is measured. Dense where CPUs step: one
#: token runs matrix-vector products, two or more run matrix-matrix ones, and on a CPU a 2-token pass
#: can cost what a 4-token pass does (SmolLM2-135M: 38 ms at T = 1, 60 at T = 2, 57 at T = 4), which
#: a line from T = 1 to T = 4 would price at 45.
COST_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


class CostModel:
    """Piecewise-linear ``c(T)``: seconds of one target forward over ``T`` input tokens."""

    def __init__(self, points: Iterable[tuple[int, float]]) -> None:
        pairs = sorted((int(t), float(s)) for t, s in points)
        if not pairs:
            raise ValueError("CostModel needs at least one measured (tokens, seconds) point")
        sizes = [t for t, _ in pairs]
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"CostModel points must have distinct token counts, got {sizes}")
        if any(t < 1 for t in sizes) or any(not (s > 0 and np.isfinite(s)) for _, s in pairs):
            raise ValueError(f"CostModel points need tokens >= 1 and finite seconds > 0, got {pairs}")
        self.points: tuple[tuple[int, float], ...] = tuple(pairs)  # as measured
        self._sizes = np.array(sizes, dtype=np.float64)
        self._seconds = isotonic([s for _, s in pairs])
        if len(pairs) >= 2:
            slope = (self._seconds[-1] - self._seconds[-2]) / (self._sizes[-1] - self._sizes[-2])
            self._tail_slope = max(float(slope), 0.0)
        else:
            self._tail_slope = 0.0

    @property
    def fitted(self) -> tuple[tuple[int, float], ...]:
        """The points ``c(T)`` interpolates: the measured ones made non-decreasing."""
        return tuple((int(t), float(s)) for t, s in zip(self._sizes, self._seconds, strict=True))

    def cost(self, tokens: float) -> float:
        """Interpolated seconds for a forward over ``tokens`` input tokens."""
        return float(self.costs(np.array([tokens], dtype=np.float64))[0])

    def costs(self, tokens: np.ndarray) -> np.ndarray:
        """`cost` of every entry of ``tokens`` (any shape)."""
        tokens = np.asarray(tokens, dtype=np.float64)
        inside = np.interp(tokens, self._sizes, self._seconds)
        beyond = self._seconds[-1] + self._tail_slope * (tokens - self._sizes[-1])
        return np.where(tokens > self._sizes[-1], beyond, inside)

    @property
    def noise(self) -> float:
        """The largest gap between a measured point and the fit, in seconds (0 for a monotone curve)."""
        measured = np.array([s for _, s in self.points])
        return float(np.abs(measured - self._seconds).max())

    def flat_extent(self, limit: int = MAX_TREE) -> int:
        """The largest tree size ``T <= limit`` (and at most twice the largest measured size) whose pass
        costs no more than a one-token pass plus the curve's noise (``2 * noise``, at least
        `FLAT_TOLERANCE` of it); 0 when even a 2-token pass is measurably dearer.

        Example: the embedded model's curve on an H200, ``[(1, 3.151e-3), (4, 3.537e-3), (8, 2.904e-3),
        (16, 3.46e-3), (32, 3.486e-3), (64, 3.516e-3)]``, is flat to 128 (its points scatter by 0.32 ms,
        the whole rise is 0.37 ms); on a 2-core CPU the same model's curve rises 22% by T = 4: 0.
        """
        base = self.cost(1)
        allowed = base + max(2 * self.noise, FLAT_TOLERANCE * base)
        sizes = np.arange(2, min(limit, 2 * int(self._sizes[-1])) + 1)
        flat = self.costs(sizes) <= allowed
        return int(sizes[flat].max()) if flat.all() else int(sizes[: np.argmin(flat)].max(initial=0))

    def to_ms(self) -> dict[str, list[list[float]]]:
        """The measured and fitted points in milliseconds (what a benchmark records)."""

        def as_ms(points: Iterable[tuple[int, float]]) -> list[list[float]]:
            return [[t, round(s * 1e3, 3)] for t, s in points]

        return {"measured": as_ms(self.points), "fitted": as_ms(self.fitted)}

    def __repr__(self) -> str:
        return f"CostModel({list(self.points)!r})"


def steady_curve(sweeps: Sequence[Sequence[tuple[int, float]]]) -> CostModel:
    """A `CostModel` from several measured sweeps of ``(tokens, seconds)`` points: each size's fastest
    pass over all sweeps (load only adds time). Every sweep must measure the same sizes.

    Example: ``steady_curve([[(1, 1.0), (8, 9.0)], [(1, 3.0), (8, 1.5)]]).points == ((1, 1.0), (8, 1.5))``.
    """
    if not sweeps:
        raise ValueError("steady_curve needs at least one sweep")
    sizes = [t for t, _ in sweeps[0]]
    if any([t for t, _ in sweep] != sizes for sweep in sweeps):
        raise ValueError("every sweep must measure the same sizes in the same order")
    return CostModel((t, min(sweep[i][1] for sweep in sweeps)) for i, t in enumerate(sizes))


def isotonic(values: Sequence[float]) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count] of pooled runs
    for value in values:
        blocks.append([float(value), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
    return np.concatenate([np.full(int(n), m) for m, n in blocks]) if blocks else np.zeros(0)


def load_curve(path: str | Path) -> CostModel:
    """A recorded tree-cost curve: a JSON list of ``[tokens, milliseconds]`` pairs, or a benchmark's
    ``results.json`` (its ``settings.cost_curve_ms.measured``).

    Raises ValueError, naming the file, when it is missing, not JSON, or holds no usable curve.
    """
    path = Path(path)
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"cost curve file not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cost curve file {path} is not readable JSON ({error})") from None
    if isinstance(data, dict):
        data = (data.get("settings") or {}).get("cost_curve_ms", data.get("cost_curve_ms"))
        if isinstance(data, dict):
            data = data.get("measured")
    hint = "expected a list of [tokens, milliseconds] pairs or a results.json that recorded cost_curve_ms"
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: no cost curve found ({hint})")
    points = []
    for entry in data:
        if not (
            isinstance(entry, list | tuple)
            and len(entry) == 2
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in entry)
        ):
            raise ValueError(f"{path}: bad cost curve point {entry!r} ({hint})")
        points.append((int(entry[0]), float(entry[1]) / 1e3))
    return CostModel(points)


def projected_seconds(
    curve: CostModel, nodes_per_pass: Sequence[int], drafting_ms: Sequence[float] = (), pending: int = 1
) -> float:
    """What a run's decoding passes would take on the device ``curve`` was recorded on: every pass
    priced at ``c(nodes + pending)`` (the tree plus the pending token), plus the drafting time measured
    here (``drafting_ms``: draft + update per pass, which runs on the host's CPU there too). The
    prefill is left out (the curve does not cover prompt-sized passes).

    Example: a flat curve of 3 ms, three passes of 0, 8 and 80 nodes, 0.5 ms drafting each ->
    ``3 * 0.003 + 3 * 0.0005 = 0.0105`` s.
    """
    nodes = np.asarray(nodes_per_pass, dtype=np.float64) + pending
    return float(curve.costs(nodes).sum()) + sum(drafting_ms) / 1000.0
