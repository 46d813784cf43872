"""The complete example of docs/sdk.md, run as it is written against a real local cluster (etcd, registry,
profiler, planner, one executor with 2 CPU slots), in an interpreter where torch cannot be imported: it
submits, streams progress, reads logs, cancels and waits, and prints what the document says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from omru.client import SyncClient
from services.common.cluster import LocalCluster, child_env

DOC = Path(__file__).resolve().parents[2] / "docs" / "sdk.md"


def example() -> tuple[str, str]:
    """The first python block of docs/sdk.md, and the output block right after it."""
    text = DOC.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    shown = re.search(r"```\n(.*?)```", text[code.end():], re.S)
    return code.group(1), shown.group(1)


@pytest.mark.timeout(420)
def test_the_example_of_docs_sdk_runs_as_written_and_prints_what_the_document_shows(tmp_path):
    code, shown = example()
    script = tmp_path / "example.py"
    script.write_text(code)
    runner = textwrap.dedent(f"""\
        import runpy, sys
        class _Blocked:  # the SDK must not need torch
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "torchvision"):
                    raise ImportError(f"{{name}} is blocked in this test")
        sys.meta_path.insert(0, _Blocked())
        runpy.run_path({str(script)!r}, run_name="__main__")
        """)
    with LocalCluster(nodes=1, slots_per_node=2, planner_port=0, work_dir=tmp_path / "up", ttl_seconds=5) as up:
        env = child_env({"OMRU_PLANNER": up.service("planner").address, "OMRU_REGISTRY": up.service("registry").address,
                         "OMRU_CONTEXT": str(tmp_path / "no-context.json")})
        done = subprocess.run([sys.executable, "-c", runner], env=env, capture_output=True, text=True, timeout=360,
                              cwd=tmp_path)
        assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
        with SyncClient(up.service("planner").address, registry=up.service("registry").address) as c:  # it agrees
            states = {j.job_id: (j.state, j.epochs_done) for j in c.list_jobs()}
            for _ in range(100):  # the cancelled script's slot is given back
                held = [g.job_id for n in c.nodes() for g in n.gpus]
                if held == ["", ""]:
                    break
                time.sleep(0.3)
    assert states == {"sdk-train": ("FINISHED", 2), "sdk-hello": ("CANCELLED", 0)}, states
    assert held == ["", ""], held

    out = done.stdout.splitlines()
    # every line the document shows comes, in its order; only the progress lines may differ in number
    fixed = [line for line in shown.splitlines() if not line.startswith("sdk-train: ")]
    assert [line for line in out if not line.startswith("sdk-train: ")] == fixed, done.stdout
    progress = [line for line in out if line.startswith("sdk-train: ")]
    assert progress[-1] == "sdk-train: finished, epoch 2/2" and "sdk-train: running, epoch 1/2" in progress, progress
    epochs = [int(line.split("epoch ")[1].split("/")[0]) for line in progress]
    assert epochs == sorted(epochs), progress  # progress only goes forward
