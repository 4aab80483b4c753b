"""Minimum makespan and finish-time fairness: exact optima against independent
formulations (closed forms, bisection over scipy linprog feasibility LPs, the
conic program), cross-backend agreement, finished jobs, errors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ALL_BACKENDS, assert_feasible
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

import allocopt
from allocopt import Cluster, Problem, Status
from allocopt.errors import InvalidOptionError, InvalidProblemError

SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
CLASSIC = Cluster({"v100": 1, "k80": 1})


def random_problem(seed: int, n: int, k: int, *, started: bool = True, finished: bool = True) -> Problem:
    """Mixed scale factors, zero throughputs, some finished jobs, times since start and isolated times."""
    rng = np.random.default_rng(seed)
    capacity = rng.integers(1, 9, size=k)
    capacity[0] = max(capacity[0], 8)
    T = rng.uniform(0.5, 50.0, size=(n, k))
    T[rng.random((n, k)) < 0.25] = 0.0
    T[:, 0] = np.maximum(T[:, 0], 0.5)  # type 0 fits every job
    steps = rng.uniform(100, 10_000, size=n)
    if finished:
        steps[rng.random(n) < 0.2] = 0.0
    cluster = Cluster({f"type{j}": int(c) for j, c in enumerate(capacity)})
    return Problem(T, cluster, scale_factors=rng.choice([1, 2, 4, 8], size=n), num_steps_remaining=steps,
                   time_since_start=rng.uniform(0, 2_000, size=n) * (rng.random(n) < 0.7) if started else None,
                   time_isolated=rng.uniform(0, 1_000, size=n) if started else None)


def bisect_min(feasible, lo: float, hi: float) -> float:
    """Smallest value in [lo, hi] where the monotone predicate ``feasible`` holds, to a relative 1e-10."""
    while hi > lo * (1 + 1e-10):
        mid = np.sqrt(lo * hi)
        lo, hi = (lo, mid) if feasible(mid) else (mid, hi)
    return hi


def throughput_lp_feasible(problem: Problem, required: np.ndarray) -> bool:
    """Is there an X with the base constraints and e_i >= required_i? (dense linprog, written out here)"""
    n, k = problem.throughputs.shape
    eye = np.eye(n)
    A = np.vstack([np.kron(eye, np.ones((1, k))),                                   # sum_j X_ij <= 1
                   np.kron(problem.scale_factors[None, :].astype(float), np.eye(k)),  # sum_i s_i X_ij <= c_j
                   -np.kron(eye, np.ones((1, k))) * problem.throughputs.ravel()])    # -e_i <= -required_i
    b = np.concatenate([np.ones(n), problem.capacity, -required])
    bounds = np.column_stack([np.zeros(n * k), problem.runnable.ravel().astype(float)])
    return linprog(np.zeros(n * k), A_ub=A, b_ub=b, bounds=bounds, method="highs",
                   options={"primal_feasibility_tolerance": 1e-10}).status == 0


def isolated_throughput(problem: Problem) -> np.ndarray:
    X = np.where(problem.runnable, problem.capacity / (problem.num_jobs * problem.scale_factors[:, None]), 0.0)
    return (problem.throughputs * X / np.maximum(X.sum(axis=1, keepdims=True), 1.0)).sum(axis=1)


def rho_of(problem: Problem, e: np.ndarray) -> np.ndarray:
    """rho_i computed from scratch for the unfinished jobs."""
    r = problem.num_steps_remaining
    t = problem.time_since_start if problem.time_since_start is not None else np.zeros_like(r)
    t_iso = problem.time_isolated if problem.time_isolated is not None else np.zeros_like(r)
    active = r > 0
    return (t[active] + r[active] / e[active]) / (t_iso[active] + r[active] / isolated_throughput(problem)[active])


# ----- minimum makespan -----------------------------------------------------------------------------------------

@SETTINGS
@given(seed=st.integers(0, 2**31), n=st.integers(1, 8), c=st.integers(1, 8))
def test_makespan_closed_form_one_type(seed, n, c):
    """One GPU type, preemptive: M = max(max_i r_i / T_i, sum_i s_i r_i / T_i / c) (McNaughton)."""
    rng = np.random.default_rng(seed)
    T, r = rng.uniform(1, 20, size=(n, 1)), rng.uniform(10, 1_000, size=n)
    s = rng.integers(1, c + 1, size=n)
    alloc = allocopt.solve(Problem(T, Cluster({"a100": c}), scale_factors=s, num_steps_remaining=r), "min_makespan")
    work = r / T[:, 0]
    assert alloc.objective == pytest.approx(max(work.max(), (s * work).sum() / c), rel=1e-7)
    assert alloc.extras["makespan_s"] == alloc.objective
    assert_feasible(alloc)


@SETTINGS
@given(seed=st.integers(0, 2**31), n=st.integers(1, 6), k=st.integers(1, 3))
def test_makespan_is_exact_against_feasibility_bisection(seed, n, k):
    problem = random_problem(seed, n, k, started=False)
    r = problem.num_steps_remaining
    alloc = allocopt.solve(problem, "min_makespan")
    assert_feasible(alloc)
    if not (r > 0).any():
        assert alloc.objective == 0.0 and alloc.timings.num_solves == 0
        return
    lo = (r / problem.throughputs.max(axis=1)).max()  # every job alone at its fastest
    expected = bisect_min(lambda M: throughput_lp_feasible(problem, r / M), lo, 1e3 * lo * n)
    assert alloc.objective == pytest.approx(expected, rel=1e-7)
    e = alloc.effective_throughput
    assert (r / np.where(r > 0, e, 1.0)).max() == pytest.approx(alloc.objective, rel=1e-12)
    assert np.all(alloc.time_fraction[r == 0] <= 1e-9)  # finished jobs get nothing


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@SETTINGS
@given(seed=st.integers(0, 2**31), n=st.integers(1, 8), k=st.integers(1, 4))
def test_makespan_backends_agree(backend, seed, n, k):
    problem = random_problem(seed, n, k, started=False)
    reference = allocopt.solve(problem, "min_makespan")
    alloc = allocopt.solve(problem, "min_makespan", backend=backend)
    assert alloc.objective == pytest.approx(reference.objective, rel=1e-6)
    assert_feasible(alloc)


def test_makespan_heterogeneity_agnostic():
    """Both jobs run at 10 steps/s on the v100; on the k80 "a" runs at 2, "b" at 8; 100 steps each."""
    problem = Problem([[10.0, 2.0], [10.0, 8.0]], CLASSIC, job_ids=["a", "b"], num_steps_remaining=[100.0, 100.0])
    # aware: b gets 1 - y of the k80 and y of the v100, a the rest; 8 + 2y = 10 - 8y at y = 0.2
    assert allocopt.solve(problem, "min_makespan").objective == pytest.approx(100 / 8.4, rel=1e-9)
    # agnostic: planned as if the k80 ran every job at its v100 speed, one job per GPU
    alloc = allocopt.solve(problem, "min_makespan", heterogeneity_aware=False, reference_gpu_type="v100")
    assert alloc.objective == pytest.approx(10.0, rel=1e-9) and alloc.extras["makespan_s"] == alloc.objective
    assumed = Problem([[10.0, 10.0], [10.0, 10.0]], CLASSIC, num_steps_remaining=[100.0, 100.0])
    np.testing.assert_allclose(((assumed.throughputs * alloc.matrix).sum(axis=1)), 10.0, rtol=1e-9)
    assert_feasible(alloc)


def test_makespan_space_sharing():
    """Two jobs at 10 steps/s alone or 8 steps/s each when sharing the one GPU: 100 steps each take 12.5 s."""
    problem = Problem([[10.0], [10.0]], Cluster({"v100": 1}), job_ids=["a", "b"], num_steps_remaining=[100, 100],
                      pair_throughputs={("a", "b"): {"v100": (8.0, 8.0)}})
    assert allocopt.solve(problem, "min_makespan").objective == pytest.approx(20.0)
    shared = allocopt.solve(problem, "min_makespan", space_sharing=True)
    assert shared.objective == pytest.approx(12.5)
    np.testing.assert_allclose(shared.pair_matrix, [[1.0]], atol=1e-7)
    assert_feasible(shared)


def test_makespan_all_finished():
    problem = Problem([[1.0, 2.0], [3.0, 4.0]], CLASSIC, num_steps_remaining=[0.0, 0.0])
    alloc = allocopt.solve(problem, "min_makespan")
    assert alloc.objective == 0.0 and alloc.extras["makespan_s"] == 0.0 and alloc.success
    assert alloc.timings.num_solves == 0 and not alloc.matrix.any()


@pytest.mark.parametrize("options, error, match", [
    ({"heterogeneity_aware": False}, InvalidOptionError, r"needs reference_gpu_type=.*\['v100', 'k80'\]"),
    ({"heterogeneity_aware": False, "reference_gpu_type": "a100"}, InvalidOptionError,
     r"'a100' is not a GPU type of the cluster; its types are \['v100', 'k80'\]"),
    ({"reference_gpu_type": "v100"}, InvalidOptionError, r"only applies with heterogeneity_aware=False"),
    ({"heterogeneity_aware": False, "reference_gpu_type": "k80"}, InvalidOptionError,
     r"job\(s\) 'b' have zero throughput on reference_gpu_type 'k80'"),
    ({"heterogeneity_aware": False, "reference_gpu_type": "v100", "space_sharing": True}, InvalidOptionError,
     r"cannot be combined with space_sharing=True"),
])
@pytest.mark.parametrize("policy", ["min_makespan", "finish_time_fairness"])
def test_reference_type_errors(policy, options, error, match):
    problem = Problem([[4.0, 1.0], [2.0, 0.0]], CLASSIC, job_ids=["a", "b"], num_steps_remaining=[10.0, 5.0])
    with pytest.raises(error, match=match):
        allocopt.solve(problem, policy, **options)


@pytest.mark.parametrize("policy", ["min_makespan", "finish_time_fairness"])
def test_missing_steps_remaining(policy):
    with pytest.raises(InvalidProblemError, match=r"needs Problem\(num_steps_remaining=...\)") as info:
        allocopt.solve(Problem([[1.0, 2.0]], CLASSIC), policy)
    assert info.value.field == "num_steps_remaining"


# ----- finish-time fairness -------------------------------------------------------------------------------------

def check_ftf(alloc, problem: Problem) -> None:
    """The allocation is feasible and attains the reported rho."""
    assert_feasible(alloc)
    r = problem.num_steps_remaining
    rho = rho_of(problem, alloc.effective_throughput)
    np.testing.assert_allclose(alloc.extras["rho"][r > 0], rho, rtol=1e-9)
    assert np.isnan(alloc.extras["rho"][r == 0]).all()
    assert alloc.objective == pytest.approx(rho.max(), rel=1e-9)
    assert np.all(alloc.time_fraction[r == 0] <= 1e-6)


def test_ftf_two_jobs_closed_form():
    """One GPU, equal jobs (R steps at 1 step/s), started at t = (0, d): equalizing t_i + R / x_i with
    x_1 + x_2 = 1 gives d x^2 - (d + 2R) x + R = 0; isolated D = 2R."""
    R, d = 100.0, 50.0
    problem = Problem([[1.0], [1.0]], Cluster({"v100": 1}), num_steps_remaining=[R, R], time_since_start=[0.0, d])
    x1 = ((d + 2 * R) - np.sqrt(d**2 + 4 * R**2)) / (2 * d)
    bisection = allocopt.solve(problem, "finish_time_fairness")
    assert bisection.objective == pytest.approx(R / x1 / (2 * R), rel=1e-8)
    np.testing.assert_allclose(bisection.matrix[:, 0], [x1, 1 - x1], rtol=1e-7)
    assert 2 <= bisection.extras["num_lp_solves"] <= 40
    check_ftf(bisection, problem)
    conic = allocopt.solve(problem, "finish_time_fairness", backend="cvxpy", method="conic")
    assert conic.objective == pytest.approx(bisection.objective, rel=1e-5)
    assert conic.extras["num_lp_solves"] == 0 and conic.timings.num_solves == 1
    check_ftf(conic, problem)


@SETTINGS
@given(seed=st.integers(0, 2**31), k=st.integers(1, 3), extra_jobs=st.integers(0, 3))
def test_ftf_without_start_times_is_isolated_normalized_max_min_fairness(seed, k, extra_jobs):
    """t = t_iso = 0: rho_i = iso_i / e_i, one LP. With n >= C single-GPU jobs that run everywhere the
    isolated share c_j / n is uncapped, iso_i = p_i C / n, and rho = C / (n * max-min fairness objective)."""
    rng = np.random.default_rng(seed)
    capacity = rng.integers(1, 3, size=k)
    n = int(capacity.sum()) + extra_jobs
    problem = Problem(rng.uniform(1, 20, size=(n, k)), Cluster({f"t{j}": int(c) for j, c in enumerate(capacity)}),
                      num_steps_remaining=rng.uniform(10, 1_000, size=n))
    alloc = allocopt.solve(problem, "finish_time_fairness")
    assert alloc.extras["num_lp_solves"] == 1
    check_ftf(alloc, problem)
    mmf = allocopt.solve(problem, "max_min_fairness").objective
    assert alloc.objective == pytest.approx(capacity.sum() / (n * mmf), rel=1e-7)


@SETTINGS
@given(seed=st.integers(0, 2**31), n=st.integers(1, 6), k=st.integers(1, 3))
def test_ftf_is_exact_against_feasibility_bisection(seed, n, k):
    problem = random_problem(seed, n, k)
    alloc = allocopt.solve(problem, "finish_time_fairness")
    r, t = problem.num_steps_remaining, problem.time_since_start
    active = r > 0
    if not active.any():
        assert alloc.objective is None
        return
    check_ftf(alloc, problem)
    D = problem.time_isolated + r / isolated_throughput(problem)
    lower = (t[active] / D[active]).max()

    def feasible(rho: float) -> bool:  # e_i >= r_i / (rho D_i - t_i)
        slack = rho * D - t
        return slack[active].min() > 0 and throughput_lp_feasible(problem, np.where(active, r / slack, 0.0))

    expected = bisect_min(feasible, max(lower, 1e-6), rho_of(problem, isolated_throughput(problem)).max() * 1.01)
    assert alloc.objective == pytest.approx(expected, rel=1e-7)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@SETTINGS
@given(seed=st.integers(0, 2**31), n=st.integers(1, 7), k=st.integers(1, 3), started=st.booleans())
def test_ftf_backends_agree_with_each_other_and_the_conic_program(backend, seed, n, k, started):
    problem = random_problem(seed, n, k, started=started)
    alloc = allocopt.solve(problem, "finish_time_fairness", backend=backend)
    if not (problem.num_steps_remaining > 0).any():
        assert alloc.objective is None and not alloc.matrix.any()
        return
    check_ftf(alloc, problem)
    reference = allocopt.solve(problem, "finish_time_fairness")
    assert alloc.objective == pytest.approx(reference.objective, rel=1e-6)
    if backend == "cvxpy":
        conic = allocopt.solve(problem, "finish_time_fairness", backend="cvxpy", method="conic")
        assert conic.objective == pytest.approx(reference.objective, rel=1e-5)
        check_ftf(conic, problem)
        if (problem.scale_factors[:, None] <= problem.capacity[None, :]).all():  # else Gavel's model differs
            gavel = allocopt.solve(problem, "finish_time_fairness", backend="cvxpy", method="conic_gavel")
            assert gavel.objective == pytest.approx(reference.objective, rel=1e-5)
            check_ftf(gavel, problem)


def test_ftf_agnostic_and_space_sharing():
    T = np.array([[40.0, 10.0], [12.0, 4.0], [100.0, 50.0]])
    kwargs = dict(num_steps_remaining=[1_000.0, 500.0, 3_000.0], time_since_start=[100.0, 0.0, 50.0])
    problem = Problem(T, CLASSIC, **kwargs)
    agnostic = allocopt.solve(problem, "finish_time_fairness", heterogeneity_aware=False, reference_gpu_type="v100")
    assumed = Problem(np.repeat(T[:, :1], 2, axis=1), CLASSIC, **kwargs)
    assert agnostic.objective == pytest.approx(allocopt.solve(assumed, "finish_time_fairness").objective, rel=1e-8)
    assert_feasible(agnostic)
    pairs = {(0, 1): {"v100": (30.0, 9.0), "k80": (8.0, 3.0)}}
    shared = allocopt.solve(Problem(T, CLASSIC, pair_throughputs=pairs, **kwargs), "finish_time_fairness",
                            space_sharing=True)
    check_ftf(shared, shared.problem)
    assert shared.objective <= allocopt.solve(problem, "finish_time_fairness").objective + 1e-9
    conic = allocopt.solve(shared.problem, "finish_time_fairness", backend="cvxpy", method="conic", space_sharing=True)
    assert conic.objective == pytest.approx(shared.objective, rel=1e-5)
    check_ftf(conic, shared.problem)


def test_ftf_finished_jobs_and_method_errors():
    problem = Problem([[4.0, 1.0], [2.0, 1.0]], CLASSIC, num_steps_remaining=[0.0, 0.0])
    done = allocopt.solve(problem, "finish_time_fairness")
    assert done.objective is None and done.success and np.isnan(done.extras["rho"]).all()
    with pytest.raises(InvalidOptionError, match=r"method='conic' .* needs backend='cvxpy', got backend='highs'"):
        allocopt.solve(problem, "finish_time_fairness", method="conic")
    with pytest.raises(InvalidOptionError, match=r"method must be one of bisection, conic, conic_gavel, got 'newton'"):
        allocopt.solve(problem, "finish_time_fairness", method="newton")
    assert done.status is Status.OPTIMAL


def gavel_search(exact: float) -> float:
    """The last feasible makespan of Gavel's bisection (100 s .. 1e6 s, widened tenfold, stop at 5%) when
    exactly the makespans >= ``exact`` are feasible."""
    high, low, last_high, found = 1e6, 100.0, 1e6, None
    while found is None:
        while 1.05 * low < high:
            mid = (low + high) / 2
            found, high, low = (mid, mid, low) if mid >= exact else (found, high, mid)
        high, low, last_high = last_high * 10, last_high, last_high * 10
    return found


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_makespan_gavel_bisection(seed, scale):
    """method="bisection": the point of Gavel's last feasible LP, within 5% of the exact makespan;
    scale 1e4 makes the first bracket (100 s .. 1e6 s) infeasible, so Gavel's widening runs."""
    problem = random_problem(seed, 6, 3, started=False, finished=False)
    problem = Problem(problem.throughputs, problem.cluster, scale_factors=problem.scale_factors,
                      num_steps_remaining=problem.num_steps_remaining * scale)
    exact = allocopt.solve(problem, "min_makespan").objective
    found = gavel_search(exact)
    for backend in ("highs", "scipy"):
        alloc = allocopt.solve(problem, "min_makespan", method="bisection", backend=backend)
        assert_feasible(alloc)
        assert exact * (1 - 1e-7) <= alloc.objective <= found * (1 + 1e-7)
        assert found <= 1.05 * exact * (1 + 1e-9) or found < 200.0
        assert alloc.extras["makespan_s"] == alloc.objective
        assert alloc.timings.num_solves > 5
    with pytest.raises(InvalidOptionError, match="method must be 'lp'"):
        allocopt.solve(problem, "min_makespan", method="newton")


