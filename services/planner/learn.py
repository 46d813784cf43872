"""Profiles that learn per placement: the epoch times the planner plans with. Pure.

A job's measured profile (epoch seconds per GPU count, and per spread over
machines where measured) is filled into a table over the cluster's GPUs
(`epoch_table`); every epoch an executor reports is folded into running
statistics per placement, (GPUs, nodes spanned) (`observe`); once a
placement's mean settled away from the time planned there (`settled`), the
job is planned with it, and its other times scaled by the observed/expected
ratio (`timing`).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Mapping, Sequence

from services.planner.core.model import epoch_table as filled_table

if TYPE_CHECKING:
    from services.planner.state import JobRecord

#: Observed epoch times change a plan (a replan, the profile planned with) only from this many epochs on,
#: and only when a t-test of their mean against the planned time rejects it at CONFIDENCE (`settled`).
MIN_EPOCHS_SEEN = 3
#: Two-sided; 3 standard errors of a normal. The planner tests every job after each of its epochs, so a
#: test that rejects more often than this restarts jobs for noise.
CONFIDENCE = 0.9973


def epoch_table(profile: Mapping[int, float], gpus: int, min_gpus: int = 1, max_gpus: int = 0) -> dict[int, float]:
    """Seconds per epoch for every count 1..gpus from a (possibly partial) measured profile.

    Gaps are filled by the planning core's rule (core/model.py `epoch_table`):
    unmeasured counts take the nearest measured count below (no speed-up is
    assumed that was not measured); counts below the smallest measured one
    scale it ideally. Counts above max_gpus cost slightly more than max_gpus
    and counts below min_gpus a hundredfold, so policies avoid them.
    """
    table = filled_table(profile, gpus)
    if max_gpus:
        for g in range(max_gpus + 1, gpus + 1):
            table[g] = table[max_gpus] * (1 + 0.01 * (g - max_gpus))
    for g in range(1, min(min_gpus, gpus + 1)):
        table[g] = table[g] * 100
    return table


def observe(observed: Mapping[int, Sequence[float]], gpus: int, seconds: float) -> dict[int, list[float]]:
    """`observed` with one more epoch of `seconds` on `gpus` GPUs folded into its running statistics
    [mean, epochs, sum of squared deviations] (Welford's update)."""
    mean, n, m2 = stats(observed.get(gpus))
    out = {k: list(v) for k, v in observed.items()}
    n += 1
    delta = seconds - mean
    mean += delta / n
    out[gpus] = [mean, n, m2 + delta * (seconds - mean)]
    return out


def stats(seen: Sequence[float] | None) -> tuple[float, int, float]:
    """(mean, epochs, sum of squared deviations) of an `observe` entry (records stored before the third
    field read as no spread)."""
    if not seen:
        return 0.0, 0, 0.0
    return float(seen[0]), int(seen[1]), float(seen[2]) if len(seen) > 2 else 0.0


def settled(seen: Sequence[float] | None, expected_s: float) -> float | None:
    """The observed mean epoch time when it really differs from `expected_s`: at least MIN_EPOCHS_SEEN
    epochs, off by more standard errors of their mean than Student's t with n - 1 degrees of freedom
    allows at CONFIDENCE (epoch times that vary as much as they differ say nothing yet; a spread
    estimated from a few epochs is itself uncertain, so a few need to be off by more); None otherwise."""
    mean, n, m2 = stats(seen)
    if n < MIN_EPOCHS_SEEN or mean <= 0:
        return None
    standard_error = math.sqrt(m2 / (n - 1) / n)
    return mean if abs(mean - expected_s) > t_quantile(n - 1) * standard_error else None


@functools.lru_cache(maxsize=None)
def t_quantile(dof: int) -> float:
    """The two-sided CONFIDENCE quantile of Student's t with `dof` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.5 + CONFIDENCE / 2, dof))


def timing(r: "JobRecord", cluster, learn: bool = True):
    """The job's epoch times as the cluster runs them, as a core Job (its `epoch_seconds(gpus, nodes)`):
    its profile as an `epoch_table` over the cluster's GPUs and its measured spreads; with `learn`, each
    placement (GPUs, nodes spanned) whose observed mean settled away from that time (`settled`) takes the
    mean there (at the tightest placement of its count, the profile's time too), and every other time is
    scaled by the mean ratio observed / expected over those (a job that runs slower side by side than
    it profiled alone is planned slower everywhere)."""
    from services.planner.core.model import Job

    gpus = cluster.gpus
    table = epoch_table(r.profile, gpus, r.spec.get("min_gpus", 1), r.max_gpus)
    base = Job(r.job_id, 1, table, placement={(g, k): t for g, k, t in r.placement if g <= gpus})
    seen = {key: m for key, v in (r.observed.items() if learn else ())
            if key[0] <= gpus and (m := settled(v, base.epoch_seconds(*key))) is not None}
    if not seen:
        return base
    scale = sum(m / base.epoch_seconds(*key) for key, m in seen.items()) / len(seen)
    profile = {g: t * scale for g, t in table.items()}
    profile.update({g: m for (g, k), m in seen.items() if k == tightest(cluster, g)})
    return Job(r.job_id, 1, profile, placement={**{key: t * scale for key, t in base.placement.items()}, **seen})


def tightest(cluster, gpus: int) -> int:
    """The fewest machines `gpus` GPUs of the cluster can lie on (the profile's placement)."""
    return cluster.fewest_hosts(-(-gpus // cluster.gpus_per_node))
