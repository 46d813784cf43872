"""`omru train` runs a job through the launcher and the worker, and refuses bad values."""

from __future__ import annotations

import json
import os
import subprocess
import sys

OMRU = [sys.executable, "-m", "omru"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def omru(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*OMRU, *args], capture_output=True, text=True, env=ENV, timeout=timeout)


def test_omru_train_json_prints_one_record_per_epoch_and_the_final_accuracy(tmp_path):
    out = omru("train", "--model", "resnet18", "--slots", "2", "--epochs", "2", "--train-samples", "128",
               "--image-size", "16", "--checkpoint-dir", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["event"] for r in records] == ["epoch_done", "epoch_done", "finished"]
    assert [r["epoch"] for r in records[:2]] == [1, 2] and {r["world_size"] for r in records[:2]} == {2}
    assert 0.0 <= records[-1]["accuracy"] <= 1.0
    assert sorted(os.listdir(tmp_path)) == ["epoch-00001.pt", "epoch-00002.pt"]


def test_omru_train_refuses_a_bad_value_naming_it_with_exit_code_2():
    out = omru("train", "--model", "resnet18", "--epochs", "0")
    assert out.returncode == 2
    assert "epochs" in out.stderr and "got 0" in out.stderr and "Traceback" not in out.stderr
    out = omru("train", "--model", "lenet", "--epochs", "1")
    assert out.returncode == 2 and "unknown model 'lenet'" in out.stderr
    out = omru("train", "--model", "resnet18", "--slots", "0")
    assert out.returncode == 2 and "--slots" in out.stderr
