"""`omru status`: where each job stands, a row per job (as `squeue` and `kubectl get` show them).

Columns: JOB; OWNER (who submitted it; "-" on a cluster without credentials); STATE; GPUS held
now; NODES its running attempt is on; EPOCHS done/total; SUBMITTED (when it came; "-" from a
planner that does not say); AGE (since submission, else since its first start); ETA (from its own
epochs so far, else from the plan in force); REASON (why it waits, or why it ended). The plan in force is named while a job is
live; an idle cluster shows none.

`-w/--watch` keeps going: on a terminal the table is redrawn live; otherwise one line per change,
each starting with its local time (ISO 8601), until interrupted or --timeout.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass

from omru.cli import plannerargs

WAITING = ("PENDING", "PROFILING", "WAITING")
HOLDING = ("STARTING", "RUNNING", "RESIZING")
#: The REASON column's width at most (a failed job's whole message follows the table).
REASON_CHARS = 60
COLUMNS = ("JOB", "OWNER", "STATE", "GPUS", "NODES", "EPOCHS", "SUBMITTED", "AGE", "ETA", "REASON")


def register(subparsers) -> None:
    p = subparsers.add_parser("status", help="show every job and the plan", description=__doc__)
    p.add_argument("--json", action="store_true", help="print JSON (with -w: one object per change)")
    p.add_argument("--state", action="append", default=[], metavar="STATE",
                   help="only jobs in this state (running, failed, ...); repeat or separate with commas")
    p.add_argument("-w", "--watch", action="store_true", help="keep watching: redraw live, or a line per change")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="with -w: stop after this long")
    plannerargs.add(p)
    p.set_defaults(func=handle)


@dataclass(frozen=True)
class Row:
    """One job as status shows it (times are Unix seconds; None: not known)."""

    job_id: str
    state: str
    gpus: int
    nodes: tuple[str, ...]
    epochs_done: int
    epochs: int
    accuracy: float
    submitted_unix_s: float | None
    started_unix_s: float | None
    age_s: float | None
    eta_s: float | None
    reason: str
    owner: str = ""

    def cells(self) -> list[str]:
        return [self.job_id, self.owner or "-", self.state.lower(), str(self.gpus) if self.gpus else "-",
                ",".join(self.nodes) or "-", f"{self.epochs_done}/{self.epochs or '?'}", clock(self.submitted_unix_s), duration(self.age_s),
                duration(self.eta_s), self.reason]

    def line(self) -> str:
        """One line for a log (the columns, named)."""
        return (f"{self.job_id} {self.state.lower()} " + (f"owner={self.owner} " if self.owner else "")
                + f"gpus={self.gpus} nodes={','.join(self.nodes) or '-'} "
                f"epochs={self.epochs_done}/{self.epochs or '?'} age={duration(self.age_s)} "
                f"eta={duration(self.eta_s)}" + (f" reason={self.reason!r}" if self.reason else ""))


def changed(before, s) -> bool:
    """Whether update s of a job says something its previous one (None: none) did not (a new plan
    re-sends every job unchanged)."""
    return before is None or (before.state, before.epochs_done, before.world_size, before.message) != (
        s.state, s.epochs_done, s.world_size, s.message)


def clock(t: float | None) -> str:
    """Local time, ISO 8601 to the second ("-" when unknown)."""
    return "-" if t is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def duration(s: float | None) -> str:
    """kubectl's short form: 42s, 3m05s, 2h07m, 4d03h ("-" when unknown)."""
    if s is None:
        return "-"
    s = max(0, int(round(s)))
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            return f"{s // size}{unit}{(s % size) // subsize:02d}{sub}"
    return f"{s}s"


