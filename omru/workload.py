"""Workload files: a batch of training jobs in YAML, loaded and validated.

Format::

    # optional: planning policy by name ("" or absent = the planner's default)
    policy: omru
    # optional: values every job gets unless it sets its own
    defaults:
      dataset: digits
      batch_size: 32
      base_lr: 0.05
      warmup_epochs: 1
    jobs:
      - id: mlp-a              # unique, [A-Za-z0-9._-], at most 128 characters
        model: mlp             # a model of the executor's zoo
        dataset: digits        # digits | synthetic | imagefolder:<dir> | clips:<dir>
        epochs: 6              # epochs to train (>= 1)
        batch_size: 32         # per GPU (per rank)
        base_lr: 0.05          # learning rate at base_batch samples per step
        base_batch: 32         # global batch base_lr is tuned for (default: batch_size)
        min_gpus: 1            # optional, fewest GPUs (default 1)
        max_gpus: 2            # optional, most GPUs (default: any number)
        # optional: measured seconds per epoch by GPU count; the planner uses
        # these instead of asking the profiler (numbers you measured yourself,
        # for instance with `omru train --json`)
        profile: {1: 9.5, 2: 5.4}
      - id: my-script          # a script job: your own training code instead of model/dataset
        command: [python, train.py, --data, /shared/data/x]   # "python" = the executor's interpreter
        workdir: /shared/code  # optional: absolute folder every node sees (default: the executor's)
        env: {SEED: "1"}       # optional: extra environment variables
        epochs: 4              # (and batch_size, base_lr, base_batch, min_gpus, max_gpus, profile)

A script job takes no zoo field from ``defaults`` (model, dataset,
num_classes, image_size, frames, train_samples); see the README, "Your own
training script", for the environment its processes get.

Every other field of a job (warmup_epochs, momentum, weight_decay,
num_classes, image_size, frames, seed, train_samples, lr_decay) means what
it means in ``omru train`` and the proto ``JobSpec``. Each job is checked
with the executor's own `TrainSpec` validation, so a workload that loads is
one the workers accept.

`load(path)` / `parse(text)` return a `Workload` or raise `WorkloadError`,
which lists *every* problem found (one per line, each naming the job and the
field), never just the first. Nothing is dropped or changed silently: a key
given twice in one mapping is a problem (naming the key and its lines), and
so is a value the cluster's JobSpec cannot carry as written (the
lr_decay 'cosine' of `omru train`, a fractional warmup_epochs, a number over
its int32) or one over the input limits (README, "Input limits"). A job id given twice with the same fields is
one job; the same id with different fields is a problem. With
``cluster_gpus`` the loader also rejects jobs that need more GPUs than the
cluster has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Mapping

import yaml

from omru.spec import shown
from services.executor.worker.spec import SpecError, TrainSpec

TOP_LEVEL = ("policy", "defaults", "jobs")
# Workload-only job fields; the rest are TrainSpec fields ("id" is job_id).
_EXTRA = ("id", "profile", "max_gpus")
_SPEC_FIELDS = tuple(f.name for f in fields(TrainSpec) if f.name not in ("job_id", "max_gpus"))
# Fields only a job that trains a model of the zoo has (a script job takes none of them from defaults).
_ZOO_FIELDS = ("model", "dataset", "num_classes", "image_size", "frames", "train_samples")


class WorkloadError(ValueError):
    """A workload with problems; `problems` lists each one (job and field named)."""

    def __init__(self, problems: list[str], source: str = "workload"):
        self.problems = list(problems)
        super().__init__(f"{source}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class WorkloadJob:
    """One job: the validated `TrainSpec`, its GPU limit and optional measured profile.

    ``max_gpus`` is 0 for "any number" (``spec.max_gpus`` then equals
    ``spec.min_gpus``: the worker never reads it, the planner reads this field).
    """

    spec: TrainSpec
    max_gpus: int = 0
    profile: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "profile", MappingProxyType(dict(sorted(self.profile.items()))))

    @property
    def id(self) -> str:
        return self.spec.job_id


@dataclass(frozen=True)
class Workload:
    """A validated batch of jobs (in file order, duplicates folded) and the policy asked for."""

    jobs: tuple[WorkloadJob, ...]
    policy: str = ""

    def job(self, job_id: str) -> WorkloadJob:
        for j in self.jobs:
            if j.id == job_id:
                return j
        raise KeyError(job_id)


def load(path: str, cluster_gpus: int | None = None) -> Workload:
    """Read and validate the workload file at `path`."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise WorkloadError([f"cannot read {path!r}: {exc.strerror}"], source=str(path)) from None
    return parse(text, cluster_gpus=cluster_gpus, source=str(path))


