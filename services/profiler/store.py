"""Profiles in etcd, keyed by what decides a job's epoch time.

A `ProfileKey` is model, input shape, per-GPU batch, GPU kind, nodes spanned,
data set, epoch cap and method (sampled iterations or whole epochs). Each
profile is one JSON value under
``profiles/<model>/<shape>/b<batch>/<kind>/<dataset>:<cap>/n<nodes>/<method>``
(parts URL-quoted), written through `services.common.etcd.EtcdStore`, the one
module that talks to etcd. Only complete, successful profiles are written;
a failed trial never reaches the store.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from urllib.parse import quote

from services.common.etcd import EtcdStore

PREFIX = "profiles/"


@dataclass(frozen=True)
class ProfileKey:
    """What decides the epoch time of a job."""

    model: str
    input_shape: str
    batch_size: int
    gpu_kind: str
    nodes: int
    dataset: str
    train_samples: int
    full_epoch: bool = False

    def family(self) -> str:
        """The key path without nodes and method (every profile of this configuration)."""
        parts = (self.model, self.input_shape, f"b{self.batch_size}", self.gpu_kind, f"{self.dataset}:{self.train_samples}")
        return PREFIX + "/".join(quote(p, safe="") for p in parts) + "/"

    def path(self) -> str:
        return self.family() + f"n{self.nodes}/{'epoch' if self.full_epoch else 'sampled'}"


@dataclass(frozen=True)
class StoredPoint:
    """Epoch seconds on one GPU count; iter_seconds and steps are set on measured points."""

    gpus: int
    nodes: int
    epoch_seconds: float
    measured: bool
    iter_seconds: float = 0.0
    steps: int = 0


@dataclass(frozen=True)
class StoredProfile:
    """A complete profile: one point per GPU count 1..max, the fitted curve and its error."""

    key: ProfileKey
    points: tuple[StoredPoint, ...]
    fit: tuple[float, float, float]  # a, b, c of t(g) = a + b/g + c(g-1)
    fit_error: float
    created_unix_s: float

    def measured(self) -> dict[int, StoredPoint]:
        return {p.gpus: p for p in self.points if p.measured}

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> "StoredProfile":
        d = json.loads(raw)
        return cls(key=ProfileKey(**d["key"]), points=tuple(StoredPoint(**p) for p in d["points"]),
                   fit=tuple(d["fit"]), fit_error=float(d["fit_error"]), created_unix_s=float(d["created_unix_s"]))


class ProfileStore:
    """Read and write profiles through an EtcdStore."""

    def __init__(self, etcd: EtcdStore) -> None:
        self.etcd = etcd

    async def get(self, key: ProfileKey) -> StoredProfile | None:
        kv = await self.etcd.get(key.path())
        return None if kv is None else StoredProfile.from_json(kv.value)

    async def put(self, profile: StoredProfile) -> int:
        """Write (replace) the profile; returns the etcd revision."""
        return await self.etcd.put(profile.key.path(), profile.to_json())

    async def family(self, key: ProfileKey) -> list[StoredProfile]:
        """Every stored profile of key's configuration (any nodes, either method)."""
        kvs, _ = await self.etcd.list(key.family())
        return [StoredProfile.from_json(kv.value) for kv in kvs]
