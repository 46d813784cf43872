"""The profiler's Prometheus metrics (served by services/common/metrics.py): the trials it ran and
the profiles it served, counted and timed as they happen."""

from __future__ import annotations

from typing import Iterable

from prometheus_client import Counter, Histogram

SECONDS_BUCKETS = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class ProfilerMeter:
    """Counters and histograms of the profiler (a collector)."""

    def __init__(self) -> None:
        self.trials = Counter("omru_profiler_trials", "Profiling trials run, by outcome (measured, failed)",
                              ["outcome"], registry=None)
        self.trial_seconds = Histogram("omru_profiler_trial_seconds",
                                       "Seconds of a profiling trial, waiting for GPUs included",
                                       buckets=SECONDS_BUCKETS, registry=None)
        self.profiles = Counter("omru_profiler_profiles",
                                "Profile requests answered, by outcome (cached: from the store; measured; failed)",
                                ["outcome"], registry=None)
        self.profile_seconds = Histogram("omru_profiler_profile_seconds",
                                         "Seconds to measure a profile (its trials, one after another)",
                                         buckets=SECONDS_BUCKETS, registry=None)

    def _all(self):
        return (self.trials, self.trial_seconds, self.profiles, self.profile_seconds)

    def describe(self) -> Iterable:
        for metric in self._all():
            yield from metric.describe()

    def collect(self) -> Iterable:
        for metric in self._all():
            yield from metric.collect()
