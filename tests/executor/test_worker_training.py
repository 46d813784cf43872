"""Real DDP training with real worker processes (gloo, CPU slots, tiny inputs).

The digits runs share one recipe: resnet18 at 32x32, 32 images per slot,
base lr 0.02 for a global batch of 32, one warm-up epoch, cosine decay, 3
epochs. The 1- and 2-slot runs are module fixtures, reused as the unresized
reference of the resize test.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
import torch

from omru import checkpoint, lsr
from services.executor.worker import launch
from services.executor.worker.spec import ProfileSpec, TrainSpec

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def digits_spec(job_id: str = "digits") -> TrainSpec:
    return TrainSpec(job_id=job_id, model="resnet18", dataset="digits", epochs=3, batch_size=32, base_lr=0.02,
                     base_batch=32, warmup_epochs=1, lr_decay="cosine", image_size=32, seed=0)


def final_accuracy(result: launch.LaunchResult) -> float:
    assert result.outcome == "finished", result.message
    return result.final["accuracy"]


@pytest.fixture(scope="module")
def one_slot_run(tmp_path_factory):
    ck = str(tmp_path_factory.mktemp("one"))
    return launch.run_attempt(digits_spec(), launch.new_attempt(1, ck), env=ENV)


@pytest.fixture(scope="module")
def two_slot_run(tmp_path_factory):
    ck = str(tmp_path_factory.mktemp("two"))
    return launch.run_attempt(digits_spec(), launch.new_attempt(2, ck), env=ENV)


def test_all_reduced_gradients_equal_the_mean_of_the_per_rank_gradients(tmp_path):
    port = launch.free_port()
    outs = [str(tmp_path / f"rank{r}.pt") for r in range(2)]
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "_grad_probe.py"), f"127.0.0.1:{port}", str(r),
                               outs[r]], env=ENV) for r in range(2)]
    assert [p.wait(timeout=240) for p in procs] == [0, 0]
    g0, g1 = (torch.load(o, weights_only=True) for o in outs)
    assert any(not torch.allclose(a, b) for a, b in zip(g0["local"], g1["local"])), "ranks saw the same batch"
    for loc0, loc1, d0, d1 in zip(g0["local"], g1["local"], g0["ddp"], g1["ddp"]):
        torch.testing.assert_close(d0, d1)
        torch.testing.assert_close(d0, (loc0 + loc1) / 2, rtol=1e-4, atol=1e-6)


def test_resnet18_on_digits_reaches_90_percent_on_one_and_two_slots_within_3_points(one_slot_run, two_slot_run):
    one, two = final_accuracy(one_slot_run), final_accuracy(two_slot_run)
    print(f"digits resnet18 test accuracy: 1 slot {one:.4f}, 2 slots {two:.4f}")
    assert one >= 0.90 and two >= 0.90
    assert abs(one - two) <= 0.03
    assert [r["epoch"] for r in two_slot_run.epochs] == [1, 2, 3]


def test_the_two_slot_run_follows_the_linear_scaling_rule(one_slot_run, two_slot_run):
    for one, two in zip(one_slot_run.epochs, two_slot_run.epochs):
        assert (one["world_size"], one["global_batch"], two["world_size"], two["global_batch"]) == (1, 32, 2, 64)
        assert one["steps"] == 2 * two["steps"]
    # the lr logged is that of the epoch's last step: warm-up from base_lr to B/base_batch x base_lr, cosine decay
    for run, world in ((one_slot_run, 1), (two_slot_run, 2)):
        schedule = lsr.new_job(0.02, 32, 32, world, warmup_epochs=1, decay="cosine", total_epochs=3)
        for r in run.epochs:
            assert r["lr"] == pytest.approx(schedule.lr(r["epoch"] - 1 + (r["steps"] - 1) / r["steps"]))
    assert lsr.new_job(0.02, 32, 32, 2, 1).lr(2) == pytest.approx(0.04)
    started = [r for r in two_slot_run.of("started")]
    assert sorted(r["rank"] for r in started) == [0, 1] and {r["backend"] for r in started} == {"gloo"}


def test_only_rank_0_reports_epochs_and_every_epoch_leaves_a_checkpoint(two_slot_run):
    assert {r["rank"] for r in two_slot_run.records if r["event"] != "started"} == {0}
    assert [os.path.basename(r["checkpoint"]) for r in two_slot_run.epochs] == [
        f"epoch-{e:05d}.pt" for e in (1, 2, 3)]


async def run_group(spec, attempt, on_record=None) -> launch.LaunchResult:
    group = launch.WorkerGroup(spec, attempt, on_record=on_record, env=ENV)
    await group.start()
    return await group.wait()


async def run_until(spec, attempt, stop_after_epoch_done: int | None = None, stop_on_start: bool = False):
    """Run one attempt; ask it to stop once it has reported the given epoch (or started)."""
    group = None

    def on_record(record):
        wants = (stop_on_start and record["event"] == "started" and record["rank"] == 0) or (
            record["event"] == "epoch_done" and record["epoch"] == stop_after_epoch_done)
        if wants:
            group.request_stop()

    group = launch.WorkerGroup(spec, attempt, on_record=on_record, env=ENV)
    await group.start()
    return await group.wait()


async def test_a_job_resized_2_1_2_does_every_epoch_once_and_matches_the_unresized_accuracy(tmp_path, two_slot_run):
    spec, ck = digits_spec(), str(tmp_path)
    first = await run_until(spec, launch.new_attempt(2, ck), stop_on_start=True)
    assert first.outcome == "stopped" and first.final["epoch"] == 1, first.message
    second = await run_until(spec, launch.new_attempt(1, ck), stop_on_start=True)
    assert second.outcome == "stopped" and second.final["epoch"] == 2, second.message
    third = await run_until(spec, launch.new_attempt(2, ck))
    accuracy = final_accuracy(third)

    attempts = [first, second, third]
    done = [(r["epoch"], r["world_size"]) for a in attempts for r in a.epochs]
    assert done == [(1, 2), (2, 1), (3, 2)]
    assert [r["epoch"] for r in third.final["history"]] == [1, 2, 3]
    assert [a.of("started")[0]["start_epoch"] for a in attempts] == [0, 1, 2]
    assert len({a.records[0]["attempt_id"] for a in attempts}) == 3
    print(f"resized accuracy {accuracy:.4f}, unresized {final_accuracy(two_slot_run):.4f}")
    assert accuracy >= 0.90
    assert abs(accuracy - final_accuracy(two_slot_run)) <= 0.03


async def test_killing_a_worker_mid_epoch_costs_at_most_that_epoch(tmp_path):
    spec = TrainSpec(job_id="kill", model="resnet18", epochs=3, batch_size=32, base_lr=0.02, warmup_epochs=0,
                     image_size=32, train_samples=640)
    ck = str(tmp_path)
    group = None
    loop = asyncio.get_running_loop()

    def on_record(record):
        if record["event"] == "epoch_done" and record["epoch"] == 1:
            victim = group.pids[1]
            loop.call_later(0.3, os.kill, victim, 9)

    group = launch.WorkerGroup(spec, launch.new_attempt(2, ck), on_record=on_record, env=ENV)
    await group.start()
    killed = await group.wait()
    assert killed.outcome == "failed"
    assert "rank 1" in killed.message and "signal 9" in killed.message
    assert set(killed.returncodes) == {0, 1} and killed.returncodes[1] == -9
    assert [r["epoch"] for r in killed.epochs] == [1]
    assert [e for e, _ in checkpoint.list_checkpoints(ck)] == [1]

    restarted = await run_group(spec, launch.new_attempt(1, ck))
    assert restarted.outcome == "finished", restarted.message
    started = restarted.of("started")[0]
    assert started["start_epoch"] == 1 and started["resumed_from"].endswith("epoch-00001.pt")
    assert [r["epoch"] for r in restarted.epochs] == [2, 3]
    assert [r["epoch"] for r in restarted.final["history"]] == [1, 2, 3]


def test_a_worker_refuses_a_checkpoint_of_another_model(tmp_path):
    other = TrainSpec(job_id="x", model="mobilenet_v3_small")
    checkpoint.save(str(tmp_path), {"job_id": "x", "model_name": other.model, "fingerprint": other.fingerprint(),
                                    "epoch": 1, "model": {}, "history": []})
    spec = TrainSpec(job_id="x", model="resnet18", epochs=2, train_samples=64)
    result = launch.run_attempt(spec, launch.new_attempt(1, str(tmp_path)), env=ENV)
    assert result.outcome == "failed"
    assert "holds model 'mobilenet_v3_small', but this job trains 'resnet18'" in result.message
    assert [e for e, _ in checkpoint.list_checkpoints(str(tmp_path))] == [1]  # nothing stored is lost


TEARDOWN_ABORT = """
import os
from omru import elastic
ctx = elastic.init()
ctx.exit_after_profile = False
for _ in ctx.batches([[0.0]] * 4):
    pass
