"""PlannerService servicer (placeholder until its issue fills it in: every RPC answers UNIMPLEMENTED)."""

from __future__ import annotations

from omru.v1 import planner_pb2_grpc


class PlannerServicer(planner_pb2_grpc.PlannerServiceServicer):
    """omru.v1.PlannerService; the generated base answers UNIMPLEMENTED for every RPC."""
