"""Water-filling: closed-form hierarchical cases, uniqueness across backends, Pareto
improvement over max-min fairness, errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ALL_BACKENDS, assert_feasible
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_properties import Dense, rates

import allocopt
from allocopt import Cluster, Problem
from allocopt.errors import InvalidOptionError

# 3 entities (weights 1, 2, 3) of 6 single-GPU jobs each, 3 GPUs of each of 3 types, every
# throughput 1: n_i is job i's time share, and 9 GPUs go to 18 jobs.
ENTITY_IDS = ["e1", "e2", "e3"]
HIERARCHY = Problem(np.ones((18, 3)), Cluster({"a": 3, "b": 3, "c": 3}),
                    priority_weights=np.tile([1.0, 2.0], 9), entities=list(np.repeat(ENTITY_IDS, 6)),
                    entity_weights={"e1": 1.0, "e2": 2.0, "e3": 3.0},
                    time_since_start=np.arange(18, 0, -1.0))  # within each entity, job order is age order
# at t = 3/2 the entities hold 3/2, 3 and 9/2 GPUs: all 9, and entity 3's weight-2 jobs run all the time
FAIRNESS_SHARES = np.concatenate([np.tile([1 / 6, 1 / 3], 3), np.tile([1 / 3, 2 / 3], 3), np.tile([1 / 2, 1], 3)])
# the oldest job of an entity takes its whole share until it runs all the time, then the next one
FIFO_SHARES = np.array([1, 1 / 2, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1 / 2, 0])
FIFO = {e: "fifo" for e in ENTITY_IDS}


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hierarchical_fairness_closed_form(backend):
    alloc = allocopt.solve(HIERARCHY, "water_filling", backend=backend)
    np.testing.assert_allclose(alloc.time_fraction, FAIRNESS_SHARES, atol=1e-6)
    np.testing.assert_allclose(alloc.extras["levels"] * HIERARCHY.priority_weights, FAIRNESS_SHARES, atol=1e-6)
    assert alloc.objective == pytest.approx(1.5, rel=1e-6)
    assert alloc.extras["num_iterations"] == 1 and alloc.timings.num_solves == alloc.extras["num_lp_solves"]
    assert_feasible(alloc)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hierarchical_fifo_closed_form(backend):
    alloc = allocopt.solve(HIERARCHY, "water_filling", backend=backend, entity_policies=FIFO)
    np.testing.assert_allclose(alloc.time_fraction, FIFO_SHARES, atol=1e-6)
    assert alloc.objective == pytest.approx(1 / 3, rel=1e-6)  # entity 3's oldest job saturates first
    assert_feasible(alloc)


def test_fifo_follows_time_since_start_and_mixes_with_fairness():
    reversed_age = Problem(HIERARCHY.throughputs, HIERARCHY.cluster, priority_weights=HIERARCHY.priority_weights,
                           entities=list(np.repeat(ENTITY_IDS, 6)), entity_weights={"e1": 1, "e2": 2, "e3": 3},
                           time_since_start=np.arange(18.0))
    alloc = allocopt.solve(reversed_age, "water_filling", entity_policies=FIFO)
    np.testing.assert_allclose(alloc.time_fraction, FIFO_SHARES.reshape(3, 6)[:, ::-1].ravel(), atol=1e-6)
    mixed = allocopt.solve(HIERARCHY, "water_filling", entity_policies={"e2": "fifo"})
    # e2 takes the same 3 GPUs either way; e1 and e3 keep their fairness shares
    expected = np.where(np.repeat(ENTITY_IDS, 6) == "e2", FIFO_SHARES, FAIRNESS_SHARES)
    np.testing.assert_allclose(mixed.time_fraction, expected, atol=1e-6)


def random_problem(seed: int, n: int, k: int, n_entities: int) -> tuple[Problem, dict | None]:
    """Mixed scale factors, some zero throughputs, weights, and optionally entities
    with mixed fairness / fifo policies."""
    rng = np.random.default_rng(seed)
    capacity = rng.integers(1, 5, size=k)
    capacity[0] = max(capacity[0], 4)
    T = rng.uniform(0.5, 20.0, size=(n, k))
    T[rng.random((n, k)) < 0.3] = 0.0
    T[:, 0] = np.maximum(T[:, 0], 0.5)  # type 0 fits every job
    cluster = Cluster({f"t{j}": int(c) for j, c in enumerate(capacity)})
    kwargs = {"scale_factors": rng.choice([1, 1, 2, 4], size=n),
              "priority_weights": rng.choice([1.0, 2.0, 3.0], size=n)}
    if not n_entities:
        return Problem(T, cluster, **kwargs), None
    entities = [f"e{v}" for v in rng.integers(0, n_entities, size=n)]
    names = sorted(set(entities))
    problem = Problem(T, cluster, entities=entities, entity_weights={e: float(rng.choice([1, 2, 3])) for e in names},
                      time_since_start=rng.choice([0.0, 10.0, 20.0], size=n), **kwargs)
    return problem, {e: str(rng.choice(["fairness", "fifo"])) for e in names}


def normalized(alloc, heterogeneity_aware: bool) -> np.ndarray:
    """``n_i``: s_i e_i / p_i, or s_i times the time share."""
    share = alloc.normalized_throughput if heterogeneity_aware else alloc.time_fraction
    return share * alloc.problem.scale_factors


def most_normalized(problem: Problem, heterogeneity_aware: bool) -> np.ndarray:
    """``u_i``: the most n_i can be, the scale of water-filling's tolerances."""
    if not heterogeneity_aware:
        return problem.scale_factors.astype(float)
    best = (problem.throughputs * problem.runnable).max(axis=1)
    return problem.scale_factors * best / problem.proportional_throughputs


