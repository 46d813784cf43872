"""`omru profile` against a running profiler: prints the profile, writes the
`omru simulate` CSV (which the planner core reads back), refuses bad input
with exit 2 and one line naming the bad value."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from services.common.cluster import child_env
from services.planner.core.profiles import load_csv
from tests.executor.service_builders import executors
from tests.profiler.profiler_helpers import profiler


def omru(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "omru"), "profile", *args], capture_output=True, text=True,
                          env=child_env(), timeout=240)


async def run_omru(*args: str) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(omru, *args)  # the in-process servers keep serving meanwhile


async def test_profile_command_prints_json_and_writes_a_csv_omru_simulate_reads(etcd, registry, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 2)) as _, profiler(etcd.endpoint, registry.address, keep_address=True) as (stub, address):
        out = tmp_path / "p.csv"
        args = ("--model", "mobilenet_v3_small", "--dataset", "synthetic", "--batch-size", "8", "--image-size", "16",
                "--train-samples", "64", "--num-classes", "4", "--gpus", "1,2", "--profiler", address)
        done = await run_omru(*args, "--json", "--csv", str(out), "--epochs", "20", "--job", "mnv3")
        assert done.returncode == 0, done.stderr
        profile = json.loads(done.stdout)
        assert profile["cached"] is False
        assert [p["gpus"] for p in profile["points"]] == [1, 2] and all(p["measured"] for p in profile["points"])
        (job,) = load_csv(out)
        assert (job.id, job.epochs) == ("mnv3", 20)
        assert job.profile == {p["gpus"]: round(p["epoch_seconds"], 6) for p in profile["points"]}

        table = await run_omru(*args)
        assert table.returncode == 0, table.stderr
        assert "[stored]" in table.stdout and "measured" in table.stdout


async def test_profile_command_refuses_bad_input_with_one_line_naming_it(etcd, registry, tmp_path):
    async with executors(registry.address, tmp_path, ("n1", 2)) as _, profiler(etcd.endpoint, registry.address, keep_address=True) as (stub, address):
        for args, named in [
            (("--model", "resnet9000", "--dataset", "synthetic"), "job.model"),
            (("--model", "resnet18", "--dataset", "mnist"), "job.dataset"),
            (("--model", "resnet18", "--dataset", "synthetic", "--batch-size", "0"), "job.batch_size"),
            (("--model", "resnet18", "--dataset", "synthetic", "--gpus", "4"), "gpu_counts[0]"),
            (("--model", "resnet18", "--dataset", "synthetic", "--gpus", "one"), "--gpus"),
        ]:
            result = await run_omru(*args, "--profiler", address)
            assert result.returncode == 2, (args, result.stderr)
            assert len(result.stderr.strip().splitlines()) == 1 and named in result.stderr, result.stderr
