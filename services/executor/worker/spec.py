"""What a worker trains (`TrainSpec`) and how one attempt is launched (`AttemptSpec`).

`TrainSpec` mirrors the proto ``JobSpec``: it is what the user submitted and it
stays the same across restarts and resizes. A job either trains a model of the
zoo on a data set, or is a script job: ``command`` (the argument list each
rank runs, see launch.py for its environment), ``workdir`` and ``env``. `AttemptSpec` is the per-attempt
launch information: world size, the device of every rank, the rendezvous
endpoint, where checkpoints live, the stop-request file, and an optional
profile mode (`ProfileSpec`, defined in omru.spec with `SpecError`: omru.elastic
reads it too). Both are frozen and validated at construction; a bad value
raises `SpecError` (a ``ValueError``) whose message and ``field`` name the
field. Both travel to the worker as JSON (`to_json` / `from_json`), never pickle.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass, fields

from omru import lease
from omru.spec import ProfileSpec, SpecError
from omru.spec import int_field as _int_field
from omru.spec import require as _require
from services.executor.worker import zoo

#: Data sets every node has (nothing read from its folders), and the kinds that read a folder ("kind:<dir>").
BUILTIN_DATASETS = ("digits", "synthetic")
FOLDER_DATASETS = ("imagefolder", "clips")
DATASET_KINDS = (*BUILTIN_DATASETS, *(f"{k}:<dir>" for k in FOLDER_DATASETS))
DEFAULT_DATASET = "digits"
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Variables the executor sets for a script job (its env may not replace them).
RESERVED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "CUDA_VISIBLE_DEVICES")


def _float_field(obj, name: str, minimum: float, strict: bool = False, maximum: float | None = None) -> None:
    value = getattr(obj, name)
    _require(isinstance(value, (int, float)) and not isinstance(value, bool), name, f"must be a number, got {value!r}")
    bad = value <= minimum if strict else value < minimum
    _require(not bad and value == value, name, f"must be {'>' if strict else '>='} {minimum}, got {value}")
    if maximum is not None:
        _require(value < maximum, name, f"must be < {maximum}, got {value}")


def dataset_kind(dataset: str) -> tuple[str, str]:
    """``"imagefolder:/d"`` -> ``("imagefolder", "/d")``; ``"digits"`` -> ``("digits", "")``."""
    kind, _, arg = dataset.partition(":")
    return kind, arg


def dataset_folder(dataset: str) -> str:
    """The folder a data set reads (``"imagefolder:/d"`` -> ``"/d"``); "" for a built-in one."""
    kind, arg = dataset_kind(dataset)
    return arg if kind in FOLDER_DATASETS else ""


@dataclass(frozen=True)
class TrainSpec:
    """One training job, as submitted (mirrors the proto JobSpec)."""

    job_id: str
    model: str = ""  # "" for a script job
    dataset: str = ""  # "" = DEFAULT_DATASET for a zoo job; "" for a script job
    epochs: int = 1
    batch_size: int = 32  # per GPU / slot
    base_lr: float = 0.1
    base_batch: int = 32  # the global batch base_lr was tuned for
    warmup_epochs: float = 5
    momentum: float = 0.9
    weight_decay: float = 5e-4
    num_classes: int = 0  # 0 = from the data
    image_size: int = 32
    frames: int = 0  # clip length for video models; 0 for images
    min_gpus: int = 1
    max_gpus: int = 1
    seed: int = 0
    train_samples: int = 0  # 0 = whole training split; otherwise caps an epoch
    lr_decay: str = "none"  # "none" (constant after warm-up) or "cosine" (see lsr.py)
    command: tuple[str, ...] = ()  # a script job: program and arguments each rank runs
    workdir: str = ""  # absolute folder the command runs in ("" = the executor's working directory)
    env: tuple[tuple[str, str], ...] = ()  # extra environment of the command (a mapping is accepted)

    def __post_init__(self) -> None:
        _require(isinstance(self.job_id, str) and bool(_JOB_ID.match(self.job_id)), "job_id",
                 f"must be 1-128 characters of letters, digits, '.', '_', '-', got {self.job_id!r}")
        self._check_script()
        for name in ("epochs", "batch_size", "base_batch", "min_gpus", "max_gpus"):
            _int_field(self, name, 1)
        _int_field(self, "seed", 0)
        _float_field(self, "base_lr", 0.0, strict=True)
        _float_field(self, "warmup_epochs", 0.0)
        _require(self.max_gpus >= self.min_gpus, "max_gpus", f"must be >= min_gpus ({self.min_gpus}), got {self.max_gpus}")
        _require(self.lr_decay in ("none", "cosine"), "lr_decay", f"must be 'none' or 'cosine', got {self.lr_decay!r}")
        if not self.is_script:
            self._check_zoo()

    def _check_script(self) -> None:
        command, env = self.command, self.env
        _require(isinstance(command, (list, tuple)) and all(isinstance(a, str) and a for a in command), "command",
                 f"must be a list of non-empty strings (program, arguments), got {command!r}")
        object.__setattr__(self, "command", tuple(command))
        if isinstance(env, dict):
            env = tuple(env.items())
        _require(isinstance(env, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in env),
                 "env", f"must map variable names to strings, got {self.env!r}")
        for name, value in env:
            _require(isinstance(name, str) and bool(_ENV_NAME.match(name)), "env",
                     f"{name!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")
            _require(isinstance(value, str), "env", f"{name}: must be a string, got {value!r}")
            _require(name not in RESERVED_ENV and not name.startswith("OMRU_"), "env",
                     f"{name} is set by the executor (RANK, WORLD_SIZE, MASTER_*, OMRU_*, ...)")
        object.__setattr__(self, "env", tuple(sorted((k, v) for k, v in env)))
        _require(isinstance(self.workdir, str) and (not self.workdir or os.path.isabs(self.workdir)), "workdir",
                 f"must be an absolute folder path, got {self.workdir!r}")
        if self.command:
            _require(self.model == "", "model", f"a script job (command {self.command[0]!r}) has no model, got "
                     f"{self.model!r}: give model and dataset, or command")
            _require(self.dataset == "", "dataset", f"a script job (command {self.command[0]!r}) reads its own "
                     f"data, got {self.dataset!r}: give model and dataset, or command")
        else:
            for name in ("workdir", "env"):
                _require(not getattr(self, name), name, f"only a script job (command) has one, got {getattr(self, name)!r}")
            _require(bool(self.model), "model", "is required (a model of the zoo), unless the job gives a command")

    def _check_zoo(self) -> None:
        if self.dataset == "":
            object.__setattr__(self, "dataset", DEFAULT_DATASET)
        try:
            entry = zoo.entry(self.model)
        except zoo.UnknownModelError as exc:
            raise SpecError("model", str(exc)) from None
        kind, arg = dataset_kind(self.dataset) if isinstance(self.dataset, str) else ("", "")
        _require(kind in BUILTIN_DATASETS + FOLDER_DATASETS and (bool(arg) == (kind in FOLDER_DATASETS)),
                 "dataset", f"must be one of {', '.join(DATASET_KINDS)}, got {self.dataset!r}")
        _int_field(self, "image_size", 1)
        for name in ("num_classes", "frames", "train_samples"):
            _int_field(self, name, 0)
        _require(self.num_classes != 1, "num_classes", "must be 0 (from the data) or >= 2, got 1")
        _float_field(self, "momentum", 0.0, maximum=1.0)
        _float_field(self, "weight_decay", 0.0)
        if entry.kind == "video":
            _require(self.frames >= 1, "frames", f"model {self.model} is a video model and needs frames >= 1, got {self.frames}")
            _require(kind in ("synthetic", "clips"), "dataset",
                     f"video model {self.model} needs a clip data set (synthetic or clips:<dir>), got {self.dataset!r}")
        else:
            _require(self.frames == 0, "frames", f"model {self.model} is an image model and needs frames = 0, got {self.frames}")
            _require(kind != "clips", "dataset", f"image model {self.model} cannot train on clips ({self.dataset!r})")

    @property
    def is_script(self) -> bool:
        """True for a script job (command given), False for a model of the zoo."""
        return bool(self.command)

    @property
    def is_video(self) -> bool:
        return not self.is_script and zoo.entry(self.model).kind == "video"

    def fingerprint(self) -> str:
        """Identifies the parameter shapes a checkpoint holds: model, classes, input (a script job: its command)."""
        key = json.dumps([self.model, self.num_classes, self.image_size, self.frames, self.dataset]
                         + ([list(self.command), self.workdir] if self.is_script else []))
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["command"], d["env"] = list(self.command), dict(self.env)
        return d

    @classmethod
    def from_dict(cls, data: dict) -> "TrainSpec":
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class AttemptSpec:
    """One launch of a job: who the ranks are and where they meet.

    ``devices[rank]`` is ``"cpu"`` (gloo, one CPU slot) or a GPU index such as
    ``"0"`` (NCCL; the launcher sets ``CUDA_VISIBLE_DEVICES`` to it, so the
    worker then uses ``cuda:0``). ``rendezvous`` is the ``host:port`` of the
    c10d TCPStore that rank 0 hosts; with port 0 rank 0 binds a port the OS
    picks on its host (``host`` = rank 0's host, as the other nodes reach it)
    and writes ``host:port`` to `rendezvous_file` in the shared
    checkpoint_dir, where the other ranks read it (so the port is never
    chosen on one machine and bound on another). Every rank uses the store
    under the prefix ``attempt_id``, so each restart attempt starts from a clean slate.
    All ranks must see ``checkpoint_dir`` (a shared folder across nodes).
    When the file ``stop_file`` exists (or a worker receives SIGUSR1), the job
    stops at the next epoch boundary after checkpointing. ``lease_file`` (when
    set) holds the Unix time until which the node's lease surely holds, as its
    executor last renewed it; past it the ranks of this node stop without
    another checkpoint (`lease_lapsed`): the planner may run the job elsewhere.

    ``resizes`` plans resizes: ``(epoch, size)`` pairs, epochs increasing: once
    ``epoch`` epochs are done the job goes on with ``size`` ranks. With
    ``in_place`` the workers regroup in place (see train.py: ranks that stay keep
    their process, joiners get the state by broadcast, a shrink ends the
    leaving ranks); otherwise they stop there as on a stop request, and the
    launcher restarts the job at the new size from the checkpoint (today's path).
    ``devices`` then names one device per rank of the largest size. A rank
    started with ``generation`` n > 0 joins a running job at its n-th regroup
    (store prefix ``<attempt_id>/gen<n>``, `generation_prefix`) on
    ``world_size`` ranks, and takes the state from rank 0 instead of a checkpoint.
    """

    attempt_id: str
    world_size: int
    rendezvous: str
    checkpoint_dir: str
    devices: tuple[str, ...] = ()
    stop_file: str = ""
    profile: ProfileSpec | None = None
    timeout_s: float = 300.0  # rendezvous and collective timeout
    lease_file: str = ""
    resizes: tuple[tuple[int, int], ...] = ()
    in_place: bool = True
    generation: int = 0

    def __post_init__(self) -> None:
        _require(isinstance(self.attempt_id, str) and bool(_JOB_ID.match(self.attempt_id)), "attempt_id",
                 f"must be 1-128 characters of letters, digits, '.', '_', '-', got {self.attempt_id!r}")
        _int_field(self, "world_size", 1)
        host, _, port = self.rendezvous.rpartition(":") if isinstance(self.rendezvous, str) else ("", "", "")
        _require(bool(host) and port.isdigit() and 0 <= int(port) < 65536, "rendezvous",
                 f"must be 'host:port' (port 0: rank 0 picks it), got {self.rendezvous!r}")
        _require(isinstance(self.checkpoint_dir, str) and bool(self.checkpoint_dir), "checkpoint_dir",
                 f"must be a folder path, got {self.checkpoint_dir!r}")
        self._check_resizes()
        ranks = self.max_world_size
        devices = tuple(self.devices) or ("cpu",) * ranks
        object.__setattr__(self, "devices", devices)
        _require(len(devices) == ranks, "devices",
                 f"needs one device per rank ({ranks}), got {len(devices)}: {list(devices)}")
        for d in devices:
            _require(d == "cpu" or d.isdigit(), "devices", f"each device must be 'cpu' or a GPU index, got {d!r}")
        if isinstance(self.profile, dict):
            object.__setattr__(self, "profile", ProfileSpec(**self.profile))
        _float_field(self, "timeout_s", 0.0, strict=True)

    def _check_resizes(self) -> None:
        resizes = self.resizes
        ok = isinstance(resizes, (list, tuple)) and all(
            isinstance(r, (list, tuple)) and len(r) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in r) for r in resizes)
        _require(ok, "resizes", f"must be (epoch, size) pairs of integers, got {resizes!r}")
        resizes = tuple((int(e), int(w)) for e, w in resizes)
        epochs = [e for e, _ in resizes]
        _require(all(e >= 1 for e in epochs) and epochs == sorted(set(epochs)), "resizes",
                 f"epochs must be >= 1 and increasing, got {epochs}")
        _require(all(w >= 1 for _, w in resizes), "resizes", f"sizes must be >= 1, got {[w for _, w in resizes]}")
        object.__setattr__(self, "resizes", resizes)
        _require(isinstance(self.in_place, bool), "in_place", f"must be true or false, got {self.in_place!r}")
        _int_field(self, "generation", 0)

    @property
    def max_world_size(self) -> int:
        """The most ranks the job has during this attempt (world_size, or a planned resize's size)."""
        return max([self.world_size, *(w for _, w in self.resizes)])

    def size_after(self, epochs_done: int, current: int) -> int:
        """The size `resizes` plans once ``epochs_done`` epochs are done (``current`` when none is planned then)."""
        return dict(self.resizes).get(epochs_done, current)

    def generation_prefix(self, generation: int) -> str:
        """The store prefix of the process group of a generation (0: the attempt's first group)."""
        return self.attempt_id if generation == 0 else f"{self.attempt_id}/gen{generation}"

    @property
    def host(self) -> str:
        return self.rendezvous.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.rendezvous.rpartition(":")[2])

    @property
    def rendezvous_file(self) -> str:
        """Where rank 0 writes the ``host:port`` it bound when the rendezvous port is 0."""
        return os.path.join(self.checkpoint_dir, f".rendezvous-{self.attempt_id}")

    def lease_lapsed(self, now: float | None = None) -> bool:
        """True when the node's lease may have lapsed (see lease_file; False without one)."""
        return lease.lapsed(self.lease_file, now)

    def publish(self, endpoint: str) -> None:
        """Rank 0's side: write the ``host:port`` it bound to `rendezvous_file` at once as a whole."""
        partial = f"{self.rendezvous_file}.{os.getpid()}.partial"
        with open(partial, "w") as f:
            f.write(endpoint)
        os.replace(partial, self.rendezvous_file)

    def published(self) -> tuple[str, int]:
        """The other ranks' side: the (host, port) rank 0 published; TimeoutError naming the file after timeout_s."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                with open(self.rendezvous_file) as f:
                    host, _, port = f.read().strip().rpartition(":")
                return host, int(port)
            except (FileNotFoundError, ValueError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank 0 did not publish its rendezvous in {self.rendezvous_file} "
                                       f"within {self.timeout_s:.0f} s") from None
                time.sleep(0.05)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["devices"] = list(self.devices)
        d["resizes"] = [list(r) for r in self.resizes]
        return d

    @classmethod
    def from_dict(cls, data: dict) -> "AttemptSpec":
        data = _known(cls, data)
        data["devices"] = tuple(data.get("devices", ()))
        data["resizes"] = tuple(tuple(r) for r in data.get("resizes", ()))
        return cls(**data)


def _known(cls, data: dict) -> dict:
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise SpecError(unknown[0], f"unknown field for {cls.__name__}")
    return dict(data)


def to_json(spec: TrainSpec, attempt: AttemptSpec) -> str:
    return json.dumps({"spec": spec.to_dict(), "attempt": attempt.to_dict()})


def from_json(text: str) -> tuple[TrainSpec, AttemptSpec]:
    data = json.loads(text)
    return TrainSpec.from_dict(data["spec"]), AttemptSpec.from_dict(data["attempt"])


__all__ = ["TrainSpec", "AttemptSpec", "ProfileSpec", "SpecError", "to_json", "from_json", "dataset_kind",
           "dataset_folder"]
