"""What the planner writes: desired state, one etcd transaction per change (the Dispatcher's actuation).

A move (follow.py: start a waiting job, or resize a running one, on exactly the
planned GPUs) is one transaction, fenced by the leader key: it claims the GPUs
the job gains (failing, writing nothing, when one is claimed), stores the
job's record (a new attempt) and writes the attempt's allocation (an executor
Directive) for each node it will run on, removing those of the nodes it
leaves. Executors watch their node's allocations and reconcile: a resized job
moves at its next epoch boundary. Nodes a resize joins get their allocation
once the old attempt released its GPUs everywhere (`_join`). A claim is given
up when its executor reports the GPU released, never before. Stopping a job
(requeue, cancel) removes its allocations; its GPUs come back as its
executors release them. A mixin of `Dispatcher` (dispatcher.py), whose state
it reads and changes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Sequence

from services.common.logging import get_logger
from services.planner import retention
from services.planner import state as st
from services.planner.follow import Gpu, Move
from services.planner.state import JobRecord

log = get_logger(__name__)

#: Seconds before a refused claim is tried again.
CLAIM_RETRY_S = 0.2


class Actuation:
    """Moves, stops and claims written to etcd as the executors' desired state."""

    def _job_lock(self, job_id: str) -> asyncio.Lock:
        """Held while a directive of the job is written and while one of its events is handled: an
        executor acts on a write within milliseconds, and its events (the old attempt stopping where a
        move dropped it) must be judged against the record that write stored, not the one before it."""
        return self._job_locks.setdefault(job_id, asyncio.Lock())

    def _acted(self, job_id: str, t: asyncio.Task) -> None:
        """A move's write ended (`_follow` started it): a pass follows, since passes meanwhile left the job
        alone (a GPU a parked job awaits may have come free); a failed one is tried again then."""
        if self._acting.get(job_id) is t:
            del self._acting[job_id]
        if not t.cancelled() and t.exception() is not None:
            self._broken("move_failed", t.exception(), job_id=job_id)
            asyncio.get_running_loop().call_later(0.5, self._follow_soon)
        elif not t.cancelled():
            self._follow_soon()

    async def moved(self) -> None:
        """Wait for the moves being written (tests)."""
        while self._acting:
            await asyncio.gather(*self._acting.values(), return_exceptions=True)

    async def _act(self, a: Move) -> None:
        async with self._job_lock(a.job_id):
            await self._act_on(a)

    async def _act_on(self, a: Move) -> None:
        r = self.records.get(a.job_id)
        if r is None or r.terminal:
            return
        gained = [g for g in a.gpus if self.owner.get(g) != r.job_id]
        if a.kind == "park" and any(g in self.owner for g in gained):
            return await self._park(r, a, gained)
        if any(g in self.owner for g in gained):
            return  # its last holder has not released it yet: that event brings the next pass
        if a.kind == "park":  # (its GPUs came free meanwhile)
            a = replace(a, kind="resize")
        # A move happens at the old attempt's next epoch boundary, which only the nodes it runs on know.
        # Nodes that join get their allocation once the old attempt released its GPUs everywhere (`_join`):
        # sooner, their ranks would wait for the others for up to an epoch (past the rendezvous timeout),
        # or, when no old node stays, train an epoch the old attempt is still training. So does a start of a
        # job requeued while its attempt still runs to its boundary (its record no longer names those GPUs).
        releasing = tuple(g for g, j in self.owner.items() if j == r.job_id)  # by the old attempt, not yet
        old_nodes = list(dict.fromkeys(g[0] for g in r.gpus + releasing))
        new_nodes = list(dict.fromkeys(g[0] for g in a.gpus))
        joining = tuple(n for n in new_nodes if n not in old_nodes) if releasing else ()
        new = replace(r, state=st.STARTING if a.kind == "start" else st.RESIZING, target=a.gpus,
                      attempt=r.attempt + 1, sent_s=time.time(), message="", joining=joining,
                      releasing=releasing if joining else ())
        value = await self._directive(new, a.kind)
        ok = await self._write(r.job_id, record=new, claim={g: self.nodes[g[0]].lease_id for g in gained},
                               put={n: (value, self.nodes[n].lease_id) for n in new_nodes if n not in joining},
                               drop=[n for n in old_nodes if n not in new_nodes])
        if not ok:  # a GPU is someone else's (a profiling trial) or a node left: try again soon
            asyncio.get_running_loop().call_later(CLAIM_RETRY_S, self._follow_soon)
            return
        log.info("dispatch", job_id=r.job_id, kind=a.kind, gpus=a.gpus, attempt=new.attempt_id)

    async def _park(self, r: JobRecord, a: Move, gained: Sequence[Gpu]) -> None:
        """Park a running job (follow.py): its allocations go, so its attempt stops at its next epoch
        boundary (the step's), keeping its claims on the GPUs the step keeps; it claims the gained GPUs
        that are free now and awaits the others; every node of the step joins once the old attempt
        released its GPUs and the awaited ones are its (`_book`, `_complete`)."""
        free = {g: self.nodes[g[0]].lease_id for g in gained if g not in self.owner}
        new = replace(r, state=st.RESIZING, target=a.gpus, attempt=r.attempt + 1, sent_s=0.0, message="",
                      joining=tuple(dict.fromkeys(g[0] for g in a.gpus)),
                      releasing=tuple(g for g in r.gpus if self.owner.get(g) == r.job_id),
                      awaiting=tuple(g for g in gained if g not in free))
        if not await self._write(r.job_id, record=new, claim=free, drop=list(dict.fromkeys(g[0] for g in r.gpus))):
            asyncio.get_running_loop().call_later(CLAIM_RETRY_S, self._follow_soon)
            return
        log.info("park", job_id=r.job_id, gpus=a.gpus, attempt=new.attempt_id, awaiting=len(new.awaiting))
        await self._complete(self.records[r.job_id])

    async def _book(self, job_id: str) -> None:
        """Claim the awaited GPUs (`_park`) their holders released; with all in hand, the move completes."""
        async with self._job_lock(job_id):
            r = self.records.get(job_id)
            free = [g for g in (r.awaiting if r is not None and not r.terminal else ())
                    if g not in self.owner and g[0] in self.nodes]  # (a lost node's jobs are requeued)
            if not free:
                return
            new = replace(r, awaiting=tuple(g for g in r.awaiting if g not in free))
            if not await self._write(job_id, record=new, claim={g: self.nodes[g[0]].lease_id for g in free}):
                asyncio.get_running_loop().call_later(CLAIM_RETRY_S, self._follow_soon)
                return
            await self._complete(self.records[job_id])

    async def _join(self, r: JobRecord, released: Sequence[Gpu]) -> None:
        """The old attempt of a job that moves released these GPUs; once it released them all (and, parked,
        holds every GPU it awaited), the nodes the move joins get their allocations (`_complete`)."""
        r = await self._update(r.job_id, lambda c: replace(c, releasing=tuple(g for g in c.releasing if g not in released))
                               if c.joining and c.attempt == r.attempt else None)
        if r is not None:
            await self._complete(r)

    async def _complete(self, r: JobRecord) -> None:
        """A move whose old attempt released everything and whose GPUs are all its own: the nodes it joins
        get their allocations (first, then the record says so: a write that fails, as one lost with a
        planner that failed, is done again when the event comes again or at the next release). A parked
        move is sent now (`sent_s`, from which its start overhead counts: the wait for the holders is not
        the start's)."""
        if not r.joining or r.releasing or r.awaiting or r.terminal:
            return
        value = await self._directive(r, "resize")
        if await self._write(r.job_id, put={n: (value, self.nodes[n].lease_id) for n in r.joining if n in self.nodes}):
            await self._update(r.job_id, lambda c: replace(c, joining=(), sent_s=c.sent_s or time.time())
                               if c.attempt == r.attempt else None)

    async def _directive(self, r: JobRecord, kind: str) -> bytes:
        """The allocation of the job's attempt on `target` (every node of it gets the same)."""
        from omru.v1 import executor_pb2
        from services.planner import convert

        # rank 0 binds a port its host has free and publishes it in the shared checkpoint folder (port 0)
        host = self.nodes[r.target[0][0]].address.rpartition(":")[0]
        d = convert.directive(executor_pb2.DIRECTIVE_KIND_START, r, r.target, f"{host}:0",
                              await self._checkpoint_dir(r.job_id), f"{r.attempt_id}-{kind}")
        return d.SerializeToString(deterministic=True)

    async def _checkpoint_dir(self, job_id: str) -> str:
        """<root>/<batch>/<job>: the batch is its origin in ms, so a later batch never resumes an old checkpoint."""
        return f"{self.checkpoint_root}/{await self._batch_folder()}/{job_id}"

    async def _batch_folder(self) -> str:
        """The current batch's folder under the checkpoint root (retention.batch_folder of its origin)."""
        if self._origin is None:  # (stored once, never changed: read once)
            self._origin = await self.state.origin()
        return retention.batch_folder(self._origin)

    async def _write(self, job_id: str, **change) -> bool:
        """One desired-state transaction for the job (PlannerState.change); False when a GPU to claim is
        taken or a node's lease is gone (nothing was written)."""
        from services.common.etcd import LeaseNotFound

        try:
            result = await self.state.change(job_id, **change)
        except LeaseNotFound as exc:
            log.info("allocation_refused", job_id=job_id, error=str(exc)[:200])
            return False
        except st.IllegalMove as exc:
            log.error("illegal_move", job_id=job_id, error=str(exc))
            return False
        if not result.succeeded:
            log.info("claim_refused", job_id=job_id, held=[kv.key for kv in result.existing][:4])
            return False
        for g in change.get("claim", ()):
            self.owner[g] = job_id
        for g in change.get("release", ()):
            self.owner.pop(g, None)
        if change.get("release"):
            self.trials.freed()
        if change.get("record") is not None:
            self._stored(replace(change["record"], revision=result.revision))
        return True

    async def _release(self, job_id: str, gpus: Sequence[Gpu]) -> None:
        """Give up the job's claims on these GPUs (its executor released them)."""
        mine = [g for g in gpus if self.owner.get(g) == job_id]
        if mine:
            await self._write(job_id, release=mine)

    async def _deallocate(self, r: JobRecord, gpus: Sequence[Gpu]) -> None:
        """Remove the job's allocation of the nodes of these GPUs (their executors stop it)."""
        nodes = list(dict.fromkeys(g[0] for g in gpus))
        if nodes:
            await self._write(r.job_id, drop=nodes)

    async def _requeue(self, r: JobRecord, why: str) -> None:
        """Stop the job's attempt wherever it runs and let it wait for the next plan (it resumes from its
        last checkpoint); its GPUs come back as its executors release them."""
        await self._forget_later(r)
        await self._deallocate(r, [g for g in r.gpus + r.target if g[0] in self.nodes])
        await self._update(r.job_id, lambda c: None if c.terminal else replace(
            c, state=st.WAITING, gpus=(), target=(), world_size=0, attempt=c.attempt + 1,
            message=f"{why}; resumes from its last checkpoint"))
        self.poke()

    async def _forget_later(self, r: JobRecord) -> None:
        """Drop the allocations the job's move still waited to put (`joining`): no executor got them, so
        the planner itself gives up the GPUs it claimed there (not those its old attempt still runs on:
        their executors release them), and it awaits nothing more."""
        if r.joining:
            await self._release(r.job_id, [g for g in r.target if g[0] in r.joining and g not in r.releasing])
            await self._update(r.job_id, lambda c: replace(c, joining=(), releasing=(), awaiting=())
                               if c.joining else None)
