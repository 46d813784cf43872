"""Pure scaling-curve fit of epoch times: t(g) = a + b / g + c * (g - 1).

`a` is the part that does not shrink with more GPUs (per-epoch overhead),
`b / g` the work that data parallelism divides, `c * (g - 1)` the cost that
grows with the ring (all-reduce hops). Coefficients are fitted by
non-negative least squares on the relative error of the measured points (so
the curve never predicts negative times); one point gives perfect scaling
t1 / g, two points get the non-negative curve closest to both (which may be
a + c(g - 1) when the second GPU made the epoch slower).

`complete` returns one point per GPU count 1..max_gpus: measured counts keep
their measurement, the others are fitted; `fit_error` is the largest relative
gap between the curve and the measured points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class ScalingFit:
    """t(g) = a + b / g + c * (g - 1)."""

    a: float
    b: float
    c: float

    def __call__(self, gpus: int) -> float:
        return self.a + self.b / gpus + self.c * (gpus - 1)


@dataclass(frozen=True)
class Point:
    """Epoch seconds on one GPU count; measured or fitted."""

    gpus: int
    epoch_seconds: float
    measured: bool


def _basis(g: int, terms: int) -> list[float]:
    return [1.0 / g, 1.0, float(g - 1)][:terms]


def fit(measured: Mapping[int, float]) -> ScalingFit:
    """The least-squares curve through the measured {gpus: epoch seconds} (at least one point)."""
    if not measured:
        raise ValueError("fit needs at least one measured point")
    for g, t in measured.items():
        if g < 1 or not (t > 0 and math.isfinite(t)):
            raise ValueError(f"measured point {g} GPUs -> {t!r} s is not a positive time on >= 1 GPU")
    import numpy as np
    from scipy.optimize import nnls

    counts = sorted(measured)
    terms = 1 if len(counts) == 1 else 3
    matrix = np.array([_basis(g, terms) for g in counts])
    times = np.array([measured[g] for g in counts])
    # relative least squares: each point weighs by 1 / t, so small times count as much as large ones
    coef, _ = nnls(matrix / times[:, None], np.ones(len(counts)))
    coef = list(coef) + [0.0] * (3 - terms)
    b, a, c = (float(x) for x in coef)
    if b == 0.0 and a == 0.0:  # degenerate (all weight on c): fall back to the 1-GPU time, perfect scaling
        return ScalingFit(0.0, measured[counts[0]] * counts[0], 0.0)
    return ScalingFit(a, b, c)


def fit_error(curve: ScalingFit, measured: Mapping[int, float]) -> float:
    """Largest |curve(g) - t(g)| / t(g) over the measured points."""
    return max((abs(curve(g) - t) / t for g, t in measured.items()), default=0.0)


def complete(measured: Mapping[int, float], max_gpus: int) -> tuple[list[Point], ScalingFit, float]:
    """Points for 1..max(max_gpus, measured counts): measured where measured, else fitted;
    with the curve and its error on the measured points."""
    curve = fit(measured)
    top = max(max_gpus, *measured)
    points = [Point(g, float(measured[g]), True) if g in measured else Point(g, curve(g), False) for g in range(1, top + 1)]
    return points, curve, fit_error(curve, measured)


def trial_counts(max_gpus: int, explicit: Sequence[int] = ()) -> list[int]:
    """GPU counts to measure: 1, 2, 4, ... up to max_gpus, and every explicit count."""
    counts = set(explicit)
    g = 1
    while g <= max_gpus:
        counts.add(g)
        g *= 2
    return sorted(counts)


def epoch_seconds(iter_seconds: float, steps: int) -> float:
    """Seconds per epoch from the steady-state iteration time and the iterations per epoch."""
    return iter_seconds * steps

