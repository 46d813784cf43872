"""omru.elastic is a library of the omru package alone: a user's script imports it (and trains with it)
where the services package is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def test_importing_omru_elastic_loads_no_services_module_and_no_grpc():
    check = ("import omru.elastic, sys; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('services', 'grpc')))")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=ENV, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_script_trains_checkpoints_and_resumes_with_omru_elastic_where_services_cannot_be_imported(tmp_path):
    # sys.modules["services"] = None makes every `import services...` fail, as where only omru is installed
    run = ("import runpy, sys; sys.modules['services'] = None; "
           f"sys.argv = ['train_script.py', '--samples', '512']; "
           f"runpy.run_path({str(REPO / 'examples' / 'train_script.py')!r}, run_name='__main__')")
    first = subprocess.run([sys.executable, "-c", run], cwd=tmp_path, capture_output=True, text=True, env=ENV,
                           timeout=120)
    assert first.returncode == 0, first.stderr
    assert [line.split(" loss ")[0] for line in first.stdout.splitlines()] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["epoch-00002.pt", "epoch-00003.pt"]
    again = subprocess.run([sys.executable, "-c", run], cwd=tmp_path, capture_output=True, text=True, env=ENV,
                           timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == ["rank 0: resumed at epoch 3 on 1 ranks"]  # nothing left to train