INSTANCES = dict(seed=st.integers(0, 2**31), n=st.integers(1, 8), k=st.integers(1, 3), n_entities=st.integers(0, 3),
                 heterogeneity_aware=st.booleans())
FAST_BACKENDS = [b for b in ALL_BACKENDS if b.values[0] != "pulp"]
PULP = [b for b in ALL_BACKENDS if b.values[0] == "pulp"]


def check_against_highs(backend: str, tol: float, seed: int, n: int, k: int, n_entities: int,
                        heterogeneity_aware: bool) -> None:
    problem, policies = random_problem(seed, n, k, n_entities)
    options = {"heterogeneity_aware": heterogeneity_aware, "entity_policies": policies}
    reference = allocopt.solve(problem, "water_filling", **options)
    alloc = allocopt.solve(problem, "water_filling", backend=backend, **options)
    assert_feasible(alloc)
    n_ref = normalized(reference, heterogeneity_aware)
    np.testing.assert_array_less(np.abs(normalized(alloc, heterogeneity_aware) - n_ref),
                                 tol * most_normalized(problem, heterogeneity_aware) + 1e-12)
    np.testing.assert_allclose(n_ref, reference.extras["levels"] * problem.priority_weights, rtol=1e-9, atol=1e-9)
    if policies is None:
        max_min = allocopt.solve(problem, "max_min_fairness", heterogeneity_aware=heterogeneity_aware)
        assert alloc.objective == pytest.approx(max_min.objective, rel=1e-6)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**INSTANCES)
def test_unique_across_backends(backend, seed, n, k, n_entities, heterogeneity_aware):
    """n is unique even where X is not: every backend finds it to 1e-6 of u_i."""
    check_against_highs(backend, 1e-6, seed, n, k, n_entities, heterogeneity_aware)


@pytest.mark.parametrize("backend", PULP)
@settings(max_examples=4, deadline=None)
@given(**INSTANCES)
def test_unique_across_backends_cbc(backend, seed, n, k, n_entities, heterogeneity_aware):
    """CBC through PuLP reports values to about 8 digits within a 1e-7 feasibility
    tolerance; throughput ratios up to 40 amplify that to about 1e-6 of u_i."""
    check_against_highs(backend, 1e-5, seed, n, k, n_entities, heterogeneity_aware)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 10), k=st.integers(1, 3), n_entities=st.integers(0, 3))
def test_pareto_better_than_max_min(seed, n, k, n_entities):
    """Every job gets at least its max-min share. Without heterogeneity, n_i is job i's
    GPU time and the achievable n form a polymatroid, where no point is above a
    water-filling one (nobody can rise): its total is the most any allocation has."""
    problem, policies = random_problem(seed, n, k, n_entities)
    for aware in (True, False):
        fill = allocopt.solve(problem, "water_filling", heterogeneity_aware=aware, entity_policies=policies)
        max_min = allocopt.solve(problem, "max_min_fairness", heterogeneity_aware=aware)
        n_fill, n_max_min = normalized(fill, aware), normalized(max_min, aware)
        tol = 1e-6 * most_normalized(problem, aware)
        if policies is None:
            assert np.all(n_fill >= max_min.objective * problem.priority_weights - tol)
            assert fill.extras["levels"].min() == pytest.approx(max_min.objective, rel=1e-6)
        if not aware:
            assert n_fill.sum() >= n_max_min.sum() - tol.sum()


