"""Warm starts: simplex bases carried from one solve to the next (HiGHS, Gurobi)."""

import numpy as np
import pytest

import allocopt
from allocopt.backends import get_backend, solve_model
from allocopt.backends.base import repair_basis
from allocopt.errors import InvalidOptionError, LicenseError
from allocopt.formulations.base import base_model
from allocopt.solution import Basis, BasisStatus
from allocopt.warm_start import model_key

WARM_BACKENDS = [b for b in ("highs", "gurobi") if get_backend(b).unavailable_reason() is None]
GPU_TYPES = ("v100", "p100", "k80")


def make_problem(job_ids, seed=0, **overrides):
    """Jobs with throughputs drawn per job id, so a job keeps its row when others come and go."""
    rows = np.array([np.random.default_rng([seed, int(j[1:])]).uniform(0.5, 10.0, len(GPU_TYPES)) for j in job_ids])
    steps = np.array([1e4 * (1 + int(j[1:]) % 7) for j in job_ids])
    fields = dict(job_ids=list(job_ids), num_steps_remaining=steps, time_since_start=np.full(len(job_ids), 100.0))
    fields.update(overrides)
    return allocopt.Problem(rows, allocopt.Cluster(dict(zip(GPU_TYPES, (6, 8, 10)))), **fields)


def mmf_model(n_jobs=60, seed=0):
    problem = make_problem([f"j{i}" for i in range(n_jobs)], seed)
    base = base_model(problem, name="mmf")
    base.model.maximize_minimum(base.throughput / problem.proportional_throughputs, name="t")
    return base.model.compile()


def final_solution(allocation):
    (_, _, solution), = allocation.warm_start.solves.values()
    return solution


def solve_or_skip(*args, **kwargs):
    try:
        return allocopt.solve(*args, **kwargs)
    except LicenseError as err:
        pytest.skip(f"Gurobi license: {err}")


@pytest.mark.parametrize("backend", WARM_BACKENDS)
def test_optimal_basis_restarts_with_zero_iterations(backend):
    model = mmf_model()
    cold = solve_model(model, backend)
    assert cold.simplex_iterations > 0 and cold.basis is not None
    warm = solve_model(model, backend, warm_start=cold.basis)
    assert warm.simplex_iterations == 0
    assert warm.objective == pytest.approx(cold.objective, rel=1e-9)


@pytest.mark.skipif(len(WARM_BACKENDS) < 2, reason="needs both HiGHS and Gurobi")
def test_basis_carries_across_backends():
    model = mmf_model()
    highs = solve_model(model, "highs")
    try:
        gurobi = solve_model(model, "gurobi", warm_start=highs.basis)
    except LicenseError as err:
        pytest.skip(f"Gurobi license: {err}")
    assert gurobi.simplex_iterations == 0
    back = solve_model(model, "highs", warm_start=gurobi.basis)
    assert back.simplex_iterations == 0
    assert back.objective == pytest.approx(highs.objective, rel=1e-9)


@pytest.mark.parametrize("backend", WARM_BACKENDS)
@pytest.mark.parametrize("statuses", ["all_basic", "all_lower", "all_upper", "invalid_codes"])
def test_any_basis_is_repaired_into_a_valid_start(backend, statuses):
    model = mmf_model(n_jobs=30)
    fill = {"all_basic": BasisStatus.BASIC, "all_lower": BasisStatus.LOWER,
            "all_upper": BasisStatus.UPPER, "invalid_codes": 7}[statuses]
    basis = Basis(np.full(model.num_cols, fill, dtype=np.int8), np.full(model.num_rows, fill, dtype=np.int8))
    repaired = repair_basis(model, basis)
    num_basic = (repaired.col_status == BasisStatus.BASIC).sum() + (repaired.row_status == BasisStatus.BASIC).sum()
    assert num_basic == model.num_rows
    assert not np.any((repaired.col_status == BasisStatus.UPPER) & np.isinf(model.col_ub))
    assert not np.any((repaired.row_status == BasisStatus.LOWER) & np.isinf(model.row_lb))
    try:
        warm = solve_model(model, backend, warm_start=basis)
    except LicenseError as err:
        pytest.skip(f"Gurobi license: {err}")
    assert warm.objective == pytest.approx(solve_model(model, "highs").objective, rel=1e-9)


