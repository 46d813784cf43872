"""The planner's state in etcd (through services/common/etcd.py), so a restarted planner resumes.

Keys (under the store's prefix, JSON values):

    planner/jobs/<job_id>              one `JobRecord`
    planner/plan                       the plan in force (`PlanRecord`)
    planner/first_plan                 the first plan of the batch (the report's "planned")
    planner/origin                     {"origin_s": first submission, Unix seconds}
    planner/events/<node>/<gen>/<seq>  every executor event seen (report, replay)
    planner/cursors/<node>             {"gen": g, "seq": s}: last event stored per node;
                                       gen grows when the executor restarted (its log restarts at 1)
    planner/leader                     the leading planner's identity, under its lease; the leader's
                                       writes all require it (EtcdStore.fenced)

and, in the registry's layout (services/registry/convert.py), the desired state
it alone writes: cluster/claims/<node>/<index> (GPU ownership) and allocs/<node>/<job>
(the attempt each node must run), both bound to the node's lease.

Job records are written with compare-and-swap on their mod revision, so two
writers never silently overwrite each other; `update_job` retries on a race.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Callable, Mapping, Sequence

from services.common.etcd import EtcdStore, TxnResult
from services.planner.report import Event

JOBS, PLAN, FIRST_PLAN, ORIGIN, EVENTS, CURSORS, LEADER = (
    "planner/jobs/", "planner/plan", "planner/first_plan", "planner/origin", "planner/events/", "planner/cursors/",
    "planner/leader")

#: omru.v1.JobState names without the prefix; terminal ones never change again.
PENDING, PROFILING, WAITING, STARTING, RUNNING, RESIZING, FINISHED, FAILED, CANCELLED = (
    "PENDING", "PROFILING", "WAITING", "STARTING", "RUNNING", "RESIZING", "FINISHED", "FAILED", "CANCELLED")
TERMINAL = frozenset({FINISHED, FAILED, CANCELLED})
#: Events stored per transaction (etcd allows 128 operations in one; the cursor is one more).
EVENTS_PER_TXN = 100

Gpu = tuple[str, int]


@dataclass(frozen=True)
class JobRecord:
    """What the planner knows of one job.

    `gpus` is the GPU set of the attempt that runs (or last ran); `target`
    the set of the attempt a directive was sent for (equal to `gpus` once it
    started). `sent_s` is when that directive went out (start overhead is
    measured from it).
    """

    spec: dict  # TrainSpec.to_dict()
    max_gpus: int = 0
    profile: dict = field(default_factory=dict)  # {gpus(int): epoch seconds}
    placement: tuple = ()  # ((gpus, nodes, epoch seconds), ...): measured spread placements
    # {(gpus, nodes spanned): [mean epoch seconds, epochs, sum of squared deviations]}
    observed: dict = field(default_factory=dict)
    state: str = PENDING
    epochs_done: int = 0
    world_size: int = 0
    accuracy: float = 0.0
    attempt: int = 0
    gpus: tuple[Gpu, ...] = ()
    target: tuple[Gpu, ...] = ()
    sent_s: float = 0.0
    progress_s: float = 0.0  # when the running attempt started or last finished an epoch (Unix seconds)
    submitted_s: float = 0.0
    finished_s: float = 0.0
    message: str = ""
    #: a resize's nodes that join: they get their allocation once the old attempt released `releasing`,
    #: its GPUs not released yet (kept here, not in the planner's memory, so a planner that takes over
    #: finishes the move)
    joining: tuple[str, ...] = ()
    releasing: tuple[Gpu, ...] = ()
    revision: int = 0  # etcd mod revision (not stored)

    @property
    def job_id(self) -> str:
        return self.spec["job_id"]

    @property
    def epochs(self) -> int:
        return int(self.spec["epochs"])

    @property
    def attempt_id(self) -> str:
        return f"{self.job_id}-a{self.attempt}"

    def attempt_of(self, attempt_id: str) -> int:
        """n of this job's attempt id "<job_id>-a<n>" (0 for another form: the empty id of a release)."""
        prefix = f"{self.job_id}-a"
        suffix = attempt_id[len(prefix):] if attempt_id.startswith(prefix) else ""
        return int(suffix) if suffix.isdigit() else 0

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def to_json(self) -> bytes:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "revision"}  # (json copies deep)
        d["profile"] = {str(k): v for k, v in self.profile.items()}
        d["observed"] = {f"{g}:{k}": list(v) for (g, k), v in self.observed.items()}
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, revision: int = 0) -> "JobRecord":
        d = json.loads(data)
        d["profile"] = {int(k): float(v) for k, v in d.get("profile", {}).items()}
        d["observed"] = {_placement_key(k): [float(v[0]), int(v[1]), *map(float, v[2:3])]
                         for k, v in d.get("observed", {}).items()}
        d["gpus"] = tuple((n, int(i)) for n, i in d.get("gpus", ()))
        d["target"] = tuple((n, int(i)) for n, i in d.get("target", ()))
        d["releasing"] = tuple((n, int(i)) for n, i in d.get("releasing", ()))
        d["joining"] = tuple(d.get("joining", ()))
        d["placement"] = tuple((int(g), int(k), float(t)) for g, k, t in d.get("placement", ()))
        return cls(**d, revision=revision)