def parse(text: str, cluster_gpus: int | None = None, source: str = "workload") -> Workload:
    """Validate workload YAML `text`; raises `WorkloadError` listing every problem."""
    loader = _Loader(text)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise WorkloadError([f"not valid YAML: {exc}"], source) from None
    finally:
        loader.dispose()
    if loader.duplicates:
        raise WorkloadError(loader.duplicates, source)
    return from_dict(data, cluster_gpus=cluster_gpus, source=source)


class _Loader(yaml.SafeLoader):
    """safe_load that records each key given twice in one mapping (YAML itself keeps the last)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.duplicates: list[str] = []

    def construct_mapping(self, node, deep=False):
        first: dict = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # (a merged key may be overridden; complex keys are left to the constructor)
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in first:
                self.duplicates.append(f"line {line}: key {shown(key)} given twice in one mapping (first on line {first[key]})")
            else:
                first[key] = line
        return super().construct_mapping(node, deep=deep)


def from_dict(data, cluster_gpus: int | None = None, source: str = "workload") -> Workload:
    """Validate an already parsed workload (the YAML's top-level mapping)."""
    problems: list[str] = []
    if not isinstance(data, dict):
        raise WorkloadError([f"must be a mapping with a 'jobs' list, got {type(data).__name__}"], source)
    for key in sorted(set(data) - set(TOP_LEVEL), key=str):
        problems.append(f"unknown top-level key {key!r} (known: {', '.join(TOP_LEVEL)})")
    policy = data.get("policy") or ""
    if not isinstance(policy, str):
        problems.append(f"policy: must be a policy name, got {policy!r}")
        policy = ""
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        problems.append(f"defaults: must be a mapping, got {defaults!r}")
        defaults = {}
    for key in sorted(set(defaults) - set(_SPEC_FIELDS) - {"max_gpus"}, key=str):
        problems.append(f"defaults: unknown field {key!r}")
    raw_jobs = data.get("jobs")
    if not isinstance(raw_jobs, list) or not raw_jobs:
        problems.append("jobs: must be a non-empty list of jobs")
        raw_jobs = []

    jobs: dict[str, WorkloadJob] = {}
    raw_by_id: dict[str, dict] = {}
    for i, raw in enumerate(raw_jobs):
        if not isinstance(raw, dict):
            problems.append(f"jobs[{i}]: must be a mapping, got {raw!r}")
            continue
        inherited = {k: v for k, v in defaults.items() if k in _SPEC_FIELDS or k == "max_gpus"}
        if "command" in raw:
            inherited = {k: v for k, v in inherited.items() if k not in _ZOO_FIELDS}
        merged = {**inherited, **raw}
        job_id = raw.get("id")
        where = f"job {shown(job_id)}" if isinstance(job_id, str) and job_id else f"jobs[{i}]"
        job, errs = _job(merged, where, cluster_gpus)
        problems += errs
        if job is None:
            continue
        if job.id in jobs:
            if raw_by_id[job.id] != merged:
                diff = sorted(k for k in set(merged) | set(raw_by_id[job.id])
                              if merged.get(k) != raw_by_id[job.id].get(k))
                problems.append(f"{where}: id given twice with different specs (differs in {', '.join(diff)})")
            continue
        jobs[job.id] = job
        raw_by_id[job.id] = merged
    if problems:
        raise WorkloadError(problems, source)
    return Workload(jobs=tuple(jobs.values()), policy=policy)


def _job(raw: dict, where: str, cluster_gpus: int | None) -> tuple[WorkloadJob | None, list[str]]:
    problems: list[str] = []
    for key in sorted(set(raw) - set(_SPEC_FIELDS) - set(_EXTRA), key=str):
        problems.append(f"{where}: unknown field {key!r}")
    if "id" not in raw:
        problems.append(f"{where}: id: missing")
    script = "command" in raw
    args = {k: raw[k] for k in _SPEC_FIELDS if k in raw}
    if script and not (isinstance(raw["command"], list) and raw["command"]):
        problems.append(f"{where}: command: must be a non-empty list of strings (program, arguments), "
                        f"got {raw['command']!r}")
        args["command"] = ["python"]  # (reported: check the other fields)
    elif not script and "model" not in raw:
        problems.append(f"{where}: model: missing (a model of the zoo, or a command: your own training script)")
    if not script:
        args.setdefault("model", _PLACEHOLDER_MODEL)  # reported missing above; checks the other fields
    args.setdefault("base_batch", args.get("batch_size", 32))
    max_gpus = raw.get("max_gpus", 0)
    if not (isinstance(max_gpus, int) and not isinstance(max_gpus, bool) and max_gpus >= 0):
        problems.append(f"{where}: max_gpus: must be an integer >= 1 (or absent for any), got {max_gpus!r}")
        max_gpus = 0
    min_gpus = args.get("min_gpus", 1)
    spec = None
    for _ in range(len(_SPEC_FIELDS) + 1):  # collect every field TrainSpec rejects, one at a time
        try:
            spec = TrainSpec(job_id=raw.get("id", "unnamed"), max_gpus=_max_for_spec(min_gpus, max_gpus), **args)
            break
        except SpecError as exc:
            problems.append(f"{where}: {exc}")
            if exc.field not in args:
                break
            if exc.field == "model" and not script:  # keep checking the other fields against a model that exists
                args["model"] = _placeholder_model(args)
            elif exc.field == "command":
                args["command"] = ["python"]
            else:
                args.pop(exc.field)
        except TypeError as exc:  # a value of the wrong type in a comparison
            problems.append(f"{where}: {exc}")
            break
    if spec is not None and max_gpus and max_gpus < spec.min_gpus:
        problems.append(f"{where}: max_gpus: must be >= min_gpus ({spec.min_gpus}), got {max_gpus}")
    if spec is not None and cluster_gpus is not None and spec.min_gpus > cluster_gpus:
        problems.append(f"{where}: min_gpus: needs {spec.min_gpus} GPUs, the cluster has {cluster_gpus}")
    if cluster_gpus is not None and max_gpus > cluster_gpus:
        problems.append(f"{where}: max_gpus: {max_gpus} GPUs asked, the cluster has {cluster_gpus}")
    profile, errs = _profile(raw.get("profile"), where, cluster_gpus)
    problems += errs
    if problems:
        return None, problems
    job = WorkloadJob(spec=spec, max_gpus=max_gpus, profile=profile)
    try:  # what the planner would refuse, or the JobSpec could not carry as written
        from services.planner import convert

        convert.workload_job(convert.job_spec(job))
    except SpecError as exc:
        return None, [f"{where}: {exc}"]
    return job, []


_PLACEHOLDER_MODEL = "resnet18"


def _placeholder_model(args: dict) -> str:
    from services.executor.worker import zoo

    video = bool(args.get("frames"))
    return next(name for name, e in sorted(zoo.MODELS.items()) if (e.kind == "video") == video)


def _max_for_spec(min_gpus, max_gpus: int):
    if not isinstance(min_gpus, int) or isinstance(min_gpus, bool):
        return 1
    return max(min_gpus, max_gpus) if max_gpus else min_gpus


def _profile(raw, where: str, cluster_gpus: int | None) -> tuple[dict[int, float], list[str]]:
    if raw is None:
        return {}, []
    if not isinstance(raw, dict) or not raw:
        return {}, [f"{where}: profile: must map GPU counts to seconds per epoch, got {raw!r}"]
    out: dict[int, float] = {}
    problems: list[str] = []
    for g, t in raw.items():
        if not (isinstance(g, int) and not isinstance(g, bool) and g >= 1):
            problems.append(f"{where}: profile: GPU count must be an integer >= 1, got {g!r}")
        elif not (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0):
            problems.append(f"{where}: profile: seconds per epoch on {g} GPUs must be > 0, got {t!r}")
        elif cluster_gpus is not None and g > cluster_gpus:
            problems.append(f"{where}: profile: {g} GPUs, the cluster has {cluster_gpus}")
        else:
            out[g] = float(t)
    return out, problems


__all__ = ["Workload", "WorkloadJob", "WorkloadError", "load", "parse", "from_dict"]