def test_a_basis_of_the_wrong_size_is_refused():
    model = mmf_model(n_jobs=10)
    with pytest.raises(InvalidOptionError, match="column and .* row statuses"):
        repair_basis(model, Basis(np.zeros(3, np.int8), np.zeros(model.num_rows, np.int8)))


CHANGES = {
    "job_arrives": lambda ids: (ids + ["j40"], {}),
    "job_leaves": lambda ids: (ids[:7] + ids[8:], {}),
    "jobs_replaced": lambda ids: (ids[5:] + ["j50", "j51", "j52"], {}),
    "weights_change": lambda ids: (ids, {"priority_weights": np.r_[2.0, np.ones(len(ids) - 1)]}),
}


@pytest.mark.parametrize("backend", WARM_BACKENDS)
@pytest.mark.parametrize("policy", ["max_min_fairness", "max_throughput", "min_makespan", "finish_time_fairness"])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_warm_solve_has_the_cold_optimum(backend, policy, change):
    ids = [f"j{i}" for i in range(30)]
    before = solve_or_skip(make_problem(ids), policy, backend=backend)
    new_ids, overrides = CHANGES[change](ids)
    after = make_problem(new_ids, **overrides)
    cold = solve_or_skip(after, policy, backend=backend)
    warm = solve_or_skip(after, policy, backend=backend, warm_start=before)
    assert warm.objective == pytest.approx(cold.objective, rel=1e-7)
    X = warm.matrix
    assert np.all(X.sum(axis=1) <= 1 + 1e-7)
    assert np.all((X * after.scale_factors[:, None]).sum(axis=0) <= after.capacity + 1e-6)


