"""Node packing behind `omru` (core/nodepack.py): one node per job, node plans, moves between nodes."""

from __future__ import annotations

import pytest

from core_builders import multi_node_instance
from services.planner.core import fluid, nodepack, validate
from services.planner.core.model import Cluster, Job, Plan, PlanningInput
from services.planner.core.nodepack import NodePacker
from services.planner.core.policies import omru

SEEDS = range(16)


def _pack(p, f: float):
    D = fluid.durations(p)
    return NodePacker(p, D, omru._node_schedule).pack(f * fluid.solve(p).T), D


@pytest.mark.parametrize("seed", SEEDS)
def test_every_job_runs_on_one_node_after_a_wide_part_from_the_start_and_the_plan_keeps_every_rule(seed):
    p = multi_node_instance(seed)
    K = p.cluster.gpus_per_node
    for f in (1.0, 1.3):
        T = f * fluid.solve(p).T
        segments, D = _pack(p, f)
        one_node = D[:, :K].min(axis=1)  # each job's fastest time on one node
        if segments is None:  # only when some job cannot end by the target on one node
            assert (one_node > T).any()
            continue
        plan = Plan("omru", tuple(segments))
        assert validate.violations(plan, p) == []
        wide_nodes = set()
        for i, job in enumerate(p.jobs):
            mine = sorted((s for s in segments if s.job == job.id), key=lambda s: s.start_s)
            assert sum(s.epochs for s in mine) == job.epochs
            if one_node[i] > T:  # a wide part on whole nodes of its own from the start, then one node
                wide, rest = mine[0], mine[1:]
                assert wide.start_s == 0.0 and len(wide.gpus) > K
                spanned = {g // K for g in wide.gpus}
                assert len(spanned) == -(-len(wide.gpus) // K) and not spanned & wide_nodes, job.id
                wide_nodes |= spanned
                assert rest and rest[0].start_s >= wide.end_s
            else:
                rest = mine
            assert len({g // K for s in rest for g in s.gpus}) == 1, job.id


def test_wide_jobs_run_wide_first_then_on_one_node_and_others_use_their_nodes_after():
    """Two 4-GPU nodes; job `wide` needs 8 GPUs for part of its epochs to end by T; `short`
    fits beside it on one node. The wide part holds both nodes from 0, then the wide job's
    remaining epochs run on one node after a restart while `short` runs on the other."""
    R = 10.0
    wide = Job("wide", 10, {g: 100.0 / g for g in range(1, 9)})  # 4 GPUs: 250 s, 8 GPUs: 125 s
    short = Job("short", 2, {g: 60.0 / g for g in range(1, 9)})
    p = PlanningInput((wide, short), Cluster(2, 4), resize_cost_s=R)
    D = fluid.durations(p)
    T = 220.0
    segments = NodePacker(p, D, omru._node_schedule).pack(T)
    assert validate.violations(Plan("omru", tuple(segments)), p) == []
    w = sorted((s for s in segments if s.job == "wide"), key=lambda s: s.start_s)
    # fewest wide epochs x with (10 - x) 25 + x 12.5 + R <= 220: x = 4
    assert [(s.start_s, len(s.gpus), s.epochs) for s in w] == [(0.0, 8, 4), (50.0, 4, 6)]
    assert w[1].end_s == pytest.approx(50.0 + R + 6 * 25.0)
    (s,) = [s for s in segments if s.job == "short"]
    assert s.start_s >= 50.0 and {g // 4 for g in s.gpus} != {g // 4 for g in w[1].gpus}
    assert max(x.end_s for x in segments) <= T


def test_moves_between_nodes_never_end_a_packing_later_and_sometimes_earlier(monkeypatch):
    earlier = 0
    for seed in SEEDS:
        p = multi_node_instance(seed)
        segments, _ = _pack(p, 1.0)
        if segments is None:
            continue
        with monkeypatch.context() as m:
            m.setattr(nodepack, "EVALS", p.cluster.nodes)  # only the first node plans: no moves
            start, _ = _pack(p, 1.0)
        end, first = max(s.end_s for s in segments), max(s.end_s for s in start)
        assert end <= first * (1 + 1e-9), seed
        earlier += end < first * (1 - 1e-6)
    assert earlier >= 2


@pytest.mark.parametrize("seed", SEEDS[:8])
def test_column_generation_packings_end_by_their_target_one_node_per_job_and_keep_every_rule(seed):
    p = multi_node_instance(seed)
    K = p.cluster.gpus_per_node
    D = fluid.durations(p)
    packer = NodePacker(p, D, omru._node_schedule)
    T_star = fluid.solve(p, D).T
    found = 0
    for f in (1.1, 1.3):
        T = f * T_star
        segments = packer.pack(T, columns=True)
        if segments is None:
            continue
        found += 1
        assert validate.violations(Plan("omru", tuple(segments)), p) == []
        assert max(s.end_s for s in segments) <= T * (1 + 1e-9)
        for job in p.jobs:
            mine = sorted((s for s in segments if s.job == job.id), key=lambda s: s.start_s)
            assert sum(s.epochs for s in mine) == job.epochs
            rest = mine[1:] if len(mine[0].gpus) > K else mine  # after a wide part, if any
            assert len({g // K for s in rest for g in s.gpus}) == 1, job.id
    assert found  # at 1.3 T* at least (these instances always fit then)


def test_column_generation_finds_the_one_exact_partition_of_rigid_jobs_onto_nodes():
    """Eight one-epoch jobs that only run well on a whole node (4 GPUs), 500, 500, 400, 400,
    300, 300, 300 and 300 s there, on three nodes by T = 1,000 s: the nodes must run exactly
    {500, 500}, {400, 300, 300} and {400, 300, 300} back to back."""
    G = 12

    def rigid(name: str, d: float) -> Job:
        return Job(name, 1, {g: (10 * d if g < 4 else d) for g in range(1, G + 1)})

    lengths = (500, 500, 400, 400, 300, 300, 300, 300)
    p = PlanningInput(tuple(rigid(f"j{i}", d) for i, d in enumerate(lengths)), Cluster(3, 4))
    segments = NodePacker(p, fluid.durations(p), omru._node_schedule).pack(1000.0, columns=True)
    assert segments is not None and validate.violations(Plan("omru", tuple(segments)), p) == []
    assert max(s.end_s for s in segments) == pytest.approx(1000.0)
    by_node: dict[int, list[int]] = {}
    for s in segments:
        assert len(s.gpus) == 4
        by_node.setdefault(s.gpus[0] // 4, []).append(lengths[int(s.job[1:])])
    assert sorted(sorted(d) for d in by_node.values()) == [[300, 300, 400], [300, 300, 400], [500, 500]]


def test_a_job_that_needs_most_of_a_node_gets_all_of_it_so_that_the_others_fit_after_it():
    """One 4-GPU node, T = 1,000 s: a one-epoch job of 820 s on 3 GPUs or 610 s on 4 (about the
    same GPU-seconds), and two 2-epoch jobs of 740 s on 1 GPU or 378 s on 2. At the fewest GPUs
    that end each by T they miss it (the big job on 3 GPUs leaves 1, the second small job
    waits); the big job on the whole node, then the small ones on 2 GPUs each, ends by 1,000 s."""
    big = Job("big", 1, {1: 2440.0, 2: 1220.0, 3: 820.0, 4: 610.0})
    small = [Job(f"small{i}", 2, {1: 370.0, 2: 189.0, 3: 143.0, 4: 120.0}) for i in range(2)]
    p = PlanningInput((big, *small), Cluster(1, 4), resize_cost_s=10.0)
    packer = NodePacker(p, fluid.durations(p), omru._node_schedule)
    end, segments = packer.node([0, 1, 2], 1000.0)
    assert end <= 1000.0
    assert validate.violations(Plan("omru", segments), p) == []
    assert [len(s.gpus) for s in segments if s.job == "big"] == [4]
