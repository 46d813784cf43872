"""Generated gRPC stubs of package omru.v1 (`make protos`)."""
