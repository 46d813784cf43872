"""What the planner hears: the cluster and the executors' events (the Dispatcher's ingest).

`Ingest` follows the registry (WatchCluster: nodes joining, changing and
leaving; a lost node's jobs wait for the next plan) and every executor's event
log (WatchEvents from the node's stored cursor: the events that arrived while
the last were handled, handled together, with a job's run of epochs in one
record write, a job's end and the GPUs its attempt released on that node in
one transaction, and the events stored in one transaction per 100). It turns
them into job-state changes through the transition table of state.py, gives
up the claims of GPUs the executors released, learns epoch times per
placement (learn.py), and asks the Dispatcher for a follow pass (GPUs freed,
a job at a planned move) or a replan (a job failed, ended early, or runs off
its planned pace). A mixin of `Dispatcher` (dispatcher.py), whose state it
reads and changes.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Sequence

from services.common.logging import get_logger
from services.executor.servicer import is_refusal
from services.executor.supervisor import is_self_stop
from services.planner import report as ev
from services.planner import state as st
from services.planner.learn import observe
from services.planner.report import Event, Gpu
from services.planner.state import JobRecord

log = get_logger(__name__)

#: The most events of one node handled (and stored, in one transaction per 100) together.
EVENT_BATCH = 500
#: A job its executors refuse this many times in a row (a placement or spec they cannot run) fails,
#: with their reason, rather than being replanned onto the same refusal again and again.
MAX_REFUSALS = 3


class Ingest:
    """The cluster and executor events in; job records, claims and requests for a pass out."""

    async def _follow_cluster(self) -> None:
        from omru.v1 import registry_pb2

        backoff = 0.2
        while True:
            try:
                listing = await self._registry().ListNodes(registry_pb2.ListNodesRequest(), timeout=5)
                for n in listing.nodes:
                    self._node_up(n)
                self._node_set({n.node_id for n in listing.nodes})
                stream = self._registry().WatchCluster(registry_pb2.WatchClusterRequest(after_revision=listing.revision))
                async for batch in stream:
                    backoff = 0.2
                    for e in batch.events:
                        if e.kind in (registry_pb2.CLUSTER_EVENT_KIND_NODE_ADDED, registry_pb2.CLUSTER_EVENT_KIND_NODE_UPDATED):
                            self._node_up(e.node)
                        elif e.kind == registry_pb2.CLUSTER_EVENT_KIND_NODE_REMOVED:
                            await self._node_lost(e.node.node_id)
                        elif e.kind == registry_pb2.CLUSTER_EVENT_KIND_RESYNC:
                            break  # re-list below
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # registry away: keep what we know, retry
                log.warning("cluster_watch_broken", error=str(exc))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    def _node_set(self, live: set[str]) -> None:
        for node_id in [n for n in self.nodes if n not in live]:
            asyncio.get_running_loop().create_task(self._node_lost(node_id))

    def _node_up(self, node) -> None:
        known = self.nodes.get(node.node_id)
        self.nodes[node.node_id], self._gpus = node, None
        self.gpu_total = max(self.gpu_total, sum(len(n.gpus) for n in self.nodes.values()))
        if known is None or known.address != node.address or node.node_id not in self._followers:
            old = self._followers.pop(node.node_id, None)
            if old:
                old.cancel()
            self._followers[node.node_id] = asyncio.get_running_loop().create_task(self._follow_node(node.node_id))
            log.info("node_up", node=node.node_id, gpus=len(node.gpus))
            self.poke()
            self.trials.freed()

    async def _node_lost(self, node_id: str) -> None:
        if self.nodes.pop(node_id, None) is None:
            return
        self._gpus = None
        t = self._followers.pop(node_id, None)
        if t:
            t.cancel()
        log.warning("node_lost", node=node_id)
        for g in [g for g in self.owner if g[0] == node_id]:  # its claims went with its lease
            del self.owner[g]
        self.trials.node_lost(node_id)
        for r in list(self.records.values()):
            if not r.terminal and any(g[0] == node_id for g in r.gpus + r.target):
                await self._requeue(r, f"node {node_id} lost")

    async def _follow_node(self, node_id: str) -> None:
        from omru.v1 import executor_pb2
        from services.planner import convert

        backoff = 0.2
        while node_id in self.nodes:
            try:
                stub = self._executor(node_id)
                jobs = await stub.GetJobs(executor_pb2.GetJobsRequest(), timeout=5)
                gen, seq = await self.state.cursor(node_id)
                if jobs.last_seq < seq:  # the executor restarted: its log begins again
                    gen, seq = gen + 1, 0
                    await self.state.set_cursor(node_id, gen, 0)
                call = stub.WatchEvents(executor_pb2.WatchEventsRequest(after_seq=seq))
                # a trial's events go to the trials (not stored, not the jobs' bookkeeping)
                async for batch in _batches(call, lambda e: None if self.trials.take(e) else convert.event(e)):
                    backoff = 0.2
                    # acted on before they are stored with the cursor: events whose handling failed (etcd
                    # away) come again when the stream reopens (handling one twice changes nothing)
                    await self._on_events(batch)
                    await self.state.add_events(gen, batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._broken("executor_watch_broken", exc, node_id=node_id)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _on_events(self, events: Sequence[Event]) -> None:
        """A node's events in order, each job's run of epoch_done events in one record write (a stream
        that fell behind catches up in fewer writes), and a job's end with the GPUs its attempt released
        on this node right after it (in the same batch) in one transaction."""
        epochs: dict[str, list[Event]] = {}
        for i, e in enumerate(events):
            if e.kind == ev.EPOCH_DONE:
                epochs.setdefault(e.job_id, []).append(e)
                continue
            async with self._job_lock(e.job_id):
                if e.job_id in epochs:
                    await self._on_epochs(epochs.pop(e.job_id))
                released = [g for x in events[i + 1:] if x.kind == ev.GPUS_RELEASED and x.job_id == e.job_id
                            and x.attempt_id == e.attempt_id for g in x.gpus if g[0] == e.node_id] \
                    if e.kind == ev.FINISHED else ()
                await self._on_event(e, released)
        for job_id, run in epochs.items():
            async with self._job_lock(job_id):
                await self._on_epochs(run)

    async def _record_for(self, e: Event) -> JobRecord | None:
        """The job's record as `e` must be judged against: the one in memory, or the stored one when `e`
        comes from a newer attempt (its executor answered the planner's write before the write's reply
        came back: a refusal takes milliseconds)."""
        r = self.records.get(e.job_id)
        if r is not None and r.attempt_of(e.attempt_id) > r.attempt:
            r = self._stored(await self.state.job(e.job_id)) or r
        return r

    async def _on_epochs(self, events: Sequence[Event]) -> None:
        """epoch_done events of one job, in order."""
        r = await self._record_for(events[-1])
        if r is None:
            return
        attempt = r.attempt_id
        for e in events:
            if e.attempt_id == attempt and r.sent_s and attempt not in self._measured:
                self._measured.add(attempt)  # the first epoch of this attempt
                self.overheads.append(max(0.0, (e.time_s - r.sent_s) * self.time_scale - e.epoch_seconds))

        def where(e: Event) -> tuple[int, int] | None:  # (GPUs, nodes) the epoch ran on, when known
            held = r.gpus if e.attempt_id == attempt else ()
            return (e.world_size, len({g[0] for g in held})) if e.world_size == len(held) else None

        def change(c: JobRecord) -> JobRecord:
            for e in events:
                key = where(e)
                c = replace(c, epochs_done=max(c.epochs_done, e.epoch),
                            accuracy=e.accuracy if e.epoch >= c.epochs_done else c.accuracy,
                            observed=observe(c.observed, key, e.epoch_seconds)
                            if key and e.epoch_seconds > 0 else c.observed,
                            progress_s=e.time_s if e.attempt_id == attempt else c.progress_s)
            return c

        r = await self._update(r.job_id, change)
        if r is None:
            return
        if self._due(r):
            self._follow_soon()
        for key in dict.fromkeys(filter(None, map(where, events))):
            if self._departs(r, key):
                log.info("replan_on_deviation", job_id=r.job_id, gpus=key[0], nodes=key[1],
                         observed_s=round(r.observed[key][0], 3),
                         planned_s=round(self._timing[r.job_id].epoch_seconds(*key), 3))
                self.poke()

    async def _on_event(self, e: Event, released: Sequence[Gpu] = ()) -> None:
        """One event; `released`: for a FINISHED event, GPUs its attempt released on its node after it."""
        if e.kind == ev.EPOCH_DONE:
            return await self._on_epochs([e])
        r = await self._record_for(e)
        if r is None:
            return
        current = e.attempt_id == r.attempt_id
        if e.kind == ev.STARTED and current and not r.terminal:
            self._refusals.pop(r.job_id, None)
            await self._update(r.job_id, lambda c: replace(c, state=st.RUNNING, gpus=c.target, world_size=len(c.target),
                                                           progress_s=e.time_s)
                               if c.attempt_id == e.attempt_id and not c.terminal else None)
            self._follow_soon()
        elif e.kind == ev.FINISHED:
            if not r.terminal:  # its allocations go (an executor that restarts must not run it again), and
                # the claims on what it released here already, in the transaction that stores it finished
                await self._forget_later(r)
                r = self.records[r.job_id]
                await self._write(r.job_id, record=replace(r, state=st.FINISHED, epochs_done=r.epochs,
                                                           finished_s=e.time_s, message=""),
                                  drop=list(dict.fromkeys(g[0] for g in r.gpus + r.target)),
                                  release=[g for g in released if self.owner.get(g) == r.job_id])
                if self._ended_early(r.job_id):
                    self.poke()
            self._follow_soon()
        elif e.kind == ev.GPUS_RELEASED and current and not r.terminal and is_self_stop(e.message):
            # the node ended the attempt it was allocated on its own (its lease lapsed, it shut down)
            await self._release(r.job_id, [g for g in e.gpus if g[0] == e.node_id])
            await self._requeue(r, f"{e.node_id}: {e.message}")
        elif e.kind == ev.GPUS_RELEASED:
            # an older attempt's release leaves the GPUs the current one moved onto; the current attempt's
            # own (a node without rank 0 ends before rank 0's node reports FINISHED) leaves nothing
            keep = set() if r.terminal or current else set(r.target)
            await self._release(r.job_id, [g for g in e.gpus if g[0] == e.node_id and g not in keep])
            if r.joining and not current:  # the old attempt released these: are they all it held?
                await self._join(r, e.gpus)
            self._follow_soon()
        elif e.kind == ev.FAILED and current and not r.terminal and is_refusal(e.message) and (
                self._refused(r.job_id) < MAX_REFUSALS):
            await self._requeue(r, f"{e.node_id} refused it ({e.message})")
        elif e.kind == ev.FAILED and current and not r.terminal:
            await self._forget_later(r)
            await self._deallocate(r, r.gpus + r.target)
            await self._update(r.job_id, lambda c: None if c.terminal or c.attempt_id != e.attempt_id else replace(
                c, state=st.FAILED, finished_s=e.time_s, message=f"failed on {e.node_id}: {e.message}" if e.message else f"failed on {e.node_id}"))
            self.poke()

    def _refused(self, job_id: str) -> int:
        """Count one more refusal of the job's directives in a row; the count."""
        self._refusals[job_id] = self._refusals.get(job_id, 0) + 1
        return self._refusals[job_id]


async def _batches(call, convert_event):
    """The events of an executor's WatchEvents stream in batches: each batch all that arrived while the
    last one was handled (one event when the planner keeps up; at most EVENT_BATCH). The stream's error
    comes after the events read before it."""
    queue: asyncio.Queue = asyncio.Queue()

    async def read() -> None:
        try:
            async for reply in call:
                e = convert_event(reply.event)
                if e is not None:
                    queue.put_nowait(e)
        except Exception as exc:  # (the reader's end is the batches' end: None or the error, queued last)
            queue.put_nowait(exc)
        else:
            queue.put_nowait(None)

    reader = asyncio.ensure_future(read())
    try:
        while True:
            batch = [await queue.get()]
            while not queue.empty() and len(batch) < EVENT_BATCH:
                batch.append(queue.get_nowait())
            end = batch[-1]
            if end is not None and not isinstance(end, Exception):
                yield batch
                continue
            if batch[:-1]:
                yield batch[:-1]
            if end is None:
                return
            raise end
    finally:
        reader.cancel()
        call.cancel()
