"""ProfilerService servicer (placeholder until its issue fills it in: every RPC answers UNIMPLEMENTED)."""

from __future__ import annotations

from omru.v1 import profiler_pb2_grpc


class ProfilerServicer(profiler_pb2_grpc.ProfilerServiceServicer):
    """omru.v1.ProfilerService; the generated base answers UNIMPLEMENTED for every RPC."""
