"""In-place resizes with real worker processes (gloo, CPU slots, tiny inputs).

One recipe: resnet18 at 16x16 on 128 digits, 16 images per slot, so an
epoch is 8 steps on one slot and 4 on two, and every sample divides evenly.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys

import pytest

from omru import lsr
from services.executor.worker import launch
from services.executor.worker.spec import TrainSpec
from services.executor.worker.train import SAMPLE_IDS_ENV

ENV = {**os.environ, "OMP_NUM_THREADS": "1", SAMPLE_IDS_ENV: "1"}
SAMPLES = 128


def tiny_spec(epochs: int = 3) -> TrainSpec:
    return TrainSpec(job_id="regroup", model="resnet18", dataset="digits", epochs=epochs, batch_size=16,
                     base_lr=0.02, base_batch=16, warmup_epochs=1, lr_decay="cosine", image_size=16,
                     train_samples=SAMPLES, seed=0)


def expected_schedules(spec: TrainSpec, sizes: list[int]) -> list[lsr.LrSchedule]:
    """The lr schedule of each epoch for the given size of each epoch (the rule the worker follows)."""
    schedule = lsr.new_job(spec.base_lr, spec.base_batch, spec.batch_size, sizes[0], spec.warmup_epochs,
                           spec.lr_decay, spec.epochs)
    out = []
    for epoch, size in enumerate(sizes):
        schedule = lsr.resumed(schedule, epoch, spec.base_lr, spec.base_batch, spec.batch_size, size)
        out.append(schedule)
    return out


def test_a_run_resized_1_2_1_in_place_trains_each_sample_once_per_epoch_and_reports_the_pauses(tmp_path):
    spec = tiny_spec()
    result = launch.run_local(spec, str(tmp_path), 1, [(1, 2), (2, 1)], env=ENV)
    assert result.outcome == "finished", result.message

    epochs = result.epochs
    assert [(r["epoch"], r["world_size"], r["global_batch"]) for r in epochs] == [(1, 1, 16), (2, 2, 32), (3, 1, 16)]
    assert [r["epoch"] for r in result.final["history"]] == [1, 2, 3]

    # every sample id of each epoch trained exactly once, whatever the size
    for epoch in (1, 2, 3):
        per_rank = [r["ids"] for r in result.of("samples") if r["epoch"] == epoch]
        assert len(per_rank) == epochs[epoch - 1]["world_size"]
        counts = collections.Counter(i for ids in per_rank for i in ids)
        assert sorted(counts) == list(range(SAMPLES)) and set(counts.values()) == {1}, epoch

    # in place: one process for rank 0 throughout, a joiner that took the state by broadcast, then left
    started = result.of("started")
    assert [(r["rank"], r["generation"], r["start_epoch"], r["resumed_from"]) for r in started] == [
        (0, 0, 0, None), (1, 1, 1, None)]
    assert [(r["rank"], r["epoch"]) for r in result.of("left")] == [(1, 2)]
    assert [(r["from_size"], r["to_size"], r["generation"]) for r in result.of("regroup")] == [(1, 2, 1), (2, 1, 2)]
    assert len({r["attempt_id"] for r in result.records}) == 1

    resized = result.of("resized")
    assert [(r["epoch"], r["from_size"], r["to_size"], r["how"]) for r in resized] == [
        (1, 1, 2, "in_place"), (2, 2, 1, "in_place")]
    assert all(r["pause_s"] > 0 for r in resized)

    # the lr follows the new global batch: the linear scaling rule with its ramp after a resize
    schedules = expected_schedules(spec, [1, 2, 1])
    assert [s.target for s in schedules] == pytest.approx([0.02, 0.04, 0.02])
    for r, schedule in zip(epochs, schedules):
        assert r["lr"] == pytest.approx(schedule.lr(r["epoch"] - 1 + (r["steps"] - 1) / r["steps"]))
    for r in resized:
        assert r["lr"] == pytest.approx(schedules[r["epoch"]].lr(r["epoch"]))
    # the checkpoints were still written (in the background at a resize)
    assert sorted(os.listdir(tmp_path)) == ["epoch-00002.pt", "epoch-00003.pt"]


def test_a_rank_killed_during_a_regroup_falls_back_to_a_restart_from_the_checkpoint(tmp_path):
    spec = tiny_spec()
    killed = []

    def on_record(record):
        if record["event"] == "joining" and not killed:  # the joiner, before its rendezvous: rank 0 waits in it
            os.kill(record["pid"], signal.SIGKILL)
            killed.append(record["pid"])

    result = launch.run_local(spec, str(tmp_path), 1, [(1, 2)], on_record=on_record, env=ENV)
    assert killed and result.outcome == "finished", result.message

    attempts = list(dict.fromkeys(r["attempt_id"] for r in result.records))
    assert len(attempts) == 2
    restarted = [r for r in result.of("started") if r["attempt_id"] == attempts[1]]
    assert {(r["start_epoch"], r["world_size"]) for r in restarted} == {(1, 2)}
    assert [r["resumed_from"] for r in restarted if r["rank"] == 0][0].endswith("epoch-00001.pt")

    # the boundary's checkpoint was written although the regroup failed: no epoch trained twice
    trained = [r["epoch"] for r in result.epochs]
    assert sorted(trained) == [1, 2, 3]
    assert [(r["epoch"], r["world_size"]) for r in result.final["history"]] == [(1, 1), (2, 2), (3, 2)]
    for epoch in (2, 3):
        ids = [i for r in result.of("samples") if r["epoch"] == epoch for i in r["ids"]]
        assert sorted(ids) == list(range(SAMPLES))
    resized = result.of("resized")
    assert [(r["epoch"], r["from_size"], r["to_size"], r["how"]) for r in resized] == [(1, 1, 2, "restart")]
    assert resized[0]["pause_s"] > 0


def omru(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "omru", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_omru_train_json_shows_the_pause_of_each_resize(tmp_path):
    out = omru("train", "--model", "resnet18", "--epochs", "2", "--train-samples", str(SAMPLES), "--image-size", "16",
               "--batch-size", "16", "--resize", "1:2", "--checkpoint-dir", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["event"] for r in records] == ["epoch_done", "resized", "epoch_done", "finished"]
    assert [r["world_size"] for r in records if r["event"] == "epoch_done"] == [1, 2]
    resized = records[1]
    assert (resized["from_size"], resized["to_size"], resized["how"]) == (1, 2, "in_place")
    assert resized["pause_s"] > 0


@pytest.mark.parametrize("value,says", [
    ("2", "'2': must be EPOCH:SLOTS"), ("x:2", "'x:2': must be EPOCH:SLOTS"), ("1:two", "'1:two': must be EPOCH:SLOTS"),
    ("0:2", "'0:2': the epoch must be 1..2"), ("3:2", "'3:2': the epoch must be 1..2"),
    ("1:0", "'1:0': slots must be >= 1, got 0"),
])
def test_omru_train_refuses_a_bad_resize_naming_it_with_exit_code_2(value, says):
    out = omru("train", "--model", "resnet18", "--epochs", "3", "--resize", value)
    assert out.returncode == 2, out.stderr
    assert f"--resize {says}" in out.stderr and "Traceback" not in out.stderr


def test_an_attempt_plans_resizes_by_epoch_and_names_a_bad_plan():
    from services.executor.worker.spec import AttemptSpec, SpecError, from_json, to_json

    attempt = AttemptSpec("a1", 1, "127.0.0.1:1234", "ck", resizes=[[1, 3], [2, 1]])
    assert attempt.resizes == ((1, 3), (2, 1)) and attempt.devices == ("cpu",) * 3
    assert [attempt.size_after(e, 1) for e in (1, 2, 3)] == [3, 1, 1]
    assert attempt.generation_prefix(0) == "a1" and attempt.generation_prefix(2) == "a1/gen2"
    assert from_json(to_json(tiny_spec(), attempt))[1] == attempt
    assert [launch.size_at(e, 1, attempt.resizes) for e in (0, 1, 2)] == [1, 3, 1]
    for bad in ([(0, 2)], [(2, 2), (1, 1)], [(1, 0)], [(1, "2")]):
        with pytest.raises(SpecError) as err:
            AttemptSpec("a1", 1, "127.0.0.1:1234", "ck", resizes=bad)
        assert err.value.field == "resizes"
    with pytest.raises(SpecError) as err:
        AttemptSpec("a1", 1, "127.0.0.1:1234", "ck", devices=("0",), resizes=[(1, 2)])
    assert err.value.field == "devices" and "needs one device per rank (2)" in str(err.value)
