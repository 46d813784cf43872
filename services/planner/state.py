"""The planner's state in etcd (through services/common/etcd.py), so a restarted planner resumes.

Keys (under the store's prefix, JSON values):

    planner/jobs/<job_id>              one `JobRecord`: what changes as it runs (state, epochs, GPUs...)
    planner/specs/<job_id>             the same job's spec, max_gpus, profile and placements: written
                                       at submission and when profiled, not at every epoch (they are
                                       three quarters of a record's bytes)
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
from functools import cached_property
from typing import Callable, Mapping, Sequence

from services.common.etcd import EtcdStore, LeaseNotFound, TxnResult
from services.planner.report import Event

JOBS, SPECS, PLAN, FIRST_PLAN, ORIGIN, EVENTS, CURSORS, LEADER = (
    "planner/jobs/", "planner/specs/", "planner/plan", "planner/first_plan", "planner/origin", "planner/events/",
    "planner/cursors/", "planner/leader")
#: JobRecord fields kept under SPECS (the rest under JOBS).
SPEC_FIELDS = ("spec", "max_gpus", "profile", "placement")

#: omru.v1.JobState names without the prefix; terminal ones never change again.
PENDING, PROFILING, WAITING, STARTING, RUNNING, RESIZING, FINISHED, FAILED, CANCELLED = (
    "PENDING", "PROFILING", "WAITING", "STARTING", "RUNNING", "RESIZING", "FINISHED", "FAILED", "CANCELLED")
TERMINAL = frozenset({FINISHED, FAILED, CANCELLED})
#: The one job-state transition table: the states each state may move to (a write that keeps the state
#: is always allowed). Every write of a job record goes through it (`check_move`); test_list_jobs holds
#: its keys to omru.v1.JobState. WAITING, STARTING, RUNNING and RESIZING may end FINISHED: an attempt stopped
#: (requeued, moved) may have trained the last epoch before it noticed.
MOVES: Mapping[str, frozenset[str]] = {
    PENDING: frozenset({PROFILING, WAITING, FAILED, CANCELLED}),
    PROFILING: frozenset({WAITING, FAILED, CANCELLED}),
    WAITING: frozenset({STARTING, FINISHED, FAILED, CANCELLED}),
    STARTING: frozenset({RUNNING, WAITING, FINISHED, FAILED, CANCELLED}),
    RUNNING: frozenset({RESIZING, WAITING, FINISHED, FAILED, CANCELLED}),
    RESIZING: frozenset({RUNNING, WAITING, FINISHED, FAILED, CANCELLED}),
    FINISHED: frozenset(), FAILED: frozenset(), CANCELLED: frozenset(),
}
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
    #: a parked move's GPUs (follow.py) that other jobs still hold: claimed as they release them; the
    #: nodes of `joining` get their allocation once this and `releasing` are empty
    awaiting: tuple[Gpu, ...] = ()
    owner: str = ""  # name of the user who submitted it ("" without auth, or stored by older code)
    revision: int = 0  # etcd mod revision (not stored)

    @cached_property  # (read in every pass over the jobs)
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
        """The whole record as one JSON value."""
        return json.dumps(self._fields(), sort_keys=True).encode()

    def state_json(self) -> bytes:
        """What changes as the job runs (the JOBS key's value)."""
        return json.dumps({k: v for k, v in self._fields().items() if k not in SPEC_FIELDS}, sort_keys=True).encode()

    def spec_json(self) -> bytes:
        """The spec, max_gpus, profile and placements (the SPECS key's value)."""
        return json.dumps({"spec": self.spec, "max_gpus": self.max_gpus, "placement": self.placement,
                           "profile": {str(k): v for k, v in self.profile.items()}}, sort_keys=True).encode()

    def same_spec(self, other: "JobRecord") -> bool:
        return all(getattr(self, f) is getattr(other, f) or getattr(self, f) == getattr(other, f) for f in SPEC_FIELDS)

    def _fields(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "revision"}  # (json copies deep)
        d["profile"] = {str(k): v for k, v in self.profile.items()}
        d["observed"] = {f"{g}:{k}": list(v) for (g, k), v in self.observed.items()}
        return d

    @classmethod
    def from_json(cls, data: bytes, revision: int = 0, spec: bytes | None = None) -> "JobRecord":
        """From `to_json`'s value, or from `state_json`'s with `spec_json`'s as `spec`."""
        d = json.loads(data)
        if spec is not None:
            d.update(json.loads(spec))
        d["profile"] = {int(k): float(v) for k, v in d.get("profile", {}).items()}
        d["observed"] = {_placement_key(k): [float(v[0]), int(v[1]), *map(float, v[2:3])]
                         for k, v in d.get("observed", {}).items()}
        d["gpus"] = tuple((n, int(i)) for n, i in d.get("gpus", ()))
        d["target"] = tuple((n, int(i)) for n, i in d.get("target", ()))
        d["releasing"] = tuple((n, int(i)) for n, i in d.get("releasing", ()))
        d["awaiting"] = tuple((n, int(i)) for n, i in d.get("awaiting", ()))
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


class IllegalMove(ValueError):
    """A write would move a job between states the transition table (`MOVES`) does not link."""


def check_move(job_id: str, old: str, new: str) -> None:
    """Raise IllegalMove unless a job in state `old` may be stored in state `new`."""
    if new != old and new not in MOVES.get(old, ()):
        raise IllegalMove(f"job {job_id!r} cannot move from {old} to {new}")


class PlannerState:
    """Typed reads and writes of the planner's keys."""

    def __init__(self, store: EtcdStore, meter=None) -> None:
        self.store = store
        self.meter = meter  # times the claim transactions (`change`): services/planner/metrics.py PlannerMeter
        self._known: dict[str, JobRecord] = {}  # job -> the record last stored or read (spec as stored)

    # --- jobs ---------------------------------------------------------------

    async def jobs(self) -> list[JobRecord]:
        kvs, _ = await self.store.list(JOBS)
        specs = {kv.key[len(SPECS):]: kv.value for kv in (await self.store.list(SPECS))[0]}
        return [self._record(kv.key[len(JOBS):], kv, specs.get(kv.key[len(JOBS):])) for kv in kvs]

    async def job(self, job_id: str) -> JobRecord | None:
        kv = await self.store.get(JOBS + job_id)
        if kv is None:
            return None
        spec = await self.store.get(SPECS + job_id)
        return self._record(job_id, kv, spec.value if spec is not None else None)

    def _record(self, job_id: str, kv, spec: bytes | None) -> JobRecord:
        r = JobRecord.from_json(kv.value, kv.mod_revision, spec)
        if spec is not None:  # (a record stored whole, before SPECS: its spec is written with its next change)
            self._stored(r)
        return r

    def _puts(self, record: JobRecord) -> dict[str, tuple[bytes, int]]:
        """The keys to write for `record`: its state, and its spec unless the one stored is the same."""
        puts = {JOBS + record.job_id: (record.state_json(), 0)}
        known = self._known.get(record.job_id)
        if known is None or not known.same_spec(record):
            puts[SPECS + record.job_id] = (record.spec_json(), 0)
        return puts

    def _stored(self, record: JobRecord) -> None:
        self._known[record.job_id] = record

    async def create_jobs(self, records: list[JobRecord]) -> tuple[bool, list[str]]:
        """Create every record, all or nothing; (created, ids that already existed)."""
        puts = {k: v for r in records for k, v in ((JOBS + r.job_id, (r.state_json(), 0)),
                                                  (SPECS + r.job_id, (r.spec_json(), 0)))}
        result = await self.store.commit(puts, absent=[JOBS + r.job_id for r in records])
        if result.succeeded:
            for r in records:
                self._stored(r)
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
            check_move(job_id, current.state, new.state)
            puts = self._puts(new)
            state, _ = puts.pop(JOBS + job_id)
            result = await self.store.cas(JOBS + job_id, state, current.revision, also=puts)
            if result.succeeded:
                self._stored(new)
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
            known = self._known.get(job_id)
            if known is not None:
                check_move(job_id, known.state, record.state)
            puts.update(self._puts(record))
        deletes = [keys.alloc_key(node, job_id) for node in drop] + [keys.claim_key(*g) for g in release]
        began, outcome = time.monotonic(), "error"
        try:
            result = await self.store.commit(puts, deletes, absent=[keys.claim_key(*g) for g in claim])
            outcome = "claimed" if result.succeeded else "taken"
        except LeaseNotFound:
            outcome = "lease_gone"
            raise
        finally:
            if claim and self.meter is not None:
                self.meter.claimed(time.monotonic() - began, outcome)
        if result.succeeded and record is not None:
            self._stored(record)
        return result

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