if ctx.rank == 0:
    os.abort()  # dies in its teardown, after every rank measured
"""


def test_a_rank_that_dies_after_the_measurement_does_not_fail_the_trial(tmp_path):
    (tmp_path / "trial.py").write_text(TEARDOWN_ABORT)
    spec = TrainSpec(job_id="p", command=("python", str(tmp_path / "trial.py")), workdir=str(tmp_path))
    profile = ProfileSpec(warmup_iters=1, measure_iters=2)
    result = launch.run_attempt(spec, launch.new_attempt(2, str(tmp_path / "ck"), profile=profile), env=ENV)
    assert result.returncodes[0] == -6  # (SIGABRT: the death the outcome must see past)
    assert result.outcome == "profiled" and result.final["world_size"] == 2 and result.final["iters"] == 2


@pytest.mark.parametrize("mode", ["sampled", "epoch"])
def test_profile_mode_reports_steady_state_iteration_seconds(tmp_path, mode):
    spec = TrainSpec(job_id="p", model="mobilenet_v3_small", dataset="synthetic", batch_size=8, image_size=32,
                     train_samples=64)
    profile = ProfileSpec(mode=mode, warmup_iters=2, measure_iters=3)
    result = launch.run_attempt(spec, launch.new_attempt(2, str(tmp_path), profile=profile), env=ENV)
    assert result.outcome == "profiled", result.message
    p = result.final
    assert p["world_size"] == 2 and p["global_batch"] == 16 and p["steps"] == 4
    assert p["iters"] == (3 if mode == "sampled" else 4)
    assert 0 < p["iter_seconds"] and p["epoch_seconds"] == pytest.approx(p["iter_seconds"] * 4)
    assert checkpoint.list_checkpoints(str(tmp_path)) == []
