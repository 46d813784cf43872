"""`omru watch`: a live progress bar per job (epoch, world size, accuracy, ETA) until all are done."""

from __future__ import annotations

import sys
import time

from omru.cli import plannerargs


def register(subparsers) -> None:
    p = subparsers.add_parser("watch", help="follow the jobs live until they are done", description=__doc__)
    p.add_argument("jobs", nargs="*", help="only these job ids (default: all)")
    p.add_argument("--timeout", type=float, default=None, help="stop watching after this many seconds")
    plannerargs.add(p)
    p.set_defaults(func=handle)


def bar(done: int, total: int, width: int = 24) -> str:
    filled = int(width * done / total) if total else 0
    return "#" * filled + "-" * (width - filled)


def line(s, epochs: int, eta_s: float | None) -> str:
    eta = f"ETA {eta_s:5.0f} s" if eta_s is not None and not s.done else " " * 9
    return (f"{s.job_id:<16} [{bar(s.epochs_done, epochs)}] {s.epochs_done:>3}/{epochs:<3} world {s.world_size} "
            f"acc {100 * s.accuracy:5.1f}% {eta}  {s.state.lower()}")


def follow(c, job_ids=(), timeout_s=None, out=None, epochs: dict[str, int] | None = None) -> dict:
    """Print progress (to `out`, default the sys.stdout of the call) until every job is done; returns
    the last status per job."""
    out = out or sys.stdout
    latest: dict = {}
    tty = out.isatty()
    shown = 0
    plan = c.plan()
    for s in c.watch(job_ids, until_done=True, timeout_s=timeout_s):
        latest[s.job_id] = s
        if s.plan_version != plan.version:
            plan = c.plan()
        ends = {}
        for seg in plan.segments:
            ends[seg.job_id] = max(ends.get(seg.job_id, 0.0), plan.created_unix_s + seg.end_s)
        rows = [line(x, (epochs or {}).get(x.job_id, x.epochs or max(x.epochs_done, 1)),
                     max(0.0, ends[x.job_id] - time.time()) if x.job_id in ends else None)
                for x in sorted(latest.values(), key=lambda x: x.job_id)]
        if tty:
            out.write(f"\x1b[{shown}A" if shown else "")
            out.write("".join(f"\x1b[2K{r}\n" for r in rows))
            shown = len(rows)
        else:
            out.write(line(s, (epochs or {}).get(s.job_id, s.epochs or max(s.epochs_done, 1)), None) + "\n")
        out.flush()
    return latest


def handle(args) -> int:
    import grpc

    with plannerargs.client(args) as c:
        try:
            latest = follow(c, args.jobs, args.timeout)
        except grpc.RpcError as exc:
            raise plannerargs.rpc_error(exc) from None
    return 0 if latest and all(s.state == "FINISHED" for s in latest.values()) else 1
