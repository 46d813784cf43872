"""The emulated cluster: the real etcd, registry, planner and executors, emulated workers.

Each run starts every service as a process (as `omru up` does) and emulated
nodes a few to a process; the assertions come from the executors' own events.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from omru.cli.main import main
from services.emulator import measure
from services.emulator.cluster import EmulatedCluster, EmulationConfig, drive
from services.planner import report
from services.planner.core import profiles
from services.planner.core.model import Job

GPUS_PER_NODE = 2


def batch(n: int, gpus: int, seed: int, epochs: tuple[int, int], seconds: tuple[float, float]) -> list[Job]:
    """n jobs with seeded epoch counts and sub-linear speed-ups on 1..gpus GPUs."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        t1, alpha = rng.uniform(*seconds), rng.uniform(0.6, 0.95)
        jobs.append(Job(f"job-{i}", rng.randint(*epochs), {g: round(t1 / g ** alpha, 3) for g in range(1, gpus + 1)}))
    return jobs


def emulation(tmp_path, jobs: list[Job], nodes: int, **options) -> tuple[EmulatedCluster, EmulationConfig]:
    path = tmp_path / "profiles.csv"
    path.write_text(profiles.to_csv(jobs))
    config = EmulationConfig(profiles=str(path), nodes=nodes, gpus_per_node=GPUS_PER_NODE, policy="omru",
                             timeout_s=240, **options)
    return EmulatedCluster(config, work_dir=tmp_path / "emulation"), config


def epoch_events(events, job_id: str) -> list[report.Event]:
    return [e for e in events if e.kind == report.EPOCH_DONE and e.job_id == job_id]


def test_a_small_emulation_runs_every_epoch_exactly_once_at_the_profiled_speed_and_no_gpu_has_two_owners(tmp_path):
    jobs = batch(20, 8 * GPUS_PER_NODE, seed=3, epochs=(2, 5), seconds=(20.0, 60.0))
    cluster, config = emulation(tmp_path, jobs, nodes=8, speed=200.0, resize_cost_s=4.0, nodes_per_process=4)
    with cluster:
        run = asyncio.run(drive(cluster, jobs))
    events = run["events"]
    assert {r.job_id: r.state for r in run["records"]} == {j.id: "FINISHED" for j in jobs}
    for j in jobs:
        done = epoch_events(events, j.id)
        assert sorted(e.epoch for e in done) == list(range(1, j.epochs + 1)), j.id
        for e in done:  # noise 0: each epoch took the profile's time on the GPUs it ran on (job seconds)
            assert e.epoch_seconds == pytest.approx(j.profile[e.world_size]), (j.id, e.epoch, e.world_size)
    assert measure.epochs_run_twice(events) == 0
    assert measure.double_owned_gpu_s(report.holds(events)) == 0.0
    nodes = {e.node_id for e in events if e.kind == report.STARTED}
    assert len(nodes) > 4, "the jobs ran on the nodes of both processes"


def test_the_jobs_of_a_killed_node_process_finish_elsewhere_from_their_checkpoints(tmp_path):
    jobs = batch(8, 4 * GPUS_PER_NODE, seed=5, epochs=(8, 10), seconds=(30.0, 40.0))
    cluster, config = emulation(tmp_path, jobs, nodes=4, speed=100.0, nodes_per_process=2, ttl_seconds=2)
    with cluster:
        run = asyncio.run(drive(cluster, jobs, kill_process_at=0.3))
    events, killed = run["events"], set(run["killed_nodes"])
    assert len(killed) == 2
    assert {r.job_id: r.state for r in run["records"]} == {j.id: "FINISHED" for j in jobs}
    kill_time = max(e.time_s for e in events if e.node_id in killed)
    moved = {e.job_id for e in events if e.node_id in killed and e.kind == report.STARTED}
    assert moved, "a job ran on the nodes that were killed"
    for job_id in moved:
        resumed = [e for e in events if e.job_id == job_id and e.kind == report.STARTED and e.time_s > kill_time
                   and e.node_id not in killed]
        finished = [e for e in events if e.job_id == job_id and e.kind == report.FINISHED]
        # it restarted on a surviving node from a checkpoint (the resume point is past epoch 0) or had finished
        assert finished and (any(e.epoch > 0 for e in resumed) or finished[0].time_s <= kill_time), job_id
    assert measure.epochs_run_twice(events) == 0
    assert measure.double_owned_gpu_s(report.holds(events)) == 0.0