def test_ftf_conic_gavel_plans_gavels_program():
    """``method="conic_gavel"``: Gavel's program (types with GPUs, in name order); time on a type a job
    cannot use is set to 0 afterwards; errors for pairs and LP backends."""
    pytest.importorskip("cvxpy")
    cluster = Cluster({"v100": 2, "p100": 0, "k80": 3})
    T = np.array([[40.0, 20.0, 10.0], [12.0, 6.0, 0.0], [100.0, 60.0, 50.0]])
    problem = Problem(T, cluster, num_steps_remaining=[1_000.0, 500.0, 3_000.0],
                      time_since_start=[100.0, 0.0, 50.0], time_isolated=[20.0, 0.0, 10.0])
    gavel = allocopt.solve(problem, "finish_time_fairness", backend="cvxpy", method="conic_gavel")
    conic = allocopt.solve(problem, "finish_time_fairness", backend="cvxpy", method="conic")
    assert gavel.objective == pytest.approx(conic.objective, rel=1e-5)
    check_ftf(gavel, problem)
    assert not gavel.matrix[:, 1].any() and gavel.matrix[1, 2] == 0.0
    agnostic = dict(heterogeneity_aware=False, reference_gpu_type="v100")
    assert allocopt.solve(problem, "finish_time_fairness", backend="cvxpy", method="conic_gavel", **agnostic
                          ).objective == pytest.approx(allocopt.solve(problem, "finish_time_fairness", **agnostic
                                                                      ).objective, rel=1e-5)
    with pytest.raises(InvalidOptionError, match="method='conic_gavel' .* needs backend='cvxpy'"):
        allocopt.solve(problem, "finish_time_fairness", method="conic_gavel")
    pairs = {(0, 2): {"v100": (30.0, 90.0), "p100": (15.0, 50.0), "k80": (8.0, 40.0)}}
    with pytest.raises(InvalidOptionError, match="conic_gavel.*without pairs"):
        allocopt.solve(Problem(T, cluster, num_steps_remaining=[1.0, 1.0, 1.0], pair_throughputs=pairs),
                       "finish_time_fairness", backend="cvxpy", method="conic_gavel", space_sharing=True)


