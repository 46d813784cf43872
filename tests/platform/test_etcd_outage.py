"""etcd stopped and restarted: UNAVAILABLE meanwhile, serving again afterwards without a restart."""

from __future__ import annotations

import asyncio
import time

import grpc

from omru.v1 import registry_pb2
from platform_helpers import Collector, job_spec, register_request, rpc_error


async def _until_serving(call_factory, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call_factory()
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_registry_answers_unavailable_while_etcd_is_down_and_serves_again_after_restart(etcd, registry_stub):
    await registry_stub.RegisterNode(register_request("node-o", ttl=60))
    await registry_stub.PutJob(registry_pb2.PutJobRequest(spec=job_spec("kept")))
    listed = await registry_stub.ListJobs(registry_pb2.ListJobsRequest())
    watch = Collector(registry_stub.WatchCluster(registry_pb2.WatchClusterRequest(after_revision=listed.revision)))

    await asyncio.to_thread(etcd.stop)
    for call in (
        registry_stub.ListNodes(registry_pb2.ListNodesRequest()),
        registry_stub.GetJob(registry_pb2.GetJobRequest(job_id="kept")),
        registry_stub.PutJob(registry_pb2.PutJobRequest(spec=job_spec("during"))),
    ):
        error = await rpc_error(call)
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert etcd.endpoint in error.details()

    await asyncio.to_thread(etcd.start)  # same ports, same data
    jobs = await _until_serving(lambda: registry_stub.ListJobs(registry_pb2.ListJobsRequest()))
    assert [j.spec.job_id for j in jobs.jobs] == ["kept"]
    assert (await registry_stub.GetNode(registry_pb2.GetNodeRequest(node_id="node-o"))).node.node_id == "node-o"
    after = (await registry_stub.PutJob(registry_pb2.PutJobRequest(spec=job_spec("after")))).job.revision
    event = await watch.wait_for(lambda e: e.revision == after, timeout=15)  # the open watch resumed by itself
    assert event.job.spec.job_id == "after"
    assert watch.error is None
    await watch.close()
