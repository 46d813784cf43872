"""`omru watch [JOB...]`: follow jobs live until they are done: a progress bar per job (epochs, world
size, accuracy, ETA) on a terminal, a line per change with its local time otherwise.

Without JOB it follows the jobs live when it starts. Exit status: 0 when every job it followed
finished, 1 when one failed or was cancelled (or --timeout came first), 2 for a job id no job has.
"""

from __future__ import annotations

import sys
import time

from omru.cli import plannerargs
from omru.cli.commands.status import View, changed, check_timeout, clock, console, duration


def register(subparsers) -> None:
    p = subparsers.add_parser("watch", help="follow the jobs live until they are done", description=__doc__)
    p.add_argument("jobs", nargs="*", help="only these job ids (default: the jobs live now)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="stop watching after this long")
    plannerargs.add(p)
    p.set_defaults(func=handle)


def _progress(out):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn
    from rich.text import Text

    class Eta(ProgressColumn):
        """Time left, counted down between updates (from the job's `eta_at`, Unix seconds)."""

        def render(self, task):
            at = task.fields.get("eta_at")
            return Text(f"ETA {duration(None if at is None else at - time.time()):>6}")

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("epochs"),
                    TextColumn("{task.fields[info]}"), Eta(), TextColumn("{task.fields[state]}"),
                    console=console(out), refresh_per_second=2)


def follow(c, job_ids=(), timeout_s=None, out=None, epochs: dict[str, int] | None = None) -> dict:
    """Show progress (on `out`, default the sys.stdout of the call) until every job followed is done;
    returns the last JobStatus per job. Without job_ids, the jobs live now. CliError naming an
    unknown job id."""
    from omru.cli.main import CliError

    out = out or sys.stdout
    known = {j.job_id: j for j in c.list_jobs(job_ids=list(job_ids))} if job_ids else \
        {j.job_id: j for j in c.list_jobs() if not j.done}
    missing = [j for j in dict.fromkeys(job_ids) if j not in known]
    if missing:
        raise CliError(f"no such job: {', '.join(missing)}")
    if not known:
        print(f"{clock(time.time())} no live job to watch", file=out)
        return {}
    latest: dict = {}
    view = View(c)
    progress = _progress(out) if out.isatty() else None
    tasks: dict[str, int] = {}
    if progress is not None:
        progress.start()
    try:
        for s in c.watch(list(known), until_done=True, timeout_s=timeout_s):
            before = latest.get(s.job_id)
            latest[s.job_id] = s
            view.saw(before, s)
            now = time.time()
            r = view.row(s, now)
            total = (epochs or {}).get(s.job_id) or s.epochs or max(s.epochs_done, 1)
            info = f"world {s.world_size}  acc {100 * s.accuracy:5.1f}%"
            state = s.state.lower() + (f": {r.reason}" if r.reason and s.state != "RUNNING" else "")
            if progress is not None:
                fields = dict(completed=s.epochs_done, total=total, info=info, state=state,
                              eta_at=None if r.eta_s is None else now + r.eta_s)
                if s.job_id in tasks:
                    progress.update(tasks[s.job_id], **fields)
                else:
                    tasks[s.job_id] = progress.add_task(s.job_id, **fields)
            elif changed(before, s):
                print(f"{clock(now)} {s.job_id:<16} {s.epochs_done:>3}/{total:<3} epochs  {info}  "
                      f"ETA {duration(r.eta_s):>6}  {state}", file=out, flush=True)
    finally:
        if progress is not None:
            progress.stop()
    return latest


def handle(args) -> int:
    import grpc

    check_timeout(args.timeout)
    with plannerargs.client(args) as c:
        try:
            latest = follow(c, args.jobs, args.timeout)
        except grpc.RpcError as exc:
            raise plannerargs.rpc_error(exc) from None
    left = sorted(j for j, s in latest.items() if not s.done)
    if left:
        print(f"omru watch: --timeout {args.timeout} s passed; still going: {', '.join(left)}", file=sys.stderr)
    return 0 if all(s.state == "FINISHED" for s in latest.values()) else 1
