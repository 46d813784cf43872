"""Time from `omru up` to its JSON ready line (printed figures, not a test).

    .venv/bin/python bench/up_time_to_ready.py [--runs 3] [--nodes 2]

Each run starts `omru up --port <free>` (its own etcd, registry, profiler,
planner and N executors), reads the ready line, stops it with SIGTERM and
checks that it exited 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.common.cluster import free_port  # noqa: E402


def once(nodes: int) -> tuple[float, float]:
    argv = [sys.executable, "-m", "omru", "up", "--nodes", str(nodes), "--port", str(free_port())]
    began = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    line = proc.stdout.readline()
    wall = time.monotonic() - began
    ready = json.loads(line)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(30)
    if code != 0 or not ready.get("ready"):
        raise SystemExit(f"omru up failed: exit {code}, line {line!r}")
    return wall, ready["seconds_to_ready"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args()
    walls, launch = zip(*(once(args.nodes) for _ in range(args.runs)))
    for i, (w, l) in enumerate(zip(walls, launch), 1):
        print(f"run {i}: ready line after {w:.2f} s (cluster launch {l:.2f} s)")
    print(f"omru up --nodes {args.nodes}: median {statistics.median(walls):.2f} s, max {max(walls):.2f} s to ready ({args.runs} runs)")


if __name__ == "__main__":
    main()