@pytest.mark.parametrize("argv, problem", [
    (["--speed", "0"], "--speed 0.0 must be a positive number"),
    (["--noise", "-0.1"], "--noise -0.1 must be >= 0"),
    (["--nodes", "600"], "--nodes 600 is not in 1..512"),
    (["--nodes", "512", "--gpus-per-node", "16"], "8192 GPUs, more than the emulator holds here (4096)"),
    (["--resize-cost", "-1"], "--resize-cost -1.0 must be >= 0"),
])
def test_bad_settings_exit_2_naming_the_value(tmp_path, capsys, argv, problem):
    path = tmp_path / "p.csv"
    path.write_text("job,epochs,gpus,epoch_seconds\na,2,1,4.0\n")
    settings = {"--nodes": "2", "--gpus-per-node": "1", "--speed": "10"}
    for flag, value in zip(argv[::2], argv[1::2]):
        settings[flag] = value
    args = ["emulate", "--profiles", str(path), "--policy", "omru"] + [x for kv in settings.items() for x in kv]
    assert main(args) == 2
    assert problem in capsys.readouterr().err


def test_a_csv_the_simulator_refuses_is_refused_the_same_way(tmp_path, capsys):
    path = tmp_path / "p.csv"
    path.write_text("job,epochs,gpus,epoch_seconds\na,2,1,4.0\na,2,2,nan\n")
    assert main(["emulate", "--profiles", str(path), "--nodes", "1", "--gpus-per-node", "2", "--policy", "omru",
                 "--speed", "10"]) == 2
    err = capsys.readouterr().err
    assert "line 3" in err and "epoch_seconds" in err
    assert main(["simulate", "--profiles", str(path), "--gpus", "2", "--policy", "omru"]) == 2
    assert capsys.readouterr().err == err.replace("emulate", "simulate")


def test_an_emulated_epoch_takes_the_time_of_its_placement():
    from services.executor.emulated import epoch_seconds, noise_factor

    job = Job("j", 3, {1: 400.0, 4: 100.0}, placement={(4, 2): 300.0, (4, 3): 250.0})
    assert epoch_seconds(job, 4, 1, gpus_per_node=4) == 100.0  # packed: the profile's row
    assert epoch_seconds(job, 4, 2, gpus_per_node=4) == 300.0  # measured spread
    assert epoch_seconds(job, 4, 4, gpus_per_node=4) == 250.0  # wider than measured: the widest known
    factors = [noise_factor(7, "j", e, 0.1) for e in range(4000)]
    mean = sum(factors) / len(factors)
    cv = (sum((f - mean) ** 2 for f in factors) / len(factors)) ** 0.5 / mean
    assert abs(mean - 1) < 0.01 and abs(cv - 0.1) < 0.01
    assert noise_factor(7, "j", 5, 0.1) == factors[5] and noise_factor(8, "j", 5, 0.1) != factors[5]
    assert noise_factor(7, "j", 5, 0.0) == 1.0


