"""`omru logs` and `Client.logs` with only the planner's address: the planner reads each node's logs through
its executor (PlannerService.GetJobLogs). Real etcd, registry, planner and executor; the jobs are scripts
that wait for a file, so following them is deterministic."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc

from omru import errors
from omru.client import Client, SyncClient
from omru.v1 import common_pb2, planner_pb2
from tests.executor.service_builders import executors
from tests.planner_service.planner_helpers import planner
from tests.platform.platform_helpers import register_request

REPO = Path(__file__).resolve().parents[2]
GATE = """import os, sys, time
print("waiting for", sys.argv[1], flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("released", flush=True)
"""


def gate_job(job_id: str, tmp_path: Path) -> common_pb2.JobSpec:
    """A script job (one rank) that prints a line, waits for the file tmp_path/<job_id>.go, prints another."""
    script = tmp_path / "gate.py"
    script.write_text(GATE)
    return common_pb2.JobSpec(job_id=job_id, command=["python", str(script), str(tmp_path / f"{job_id}.go")],
                              workdir=str(tmp_path), epochs=1, batch_size=16, base_lr=0.05, base_batch=16,
                              max_gpus=1)


def omru(*args: str, planner_env: str = "", stderr=subprocess.PIPE) -> subprocess.Popen:
    """`omru logs ARGS` with $OMRU_PLANNER = planner_env (unset when empty) and no $OMRU_REGISTRY."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMRU_REGISTRY", "OMRU_PLANNER")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **({"OMRU_PLANNER": planner_env} if planner_env else {}))
    return subprocess.Popen([sys.executable, "-m", "omru", "logs", *args], stdout=subprocess.PIPE, stderr=stderr,
                            text=True, env=env)


