"""Multi-host: head, host-a and host-b are network namespaces (cluster.py), one CPU slot per executor.

A job spans the two hosts and trains with gloo across them. Cutting a
host's cable, or killing its executor, is seen through the node's lease
within TTL + 2 s; the planner replans and the job resumes from its last
checkpoint (in the shared folder that is the planner's --checkpoint-root) on
the other host, every epoch done once (but the one the fault
cut short). etcd restarted mid-run loses no job: the services reconnect by
themselves and the batch completes.
"""

from __future__ import annotations

import asyncio
import collections
import time

import pytest

from omru import workload
from omru.client import Client
from tests.multihost.cluster import NODES

pytestmark = pytest.mark.multihost

# tiny: 96 digits at 8x8, 3 steps per rank and epoch; the planner believes a second GPU halves an epoch
JOB = dict(model="mobilenet_v3_small", dataset="digits", image_size=8, batch_size=16, base_batch=16, base_lr=0.02,
           warmup_epochs=1, seed=0, train_samples=96, lr_decay="none", max_gpus=2, profile={1: 40.0, 2: 20.0})


def batch(*jobs: dict) -> workload.Workload:
    return workload.from_dict({"jobs": [{**JOB, **j} for j in jobs]})


async def planner_view(cluster):
    """(events, jobs) as the planner stored them in etcd."""
    from services.common.etcd import EtcdStore
    from services.planner.state import PlannerState

    store = EtcdStore(cluster.etcd_endpoint, "/omru/", timeout=5.0)
    await store.connect()
    try:
        state = PlannerState(store)
        return await state.events(), {r.job_id: r for r in await state.jobs()}
    finally:
        await store.close()


def epochs_done(events, job_id: str) -> collections.Counter:
    return collections.Counter(e.epoch for e in events if e.job_id == job_id and e.kind == "epoch_done")


async def until(client: Client, check, timeout_s: float, what: str) -> dict:
    """Follow WatchJobs until check(latest statuses by id) holds; returns them."""
    latest = {}
    async for s in client.watch(timeout_s=timeout_s):
        latest[s.job_id] = s
        if check(latest):
            return latest
    raise AssertionError(f"{what} not within {timeout_s} s: {latest}")


async def submit_when_both_hosts_count(client: Client, cluster, jobs: workload.Workload) -> None:
    await cluster.wait_nodes(len(NODES))
    deadline = time.monotonic() + 30
    while (await client.report()).gpus < len(NODES) and time.monotonic() < deadline:  # the planner saw both
        await asyncio.sleep(0.2)
    await client.submit(jobs)


def all_finished(ids):
    return lambda latest: all(i in latest and latest[i].done for i in ids)


async def test_a_job_spanning_two_hosts_trains_with_gloo_across_them_every_epoch_once(multihost):
    async with Client(multihost.planner) as c:
        await submit_when_both_hosts_count(c, multihost, batch({"id": "span", "epochs": 3, "min_gpus": 2}))
        final = await until(c, all_finished(["span"]), 300, "span finished")
    events, _ = await planner_view(multihost)
    assert final["span"].state == "FINISHED", (final, multihost.log("host-a"))
    started = [e for e in events if e.job_id == "span" and e.kind == "started"]
    # one rank on each host, one world of two: the ranks met over the bridge
    assert {e.node_id for e in started} == set(NODES), started
    assert {e.world_size for e in started} == {2} and len({e.attempt_id for e in started}) == 1, started
    assert epochs_done(events, "span") == {1: 1, 2: 1, 3: 1}
    assert {e.world_size for e in events if e.job_id == "span" and e.kind == "epoch_done"} == {2}


async def watch_removals(registry: str, removed: dict[str, float], watching: asyncio.Event) -> None:
    """Record when the registry reports each node removed (time.monotonic())."""
    from omru.v1 import registry_pb2, registry_pb2_grpc
    from services.common.channels import open_channel

    async with open_channel(registry) as channel:
        stub = registry_pb2_grpc.RegistryServiceStub(channel)
        listing = await stub.ListNodes(registry_pb2.ListNodesRequest(), timeout=5)
        call = stub.WatchCluster(registry_pb2.WatchClusterRequest(after_revision=listing.revision))
        await call.wait_for_connection()
        watching.set()
        async for reply in call:
            for e in reply.events:
                if e.kind == registry_pb2.CLUSTER_EVENT_KIND_NODE_REMOVED:
                    removed.setdefault(e.node.node_id, time.monotonic())


