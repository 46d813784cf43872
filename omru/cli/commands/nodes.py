"""`omru nodes [--json]`: every live node of the cluster (RegistryService.ListNodes): its executor's
address, its GPUs (count and kind) and which job holds each (RegistryService.ListClaims), when it
registered and its lease's time to live."""

from __future__ import annotations

from omru.cli import plannerargs


def register(subparsers) -> None:
    p = subparsers.add_parser("nodes", help="list the cluster's nodes, their GPUs and who holds them", description=__doc__)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--registry", default=None,
                   help="registry address host:port (default: $OMRU_REGISTRY, else the context `omru up` wrote)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the registry (default 10)")
    plannerargs.add_token(p)
    plannerargs.add_tls(p)
    p.set_defaults(func=handle)


def _kinds(gpus) -> str:
    from collections import Counter

    counts = Counter(g.kind or "?" for g in gpus)
    return ", ".join(f"{n}x {kind}" for kind, n in sorted(counts.items())) or "none"


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def handle(args) -> int:
    import asyncio
    import json
    import time

    import grpc

    from omru.cli.errors import CliError, from_rpc

    if not 0 < args.timeout <= 3600:
        raise CliError(f"--timeout {args.timeout} is not in (0, 3600]")
    conn = plannerargs.connection(args, "registry")
    tls = plannerargs.tls_of(conn)

    async def read():
        from omru.client import node_listing
        from omru.v1 import registry_pb2_grpc
        from services.common.channels import open_channel

        async with open_channel(conn.address, token=conn.token, tls=tls, deadline=args.timeout) as channel:
            return await node_listing(registry_pb2_grpc.RegistryServiceStub(channel), args.timeout)

    try:
        nodes, holder = asyncio.run(read())
    except grpc.RpcError as exc:
        raise from_rpc(exc, "registry", conn.address, conn.source) or \
            CliError(f"registry said {exc.code().name}: {exc.details()}") from None
    now = time.time()
    rows = []
    for n in nodes.nodes:
        rows.append({
            "node_id": n.node_id, "address": n.address,
            "gpus": [{"index": g.index, "kind": g.kind, "memory_bytes": g.memory_bytes,
                      "job_id": holder.get((n.node_id, g.index), "")} for g in n.gpus],
            "lease_id": n.lease_id, "ttl_seconds": n.ttl_seconds, "registered_unix_s": n.registered_unix_s,
            "age_s": round(max(0.0, now - n.registered_unix_s), 3) if n.registered_unix_s else None,
        })
    if args.json:
        print(json.dumps({"nodes": rows, "revision": nodes.revision}))
        return 0
    if not rows:
        print(f"no live nodes (registry {conn.address})")
        return 0
    print(f"{'NODE':<16} {'ADDRESS':<22} {'GPUS':<18} {'HELD BY':<30} {'UP':>6} {'TTL':>5}")
    for n, row in zip(nodes.nodes, rows):
        held = " ".join(f"{g['index']}:{g['job_id'] or '-'}" for g in row["gpus"])
        up = _age(row["age_s"]) if row["age_s"] is not None else "?"
        print(f"{n.node_id:<16} {n.address:<22} {len(n.gpus)} ({_kinds(n.gpus)})".ljust(58) +
              f" {held:<30} {up:>6} {n.ttl_seconds:>4}s")
    return 0
