"""Workload builders from the shared public data (../shared/data, relative to the repo root).

- Pollux (`pollux/<app>/placements.csv`, `scalability.csv`; 4-GPU T4 nodes):
  epoch seconds on g GPUs over k nodes = (samples per epoch / (g x per-GPU
  batch)) x measured step time. Placements with the same (g, k) are
  averaged; a job's profile[g] is its packed placement (k = ceil(g / 4)),
  interpolated in g between measured counts; a spread placement that was not
  measured is the packed time times the median slow-down measured for that
  many nodes (a spread placement measured faster than the packed one
  counts as the packed time, so profile[g] is the best placement and
  LB_fluid a true bound). Beyond 64 GPUs nothing was measured, so more
  GPUs give no speed-up (the 64-GPU time). Samples per epoch are the
  applications' public training-set sizes (APPS below), the per-GPU batch
  the median batch measured on every placement.
- Gavel (`gavel/simulation_throughputs.json`, V100, alone): epoch seconds
  on g GPUs = STEPS_PER_EPOCH / throughput at the largest measured scale
  factor <= g that runs fastest (1, 2, 4, 8; the rest idle).
- Traces (`traces/philly.csv`, `traces/itp/cluster*.csv`): a seeded window
  of consecutive submissions gives each job its requested GPUs, its run time
  (clamped to 10 min .. 24 h) and, for online runs, its arrival. A job's
  epochs are set so its run time on its requested GPUs matches the trace.

Every builder is seeded and returns model.Job tuples; `missing()` says which
data files are absent so a bench can say so and stop.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import random
import statistics
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from services.planner.core.model import Job

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
GPUS_PER_NODE = 4
#: Pollux application -> training samples per epoch (public data-set sizes).
APPS = {
    "imagenet": 1_281_167,  # ResNet-50 on ImageNet-1k
    "cifar10": 50_000,  # ResNet-18 on CIFAR-10
    "bert": 88_641,  # BERT fine-tuning on SQuAD v1.1
    "deepspeech2": 28_539,  # DeepSpeech2 on LibriSpeech train-clean-100
    "yolov3": 16_551,  # YOLOv3 on PASCAL VOC 07+12
    "ncf": 994_169,  # NeuMF on MovieLens-1M
}
MEASURED_MAX_GPUS = 64
STEPS_PER_EPOCH = 2_000
MIN_RUN_S, MAX_RUN_S = 600.0, 86_400.0


def missing() -> list[str]:
    """Data files the builders need that are not there (relative to the repo root)."""
    need = [DATA / "pollux" / app / f for app in APPS for f in ("placements.csv", "scalability.csv")]
    need += [DATA / "gavel" / "simulation_throughputs.json", DATA / "traces" / "philly.csv"]
    need += [DATA / "traces" / "itp" / "cluster01.csv"]
    return [str(Path("..") / p.relative_to(ROOT.parent)) for p in need if not p.exists()]


# ---------------------------------------------------------------- Pollux


@dataclass(frozen=True)
class Scaling:
    """One application's epoch seconds: profile[g] (best placement) and spread[(g, k)]."""

    name: str
    profile: dict[int, float]
    spread: dict[tuple[int, int], float]

    def epoch_seconds(self, g: int) -> float:
        return self.profile[g]


