"""Lower bounds, checked on instances small enough to solve by hand."""

from __future__ import annotations

import pytest

from core_builders import example_problem, job, problem
from services.planner.core import bounds


def test_perfectly_scaling_jobs_have_every_bound_equal_to_the_area():
    p = problem([job("a", 1, 10.0, 5.0), job("b", 1, 10.0, 5.0)], gpus=2)
    lb = bounds.all_bounds(p)
    assert (lb.length_s, lb.area_s) == (5.0, 10.0)
    assert lb.fluid_s == pytest.approx(10.0)
    assert lb.static_s == pytest.approx(10.0)


def test_a_single_poorly_scaling_job_is_bounded_by_its_fastest_run():
    # D(1) = 10, D(2) = 8: area says 5, but the job alone needs 8 on 2 GPUs.
    lb = bounds.all_bounds(problem([job("a", 1, 10.0, 8.0)], gpus=2))
    assert lb.area_s == 5.0 and lb.length_s == 8.0
    assert lb.fluid_s == pytest.approx(8.0) and lb.static_s == pytest.approx(8.0)


def test_fluid_mixes_gpu_counts_where_static_must_pick_one():
    # Two jobs on 3 GPUs, D(1) = 12, D(2) = 7, D(3) = 6.
    jobs = [job("a", 1, 12.0, 7.0, 6.0), job("b", 1, 12.0, 7.0, 6.0)]
    lb = bounds.all_bounds(problem(jobs, gpus=3))
    # Fluid: each job a share x of its work on 1 GPU, 1-x on 2: 12x + 7(1-x) = T
    # and 2(12x + 14(1-x)) = 3T -> x = 7/19, T = 168/19.
    assert lb.fluid_s == pytest.approx(168 / 19)
    # Static: areas 12 (D=12) or 14 (D=7) or 18 (D=6); T >= 7 needs 28 <= 3T -> T = 28/3.
    assert lb.static_s == pytest.approx(28 / 3)


def test_whole_epochs_forbid_the_fluid_mix_of_a_one_epoch_job():
    # On 2 GPUs: a takes 10 s on 1 GPU or 6 on 2, b 4 s on either. Fluid: a runs 0.6 of its
    # epoch on 2 GPUs, 10 - 4x = (14 + 2x) / 2 -> T = 7.6. Whole epochs: a on 1 GPU needs
    # 10 s; on 2, the area is 12 + 4 = 16 GPU-seconds -> T = 8.
    p = problem([job("a", 1, 10.0, 6.0), job("b", 1, 4.0, 4.0)], gpus=2)
    assert bounds.fluid(p) == pytest.approx(7.6)
    assert bounds.whole_epochs(p) == pytest.approx(8.0)


def test_on_the_paper_data_fluid_is_the_published_124_6_minutes_for_image_at_8_gpus():
    assert bounds.fluid(example_problem("image", 8)) / 60 == pytest.approx(124.6, abs=0.05)