def test_a_reuse_gap_counts_from_when_all_of_an_attempts_gpus_were_free():
    def hold(job, attempt, node, start, end):
        return report.Hold(job, attempt, node, ((node, 0),), start, end, 2)

    holds = [hold("a", "a-a1", "n0", 0.0, 10.0), hold("c", "c-a1", "n1", 0.0, 50.0),
             # b's part on n0 waits for c's GPU on n1 by plan: from 50 on, not from 10
             hold("b", "b-a1", "n0", 52.0, 90.0), hold("b", "b-a1", "n1", 51.0, 90.0),
             hold("d", "d-a1", "n2", 5.0, 30.0),  # on a GPU nobody held: no hand-over
             # y moves onto e's GPU, idle since 20, at its own epoch boundary (60): from 60 on, not from 20
             hold("e", "e-a1", "n4", 0.0, 20.0), hold("y", "y-a1", "n3", 0.0, 60.0), hold("y", "y-a2", "n4", 63.0, 90.0)]
    assert sorted(measure.reuse_gaps(holds)) == [1.0, 2.0, 3.0]
    worst = measure.control([], holds, 2.0, 1.0, [], 0.0, {})["worst_hand_overs"]  # wall seconds at speed 2
    assert [(w["gap_s"], w["job_id"], w["node_id"]) for w in worst] == [(1.5, "y", "n4"), (1.0, "b", "n0"), (0.5, "b", "n1")]


def test_as_planned_is_the_share_of_epochs_run_on_the_gpus_the_first_plan_gave_them():
    plan = {"segments": [{"job": "a", "start_s": 0.0, "gpus": [["n0", 0], ["n0", 1]], "epochs": 2},
                         {"job": "a", "start_s": 9.0, "gpus": [["n1", 0]], "epochs": 2}]}
    holds = [report.Hold("a", "a-a1", "n0", (("n0", 0), ("n0", 1)), 0.0, 9.0, 2),
             report.Hold("a", "a-a2", "n0", (("n0", 0),), 9.0, 20.0, 1)]  # not where planned (n1)

    def epoch(k, attempt):
        return report.Event("n0", "a", report.EPOCH_DONE, float(k), attempt_id=attempt, epoch=k)

    events = [epoch(1, "a-a1"), epoch(2, "a-a1"), epoch(3, "a-a2"), epoch(4, "a-a2"), epoch(4, "a-a2")]
    assert measure.as_planned(events, holds, plan) == 0.5  # epochs 1-2 as planned, 3-4 elsewhere
    assert measure.as_planned(events, holds[:1] + [report.Hold("a", "a-a2", "n1", (("n1", 0),), 9.0, 20.0, 1)],
                              plan) == 1.0
    assert measure.as_planned(events, holds, None) == 0.0


def test_the_critical_chain_follows_the_hand_overs_back_from_the_job_that_ended_last():
    H, P = report.Hold, report.PlannedSegment
    holds = [H("a", "a-1", "n0", (("n0", 0),), 1.0, 10.0, 1),
             H("x", "x-1", "n1", (("n1", 0),), 0.0, 30.0, 1),  # ends late but waits for no one and hands nothing over
             H("b", "b-1", "n0", (("n0", 0), ("n0", 1)), 12.0, 20.0, 2),
             H("c", "c-1", "n0", (("n0", 1),), 25.0, 40.0, 1),  # ended last: after b on n0:1
             H("d", "d-1", "n1", (("n1", 0),), 31.0, 35.0, 1)]
    planned = [P("a", 0.0, 9.0, (("n0", 0),)), P("b", 9.0, 15.0, (("n0", 0), ("n0", 1))),
               P("c", 15.0, 30.0, (("n0", 1),))]
    chain = measure.critical_chain(holds, planned)
    assert [link["job"] for link in chain["links"]] == ["a", "b", "c"]
    assert [link["wait_s"] for link in chain["links"]] == [1.0, 2.0, 5.0]
    assert [link["planned_wait_s"] for link in chain["links"]] == [0.0, 0.0, 0.0]
    assert (chain["wait_s"], chain["run_s"], chain["planned_run_s"]) == (8.0, 32.0, 30.0)
    assert measure.critical_chain([], planned)["links"] == []
