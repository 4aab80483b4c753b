"""technique='auto': which exact technique allocopt.solve picks, and that every technique
reaches the plain LP's optimum (1e-6 relative) on every bench instance family."""

from __future__ import annotations

import numpy as np
import pytest

import allocopt
from allocopt.bench.instances import FAMILIES, uniform_problem
from allocopt.errors import InvalidOptionError
from allocopt.technique import TECHNIQUES

RTOL = 1e-6


def check_feasible(problem: allocopt.Problem, matrix: np.ndarray) -> None:
    assert np.all(matrix >= 0) and np.all(matrix <= problem.runnable)  # nothing on types a job cannot use
    assert np.all(matrix.sum(axis=1) <= 1 + 1e-7)
    assert np.all(problem.scale_factors @ matrix <= problem.capacity * (1 + 1e-7) + 1e-7)


def normalized_minimum(problem: allocopt.Problem, matrix: np.ndarray) -> float:
    value = (matrix * problem.throughputs).sum(axis=1) * problem.scale_factors
    return float(np.min(value / (problem.priority_weights * problem.proportional_throughputs)))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_technique_agrees_with_the_plain_lp_on_every_family(family):
    problem = FAMILIES[family][1](1200, 3)
    plain = allocopt.solve(problem, "max_min_fairness", technique="plain")
    assert plain.extras["technique"] == "plain"
    for technique in ("auto", "closed_form", "aggregate_job_types", "price_decomposition"):
        alloc = allocopt.solve(problem, "max_min_fairness", technique=technique)
        assert alloc.objective == pytest.approx(plain.objective, rel=RTOL), (family, technique)
        check_feasible(problem, alloc.matrix)
        # the allocation attains the objective it reports
        assert normalized_minimum(problem, alloc.matrix) == pytest.approx(alloc.objective, rel=RTOL)
        assert alloc.extras["technique_reason"]
    throughput = allocopt.solve(problem, "max_throughput", technique="plain")
    for technique in ("auto", "closed_form", "aggregate_job_types", "price_decomposition"):
        alloc = allocopt.solve(problem, "max_throughput", technique=technique)
        assert alloc.objective == pytest.approx(throughput.objective, rel=RTOL), (family, technique)
        check_feasible(problem, alloc.matrix)


@pytest.mark.parametrize("family, expected", [("uniform", "closed_form"), ("undersubscribed", "closed_form"),
                                              ("gavel_table", "aggregate_job_types"),
                                              ("soroush", "closed_form"),  # Soroush's weights: the time limit decides
                                              ("random", "price_decomposition"),
                                              ("oversubscribed", "closed_form"),
                                              ("unequal", "price_decomposition")])
def test_auto_picks_from_the_instance(family, expected):
    alloc = allocopt.solve(FAMILIES[family][1](2048, 0))
    assert alloc.extras["technique"] == expected, alloc.extras["technique_reason"]


def test_closed_form_is_certified_or_not_used():
    loose = uniform_problem(400, 8, 1)  # n/4 GPUs per type: every job's best type has room
    alloc = allocopt.solve(loose, technique="closed_form")
    assert alloc.extras["technique"] == "closed_form" and alloc.extras["certified_gap"] <= 1e-12
    a = allocopt.formulations.max_min_fairness.normalized_coefficients(loose) * loose.runnable
    assert alloc.objective == pytest.approx(a.max(axis=1).min(), rel=1e-12)  # the time-limit bound, attained
    # jobs get more than the minimum where their type has spare GPUs
    assert np.any(alloc.matrix.sum(axis=1) > alloc.objective / a.max(axis=1) + 1e-9)
    tight = uniform_problem(400, 8, 1, capacity=4)  # oversubscribed: the bound is not attainable
    forced = allocopt.solve(tight, technique="closed_form")
    assert forced.extras["technique"] == "plain" and "does not hold" in forced.extras["technique_reason"]
    assert forced.objective == pytest.approx(allocopt.solve(tight, technique="plain").objective, rel=RTOL)
    assert allocopt.solve(tight).extras["technique"] != "closed_form"


def test_max_throughput_closed_form_and_deadlines():
    problem = uniform_problem(300, 4, 2, capacity=600)
    alloc = allocopt.solve(problem, "max_throughput")
    assert alloc.extras["technique"] == "closed_form"
    assert alloc.objective == pytest.approx(problem.throughputs.max(axis=1).sum(), rel=1e-12)
    slos = np.full(problem.num_jobs, np.inf)
    slos[0] = 1e9
    with_deadline = allocopt.Problem(problem.throughputs, problem.cluster, scale_factors=problem.scale_factors,
                                     num_steps_remaining=np.full(problem.num_jobs, 10.0), slos=slos)
    assert allocopt.solve(with_deadline, "max_throughput").extras["technique"] == "plain"


