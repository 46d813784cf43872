"""An executor configured with a planner address applies the directives the
planner streams for its node (PlannerService.WatchDirectives), reconnects
after a broken stream, acknowledges re-sent directives without redoing them,
and reports a refused directive as a FAILED event.

The planner here is a stand-in that serves only WatchDirectives from a
script, so the test can break the stream at a chosen point; the executor,
registry and workers are real."""

from __future__ import annotations

import asyncio

import grpc

from omru.v1 import planner_pb2, planner_pb2_grpc
from services.common.config import ServerConfig
from services.common.server import Service, service_name, start_server
from tests.executor.service_builders import K, START, claims_of, directive, executors, gpu, is_event, tiny_job


class ScriptedPlanner(planner_pb2_grpc.PlannerServiceServicer):
    """Stream n (0-based) of WatchDirectives sends scripts[n], then breaks (UNAVAILABLE) or stays open (last)."""

    def __init__(self, scripts):
        self.scripts = scripts
        self.calls: list[str] = []

    async def WatchDirectives(self, request, context):
        n = len(self.calls)
        self.calls.append(request.node_id)
        for d in self.scripts[min(n, len(self.scripts) - 1)]:
            yield planner_pb2.WatchDirectivesResponse(directive=d)
        if n < len(self.scripts) - 1:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "planner restarting")
        await asyncio.Event().wait()


async def test_streamed_directives_are_applied_once_across_a_reconnect_and_refusals_become_failed_events(registry, tmp_path):
    start = directive("s-1", START, tiny_job("streamed", epochs=2), [gpu("n1", 0)])
    bad = directive("s-2", START, tiny_job("bad", model="no-such-net"), [gpu("n1", 1)])
    planner = ScriptedPlanner([[start], [start, bad]])
    running = await start_server(ServerConfig(), [Service(planner_pb2_grpc.add_PlannerServiceServicer_to_server, planner,
                                                          service_name(planner_pb2, "PlannerService"))])
    try:
        async with executors(registry.address, tmp_path, ("n1", 2), planner=running.address) as (ex,):
            events = ex.events()
            refused = await events.wait_for(is_event("bad", K.EXECUTOR_EVENT_KIND_FAILED))
            assert "directive 's-2' refused" in refused.message and "no-such-net" in refused.message
            await events.wait_for(is_event("streamed", K.EXECUTOR_EVENT_KIND_GPUS_RELEASED))
            assert planner.calls[:2] == ["n1", "n1"]  # subscribed for its node, and again after the break
            assert len(events.of("streamed", K.EXECUTOR_EVENT_KIND_STARTED)) == 1  # the re-sent START was not redone
            assert [e.epoch for e in events.of("streamed", K.EXECUTOR_EVENT_KIND_EPOCH_DONE)] == [1, 2]
            assert await claims_of(registry.address, "bad") == []
            events.close()
    finally:
        await running.stop(0)