@pytest.mark.parametrize("backend", WARM_BACKENDS)
def test_one_arrival_needs_a_fraction_of_the_cold_pivots(backend):
    ids = [f"j{i}" for i in range(40)]
    before = solve_or_skip(make_problem(ids), "max_min_fairness", backend=backend)
    after = make_problem(ids + ["j99"])
    cold = final_solution(solve_or_skip(after, "max_min_fairness", backend=backend))
    warm = final_solution(solve_or_skip(after, "max_min_fairness", backend=backend, warm_start=before))
    assert warm.simplex_iterations <= max(5, cold.simplex_iterations // 10)


def test_the_warm_start_maps_blocks_by_job_id():
    ids = ["j0", "j1", "j2", "j3"]
    before = allocopt.solve(make_problem(ids), "max_min_fairness", technique="plain")  # auto: a closed form
    solution = final_solution(before)
    after = make_problem(["j2", "j9", "j0"])
    base = base_model(after, name="max_min_fairness")
    base.model.maximize_minimum(base.throughput, name="normalized_throughput")
    model = base.model.compile()
    start = before.warm_start.basis_for(model, after.job_ids)
    old = solution.basis.col_status[:12].reshape(4, 3)
    new = start.col_status[:9].reshape(3, 3)
    assert np.array_equal(new[0], old[2]) and np.array_equal(new[2], old[0])
    assert np.all(new[1] == BasisStatus.LOWER)  # a new job starts at zero
    assert model_key(model) in before.warm_start.solves


def test_warm_start_must_come_from_the_same_policy():
    problem = make_problem(["j0", "j1"])
    other = allocopt.solve(problem, "max_throughput")
    with pytest.raises(InvalidOptionError, match="policy 'max_min_fairness'"):
        allocopt.solve(problem, "max_min_fairness", warm_start=other)
    with pytest.raises(InvalidOptionError, match="warm_start must be an Allocation"):
        allocopt.solve(problem, "max_min_fairness", warm_start={"X": 1})


def test_backends_without_bases_and_water_filling_solve_cold():
    problem = make_problem([f"j{i}" for i in range(8)])
    scipy_first = allocopt.solve(problem, "max_min_fairness", backend="scipy")
    assert scipy_first.warm_start is None
    warm = allocopt.solve(problem, "max_min_fairness", backend="scipy", warm_start=scipy_first)
    assert warm.objective == pytest.approx(scipy_first.objective, rel=1e-7)
    filled = allocopt.solve(problem, "water_filling")
    assert filled.warm_start is None
    again = allocopt.solve(problem, "water_filling", warm_start=filled)
    assert np.allclose(again.matrix, filled.matrix, atol=1e-7)


def test_engine_reallocates_from_its_previous_basis():
    engine = allocopt.Engine({"v100": 4, "k80": 4})
    for i in range(20):
        engine.add_job(f"j{i}", {"v100": 2.0 + i % 5, "k80": 1.0 + i % 3})
    first = engine.allocate()
    engine.add_job("late", {"v100": 3.0, "k80": 1.5})
    second = engine.allocate()
    assert final_solution(second).simplex_iterations < final_solution(first).simplex_iterations
    problem, _ = engine.problem()
    assert second.objective == pytest.approx(allocopt.solve(problem, "max_min_fairness").objective, rel=1e-9)


@pytest.mark.parametrize("backend", WARM_BACKENDS)
def test_allocations_with_bases_pickle_and_copy(backend):
    import copy
    import pickle

    problem = make_problem([f"j{i}" for i in range(20)])
    allocation = solve_or_skip(problem, "max_min_fairness", backend=backend, technique="plain")
    for clone in (pickle.loads(pickle.dumps(allocation)), copy.deepcopy(allocation)):
        assert clone.objective == allocation.objective
        again = solve_or_skip(problem, "max_min_fairness", backend=backend, warm_start=clone, technique="plain")
        assert final_solution(again).simplex_iterations == 0


def test_a_mostly_new_set_of_jobs_solves_cold():
    before = allocopt.solve(make_problem([f"j{i}" for i in range(10)]), "max_min_fairness", technique="plain")
    base = base_model(make_problem([f"j{i}" for i in range(4, 14)]), name="max_min_fairness")
    base.model.maximize_minimum(base.throughput, name="normalized_throughput")
    model = base.model.compile()
    assert before.warm_start.basis_for(model, [f"j{i}" for i in range(4, 14)]) is not None  # 6 of 10 known
    assert before.warm_start.basis_for(model, [f"j{i}" for i in range(6, 16)]) is None  # 4 of 10 known


def boxed_model():
    """An LP with boxed, fixed and free columns and ranged and equality rows (every status kind)."""
    from allocopt.model import Constraint, Model

    rng = np.random.default_rng(7)
    m = Model("boxed")
    x = m.add_variable("x", 40, lb=0.0, ub=rng.uniform(0.2, 1.0, 40))
    fixed = m.add_variable("fixed", 3, lb=0.5, ub=0.5)
    free = m.add_variable("free", lb=-np.inf)
    weights = rng.uniform(0.0, 1.0, (6, 40))
    ranged = (x[None, :] * weights).sum(axis=1)
    m.add_constraint("ranged", Constraint(ranged, lb=np.full(6, 1.0), ub=np.full(6, 4.0)))
    m.add_constraint("upper", x[:20].sum() + fixed.sum() <= 6.0)
    m.add_constraint("lower", x[20:].sum() >= 2.0)
    m.add_constraint("tie", x[0] - free == 0.1)
    m.add_constraint("cap", x[10:30].sum() + free <= 5.0)
    m.maximize((x * rng.uniform(0.5, 2.0, 40)).sum() - 0.3 * free)
    return m.compile()


@pytest.mark.parametrize("solver", ["simplex", "ipm"])
def test_highs_reads_the_basis_it_ends_with(solver):
    """The basis read from getBasicVariables and the values is HiGHS's own (its basic set, and a
    nonbasic status on the bound the value sits at), after simplex and after interior point."""
    import dataclasses

    from allocopt.backends.base import SolveOptions
    from allocopt.backends.highs import HighsBackend

    for model in (boxed_model(), mmf_model(200)):
        backend = HighsBackend()
        minimize = dataclasses.replace(model, c=-model.c, sense="min")
        handle = backend.build(minimize, SolveOptions(solver_options={"solver": solver}))
        raw = backend.run(handle, minimize, SolveOptions())
        assert raw.basis is not None
        ours = raw.basis()
        native = handle.getBasis()
        cols = np.array([int(s) for s in native.col_status])
        rows = np.array([int(s) for s in native.row_status])
        assert np.array_equal(ours.col_status == BasisStatus.BASIC, cols == BasisStatus.BASIC)
        assert np.array_equal(ours.row_status == BasisStatus.BASIC, rows == BasisStatus.BASIC)
        nonbasic = ours.col_status != BasisStatus.BASIC
        bound = np.where(ours.col_status == BasisStatus.UPPER, minimize.col_ub, minimize.col_lb)
        assert np.allclose(raw.x[nonbasic], np.where(np.isfinite(bound), bound, 0.0)[nonbasic], atol=1e-9)
        # it restarts the same LP with no pivot, at the same optimum
        again = solve_model(model, "highs", warm_start=ours)
        assert again.simplex_iterations == 0
        assert again.objective == pytest.approx(-float(minimize.c @ raw.x), rel=1e-9)
        # a warm solve's basis (read straight from the simplex) is the one it started from
        assert np.array_equal(again.basis.col_status == BasisStatus.BASIC, ours.col_status == BasisStatus.BASIC)
        assert np.array_equal(again.basis.row_status == BasisStatus.BASIC, ours.row_status == BasisStatus.BASIC)


def test_a_singular_start_is_repaired_by_highs():
    """Two identical columns both basic: HiGHS replaces one by a slack and still finds the optimum."""
    from allocopt.model import Model

    m = Model("twins")
    x = m.add_variable("x", 3)
    m.add_constraint("rows", (x * np.array([1.0, 1.0, 1.0])).sum() <= 1.0)
    m.add_constraint("more", (x * np.array([1.0, 1.0, 2.0])).sum() <= 1.5)
    m.maximize((x * np.array([1.0, 1.0, 1.5])).sum())
    model = m.compile()
    start = Basis(np.array([1, 1, 0], dtype=np.int8), np.array([2, 2], dtype=np.int8))
    warm = solve_model(model, "highs", warm_start=start)
    assert warm.objective == pytest.approx(1.25)


@pytest.mark.parametrize("event", ["arrival", "departure", "throughput", "capacity"])
def test_finish_time_fairness_warm_search_starts_at_the_previous_rho(event):
    """A warm re-solve searches near the previous optimum (a few LPs, each from the one before) and
    reaches the cold solve's rho; the previous rho and slope travel in the warm start's hints."""
    from allocopt.bench.instances import random_problem
    from allocopt.bench.resolve import event_pair

    before, after = event_pair(random_problem(303, 4, 1), 300, event, 0)
    previous = allocopt.solve(before, "finish_time_fairness")
    assert previous.warm_start.hints["rho"] == previous.objective
    warm = allocopt.solve(after, "finish_time_fairness", warm_start=previous)
    cold = allocopt.solve(after, "finish_time_fairness")
    assert warm.objective == pytest.approx(cold.objective, rel=1e-8)
    assert np.nanmax(warm.extras["rho"]) == pytest.approx(warm.objective, rel=1e-12)
    assert warm.extras["num_lp_solves"] <= 2  # the guess, then the Newton step the duals give


def test_old_positions_match_jobs_by_id_whatever_their_type():
    from allocopt.warm_start import old_positions

    assert old_positions((3, 1, 2), (1, 2, 5, 3)).tolist() == [1, 2, -1, 0]
    assert old_positions(("a", "b"), ("b", "c")).tolist() == [1, -1]
    assert old_positions((1, "1"), ("1", 1, 2)).tolist() == [1, 0, -1]  # 1 and "1" are different jobs
    assert old_positions((), (4,)).tolist() == [-1]
    assert old_positions((7, 8), (7, 8)).tolist() == [0, 1]
    assert old_positions((2**70, 5), (5, 2**70)).tolist() == [1, 0]


@pytest.mark.parametrize("policy", ["max_min_fairness", "max_throughput", "min_makespan", "finish_time_fairness"])
@pytest.mark.parametrize("event", ["arrival", "departure", "throughput", "capacity"])
def test_warm_resolve_after_each_bench_change_has_the_cold_optimum(policy, event):
    """The re-solve target's changes (allocopt.bench.resolve) at a size where max-min fairness warm-starts
    price decomposition from the previous prices: the warm answer has the cold plain solve's objective."""
    from allocopt.bench.instances import random_problem
    from allocopt.bench.resolve import event_pair

    plain = {"technique": "plain"} if policy in ("max_min_fairness", "max_throughput") else {}
    before, after = event_pair(random_problem(1203, 4, 2), 1200, event, 1)
    previous = allocopt.solve(before, policy, **plain)
    warm = allocopt.solve(after, policy, warm_start=previous)
    again = allocopt.solve(after, policy, warm_start=warm)  # a chain of warm solves
    cold = allocopt.solve(after, policy, **plain)
    for answer in (warm, again):
        assert answer.success
        assert answer.objective == pytest.approx(cold.objective, rel=1e-7)
        X = answer.matrix
        assert np.all(X.sum(axis=1) <= 1 + 1e-7)
        assert np.all((X * after.scale_factors[:, None]).sum(axis=0) <= after.capacity * (1 + 1e-7))
    if policy == "max_min_fairness":
        assert "prices" in previous.warm_start.hints
        assert warm.extras["technique"] == again.extras["technique"] == "price_decomposition"
        assert warm.extras["price_evaluations"] < 25  # from scratch: about 50


def test_finish_time_fairness_dual_bound_proves_every_rho_below_it_infeasible():
    """The duals of one LP of the search bound theta at every other rho: below the bound no
    allocation reaches theta 1 (checked by solving the LP there), and the bound is tight at the optimum."""
    from allocopt.backends import SolveOptions
    from allocopt.bench.instances import random_problem
    from allocopt.formulations.base import ModelSolver
    from allocopt.formulations.finish_time_fairness import dual_lower_bound
    from allocopt.formulations.makespan import SpeedupLP, isolated_throughputs, max_speedup

    problem = random_problem(200, 4, 3)
    rng = np.random.default_rng(3)
    problem = allocopt.Problem(problem.throughputs, problem.cluster, scale_factors=problem.scale_factors,
                               num_steps_remaining=rng.uniform(1e3, 1e5, 200),
                               time_since_start=rng.uniform(0.0, 2e4, 200))
    optimum = allocopt.solve(problem, "finish_time_fairness").objective
    steps, started = problem.num_steps_remaining, problem.time_since_start
    D = steps / isolated_throughputs(problem, None)
    active = np.ones(200, dtype=bool)
    solver = ModelSolver("highs", SolveOptions())
    lp = SpeedupLP(problem, active, name="ftf", throughputs=None, space_sharing=False)

    def theta(rho):
        _, _, _, solution = max_speedup(problem, solver, steps / (rho * D - started), name="ftf",
                                        throughputs=None, space_sharing=False, lp=lp)
        return solution

    lowest = float(np.max(started / D))  # theta is 0 there
    assert lowest < optimum
    for rho in (0.5 * (lowest + optimum), optimum * (1 + 1e-6), 1.3 * optimum):
        solution = theta(rho)
        bound = dual_lower_bound(-solution.duals["finish"], rho, solution.objective, D, started)
        assert lowest < bound <= optimum * (1 + 1e-9)
        if abs(rho / optimum - 1) < 1e-3:
            assert bound == pytest.approx(optimum, rel=1e-5)  # tight near the optimum
        for below in (0.5 * (lowest + bound), bound - 1e-4 * (bound - lowest)):
            assert theta(below).objective < 1.0


@pytest.mark.parametrize("policy", ["finish_time_fairness", "min_makespan"])
def test_a_warm_solve_keeps_the_previous_allocation_only_when_it_attains_the_bound(policy):
    """When one job's fastest type decides the optimum (the bench's instance), a warm re-solve after a
    change that leaves that job alone keeps the previous allocation (a new job, and jobs whose new
    throughputs leave them short, on spare GPUs) with no LP, at the cold optimum, and passes the bases on;
    after other changes the answer is the cold one too, and when the previous allocation does not fit,
    LPs are solved."""
    from allocopt.bench.instances import random_problem
    from allocopt.bench.resolve import event_pair

    full = random_problem(603, 4, 1)
    kept = 0
    for event in ("departure", "arrival", "throughput", "capacity"):
        before, after = event_pair(full, 600, event, 0)
        previous = allocopt.solve(before, policy)
        warm = allocopt.solve(after, policy, warm_start=previous)
        cold = allocopt.solve(after, policy)
        assert warm.objective == pytest.approx(cold.objective, rel=1e-9)
        assert warm.success and warm.warm_start is not None
        if warm.timings.num_solves == 0:
            kept += 1
            assert warm.warm_start.solves == previous.warm_start.solves  # the bases carry on
            assert warm.warm_start.previous[1] is warm.matrix
    assert kept == 4
    if policy == "finish_time_fairness":
        bottleneck = int(np.nanargmax(previous.extras["rho"]))
    else:  # the job that needs longest on its fastest type (others may tie with it but have time to spare)
        bottleneck = int(np.argmax(before.num_steps_remaining / before.throughputs.max(axis=1)))
    previous = allocopt.solve(before, policy)
    T = before.throughputs.copy()
    T[bottleneck] *= 0.5
    tiny = allocopt.Cluster({t: 8 for t in before.gpu_types})
    for throughputs, cluster in ((T, before.cluster), (before.throughputs, tiny)):
        changed = allocopt.Problem(throughputs, cluster, job_ids=before.job_ids, scale_factors=before.scale_factors,
                                   priority_weights=before.priority_weights,
                                   num_steps_remaining=before.num_steps_remaining,
                                   time_since_start=before.time_since_start)
        warm = allocopt.solve(changed, policy, warm_start=previous)
        assert warm.objective == pytest.approx(allocopt.solve(changed, policy).objective, rel=1e-8)
        assert warm.objective != pytest.approx(previous.objective, rel=1e-6)
    assert warm.timings.num_solves >= 1  # 8 GPUs per type: the previous allocation does not fit


def test_finish_time_fairness_starts_cold_once_time_has_moved_every_rate():
    """The previous basis starts the first LP of a warm search only while most jobs keep their rates:
    after an arrival it does, after time passes (every job's rate moves) the LP starts cold; both reach
    the cold solve's rho."""
    from allocopt.bench.instances import random_problem
    from allocopt.bench.resolve import event_pair
    from allocopt.formulations.finish_time_fairness import previous_basis_near
    from allocopt.formulations.makespan import isolated_throughputs

    before, arrived = event_pair(random_problem(303, 4, 3), 300, "arrival", 0)
    previous = allocopt.solve(before, "finish_time_fairness")
    hints = previous.warm_start.hints
    assert len(hints["basis_rates"]) == before.num_jobs and "basis_rho" in hints
    later = before.with_progress(np.arange(before.num_jobs),
                                 num_steps_remaining=np.ceil(0.9 * before.num_steps_remaining),
                                 time_since_start=before.time_since_start + 600.0)

    def near(problem):
        steps = problem.num_steps_remaining
        D = steps / isolated_throughputs(problem, None)  # time_isolated is 0
        return previous_basis_near(problem, previous.warm_start, steps, problem.time_since_start, D)

    assert near(before) and near(arrived)
    assert not near(later)
    for after in (arrived, later):
        warm = allocopt.solve(after, "finish_time_fairness", warm_start=previous)
        cold = allocopt.solve(after, "finish_time_fairness")
        assert warm.objective == pytest.approx(cold.objective, rel=1e-8)
        assert np.nanmax(warm.extras["rho"]) == pytest.approx(warm.objective, rel=1e-12)