@dataclass(frozen=True)
class Held:
    """From the report's GPU holds: each job's first start (Unix s) and the nodes of its newest attempt."""

    started: dict
    nodes: dict

    @classmethod
    def of(cls, report) -> "Held":
        first: dict[str, float] = {}
        attempts: dict[str, dict[str, tuple[float, set]]] = {}
        for h in report.holds:
            first[h.job_id] = min(first.get(h.job_id, h.start_s), h.start_s)
            start, nodes = attempts.setdefault(h.job_id, {}).get(h.attempt_id, (h.start_s, set()))
            attempts[h.job_id][h.attempt_id] = (min(start, h.start_s), nodes | {h.gpu.node_id})
        newest = {j: sorted(max(a.values(), key=lambda v: v[0])[1]) for j, a in attempts.items()}
        return cls({j: report.origin_unix_s + t for j, t in first.items()}, {j: tuple(n) for j, n in newest.items()})


class View:
    """What rows derive from besides the jobs: the plan in force and the report's holds; fetched again
    after a job changed state or size (or the plan changed), at most once a second (a report replays
    every event), on the next update after that."""

    EVERY_S = 1.0

    def __init__(self, c) -> None:
        self.c = c
        self.stale = True
        self.at = 0.0
        self.plan = self.held = None
        self.saw(None, None)

    def saw(self, before, s) -> None:
        """Note update `s` of a job last seen as `before` (None: new); fetch again when due."""
        if s is None or before is None or (before.state, before.world_size, before.plan_version) != (
                s.state, s.world_size, s.plan_version):
            self.stale = True
        if self.stale and time.monotonic() - self.at >= self.EVERY_S:
            self.plan, self.held = self.c.plan(), Held.of(self.c.report_proto())
            self.stale, self.at = False, time.monotonic()

    def row(self, j, now: float | None = None) -> "Row":
        return row(j, self.plan, self.held, time.time() if now is None else now)


def row(j, plan, held: Held, now: float) -> Row:
    """The Row of a JobStatus `j` under the plan in force and the holds so far."""
    planned = [s for s in plan.segments if s.job_id == j.job_id] if plan.version else []
    started = held.started.get(j.job_id)
    # (an older planner gives no submission time: a job that never started has it as its time)
    submitted = getattr(j, "submitted_unix_s", 0.0) or (
        j.time_unix_s if j.state in WAITING and started is None and j.time_unix_s else None)
    eta = None
    if not j.done:
        if j.epochs_done and started and j.epochs:  # its own pace so far
            eta = (now - started) / j.epochs_done * max(j.epochs - j.epochs_done, 0)
        elif planned and plan.created_unix_s + max(s.end_s for s in planned) > now:
            eta = plan.created_unix_s + max(s.end_s for s in planned) - now
    return Row(j.job_id, j.state, j.world_size if j.state in HOLDING else 0,
               held.nodes.get(j.job_id, ()) if j.state in HOLDING else (), j.epochs_done, j.epochs, j.accuracy,
               submitted, started, now - (submitted or started) if (submitted or started) else None, eta,
               reason(j, planned, plan.created_unix_s, now), getattr(j, "owner", ""))


def reason(j, planned, plan_created: float, now: float) -> str:
    """Why the job is where it is (its message first: the planner's words)."""
    if j.message:
        first = j.message.strip().splitlines()[0]
        return first if len(first) <= REASON_CHARS else first[:REASON_CHARS - 1] + "…"
    if j.state == "PENDING":
        return "waiting for its profile"
    if j.state == "PROFILING":
        return "being profiled"
    if j.state == "WAITING":
        if not planned:
            return "not in the plan yet"
        at = plan_created + min(s.start_s for s in planned)
        return f"planned to start in {duration(at - now)}" if at > now else "waiting for its planned GPUs"
    if j.state == "RESIZING":
        return "moving to other GPUs"
    return ""


def plan_line(plan, jobs) -> str | None:
    """The plan in force, while any job is live (None on an idle cluster: the last plan is spent)."""
    if not plan.version or all(j.done for j in jobs):
        return None
    return (f"plan v{plan.version} ({plan.policy}) made {clock(plan.created_unix_s)}, "
            f"planned makespan {duration(plan.makespan_s)}")


