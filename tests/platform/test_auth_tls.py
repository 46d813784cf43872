"""Optional bearer-token auth (UNAUTHENTICATED without it) and TLS on the server bootstrap.
(Who may call which RPC: test_authz.py.)"""

from __future__ import annotations

import asyncio
import subprocess

import grpc
from conftest import start_registry
from grpc_health.v1 import health_pb2, health_pb2_grpc

from omru.v1 import registry_pb2, registry_pb2_grpc
from platform_helpers import register_request, rpc_error
from services.common.channels import open_channel


async def test_with_auth_on_calls_without_the_right_token_are_unauthenticated(etcd):
    from services.common.authz import NODE, Principal

    server = await start_registry(etcd.endpoint, auth_token="s3cret-token", tokens={"node-a-token": Principal(NODE, "node-a")})
    anonymous = open_channel(server.address)
    wrong = open_channel(server.address, token="guess")
    right = open_channel(server.address, token="s3cret-token")  # an admin's: reads, but registers no node
    node = open_channel(server.address, token="node-a-token")
    for channel, what in ((anonymous, "missing"), (wrong, "wrong")):
        stub = registry_pb2_grpc.RegistryServiceStub(channel)
        error = await rpc_error(stub.RegisterNode(register_request("node-a")))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert what in error.details()
        stream_error = await rpc_error(stub.WatchCluster(registry_pb2.WatchClusterRequest()).read())
        assert stream_error.code() == grpc.StatusCode.UNAUTHENTICATED
    stub = registry_pb2_grpc.RegistryServiceStub(right)
    assert not (await stub.ListNodes(registry_pb2.ListNodesRequest())).nodes  # nothing was stored by the refused calls
    await registry_pb2_grpc.RegistryServiceStub(node).RegisterNode(register_request("node-a"))
    assert [n.node_id for n in (await stub.ListNodes(registry_pb2.ListNodesRequest())).nodes] == ["node-a"]
    watch = stub.WatchCluster(registry_pb2.WatchClusterRequest(after_revision=1))  # streams carry the token too
    first = await asyncio.wait_for(watch.read(), 10)
    assert "node-a" in str(first)
    watch.cancel()
    health = await health_pb2_grpc.HealthStub(anonymous).Check(health_pb2.HealthCheckRequest(service="omru.v1.RegistryService"))
    assert health.status == health_pb2.HealthCheckResponse.SERVING  # probes need no token
    for channel in (anonymous, wrong, right, node):
        await channel.close()
    await server.stop(0)


async def test_tls_server_serves_clients_that_trust_its_certificate(etcd, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    from services.common.config import TlsConfig

    server = await start_registry(etcd.endpoint, tls=TlsConfig(cert, key))
    channel = open_channel(server.address, tls=TlsConfig(ca_file=cert))
    stub = registry_pb2_grpc.RegistryServiceStub(channel)
    assert (await stub.RegisterNode(register_request("node-tls"))).node.node_id == "node-tls"
    plain = open_channel(server.address)
    error = await rpc_error(registry_pb2_grpc.RegistryServiceStub(plain).ListNodes(registry_pb2.ListNodesRequest(), timeout=2))
    assert error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    for c in (channel, plain):
        await c.close()
    await server.stop(0)