@pytest.mark.parametrize("fault", ["cut the cable", "kill the executor"])
async def test_a_lost_host_is_seen_through_its_lease_and_its_job_resumes_on_the_other_host(multihost, fault):
    epochs, victim = 6, "host-b"
    async with Client(multihost.planner) as c:
        await submit_when_both_hosts_count(c, multihost, batch({"id": "j", "epochs": epochs, "train_samples": 480}))
        removed, watching = {}, asyncio.Event()
        watcher = asyncio.get_running_loop().create_task(watch_removals(multihost.registry, removed, watching))
        await asyncio.wait_for(watching.wait(), 10)
        before = await until(c, lambda s: "j" in s and s["j"].epochs_done >= 2, 300, "two epochs on two hosts")
        assert before["j"].world_size == 2 and before["j"].epochs_done < epochs, before
        began = time.monotonic()
        if fault == "cut the cable":
            multihost.host(victim).cut()
        else:
            multihost.services[victim].kill()
        while victim not in removed and time.monotonic() - began < multihost.ttl + 10:
            await asyncio.sleep(0.05)
        watcher.cancel()
        seen_s = removed.get(victim, float("inf")) - began
        print(f"\n{fault}: {victim} removed from the registry {seen_s:.2f} s after the fault (TTL {multihost.ttl} s)")
        assert seen_s <= multihost.ttl + 2, f"{victim} still listed {seen_s:.2f} s after the fault"
        final = await until(c, all_finished(["j"]), 300, "j finished")
    events, _ = await planner_view(multihost)
    assert final["j"].state == "FINISHED", (final, multihost.log("host-a"))
    counts = epochs_done(events, "j")
    assert set(counts) == set(range(1, epochs + 1)), counts
    assert sum(c - 1 for c in counts.values()) <= 1, f"an epoch beyond the interrupted one ran twice: {counts}"
    after = [e for e in events if e.job_id == "j" and e.kind == "started" and e.world_size == 1]
    assert after and {e.node_id for e in after} == {"host-a"}, after
    # it resumed from its last checkpoint: the epoch it resumed at had been done before the fault
    assert max(e.epoch for e in after) >= before["j"].epochs_done, (after, before)
    # the checkpoints are where the planner's --checkpoint-root put them: the shared folder both hosts see
    saved = list(multihost.checkpoints.glob("batch-*/j/epoch-*.pt"))
    assert saved and max(int(p.stem.split("-")[1]) for p in saved) >= before["j"].epochs_done, saved


async def test_etcd_restarted_mid_run_loses_no_job_and_the_services_reconnect_by_themselves(multihost):
    ids = ["p", "q"]
    async with Client(multihost.planner) as c:
        await submit_when_both_hosts_count(c, multihost, batch(*({"id": i, "epochs": 5, "max_gpus": 1, "train_samples": 480,
                                                                    "profile": {1: 40.0}} for i in ids)))
        await until(c, lambda s: any(x.epochs_done >= 1 for x in s.values()), 300, "a first epoch")
        # (in this thread: etcd's parent-death signal is bound to the thread that starts it)
        multihost.etcd.stop()
        await asyncio.sleep(2 * multihost.ttl)  # an outage longer than the node leases
        multihost.etcd.start()
        during = await until(c, lambda s: True, 30, "the planner answering")
        assert any(not s.done for s in during.values()), f"the batch ended before etcd came back: {during}"
        final = await until(c, all_finished(ids), 300, "the batch finished")
        late = batch({"id": "late", "epochs": 1, "max_gpus": 1, "profile": {1: 40.0}})
        await c.submit(late)  # the planner writes to the restarted etcd
        final.update(await until(c, all_finished(["late"]), 300, "a job submitted after the restart"))
    assert {i: s.state for i, s in final.items()} == {"p": "FINISHED", "q": "FINISHED", "late": "FINISHED"}, final
    assert await multihost.wait_nodes(len(NODES)) == sorted(NODES)
    events, jobs = await planner_view(multihost)
    for i in ids:
        assert epochs_done(events, i) == {e: 1 for e in range(1, 6)}, (i, epochs_done(events, i))
        assert jobs[i].epochs_done == 5
