"""Script jobs end to end: 1 executor node x 2 CPU slots, real etcd, registry, planner and the examples/ scripts.

A script that raises fails with its exception in `omru status`, in
`omru report --json` and in `omru logs` (through the planner); then a plain
torchrun-style script (knows nothing of omru) and one that uses omru.elastic
both finish every epoch, and the second grows from 1 to 2 slots when the
first ends, its lr scaled by 2, no epoch trained twice (`omru logs --attempt`
shows each attempt's epochs).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from services.planner import state as st
from services.planner.state import JobRecord
from tests.e2e.test_batch import run_until_done, start_nodes
from tests.planner_service.planner_helpers import planner

REPO = Path(__file__).resolve().parents[2]


def script(job_id: str, command: list[str], epochs: int, profile: dict) -> JobRecord:
    spec = dict(job_id=job_id, model="", dataset="", command=command, workdir=str(REPO), epochs=epochs,
                batch_size=16, base_lr=0.05, base_batch=16, warmup_epochs=0.0, num_classes=0, image_size=0,
                min_gpus=1, seed=0)
    return JobRecord(spec=spec, profile=profile, state=st.PENDING, submitted_s=time.time())


def omru(planner_address: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "OMRU_PLANNER": planner_address}
    return subprocess.run([sys.executable, "-m", "omru", *args], capture_output=True, text=True, env=env, timeout=60)


async def test_a_failing_script_says_why_and_two_scripts_finish_the_elastic_one_growing_onto_the_freed_slot(
        etcd, registry, start_service, tmp_path):
    await start_nodes(start_service, registry, tmp_path, n=1, slots=2)
    async with planner(etcd.endpoint, registry.address, checkpoint_root=str(tmp_path / "ckpt"),
                       learn_profiles=False) as (running, d, _stub):
        for _ in range(100):
            if len(d.live_gpus()) == 2:
                break
            await asyncio.sleep(0.1)
        d.policy_in_force = "parallel"  # both scripts at once, so growing is left to GPU reuse

        await d.submit([script("broken", ["python", "examples/train_script.py", "--fail", "no such bucket s3://x"],
                               2, {1: 5.0, 2: 5.0})])
        failed = await run_until_done(d, ["broken"], timeout_s=120)
        assert failed["broken"].state == "FAILED"
        status = await asyncio.to_thread(omru, running.address, "status")
        assert status.returncode == 0, status.stderr
        assert "RuntimeError: no such bucket s3://x" in status.stdout, status.stdout
        report = await asyncio.to_thread(omru, running.address, "report", "--json", str(tmp_path / "report.json"))
        assert report.returncode == 0, report.stderr
        jobs = {j["job_id"]: j for j in json.loads((tmp_path / "report.json").read_text())["jobs"]}
        assert "exited with code 1" in jobs["broken"]["message"]
        assert "RuntimeError: no such bucket s3://x" in jobs["broken"]["message"]
        assert "broken failed: " in report.stdout
        logs = await asyncio.to_thread(omru, running.address, "logs", "broken")  # the planner's address alone
        assert logs.returncode == 0, logs.stderr
        assert any(line.startswith("[node-0 rank 0] ") and line.endswith("RuntimeError: no such bucket s3://x")
                   for line in logs.stdout.splitlines()), logs.stdout

        # the planner believes in strong scaling for "elastic" (growing pays), "plain" ends first
        jobs = [script("plain", ["python", "examples/train_ddp.py", "--epochs", "2", "--samples", "256"], 2,
                       {1: 4.0, 2: 4.0}),
                script("elastic", ["python", "examples/train_script.py", "--samples", "16384"], 6,
                       {1: 40.0, 2: 20.0})]
        await d.submit(jobs)
        done = await run_until_done(d, ["plain", "elastic"], timeout_s=240)
        events = await d.state.events()
        first, last = [await asyncio.to_thread(omru, running.address, "logs", "elastic", "--rank", "0", *attempt)
                       for attempt in (("--attempt", "1"), ())]
    assert {j: done[j].state for j in ("plain", "elastic")} == {"plain": "FINISHED", "elastic": "FINISHED"}
    epochs = collections.defaultdict(list)
    for e in events:
        if e.kind == "epoch_done":
            epochs[e.job_id].append((e.epoch, e.world_size))
    assert sorted(epochs["elastic"]) == epochs["elastic"] and [ep for ep, _ in epochs["elastic"]] == [1, 2, 3, 4, 5, 6]
    sizes = [w for _, w in epochs["elastic"]]
    assert sizes[0] == 1 and sizes[-1] == 2, epochs["elastic"]
    finished_plain = min(e.time_s for e in events if e.job_id == "plain" and e.kind == "finished")
    grown = min(e.time_s for e in events if e.job_id == "elastic" and e.kind == "started" and e.world_size == 2)
    assert grown >= finished_plain
    assert first.returncode == 0 and last.returncode == 0, (first.stderr, last.stderr)
    assert "epoch 1/6 " in first.stdout and " world 1" in first.stdout and " world 2" not in first.stdout
    assert "epoch 6/6 " in last.stdout and " world 2" in last.stdout and "resumed at epoch" in last.stdout


async def test_a_job_no_node_can_run_fails_naming_why_and_a_spread_never_exceeds_max_gpus(
        etcd, registry, start_service, tmp_path):
    from dataclasses import replace

    from services.planner.ingest import MAX_REFUSALS

    await start_nodes(start_service, registry, tmp_path, n=1, slots=2)
    async with planner(etcd.endpoint, registry.address, checkpoint_root=str(tmp_path / "ckpt"),
                       learn_profiles=False) as (_running, d, _stub):
        for _ in range(100):
            if len(d.live_gpus()) == 2:
                break
            await asyncio.sleep(0.1)
        d.policy_in_force = "parallel"  # spreads a lone job over every GPU

        nowhere = script("nowhere", ["python", "examples/train_ddp.py"], 2, {1: 4.0, 2: 4.0})
        nowhere.spec["workdir"] = str(tmp_path / "no-such-folder")
        await d.submit([nowhere])
        failed = (await run_until_done(d, ["nowhere"], timeout_s=60))["nowhere"]
        assert failed.state == "FAILED" and "refused" in failed.message and "no-such-folder" in failed.message, failed
        assert failed.attempt <= 2 * MAX_REFUSALS, failed  # replanned a few times, then given up

        narrow = replace(script("narrow", ["python", "examples/train_ddp.py", "--epochs", "2", "--samples", "256"], 2,
                                {1: 4.0, 2: 4.0}), max_gpus=1)
        await d.submit([narrow])
        done = await run_until_done(d, ["narrow"], timeout_s=120)
        events = await d.state.events()
    assert done["narrow"].state == "FINISHED", done["narrow"]
    assert {e.world_size for e in events if e.job_id == "narrow" and e.kind == "started"} == {1}