def test_space_sharing_pairs():
    problem = Problem([[4.0, 1.0], [2.0, 2.0], [3.0, 0.0]], Cluster({"v100": 1, "k80": 1}),
                      pair_throughputs={(0, 1): {"v100": (3.0, 1.5), "k80": (0.8, 1.5)},
                                        (1, 2): {"v100": (1.8, 2.7), "k80": (0.0, 0.0)}})
    alone = allocopt.solve(problem, "water_filling")
    shared = allocopt.solve(problem, "water_filling", space_sharing=True)
    assert_feasible(shared)
    assert shared.objective == pytest.approx(allocopt.solve(problem, "max_min_fairness", space_sharing=True).objective)
    assert shared.objective == pytest.approx(20 / 21) and alone.objective == pytest.approx(10 / 11)
    assert shared.pair_matrix.sum() > 0.4  # jobs 1 and 2 share the v100 about half the time
    np.testing.assert_allclose(shared.normalized_throughput, shared.extras["levels"], rtol=1e-9)


def test_entity_policy_errors():
    with pytest.raises(InvalidOptionError, match=r"unknown entity 'e9'"):
        allocopt.solve(HIERARCHY, "water_filling", entity_policies={"e9": "fifo"})
    with pytest.raises(InvalidOptionError, match=r"\['e1'\] is 'lifo'; choose one of 'fairness', 'fifo'"):
        allocopt.solve(HIERARCHY, "water_filling", entity_policies={"e1": "lifo"})
    with pytest.raises(InvalidOptionError, match="problem has no entities"):
        allocopt.solve(random_problem(0, 3, 2, 0)[0], "water_filling", entity_policies={"e1": "fifo"})
    with pytest.raises(InvalidOptionError, match="must be a dict"):
        allocopt.solve(HIERARCHY, "water_filling", entity_policies=["fifo"])


def test_every_job_frozen_once_per_level():
    """Jobs of a fifo entity that can get nothing more are frozen with its oldest job,
    not one iteration each."""
    cluster = Cluster({"a": 1})
    problem = Problem(np.ones((6, 1)), cluster, entities=["x"] * 6)
    alloc = allocopt.solve(problem, "water_filling", entity_policies={"x": "fifo"})
    np.testing.assert_allclose(alloc.time_fraction, [1, 0, 0, 0, 0, 0], atol=1e-9)
    np.testing.assert_allclose(alloc.extras["levels"], [1, 0, 0, 0, 0, 0], atol=1e-9)
    assert alloc.extras["num_iterations"] == 1


# The 5-job example of the issue on water-filling's robustness: bottleneck LPs failed on every backend.
ISSUE_EXAMPLE = {"cluster": {"gpus": {"t0": 3, "t1": 2, "t2": 1}}, "jobs": [
    {"id": 0, "throughputs": {"t0": 0.118, "t1": 0.173, "t2": 0.004}},
    {"id": 1, "throughputs": {"t0": 0.092, "t1": 0.048, "t2": 0.041}},
    {"id": 2, "throughputs": {"t0": 0.002, "t1": 3.016, "t2": 0.002}},
    {"id": 3, "throughputs": {"t0": 0.002, "t1": 55.306, "t2": 0.003}},
    {"id": 4, "throughputs": {"t0": 0.002, "t1": 12.172, "t2": 679.884}}]}


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_degenerate_levels_of_the_issue_example(backend):
    problem = Problem.from_json(ISSUE_EXAMPLE)
    reference = allocopt.solve(problem, "water_filling")
    alloc = allocopt.solve(problem, "water_filling", backend=backend)
    assert_feasible(alloc)
    u = most_normalized(problem, True)
    tol = 1e-4 if backend == "pulp" else 1e-6  # CBC's values carry about 8 digits; job 4's rates span 3e5
    np.testing.assert_array_less(np.abs(normalized(alloc, True) - normalized(reference, True)), tol * u)
    assert alloc.objective == pytest.approx(allocopt.solve(problem, "max_min_fairness").objective, rel=1e-6)