async def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    try:
        out = await asyncio.wait_for(asyncio.to_thread(proc.stdout.read), timeout)
        return await asyncio.to_thread(proc.wait, timeout), out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def wait_state(d, job_id: str, states: set[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = await d.state.job(job_id)
        if r is not None and r.state in states:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{job_id} not in {states} within {timeout} s: {r}")


async def test_logs_through_the_planner_follow_a_running_job_and_read_a_finished_one(etcd, registry, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 2)), \
            planner(etcd.endpoint, registry.address, checkpoint_root=str(tmp_path / "ckpt"),
                    learn_profiles=False) as (running, d, stub):
        for _ in range(100):
            if len(d.live_gpus()) == 2:
                break
            await asyncio.sleep(0.1)
        jobs = [gate_job("gate-a", tmp_path), gate_job("gate-b", tmp_path)]
        await stub.SubmitJobs(planner_pb2.SubmitJobsRequest(jobs=jobs, profiles=[
            planner_pb2.JobProfile(job_id=j.job_id, epoch_seconds={1: 5.0}) for j in jobs]), timeout=10)
        await wait_state(d, "gate-a", {"RUNNING"})
        await wait_state(d, "gate-b", {"RUNNING"})

        # the SDK follows gate-a: what it printed so far, then what it prints next, then the end of the attempt
        async with Client(running.address) as c:
            stream = c.logs("gate-a", follow=True, timeout_s=60)
            first = await asyncio.wait_for(anext(stream), 30)
            assert (first.node_id, first.attempt, first.rank) == ("n1", 1, 0) and first.attempt_id
            assert first.text.startswith("waiting for ") and "released" not in first.text
            began = time.monotonic()
            (tmp_path / "gate-a.go").touch()
            rest = "".join([chunk.text async for chunk in stream])
            assert rest.endswith("released\n") and time.monotonic() - began < 30  # ended with the attempt

        # `omru logs --follow` with nothing but --planner does the same for gate-b
        with open(tmp_path / "follow.err", "w") as err:
            follow = omru("gate-b", "--follow", "--planner", running.address, stderr=err)
        line = await asyncio.wait_for(asyncio.to_thread(follow.stdout.readline), 60)
        assert line.startswith("[n1 rank 0] waiting for "), (line, (tmp_path / "follow.err").read_text())
        (tmp_path / "gate-b.go").touch()
        code, out = await finish(follow)
        assert code == 0 and out == "[n1 rank 0] released\n", (out, (tmp_path / "follow.err").read_text())
        await wait_state(d, "gate-a", {"FINISHED"})
        await wait_state(d, "gate-b", {"FINISHED"})

        # after the job: the CLI with $OMRU_PLANNER only, and the blocking SDK
        env_only = omru("gate-a", "--rank", "0", planner_env=running.address)
        code, out = await finish(env_only)
        assert code == 0 and out.splitlines() == [f"waiting for {tmp_path / 'gate-a.go'}", "released"], \
            (out, env_only.stderr.read())
        with SyncClient(running.address) as sc:
            chunks = await asyncio.to_thread(lambda: list(sc.logs("gate-b", rank=0)))
        assert {(ch.node_id, ch.rank, ch.attempt) for ch in chunks} == {("n1", 0, 1)}
        assert b"".join(ch.data for ch in chunks).decode().endswith("released\n")

        # bad input names the field; an unknown job, or an attempt no node ran, is NOT_FOUND
        invalid, missing = errors.InvalidArgument, errors.NotFound
        async with Client(running.address) as c:
            for kwargs, code, text in [
                ({"job_id": ""}, invalid, "job_id: is required"),
                ({"job_id": "x" * 129}, invalid, "job_id: 'xxx"),
                ({"job_id": "../gate-a"}, invalid, "job_id: '../gate-a' is not a valid id"),
                ({"job_id": "gate-a", "rank": -1}, invalid, "rank: -1 is negative"),
                ({"job_id": "gate-a", "attempt": -2}, invalid, "attempt: -2 is negative"),
                ({"job_id": "ghost"}, missing, "job_id 'ghost' not found"),
                ({"job_id": "gate-a", "attempt": 5}, missing,
                 "no logs of job 'gate-a' on any node (n1: attempt: job 'gate-a' has attempts 1..1 on this node, "
                 "not 5)"),
                ({"job_id": "gate-a", "rank": 3}, missing, "ran ranks [0] on this node, not 3"),
            ]:
                err = await sdk_error(_drain(c.logs(**kwargs)))
                assert type(err) is code and err.code() == code.status and text in err.details(), (kwargs, err)
        for args, text in [(("ghost",), "omru logs: error: planner said NOT_FOUND: job_id 'ghost' not found"),
                           (("gate-a", "--attempt", "-1"), "--attempt -1 is negative"),
                           (("gate-a", "--timeout", "0"), "--timeout 0.0 must be > 0")]:
            cli = omru(*args, planner_env=running.address)
            code, _ = await finish(cli)
            assert code == 2 and text in cli.stderr.read(), args
        cli = omru("gate-a", "--planner", "nowhere")
        code, _ = await finish(cli)
        assert code == 2 and "--planner 'nowhere' is not host:port" in cli.stderr.read()

        # a registered node whose executor cannot be reached is named (the reachable nodes' logs come first)
        from omru.v1 import registry_pb2_grpc
        from services.common.channels import open_channel
        from services.common.cluster import free_port

        async with open_channel(registry.address) as ch:
            await registry_pb2_grpc.RegistryServiceStub(ch).RegisterNode(
                register_request("n0-gone", slots=1, ttl=30, port=free_port()), timeout=10)
        got = []
        async with Client(running.address) as c:
            err = await sdk_error(_drain(c.logs("gate-a"), got))
        assert isinstance(err, errors.Unavailable) and err.code() == grpc.StatusCode.UNAVAILABLE
        assert "n0-gone (127.0.0.1:" in err.details(), err.details()
        assert "".join(ch.text for ch in got).endswith("released\n")  # n1's logs all the same


async def sdk_error(call) -> errors.OmruError:
    """The SDK error an awaited call raises (AssertionError when it succeeds)."""
    try:
        await call
    except errors.OmruError as exc:
        return exc
    raise AssertionError("call succeeded, expected an error")


async def _drain(stream, into: list | None = None) -> None:
    async for chunk in stream:
        if into is not None:
            into.append(chunk)