def table(rows, title: str | None = None):
    """The rows as a rich table, kubectl-style (no box), under `title` when given."""
    from rich.console import Group
    from rich.table import Table

    t = Table(*COLUMNS, box=None, pad_edge=False, padding=(0, 3, 0, 0), header_style="bold")
    for r in rows:
        t.add_row(*r.cells(), style={"FAILED": "red", "CANCELLED": "yellow", "FINISHED": "green"}.get(r.state))
    return Group(title, t) if title else t


def show(renderable, out=None) -> None:
    """Print a rich renderable: styled on a terminal; plain, without trailing blanks, elsewhere."""
    c = console(out)
    if c.is_terminal:
        c.print(renderable)
        return
    with c.capture() as captured:
        c.print(renderable)
    print("\n".join(line.rstrip() for line in captured.get().splitlines()), file=out or sys.stdout)


def console(out=None):
    """A rich Console on `out` (default the sys.stdout of the call); wide when not a terminal."""
    from rich.console import Console

    out = out or sys.stdout
    tty = out.isatty()
    return Console(file=out, width=None if tty else 250, force_terminal=tty, highlight=False)


def states_of(values: list[str]) -> list[str]:
    """--state values (repeated, comma-separated) as JobState names; CliError naming a bad one."""
    from omru.cli.main import CliError
    from omru.client import _state_value
    from omru.v1 import common_pb2

    names = [v.strip() for value in values for v in value.split(",") if v.strip()]
    for name in names:
        try:
            _state_value(name)
        except ValueError as exc:
            raise CliError(f"--state: {exc}") from None
    return [common_pb2.JobState.Name(_state_value(n)).removeprefix("JOB_STATE_") for n in names]


def check_timeout(value: float | None) -> None:
    from omru.cli.main import CliError

    if value is not None and not value > 0:
        raise CliError(f"--timeout: {value} is not a positive number of seconds")


def handle(args) -> int:
    import json

    import grpc

    states = states_of(args.state)
    check_timeout(args.timeout)
    with plannerargs.client(args) as c:
        try:
            if args.watch:
                return watch(c, states, args.json, args.timeout)
            jobs, plan, held = c.list_jobs(states=states), c.plan(), Held.of(c.report_proto())
        except grpc.RpcError as exc:
            raise plannerargs.rpc_error(exc) from None
    now = time.time()
    rows = [row(j, plan, held, now) for j in jobs]
    line = plan_line(plan, jobs)
    if args.json:
        print(json.dumps({"jobs": [{**asdict(j), **asdict(r)} for j, r in zip(jobs, rows)],
                          "plan": asdict(plan) if line else None}))
        return 0
    show(table(rows, line) if rows else line or "no jobs")
    for j in jobs:
        if j.state == "FAILED" and j.message:
            print(f"{j.job_id} failed: {j.message}")
    return 0


def watch(c, states: list[str], as_json: bool, timeout_s: float | None, out=None) -> int:
    """-w: the table live on a terminal, else a timestamped line (or JSON object) per change."""
    import json

    from rich.live import Live

    out = out or sys.stdout
    latest: dict = {}
    view = View(c)

    class Table:
        def __rich__(self):
            now = time.time()
            rows = [view.row(j, now) for _, j in sorted(latest.items()) if not states or j.state in states]
            return table(rows, plan_line(view.plan, latest.values()))

    live = Live(Table(), console=console(out), refresh_per_second=2) if out.isatty() and not as_json else None
    if live is not None:
        live.start()
    try:
        for s in c.watch((), timeout_s=timeout_s):
            before = latest.get(s.job_id)
            latest[s.job_id] = s
            view.saw(before, s)
            if live is not None or not changed(before, s) or (states and s.state not in states):
                continue
            r, at = view.row(s), clock(time.time())
            print(json.dumps({"time": at, **asdict(r)}) if as_json else f"{at} {r.line()}", file=out, flush=True)
    finally:
        if live is not None:
            live.stop()
    return 0