def test_one_lp_per_level_mostly():
    """Bottlenecks come from the level LP's duals: about one LP per level, not one per candidate job
    (besides the rounds of refinement of each LP's answer)."""
    problem, policies = random_problem(3, 40, 3, 3)
    alloc = allocopt.solve(problem, "water_filling", entity_policies=policies)
    assert alloc.extras["num_lp_solves"] - alloc.extras["num_refinements"] <= 2 * alloc.extras["num_iterations"]
    assert_feasible(alloc)


@pytest.mark.parametrize("backend", ["highs", "scipy", "pulp"])
def test_level_duals_are_in_the_lps_own_units_after_refinement(backend, monkeypatch):
    """The duals of the rows with a positive share weigh t's column to 1 (module docstring), also
    where a level LP was refined: the zoomed LP's duals were 2^20 times the LP's own, so
    DUAL_TOL held 2^20 times looser on refined levels (the wide-family problem of seed 3035033774)."""
    from allocopt.formulations import water_filling as wf
    from test_properties import make_problem

    shares, refinements = [], []
    level_lp, refine = wf._WaterFill.level_lp, wf._Lps.refine

    def recording_level_lp(self, *args):
        level = level_lp(self, *args)
        if level is not None:
            shares.append(float(level.dual_share.sum()))
        return level

    def recording_refine(self, model, solution):
        refined = refine(self, model, solution)
        refinements.append(refined is not None)
        return refined

    monkeypatch.setattr(wf._WaterFill, "level_lp", recording_level_lp)
    monkeypatch.setattr(wf._Lps, "refine", recording_refine)
    problem, _ = make_problem(3035033774, 6, 2, True, False)
    allocopt.solve(problem, "water_filling", backend=backend, exact=False)  # exact LPs need no refinement
    assert any(refinements), "no level LP was refined: the test no longer covers refinement"
    np.testing.assert_allclose(shares, 1.0, rtol=1e-6)


def bottleneck_gain(problem: Problem, level: np.ndarray, i: int) -> float:
    """The most job ``i``'s normalized throughput can rise above ``level[i]`` (relative to it) while every
    other job at or below its level (per unit of weight) keeps at least ``level`` less 1e-7: the property
    suite's dense ``linprog`` model, written apart from water_filling. Zero for every job of the exact
    lexicographic max-min vector."""
    lp = Dense(problem, rates(problem))
    w = problem.priority_weights
    others = [j for j in np.flatnonzero(level / w <= level[i] / w[i] * (1 + 1e-9)) if j != i]
    most = lp.solve(lp.n_row(i), [lp.n_row(j) for j in others], [-level[j] * (1 - 1e-7) for j in others], (0, 0))
    return most / level[i] - 1.0


@pytest.mark.parametrize("seed, capacity", [(1, 16), (2, 20), (1, 28), (3, 40)])
def test_jobs_capped_by_their_own_time_freeze_in_few_lps(seed, capacity):
    """Where most jobs' own caps (all their time on their best type) set their levels, runs of them are
    frozen by a few probes, not one level each; every job is a bottleneck of the result (checked by an
    independent LP per job)."""
    from allocopt.bench.instances import uniform_problem

    problem = uniform_problem(40, 3, seed, capacity=capacity)
    alloc = allocopt.solve(problem, "water_filling", technique="plain")
    level = alloc.extras["levels"] * problem.priority_weights
    capped = level >= rates(problem).max(axis=1) * (1 - 1e-6)
    assert capped.sum() >= 24 and alloc.extras["num_cap_probes"] > 0
    assert alloc.extras["num_iterations"] <= 5 and alloc.extras["num_lp_solves"] <= 20
    gains = np.array([bottleneck_gain(problem, level, i) for i in range(problem.num_jobs)])
    assert gains.max() < 2e-4  # RISE: a job is a bottleneck when it cannot rise by 1e-4 of its level
    assert_feasible(alloc)


def test_large_runs_agree_with_a_cold_backend():
    """Runs of at least PRIMAL_FIRST columns solve with primal simplex, its bounds unperturbed, each LP from
    the last one's basis; their levels equal scipy's, whose HiGHS solves every LP from scratch (its bounds
    perturbed)."""
    from allocopt.bench.instances import uniform_problem
    from allocopt.formulations import water_filling as wf

    problem = uniform_problem(460, 8, 1)
    assert problem.num_jobs * (problem.cluster.num_gpu_types + 1) + 1 >= wf.PRIMAL_FIRST  # X, d and t
    alloc = allocopt.solve(problem, "water_filling", technique="plain")
    cold = allocopt.solve(problem, "water_filling", backend="scipy", technique="plain")
    assert alloc.objective == pytest.approx(cold.objective, rel=1e-12)
    u = rates(problem).max(axis=1)
    np.testing.assert_array_less(np.abs(alloc.normalized_throughput - cold.normalized_throughput), 1e-9 * u)
    assert_feasible(alloc)