def _packed(g: int) -> int:
    return -(-g // GPUS_PER_NODE)


@lru_cache(maxsize=None)
def pollux(app: str) -> Scaling:
    """Epoch seconds of a Pollux application by GPU count and nodes spanned (see module docstring)."""
    folder = DATA / "pollux" / app
    rows = []  # (g, k, local_bsz, step_time)
    with open(folder / "placements.csv") as f:
        for r in csv.DictReader(f):
            counts = [int(c) for c in r["placement"]]
            rows.append((sum(counts), len(counts), int(r["local_bsz"]), float(r["step_time"])))
    with open(folder / "scalability.csv") as f:
        for r in csv.DictReader(f):
            rows.append((int(r["num_replicas"]), int(r["num_nodes"]), int(r["local_bsz"]), float(r["step_time"])))
    placements = {(g, k) for g, k, _, _ in rows}
    common = set.intersection(*({b for g, k, b, _ in rows if (g, k) == p} for p in placements))
    bsz = sorted(common)[len(common) // 2]
    steps: dict[tuple[int, int], list[float]] = {}
    for g, k, b, t in rows:
        if b == bsz:
            steps.setdefault((g, k), []).append(t)
    samples = APPS[app]
    measured = {key: samples / (key[0] * bsz) * statistics.fmean(v) for key, v in steps.items()}
    packed = {g: t for (g, k), t in measured.items() if k == _packed(g)}
    gs = sorted(packed)
    profile: dict[int, float] = {}
    for g in range(1, MEASURED_MAX_GPUS + 1):
        if g in packed:
            profile[g] = packed[g]
        else:  # linear in g between the measured neighbours
            lo = max(x for x in gs if x < g)
            hi = min((x for x in gs if x > g), default=lo)
            w = 0 if hi == lo else (g - lo) / (hi - lo)
            profile[g] = packed[lo] + w * (packed[hi] - packed[lo])
    slow: dict[int, list[float]] = {}
    for (g, k), t in measured.items():
        if g in packed and k > _packed(g):
            slow.setdefault(k, []).append(t / packed[g])
    factor = {k: statistics.median(v) for k, v in slow.items()}
    spread: dict[tuple[int, int], float] = {}
    for g in range(2, MEASURED_MAX_GPUS + 1):
        for k in range(_packed(g) + 1, g + 1):
            if (g, k) in measured:  # never faster than packed: the profile is the best placement
                spread[(g, k)] = max(measured[(g, k)], profile[g])
            else:
                near = min(factor, key=lambda m: (abs(m - k), -m))
                spread[(g, k)] = profile[g] * max(1.0, factor[near])
    return Scaling(app, profile, spread)


# ---------------------------------------------------------------- Gavel


@lru_cache(maxsize=None)
def gavel_types() -> dict[str, dict[int, float]]:
    """Gavel job type -> {scale factor: epoch seconds} on V100, alone."""
    with open(DATA / "gavel" / "simulation_throughputs.json") as f:
        v100 = json.load(f)["v100"]
    out: dict[str, dict[int, float]] = {}
    for key, entry in v100.items():
        name, scale = ast.literal_eval(key)
        thr = entry.get("null")
        if isinstance(thr, (int, float)) and thr > 0:
            out.setdefault(name, {})[int(scale)] = STEPS_PER_EPOCH / thr
    return {k: v for k, v in sorted(out.items()) if 1 in v}


def gavel(name: str, G: int) -> Scaling:
    measured = gavel_types()[name]
    profile, best = {}, math.inf
    for g in range(1, G + 1):
        best = min(best, measured.get(g, math.inf))
        profile[g] = best
    return Scaling(name, profile, {})


# ---------------------------------------------------------------- traces


@dataclass(frozen=True)
class TraceJob:
    arrival_s: float
    run_s: float
    gpus: int


@lru_cache(maxsize=None)
def trace(kind: str) -> tuple[TraceJob, ...]:
    """All jobs of a trace ("philly" or "itp"), by submission time."""
    out = []
    if kind == "philly":
        with open(DATA / "traces" / "philly.csv") as f:
            for r in csv.DictReader(f):
                t = datetime.strptime(r["timestamp"], "%Y-%m-%d %H:%M:%S").timestamp()
                out.append(TraceJob(t, float(r["duration"]), int(float(r["num_gpus"]))))
    elif kind == "itp":
        for path in sorted((DATA / "traces" / "itp").glob("cluster*.csv")):
            with open(path) as f:
                for r in csv.DictReader(f):
                    out.append(TraceJob(float(r["submission_time"]), float(r["duration"]), int(float(r["num_gpu"]))))
    else:
        raise ValueError(f"unknown trace {kind!r} (philly, itp)")
    return tuple(sorted((j for j in out if j.run_s > 0 and j.gpus > 0), key=lambda j: j.arrival_s))


def window(kind: str, n: int, seed: int, max_gpus: int) -> list[TraceJob]:
    """n consecutive submissions from a seeded start, arrivals from 0, GPUs capped at max_gpus."""
    jobs = [j for j in trace(kind) if j.gpus <= max_gpus]
    start = random.Random(seed).randrange(0, len(jobs) - n)
    w = jobs[start:start + n]
    t0 = w[0].arrival_s
    return [TraceJob(j.arrival_s - t0, min(max(j.run_s, MIN_RUN_S), MAX_RUN_S), j.gpus) for j in w]


# ---------------------------------------------------------------- batches


def _job(name: str, scaling: Scaling, t: TraceJob, G: int, arrivals: bool) -> Job:
    req = min(t.gpus, G, MEASURED_MAX_GPUS)
    epochs = max(1, round(t.run_s / scaling.profile[req]))
    last = scaling.profile[max(g for g in scaling.profile if g <= G)]
    profile = {g: scaling.profile.get(g, last) for g in range(1, G + 1)}
    spread = {key: v for key, v in scaling.spread.items() if key[0] <= G and key[1] <= G // GPUS_PER_NODE}
    return Job(name, epochs, profile, arrival_s=t.arrival_s if arrivals else 0.0, requested_gpus=req,
               placement=spread)


def pollux_batch(n: int, nodes: int, seed: int, kind: str = "philly", arrivals: bool = False) -> tuple[Job, ...]:
    """n Pollux jobs (seeded application mix) with sizes/run times (and arrivals) from a trace window."""
    rng = random.Random(seed)
    G = nodes * GPUS_PER_NODE
    apps = sorted(APPS)
    return tuple(_job(f"{app}-{i}", pollux(app), t, G, arrivals)
                 for i, t in enumerate(window(kind, n, seed, G))
                 for app in [rng.choice(apps)])


def gavel_batch(n: int, nodes: int, seed: int, kind: str = "philly") -> tuple[Job, ...]:
    """n Gavel job types (seeded) with sizes and run times from a trace window (no placement data)."""
    rng = random.Random(seed)
    G = nodes * GPUS_PER_NODE
    types = list(gavel_types())
    out = []
    for i, t in enumerate(window(kind, n, seed, G)):
        name = rng.choice(types)
        out.append(_job(f"g{i}-{name.split(' ')[0]}", gavel(name, G), TraceJob(0.0, t.run_s, min(t.gpus, 8)), G, False))
    return tuple(out)