def test_names_options_and_errors():
    problem = uniform_problem(64, 3, 0, capacity=4)
    with pytest.raises(InvalidOptionError, match="unknown technique"):
        allocopt.solve(problem, technique="fastest")
    with pytest.raises(InvalidOptionError, match="applies to"):
        allocopt.solve(problem, "min_makespan", technique="price_decomposition")
    with pytest.raises(InvalidOptionError, match="both pick a technique"):
        allocopt.solve(problem, technique="plain", price_decomposition=True)
    explicit = allocopt.solve(problem, price_decomposition=True)
    assert explicit.extras["technique"] == "explicit"
    assert set(TECHNIQUES) >= {"auto", "plain", "closed_form", "price_decomposition", "relaxation_first"}
    sia_problem = allocopt.bench.instances.sia_rounds(160, 0, steady=False)[0]["first"]
    assert allocopt.solve(sia_problem).extras["technique"] == "relaxation_first"
    whole = allocopt.solve(sia_problem, technique="whole_milp", mip_gap=0.0)
    assert whole.extras["technique"] == "whole_milp"
    assert whole.objective == pytest.approx(allocopt.solve(sia_problem).objective, rel=1e-9)


def test_warm_start_from_a_plain_solve_prices_from_its_duals_or_stays_plain():
    """Above the price decomposition's size the plain LP's capacity duals start the cutting planes (a few
    steps, one small LP); below it the warm simplex basis is used."""
    problem = FAMILIES["random"][1](1100, 0)
    first = allocopt.solve(problem, technique="plain")
    again = allocopt.solve(problem, warm_start=first)
    assert again.extras["technique"] == "price_decomposition" and "warm start" in again.extras["technique_reason"]
    assert again.extras["price_evaluations"] < 20 and again.extras["restricted_lps"] == 1
    assert again.objective == pytest.approx(first.objective, rel=RTOL)
    cold = allocopt.solve(problem)
    assert cold.extras["technique"] == "price_decomposition"
    assert cold.extras["price_evaluations"] > again.extras["price_evaluations"]
    assert cold.objective == pytest.approx(first.objective, rel=RTOL)
    small = FAMILIES["random"][1](600, 0)
    first = allocopt.solve(small, technique="plain")
    again = allocopt.solve(small, warm_start=first)
    assert again.extras["technique"] == "plain" and "warm start" in again.extras["technique_reason"]
    assert again.objective == pytest.approx(first.objective, rel=RTOL)


def test_single_type_water_level_closed_form():
    """One GPU type: the level min(min_i a_i, c / sum_i s_i / a_i), certified by those bounds."""
    for capacity in (20, 400):
        problem = uniform_problem(300, 1, 4, capacity=capacity)
        alloc = allocopt.solve(problem)
        assert alloc.extras["technique"] == "closed_form"
        plain = allocopt.solve(problem, technique="plain")
        assert alloc.objective == pytest.approx(plain.objective, rel=RTOL)
        check_feasible(problem, alloc.matrix)
        assert normalized_minimum(problem, alloc.matrix) == pytest.approx(alloc.objective, rel=RTOL)


def test_time_limit_level_reached_after_moving_jobs_off_their_best_type():
    """Every job prefers type 0, which cannot give them all the time-limit level; moved to type 1
    they reach it, so the closed form still certifies (and agrees with the LP)."""
    rng = np.random.default_rng(7)
    n = 200
    T = np.column_stack([rng.uniform(1.05, 1.2, n), rng.uniform(0.9, 1.0, n)])
    weights = np.where(np.arange(n) < 20, 5.0, 1.0)  # the heavy jobs set a low time-limit level
    problem = allocopt.Problem(T, allocopt.Cluster({"fast": 30, "slow": 100}), priority_weights=weights)
    a = allocopt.formulations.max_min_fairness.normalized_coefficients(problem)
    best = a.argmax(axis=1)
    t_cap = a.max(axis=1).min()
    assert (t_cap / a[np.arange(n), best]).sum() > 30  # the best types alone do not fit
    alloc = allocopt.solve(problem)
    assert alloc.extras["technique"] == "closed_form"
    assert alloc.objective == pytest.approx(t_cap, rel=1e-12)
    assert alloc.objective == pytest.approx(allocopt.solve(problem, technique="plain").objective, rel=RTOL)
    check_feasible(problem, alloc.matrix)
    assert np.any(alloc.matrix[:, 1] > 0) and np.any(alloc.matrix[:, 0] > 0)
