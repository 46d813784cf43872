"""The scaling curve t(g) = a + b/g + c(g-1): recovered from exact points,
measured points kept as measured, unmeasured counts filled, error reported."""

from __future__ import annotations

import pytest

from services.profiler import fit


def test_three_exact_points_recover_the_curve_and_fill_the_rest():
    truth = fit.ScalingFit(a=2.0, b=40.0, c=0.5)
    measured = {g: truth(g) for g in (1, 2, 4)}
    points, curve, error = fit.complete(measured, 8)
    assert [p.gpus for p in points] == list(range(1, 9))
    assert [p.measured for p in points] == [True, True, False, True, False, False, False, False]
    assert error < 1e-9
    for p in points:
        assert p.epoch_seconds == pytest.approx(truth(p.gpus), rel=1e-6)


def test_one_point_means_perfect_scaling():
    points, curve, error = fit.complete({1: 12.0}, 4)
    assert [round(p.epoch_seconds, 6) for p in points] == [12.0, 6.0, 4.0, 3.0]
    assert error == pytest.approx(0.0)


def test_noisy_points_give_a_non_negative_curve_and_its_error_on_them():
    measured = {1: 10.0, 2: 6.0, 4: 4.4}
    curve = fit.fit(measured)
    assert min(curve.a, curve.b, curve.c) >= 0
    assert fit.fit_error(curve, measured) == pytest.approx(max(abs(curve(g) - t) / t for g, t in measured.items()))


def test_measured_values_are_kept_exactly_even_off_the_curve():
    points, _, error = fit.complete({1: 10.0, 2: 9.0, 4: 2.0}, 4)
    by_gpus = {p.gpus: p for p in points}
    assert (by_gpus[2].epoch_seconds, by_gpus[2].measured) == (9.0, True)
    assert error > 0.05


def test_trial_counts_are_powers_of_two_up_to_the_maximum_plus_explicit_ones():
    assert fit.trial_counts(6) == [1, 2, 4]
    assert fit.trial_counts(2, [3]) == [1, 2, 3]
    assert fit.trial_counts(0, [2]) == [2]


@pytest.mark.parametrize("measured", [{}, {0: 1.0}, {1: 0.0}, {1: float("nan")}])
def test_fit_refuses_points_that_are_not_positive_times(measured):
    with pytest.raises(ValueError):
        fit.fit(measured)


def test_two_points_where_the_second_gpu_is_slower_are_still_fitted_exactly():
    curve = fit.fit({1: 10.0, 2: 11.0})
    assert fit.fit_error(curve, {1: 10.0, 2: 11.0}) < 1e-6