def _placement_key(key: str) -> tuple[int, int]:
    """(gpus, nodes) of an `observed` key "gpus:nodes" (a record stored before nodes were kept: "gpus",
    read as one node)."""
    gpus, _, nodes = key.partition(":")
    return int(gpus), int(nodes or 1)


class StateRace(Exception):
    """A job record changed under a compare-and-swap too many times in a row."""


class PlannerState:
    """Typed reads and writes of the planner's keys."""

    def __init__(self, store: EtcdStore, meter=None) -> None:
        self.store = store
        self.meter = meter  # times the claim transactions (`change`): services/planner/metrics.py PlannerMeter

    # --- jobs ---------------------------------------------------------------

    async def jobs(self) -> list[JobRecord]:
        kvs, _ = await self.store.list(JOBS)
        return [JobRecord.from_json(kv.value, kv.mod_revision) for kv in kvs]

    async def job(self, job_id: str) -> JobRecord | None:
        kv = await self.store.get(JOBS + job_id)
        return None if kv is None else JobRecord.from_json(kv.value, kv.mod_revision)

    async def create_jobs(self, records: list[JobRecord]) -> tuple[bool, list[str]]:
        """Create every record, all or nothing; (created, ids that already existed)."""
        result = await self.store.create({JOBS + r.job_id: r.to_json() for r in records})
        return result.succeeded, [kv.key[len(JOBS):] for kv in result.existing]

    async def update_job(self, job_id: str, change: Callable[[JobRecord], JobRecord | None],
                         known: JobRecord | None = None) -> JobRecord | None:
        """Apply `change` with compare-and-swap (retried on a race); None = leave unchanged. `known`: the
        record as the caller last saw it (read first when absent or outdated).

        Returns the stored record (with its new revision), or None when the job is absent."""
        for _ in range(20):
            current, known = known or await self.job(job_id), None
            if current is None:
                return None
            new = change(current)
            if new is None or new == current:
                return current
            result = await self.store.cas(JOBS + job_id, new.to_json(), current.revision)
            if result.succeeded:
                return replace(new, revision=result.revision)
        raise StateRace(f"job {job_id!r} changed 20 times while being updated")

    # --- desired state: GPU claims and allocations -----------------------------

    async def claims(self) -> dict[Gpu, str]:
        """GPU -> the job that holds it."""
        from services.registry import convert as keys

        kvs, _ = await self.store.list(keys.CLAIMS)
        return {(c.gpu.node_id, c.gpu.index): c.job_id for c in map(keys.claim_from_kv, kvs)}

    async def change(self, job_id: str, record: JobRecord | None = None, claim: Mapping[Gpu, int] = {},
                     put: Mapping[str, tuple[bytes, int]] = {}, drop: Sequence[str] = (),
                     release: Sequence[Gpu] = ()) -> TxnResult:
        """One transaction for the job: store `record`, claim the GPUs of `claim` (GPU -> its node's
        lease; fails, writing nothing, when one is claimed: `existing` names it), write its allocation
        of each node of `put` (node -> (Directive bytes, the node's lease)), remove those of the nodes of
        `drop`, give up its claims on `release`. LeaseNotFound when a node's lease is gone."""
        from omru.v1 import common_pb2, registry_pb2
        from services.registry import convert as keys

        now = time.time()
        puts = {keys.claim_key(*g): (keys.encode(registry_pb2.GpuClaim(
            gpu=common_pb2.GpuRef(node_id=g[0], index=g[1]), job_id=job_id, claimed_unix_s=now)), lease)
            for g, lease in claim.items()}
        puts.update({keys.alloc_key(node, job_id): value for node, value in put.items()})
        if record is not None:
            puts[JOBS + job_id] = (record.to_json(), 0)
        deletes = [keys.alloc_key(node, job_id) for node in drop] + [keys.claim_key(*g) for g in release]
        if not claim or self.meter is None:
            return await self.store.commit(puts, deletes, absent=[keys.claim_key(*g) for g in claim])
        from services.common.etcd import LeaseNotFound

        began, outcome = time.monotonic(), "error"
        try:
            result = await self.store.commit(puts, deletes, absent=[keys.claim_key(*g) for g in claim])
            outcome = "claimed" if result.succeeded else "taken"
            return result
        except LeaseNotFound:
            outcome = "lease_gone"
            raise
        finally:
            self.meter.claimed(time.monotonic() - began, outcome)

    # --- plan and origin ----------------------------------------------------

    async def put_plan(self, plan: dict, first: bool = True) -> None:
        """Store the plan in force; with `first`, also as the batch's first plan unless one is stored."""
        await self.store.put(PLAN, json.dumps(plan).encode())
        if first:
            await self.store.cas(FIRST_PLAN, json.dumps(plan).encode(), 0)  # only the first one sticks

    async def bound_first_plan(self, lower_bound_s: float) -> None:
        """Set the first plan's lower bound (LB_fluid of its problem, computed after it was stored)."""
        kv = await self.store.get(FIRST_PLAN)
        if kv is not None:
            plan = json.loads(kv.value)
            plan["lower_bound_s"] = lower_bound_s
            await self.store.put(FIRST_PLAN, json.dumps(plan).encode())

    async def plan(self) -> dict | None:
        kv = await self.store.get(PLAN)
        return None if kv is None else json.loads(kv.value)

    async def first_plan(self) -> dict | None:
        kv = await self.store.get(FIRST_PLAN)
        return None if kv is None else json.loads(kv.value)

    async def set_origin(self, origin_s: float) -> float:
        """Store the batch's origin unless one is stored; returns the stored one."""
        result = await self.store.cas(ORIGIN, json.dumps({"origin_s": origin_s}).encode(), 0)
        if result.succeeded:
            return origin_s
        return json.loads(result.existing[0].value)["origin_s"] if result.existing else origin_s

    async def origin(self) -> float | None:
        kv = await self.store.get(ORIGIN)
        return None if kv is None else json.loads(kv.value)["origin_s"]

    # --- executor events ----------------------------------------------------

    async def cursor(self, node_id: str) -> tuple[int, int]:
        kv = await self.store.get(CURSORS + node_id)
        if kv is None:
            return 0, 0
        d = json.loads(kv.value)
        return d["gen"], d["seq"]

    async def add_events(self, gen: int, events: Sequence[Event]) -> None:
        """Store one node's events (in order) and move its cursor past the last, a transaction per
        EVENTS_PER_TXN events."""
        for i in range(0, len(events), EVENTS_PER_TXN):
            chunk = events[i:i + EVENTS_PER_TXN]
            puts = {f"{EVENTS}{e.node_id}/{gen:06d}/{e.seq:012d}": (json.dumps(asdict(e)).encode(), 0) for e in chunk}
            last = chunk[-1]
            puts[CURSORS + last.node_id] = (json.dumps({"gen": gen, "seq": last.seq}).encode(), 0)
            await self.store.commit(puts)

    async def set_cursor(self, node_id: str, gen: int, seq: int) -> None:
        await self.store.put(CURSORS + node_id, json.dumps({"gen": gen, "seq": seq}).encode())

    async def events(self) -> list[Event]:
        kvs, _ = await self.store.list(EVENTS)
        out = []
        for kv in kvs:
            d = json.loads(kv.value)
            d["gpus"] = tuple((n, int(i)) for n, i in d["gpus"])
            out.append(Event(**d))
        return out
