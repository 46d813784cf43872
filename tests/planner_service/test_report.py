"""The report: figures computed from executor events, ownership replay, Gantt PNG."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.planner import report
from services.planner.report import Event, PlannedSegment

T0 = 1000.0


def ev(node, job, kind, t, attempt="a1", gpus=(), world=0, epoch=0, secs=0.0, acc=0.0):
    return Event(node_id=node, job_id=job, kind=kind, time_s=T0 + t, attempt_id=attempt, gpus=gpus,
                 world_size=world or len(gpus), epoch=epoch, epoch_seconds=secs, accuracy=acc)


def two_jobs_one_grows():
    """n0 has GPUs 0,1. Job A on n0:0 for 10 s; job B on n0:1, then grows to both at 11 s."""
    a, b1, b2 = (("n0", 0),), (("n0", 1),), (("n0", 0), ("n0", 1))
    return [
        ev("n0", "A", "started", 0, gpus=a),
        ev("n0", "A", "epoch_done", 5, gpus=a, epoch=1, secs=5, acc=0.5),
        ev("n0", "A", "epoch_done", 10, gpus=a, epoch=2, secs=5, acc=0.7),
        ev("n0", "A", "finished", 10, gpus=a),
        ev("n0", "A", "gpus_released", 10.5, gpus=a),
        ev("n0", "B", "started", 0, gpus=b1),
        ev("n0", "B", "epoch_done", 8, gpus=b1, epoch=1, secs=8, acc=0.4),
        ev("n0", "B", "gpus_released", 10.8, gpus=b1),
        ev("n0", "B", "started", 11, attempt="a2", gpus=b2),
        ev("n0", "B", "epoch_done", 16, attempt="a2", gpus=b2, epoch=2, secs=5, acc=0.8),
        ev("n0", "B", "finished", 16, attempt="a2", gpus=b2),
        ev("n0", "B", "gpus_released", 16.2, attempt="a2", gpus=b2),
    ]


def test_figures_follow_from_the_events():
    plan = [PlannedSegment("A", 0, 10, (("n0", 0),)), PlannedSegment("B", 0, 15, (("n0", 1),))]
    f = report.figures(two_jobs_one_grows(), gpus=2, origin_s=T0, plan=plan, policy="omru")
    assert f.makespan_s == pytest.approx(16.0)
    assert f.planned_makespan_s == pytest.approx(15.0)
    assert f.makespan_error == pytest.approx(1 / 15)
    # held: A 10 s on 1 GPU (released at 10.5 but counted to makespan = 16 only)
    held = 10.5 + 10.8 + 2 * (16 - 11)
    assert f.utilisation == pytest.approx(held / (2 * 16))
    assert f.compute_utilisation == pytest.approx((5 + 5 + 8 + 2 * 5) / (2 * 16))
    assert f.all_finished
    a, b = f.jobs
    assert (a.job_id, a.epochs_done, a.accuracy, a.actual_finish_s, a.planned_finish_s) == ("A", 2, 0.7, 10.0, 10.0)
    assert b.world_sizes == (1, 2) and b.epochs_done == 2
    assert [(r.job_id, r.from_size, r.to_size, r.time_s) for r in f.resizes] == [("B", 1, 2, 11.0)]


def test_no_gpu_with_two_owners_gives_no_conflict_and_an_overlap_is_found():
    hs = report.holds(two_jobs_one_grows())
    assert report.ownership_conflicts(hs) == []
    # B's second attempt claims GPU 0 while A still holds it
    bad = two_jobs_one_grows()
    bad[8] = ev("n0", "B", "started", 9, attempt="a2", gpus=(("n0", 0), ("n0", 1)))
    conflicts = report.ownership_conflicts(report.holds(bad))
    assert [(g, a.job_id, b.job_id) for g, a, b in conflicts][:1] == [(("n0", 0), "A", "B")]


def test_an_unfinished_job_is_open_and_its_hold_runs_to_now():
    events = [ev("n0", "A", "started", 0, gpus=(("n0", 0),)),
              ev("n0", "A", "epoch_done", 4, gpus=(("n0", 0),), epoch=1, secs=4)]
    f = report.figures(events, gpus=1, origin_s=T0, now_s=T0 + 6)
    assert not f.all_finished and f.jobs[0].epochs_done == 1
    assert f.jobs[0].gpu_seconds == pytest.approx(6.0)


def test_a_multi_node_attempt_holds_only_its_local_gpus_on_each_node():
    gs = (("n0", 0), ("n1", 0))
    events = [ev("n0", "A", "started", 0, gpus=gs), ev("n1", "A", "started", 0, gpus=gs),
              ev("n0", "A", "gpus_released", 5, gpus=gs), ev("n1", "A", "gpus_released", 5, gpus=gs)]
    hs = report.holds(events)
    assert sorted(h.gpus for h in hs) == [(("n0", 0),), (("n1", 0),)]
    assert all(h.world_size == 2 for h in hs)


def test_an_unknown_event_kind_is_rejected_by_name():
    with pytest.raises(ValueError, match="'exploded'"):
        Event("n0", "A", "exploded", 0.0)


def test_the_gantt_chart_is_a_png(tmp_path):
    path = tmp_path / "g.png"
    plan = [PlannedSegment("A", 0, 10, (("n0", 0),))]
    report.gantt(str(path), report.holds(two_jobs_one_grows()), T0, plan=plan, title="demo")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 2000


def test_the_text_report_names_every_job_and_the_resize():
    f = report.figures(two_jobs_one_grows(), gpus=2, origin_s=T0)
    out = report.text(f)
    assert "B 1->2 at 11.0 s" in out and out.count("finished") == 2


def test_a_resize_that_keeps_a_gpu_ends_the_old_hold_when_the_new_attempt_starts():
    one, two = (("n0", 0),), (("n0", 0), ("n0", 1))
    events = [ev("n0", "A", "started", 0, gpus=one), ev("n0", "A", "started", 5, attempt="a2", gpus=two),
              ev("n0", "A", "finished", 9, attempt="a2", gpus=two), ev("n0", "A", "gpus_released", 9, attempt="a2", gpus=two)]
    hs = report.holds(events)
    assert [(h.attempt_id, h.start_s - T0, h.end_s - T0, len(h.gpus)) for h in hs] == [("a1", 0, 5, 1), ("a2", 5, 9, 2)]
    assert report.ownership_conflicts(hs) == []


def test_batches_are_parted_by_an_idle_cluster_only():
    spans = {"a": (0.0, 10.0), "b": (5.0, 20.0), "c": (20.0, 25.0), "d": (30.0, 31.0), "e": (31.0, 31.0)}
    assert report.batches(spans) == [["a", "b", "c"], ["d", "e"]]
    assert report.batches({}) == []


def test_a_subset_counts_its_own_jobs_from_its_own_start():
    f = report.figures(two_jobs_one_grows(), gpus=2, origin_s=T0,
                       plan=[PlannedSegment("A", 0, 10, (("n0", 0),)), PlannedSegment("B", 0, 15, (("n0", 1),))])
    f = replace(f, jobs=tuple(replace(j, state="FINISHED") for j in f.jobs))
    sub, hs = report.subset(f, report.holds(two_jobs_one_grows()), ["B"], 1.0)
    assert [j.job_id for j in sub.jobs] == ["B"] and sub.jobs[0].actual_finish_s == pytest.approx(15.0)
    assert sub.makespan_s == pytest.approx(15.0) and sub.planned_makespan_s == pytest.approx(14.0)
    assert min(h.start_s for h in hs) == pytest.approx(T0 - 1.0)  # (holds are Unix seconds: moved by 1 s)
    assert [(r.job_id, r.time_s) for r in sub.resizes] == [("B", 10.0)] and sub.compute_utilisation == -1.0


def test_the_text_names_the_plans_shows_cancelled_jobs_and_unknowns_as_dashes():
    f = report.figures(two_jobs_one_grows(), gpus=2, origin_s=T0, plan=[PlannedSegment("A", 0, 10, (("n0", 0),))])
    f = replace(f, jobs=(replace(f.jobs[0], state="FINISHED"), replace(f.jobs[1], state="CANCELLED")))
    out = report.text(f, "v1 (omru)", {"B": ("v3", 14.5)})
    assert "planned by the first plan v1 (omru) (not comparable: B not in it)" in out
    a, b = [line.split() for line in out.splitlines() if line.split()[0] in ("A", "B")]
    assert a[1] == "finished" and a[5] == "10.0" and a[6] == "-"  # no plan known at its start
    assert b[1] == "cancelled" and b[5] == "-" and b[6:8] == ["14.5", "v3"]
    assert "(in epochs)" not in report.text(replace(f, compute_utilisation=-1.0))


def test_the_gantt_names_every_job_in_its_legend(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    seen = {}
    save = plt.Figure.savefig

    def spy(fig, *args, **kw):
        seen["legend"] = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
        seen["panels"] = [ax.get_ylabel() for ax in fig.axes]
        return save(fig, *args, **kw)

    plt.Figure.savefig = spy
    try:
        report.gantt(str(tmp_path / "g.png"), report.holds(two_jobs_one_grows()), T0,
                     plan=[PlannedSegment("A", 0, 10, (("n0", 0),)), PlannedSegment("C", 10, 12, (("n0", 0),))],
                     plan_origin_s=T0, jobs=["A", "B", "C", "D"], plan_name="planned (v1)")
    finally:
        plt.Figure.savefig = save
    assert seen["legend"] == ["A", "B (not planned)", "C (did not run)", "D (not planned, did not run)"]
    assert seen["panels"] == ["planned (v1)", "actual"]
