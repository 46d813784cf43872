"""ExecutorService servicer (placeholder until its issue fills it in: every RPC answers UNIMPLEMENTED)."""

from __future__ import annotations

from omru.v1 import executor_pb2_grpc


class ExecutorServicer(executor_pb2_grpc.ExecutorServiceServicer):
    """omru.v1.ExecutorService; the generated base answers UNIMPLEMENTED for every RPC."""
