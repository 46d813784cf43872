"""What an emulated run did, from the executors' own events. Pure: no grpc, no etcd.

Events come in wall seconds; the emulated cluster runs `speed` times faster
than the jobs' profiles, so every time in the figures is in job seconds
((wall - origin) x speed), comparable with `omru simulate`, except the
control plane's own delays (reuse gaps), which are wall seconds.

- epochs_run_twice: EPOCH_DONE events beyond the first for the same (job,
  epoch): an epoch trained again although it had completed (an interrupted
  epoch never reports, so it is not counted).
- double_owned_gpu_s: GPU-seconds in which two different attempts held one
  GPU (report.ownership_conflicts over the holds).
- as_planned: the share of epochs that ran on the very GPUs the first plan
  gave them (replans and noise move some; at noise 0 nearly all should stay).
- reuse gap of a hold (one attempt of one job on one node): its start minus
  the moment the attempt could begin: its GPUs, on every node it spans, all
  free (the latest release of one of them by an earlier hold) and, for a job
  that moves (resize), its previous attempt ended. A part on a node freed
  early waits, by plan, for the attempt's other nodes, and GPUs a job grows
  onto wait, by plan, for its epoch boundary; neither is a hand-over delay.
  Only attempts that take over at least one GPU from another job count (a
  start on GPUs idle long before is the plan's choice).
- critical chain: where the makespan went. From the job that ended last,
  back through the job whose hold on one of its first GPUs ended last before
  it started, to a job that waited for no one; for those jobs, the actual
  waits (start minus its predecessor's end) and runs (first start to last
  end) beside the first plan's, so a late end reads as late hand-overs
  (waits) or slow runs (start overhead, epoch times).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Sequence

from services.planner import report
from services.planner.report import Event, Hold


def in_job_seconds(events: Sequence[Event], origin_s: float, speed: float) -> list[Event]:
    """The events with time_s = (time_s - origin_s) x speed."""
    return [replace(e, time_s=(e.time_s - origin_s) * speed) for e in events]


def epochs_run_twice(events: Sequence[Event]) -> int:
    counts = Counter((e.job_id, e.epoch) for e in events if e.kind == report.EPOCH_DONE)
    return sum(n - 1 for n in counts.values())


def as_planned(events: Sequence[Event], holds: Sequence[Hold], first_plan: dict | None) -> float:
    """Share of the epochs (each job's first run of each) that ran on exactly the GPUs the first plan
    gave them (its segments in start order per job, each covering its `epochs` epochs); 0 without a plan."""
    planned: dict[tuple[str, int], frozenset] = {}
    done: dict[str, int] = {}
    for seg in sorted((first_plan or {}).get("segments", ()), key=lambda seg: seg["start_s"]):
        first = done.get(seg["job"], 0)
        for k in range(first + 1, first + seg["epochs"] + 1):
            planned[seg["job"], k] = frozenset((n, int(i)) for n, i in seg["gpus"])
        done[seg["job"]] = first + seg["epochs"]
    ran_on: dict[str, set] = {}
    for h in holds:
        ran_on.setdefault(h.attempt_id, set()).update(h.gpus)
    firsts = {(e.job_id, e.epoch): e.attempt_id for e in reversed(events) if e.kind == report.EPOCH_DONE}
    if not firsts or not planned:
        return 0.0
    return sum(planned.get(key) == ran_on.get(attempt) for key, attempt in firsts.items()) / len(firsts)


def double_owned_gpu_s(holds: Sequence[Hold]) -> float:
    """GPU-seconds in which two different attempts held one GPU."""
    total = 0.0
    for _, a, b in report.ownership_conflicts(holds):
        total += max(0.0, min(a.end_s, b.end_s) - b.start_s)
    return total


#: The longest hand-overs `control` names.
WORST = 5


def reuse_gaps(holds: Sequence[Hold]) -> list[float]:
    """One gap per hold that takes over a GPU from another job (see the module docstring), in the holds' unit."""
    return [gap for gap, _ in hand_overs(holds)]


def hand_overs(holds: Sequence[Hold]) -> list[tuple[float, Hold]]:
    """(reuse gap, hold) of each hold that takes over a GPU from another job, in the holds' unit."""
    by_gpu: dict[tuple[str, int], list[Hold]] = {}
    for h in holds:
        for g in h.gpus:
            by_gpu.setdefault(g, []).append(h)
    for hs in by_gpu.values():
        hs.sort(key=lambda h: h.start_s)
    attempts: dict[tuple[str, str], list[Hold]] = {}
    for h in holds:
        attempts.setdefault((h.job_id, h.attempt_id), []).append(h)
    ended: dict[str, list[tuple[float, float]]] = {}  # job: (start, end) of each attempt
    for (job_id, _), parts in attempts.items():
        ended.setdefault(job_id, []).append((min(p.start_s for p in parts), max(p.end_s for p in parts)))
    freed: dict[tuple[str, str], tuple[float | None, bool]] = {}  # attempt: (it could begin, handed over)
    for key, parts in attempts.items():
        begin = min(p.start_s for p in parts)
        earlier = [end for start, end in ended[key[0]] if start < begin]
        ready, handed_over = (max(earlier) if earlier else None), False
        for part in parts:
            for g in part.gpus:
                before = [p for p in by_gpu[g] if p.start_s < part.start_s and p is not part]
                if not before:
                    continue
                prev = before[-1]
                handed_over |= prev.job_id != part.job_id
                ready = prev.end_s if ready is None else max(ready, prev.end_s)
        freed[key] = (ready, handed_over)
    out = []
    for h in holds:
        ready, handed_over = freed[(h.job_id, h.attempt_id)]
        if handed_over and ready is not None and ready <= h.start_s:
            out.append((h.start_s - ready, h))
    return out


def critical_chain(holds: Sequence[Hold], planned: Sequence[report.PlannedSegment]) -> dict:
    """The chain of jobs that set the makespan (module docstring), first job first, and its sums.

    Each link: job, actual start/end, planned start/end (None when the plan
    had no segment of it), wait (start minus the predecessor's end; the first
    link's: its start). Totals: wait and run, actual and planned."""
    if not holds:
        return {"links": [], "wait_s": 0.0, "run_s": 0.0, "planned_wait_s": 0.0, "planned_run_s": 0.0}
    span: dict[str, list[float]] = {}
    for h in holds:
        s = span.setdefault(h.job_id, [h.start_s, h.end_s])
        s[0], s[1] = min(s[0], h.start_s), max(s[1], h.end_s)
    plan: dict[str, list[float]] = {}
    for seg in planned:
        p = plan.setdefault(seg.job_id, [seg.start_s, seg.end_s])
        p[0], p[1] = min(p[0], seg.start_s), max(p[1], seg.end_s)
    by_gpu: dict = {}
    for h in holds:
        for g in h.gpus:
            by_gpu.setdefault(g, []).append(h)
    chain, job, seen = [], max(span, key=lambda j: span[j][1]), set()
    while job is not None and job not in seen:
        seen.add(job)
        start = span[job][0]
        first = {g for h in holds if h.job_id == job and h.start_s == start for g in h.gpus}
        before = [h for g in first for h in by_gpu[g] if h.job_id != job and h.end_s <= start + 1e-9]
        pred = max(before, key=lambda h: h.end_s).job_id if before else None
        chain.append((job, pred))
        job = pred
    links = []
    for job, pred in reversed(chain):
        (start, end), planned_span = span[job], plan.get(job)
        wait = start - (span[pred][1] if pred else 0.0)
        planned_wait = None
        if planned_span is not None:
            planned_wait = planned_span[0] - (plan[pred][1] if pred in plan else 0.0)
        links.append({"job": job, "start_s": start, "end_s": end, "wait_s": wait,
                      "planned_start_s": planned_span[0] if planned_span else None,
                      "planned_end_s": planned_span[1] if planned_span else None, "planned_wait_s": planned_wait})
    return {"links": links, "wait_s": sum(link["wait_s"] for link in links),
            "run_s": sum(link["end_s"] - link["start_s"] for link in links),
            "planned_wait_s": sum(link["planned_wait_s"] or 0.0 for link in links),
            "planned_run_s": sum(link["planned_end_s"] - link["planned_start_s"] for link in links
                                 if link["planned_end_s"] is not None)}


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by the nearest rank; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def spread(values: Sequence[float], prefix: str) -> dict[str, float]:
    """{prefix_p50, prefix_p99, prefix_max} of the values."""
    return {f"{prefix}_p50": percentile(values, 0.5), f"{prefix}_p99": percentile(values, 0.99),
            f"{prefix}_max": max(values, default=0.0)}


def figures(events: Sequence[Event], origin_s: float, speed: float, gpus: int, job_ids: Sequence[str],
            first_plan: dict | None, policy: str, lower_bound_s: float) -> tuple[dict, list[Hold], list]:
    """The report's figures in job seconds (report.figures on the scaled events) and first_plan_at_s (when
    the first plan was stored), the holds and the planned segments (both in job seconds after the origin)."""
    from services.planner import convert

    scaled = in_job_seconds(events, origin_s, speed)
    # the plan's segments are in job seconds after its creation
    plan = convert.planned_segments(first_plan)
    plan_origin = (first_plan["created_unix_s"] - origin_s) * speed if first_plan else 0.0
    f = report.figures(scaled, gpus, 0.0, plan, plan_origin_s=plan_origin, policy=policy,
                       lower_bound_s=lower_bound_s, jobs=job_ids)
    hs = report.holds(scaled)
    shifted = [replace(s, start_s=s.start_s + plan_origin, end_s=s.end_s + plan_origin) for s in plan]
    # the first plan's wait (submission to plan) in job seconds: the emulation scales the jobs' time, not
    # the planner's, so a plan that takes 5 wall s weighs `speed` times more here than on a cluster
    return {**f.to_dict(), "first_plan_at_s": plan_origin, "as_planned": as_planned(events, hs, first_plan),
            "critical_chain": critical_chain(hs, shifted)}, hs, shifted


def control(events: Sequence[Event], holds: Sequence[Hold], speed: float, wall_s: float,
            plan_seconds: Sequence[float], etcd_requests: float, cpu: dict[str, float]) -> dict:
    """The control plane's figures; `holds` in job seconds, reuse gaps in wall seconds."""
    taken = sorted(((g / speed, h) for g, h in hand_overs(holds)), key=lambda x: -x[0])
    gaps = [g for g, _ in taken]
    out = {"reconciles": len(plan_seconds), **spread(plan_seconds, "plan_s"),
           "reuse_gap_s_p50": percentile(gaps, 0.5), "reuse_gap_s_p99": percentile(gaps, 0.99),
           "reuse_gap_s_max": max(gaps, default=0.0), "hand_overs": len(gaps),
           # where the tail is: the longest hand-overs (job seconds of the start, on the first plan's clock)
           "worst_hand_overs": [{"gap_s": round(g, 2), "job_id": h.job_id, "attempt_id": h.attempt_id,
                                 "node_id": h.node_id, "start_s": round(h.start_s, 1)} for g, h in taken[:WORST]],
           "etcd_requests_per_s": etcd_requests / wall_s if wall_s > 0 else 0.0,
           "executor_events_per_s": len(events) / wall_s if wall_s > 0 else 0.0}
    out.update(cpu)
    return out