def test_makespan_gavel_program_is_gavels_bisection_as_gavel_writes_it():
    """``gavel_program=True``: each feasibility LP of Gavel's bisection as Gavel's cvxpy code writes it
    (types with GPUs in name order, no bound on a type a job cannot use, ``Maximize(1)``): the point the
    same loop over Gavel's own program returns, to the solver's bits; errors elsewhere."""
    cp = pytest.importorskip("cvxpy")
    cluster = Cluster({"v100": 2, "p100": 0, "k80": 3})
    T = np.array([[40.0, 20.0, 10.0], [12.0, 6.0, 0.0], [100.0, 60.0, 50.0], [30.0, 25.0, 20.0]])
    steps = np.array([200_000.0, 50_000.0, 900_000.0, 300_000.0])
    problem = Problem(T, cluster, num_steps_remaining=steps, scale_factors=[1, 1, 2, 1])
    ours = allocopt.solve(problem, "min_makespan", backend="cvxpy", method="bisection", gavel_program=True,
                          solver_options={"solver": "CLARABEL"})
    # Gavel's MinTotalDurationPolicyWithPerf over its flattened matrix (v100 and k80, name order: k80, v100)
    columns = [2, 0]
    scale = np.repeat(np.array([1.0, 1.0, 2.0, 1.0])[:, None], 2, axis=1)
    high, low, last_high, found = 1e6, 100.0, 1e6, None
    while found is None:
        while 1.05 * low < high:
            makespan = (low + high) / 2
            x = cp.Variable((4, 2))
            program = cp.Problem(cp.Maximize(1), [x >= 0, cp.sum(cp.multiply(scale, x), axis=0) <= [3, 2],
                                                  cp.sum(x, axis=1) <= 1,
                                                  cp.sum(cp.multiply(T[:, columns], x), axis=1) >= steps / makespan])
            program.solve(solver="CLARABEL")
            if program.status == "optimal":
                found, high = x.value.clip(0.0, 1.0), makespan
            else:
                low = makespan
        high, low, last_high = last_high * 10, last_high, last_high * 10
    expected = np.zeros(T.shape)
    expected[:, columns] = found
    expected[1, 2] = 0.0  # job 1 cannot run on a K80: Gavel's mechanism never uses that time
    np.testing.assert_array_equal(ours.matrix, expected)
    assert ours.status is Status.OPTIMAL
    exact = allocopt.solve(problem, "min_makespan").objective
    assert exact * (1 - 1e-6) <= ours.objective <= 1.05 * exact * (1 + 1e-6)
    with pytest.raises(InvalidOptionError, match="gavel_program=True .* needs method='bisection'"):
        allocopt.solve(problem, "min_makespan", backend="cvxpy", gavel_program=True)
    with pytest.raises(InvalidOptionError, match="needs backend='cvxpy'"):
        allocopt.solve(problem, "min_makespan", method="bisection", gavel_program=True)