# ----- exact levels ----------------------------------------------------------------------------
#: problems of the property suite's wide family (seed 1 of its long run) on which the floating-point
#: solvers ended 0.79 and 0.67 u_i apart (the second: one job 2.3e-3 u_i on HiGHS, 0.67 u_i on scipy)
FLOAT_SOLVERS_APART = [(2670833651, 12, 4, True), (840497928, 11, 4, False)]


@pytest.mark.parametrize("seed, n_jobs, n_types, entities", FLOAT_SOLVERS_APART)
def test_small_runs_solve_their_lps_exactly_and_every_backend_agrees(seed, n_jobs, n_types, entities):
    from test_properties import make_problem

    problem, policies = make_problem(seed, n_jobs, n_types, True, entities)
    runs = {b: allocopt.solve(problem, "water_filling", backend=b, entity_policies=policies)
            for b in ("highs", "scipy", "pulp")}
    u = rates(problem).max(axis=1)
    for backend, alloc in runs.items():
        assert alloc.extras["num_exact_lp_solves"] == alloc.extras["num_lp_solves"] > 0, backend
        assert alloc.extras["num_refinements"] == 0
        assert_feasible(alloc)
        np.testing.assert_array_less(np.abs(alloc.normalized_throughput - runs["highs"].normalized_throughput),
                                     1e-12 * u + 1e-300)
    float_run = allocopt.solve(problem, "water_filling", entity_policies=policies, exact=False)
    # on the backend, but for the LPs HiGHS fails in every setting (1 or 2 of about 20 on two of these)
    assert float_run.extras["num_exact_lp_solves"] <= float_run.extras["num_lp_solves"] // 4
    assert float_run.objective == pytest.approx(runs["highs"].objective, rel=1e-6)


def test_an_exact_lp_over_its_time_limit_leaves_the_rest_of_the_run_to_the_backend(monkeypatch):
    from test_properties import make_problem

    from allocopt.formulations import water_filling_lps as wf

    problem, _ = make_problem(1001, 28, 8, True, False)  # 253 columns: exact by default, ~10 ms per LP here
    monkeypatch.setattr(wf, "EXACT_TIME_LIMIT_S", 1e-3)  # GLPK's limit is in whole milliseconds
    alloc = allocopt.solve(problem, "water_filling")
    assert alloc.extras["num_exact_lp_solves"] < alloc.extras["num_lp_solves"]
    assert alloc.status is allocopt.Status.OPTIMAL
    assert_feasible(alloc)
    exact = allocopt.solve(problem, "water_filling", exact=True)
    assert alloc.objective == pytest.approx(exact.objective, rel=1e-6)


def test_exact_option_is_checked():
    problem = Problem.from_json(ISSUE_EXAMPLE)
    with pytest.raises(InvalidOptionError, match="exact must be None, True or False"):
        allocopt.solve(problem, "water_filling", exact="yes")


def _python(code: str, timeout: float, check: bool = False) -> subprocess.CompletedProcess:
    """``code`` in a fresh Python process that imports this checkout's allocopt."""
    root = Path(allocopt.__file__).resolve().parent.parent
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(root)}, check=check)


def test_without_swiglpk_small_runs_solve_in_floating_point_with_a_warning():
    """swiglpk is a core dependency, but allocopt run from a path (a scheduler's own environment) can lack
    it: the default then solves in floating point and says so; ``exact=True`` raises naming the package."""
    code = ("import logging, sys\n"
            "sys.modules['swiglpk'] = None  # not importable\n"
            "logging.basicConfig(level=logging.WARNING)\n"
            "import allocopt\n"
            f"problem = allocopt.Problem.from_json({ISSUE_EXAMPLE!r})\n"
            "alloc = allocopt.solve(problem, 'water_filling')\n"
            "print(alloc.status.value, alloc.extras['num_exact_lp_solves'], alloc.backend)\n"
            "try:\n"
            "    allocopt.solve(problem, 'water_filling', exact=True)\n"
            "except allocopt.errors.BackendNotInstalledError as err:\n"
            "    print('raised:', err)\n")
    out = _python(code, timeout=120, check=True)
    status, exact_solves, backend = out.stdout.splitlines()[0].split()
    assert (status, exact_solves, backend) == ("optimal", "0", "highs")
    assert "raised: backend 'glpk-exact' needs the Python package(s) swiglpk" in out.stdout
    assert "its LPs are solved in floating point, without exact levels" in out.stderr


def test_a_level_lp_no_backend_setting_solves_is_solved_exactly():
    """CBC called level LPs of this 85-job wide run infeasible with every retry (an InfeasibleError before):
    each such LP is solved by GLPK's exact simplex instead, and the run ends optimal."""
    from test_properties import make_problem

    problem, policies = make_problem(4291298633, 85, 8, True, True)
    alloc = allocopt.solve(problem, "water_filling", backend="pulp", entity_policies=policies, exact=False)
    assert alloc.status is allocopt.Status.OPTIMAL
    assert 0 < alloc.extras["num_exact_lp_solves"] < alloc.extras["num_lp_solves"]
    assert_feasible(alloc)


def test_cbc_retries_end():
    """On this 75-job wide run CBC's dual simplex failed a level LP, and the retry with CBC's barrier never
    ended (one barrier iteration; CBC's time and iteration limits do not stop it): the run now ends, optimal,
    with feasible levels. In a subprocess with a time limit, so that a retry that does not end fails here."""
    tests = Path(__file__).resolve().parent
    code = ("import sys\n"
            f"sys.path.insert(0, {str(tests)!r})\n"
            "import allocopt\n"
            "from conftest import assert_feasible\n"
            "from test_properties import make_problem\n"
            "problem, _ = make_problem(3954715779, 75, 7, True, False)\n"
            "alloc = allocopt.solve(problem, 'water_filling', backend='pulp', exact=False)\n"
            "assert_feasible(alloc)\n"
            "print(alloc.status.value)\n")
    out = _python(code, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["optimal"]


def test_every_lp_the_backend_leaves_unanswered_is_solved_exactly():
    """CBC held to no iterations answers no LP (each stops at its iteration limit): every one, level and
    improvement LPs alike, is solved by GLPK's exact simplex before any other fallback, so the run ends
    where CBC's own floating-point run ends."""
    problem = Problem.from_json(ISSUE_EXAMPLE)
    held = allocopt.solve(problem, "water_filling", backend="pulp", exact=False,
                          solver_options={"options": ["maxIterations 0"]})
    own = allocopt.solve(problem, "water_filling", backend="pulp", exact=False)
    assert held.status is allocopt.Status.OPTIMAL
    assert own.extras["num_exact_lp_solves"] == 0
    # each LP recorded twice (CBC's stop, then the exact answer), but for refinements (zoomed LPs, which
    # are not rescued: the point stands where they fail)
    extras = held.extras
    assert 2 * extras["num_exact_lp_solves"] + extras["num_refinements"] == extras["num_lp_solves"] > 0
    u = rates(problem).max(axis=1)
    n_held, n_own = (a.normalized_throughput * problem.scale_factors for a in (held, own))
    np.testing.assert_array_less(np.abs(n_held - n_own), 1e-9 * u)


def test_exact_levels_reach_1024_columns():
    """113 jobs on 8 types (1,017 LP columns) solve exactly by default, the same on every backend; 114 jobs
    (1,026 columns) in floating point."""
    from test_properties import make_problem

    from allocopt.formulations.water_filling import EXACT_MAX_COLUMNS

    assert EXACT_MAX_COLUMNS == 1024
    problem, policies = make_problem(7, 113, 8, False, True)
    runs = {b: allocopt.solve(problem, "water_filling", backend=b, entity_policies=policies) for b in ("highs", "pulp")}
    u = rates(problem).max(axis=1)
    for alloc in runs.values():
        assert alloc.extras["num_exact_lp_solves"] == alloc.extras["num_lp_solves"] > 0
        assert_feasible(alloc)
    np.testing.assert_array_less(np.abs(runs["pulp"].normalized_throughput - runs["highs"].normalized_throughput),
                                 1e-12 * u + 1e-300)
    problem, policies = make_problem(7, 114, 8, False, True)
    assert allocopt.solve(problem, "water_filling", entity_policies=policies).extras["num_exact_lp_solves"] == 0
