"""One battery of small LPs and MILPs with known optima and duals, run on every backend.

Each backend is skipped, with the reason, when its solver package is missing.
Duals are checked twice: against the known values and against finite
differences of the optimal objective (shift a row's bounds by ``DELTA``,
re-solve), which pins the sign convention ``d objective / d delta``.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar

import numpy as np
import pytest

from allocopt.backends import BACKENDS, Backend, SolveOptions, get_backend, solve_model
from allocopt.csr import CSR
from allocopt.errors import (BackendNotInstalledError, InvalidOptionError,
                             LicenseLimitError, UnknownBackendError)
from allocopt.model import CompiledModel, Constraint, Model
from allocopt.solution import Solution, Status

DELTA = 1e-2  # every battery LP keeps its optimal basis for row shifts this small
# Interior-point solvers (cvxpy may pick Clarabel) are accurate to about 1e-8 relative;
# PuLP reads CBC's solution back from a text file with about 8 significant digits.
TOLERANCE = {"cvxpy": 1e-5, "pulp": 1e-6}


def _backend(name: str) -> Backend:
    backend = get_backend(name)
    reason = backend.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return backend


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    return _backend(request.param)


def _tol(backend: Backend) -> float:
    return TOLERANCE.get(backend.name, 1e-7)


def _solve(backend: Backend, model: CompiledModel, **options: Any) -> Solution:
    return backend.solve(model, SolveOptions(**options))


# ----- the battery -------------------------------------------------------------

@dataclass
class Case:
    """A model with its known optimum: objective, values and duals per block."""

    build: Callable[[], Model]
    objective: float
    values: dict[str, list[float]] = field(default_factory=dict)
    duals: dict[str, list[float]] = field(default_factory=dict)

    def compile(self) -> CompiledModel:
        return self.build().compile()


def _lp_max() -> Model:
    # max 3x + 5y s.t. x <= 4, 2y <= 12, 3x + 2y <= 18 (the textbook Wyndor LP)
    m = Model()
    x = m.add_variable("x", 2)
    m.add_constraint("limits", x * np.array([1.0, 2.0]) <= np.array([4.0, 12.0]))
    m.add_constraint("mix", x.dot(np.array([3.0, 2.0])) <= 18.0)
    m.maximize(x.dot(np.array([3.0, 5.0])))
    return m


def _lp_min() -> Model:
    # min 2x + 3y s.t. x + y >= 4, x + 3y >= 6
    m = Model()
    x = m.add_variable("x", 2)
    m.add_constraint("cover", (x[None, :] * np.array([[1.0, 1.0], [1.0, 3.0]])).sum(axis=1) >= [4.0, 6.0])
    m.minimize(x.dot(np.array([2.0, 3.0])))
    return m


def _lp_equality() -> Model:
    # min x + 3y + 4z s.t. x + y + z = 6, y - z = 1
    m = Model()
    x = m.add_variable("x", 3)
    m.add_constraint("total", x.sum() == 6.0)
    m.add_constraint("balance", x[1] - x[2] == 1.0)
    m.minimize(x.dot(np.array([1.0, 3.0, 4.0])))
    return m


def _lp_ranged() -> Model:
    # max x + 2y s.t. 1 <= x - y <= 3 (binds below), 2 <= x + y <= 8 (binds above),
    # and a row with no finite bound at all
    m = Model()
    x = m.add_variable("x", 2)
    rows = (x[None, :] * np.array([[1.0, -1.0], [1.0, 1.0]])).sum(axis=1)
    m.add_constraint("band", Constraint(rows, lb=np.array([1.0, 2.0]), ub=np.array([3.0, 8.0])))
    m.add_constraint("free_row", Constraint(x.sum().reshape(1), lb=np.array([-np.inf]),
                                            ub=np.array([np.inf])))
    m.maximize(x.dot(np.array([1.0, 2.0])))
    return m


def _lp_free() -> Model:
    # min max(x + 1, -x - 3) over a free x: epigraph variable t and x both end negative
    m = Model()
    x = m.add_variable("x", lb=-np.inf)
    m.minimize_maximum(x * np.array([1.0, -1.0]) + np.array([1.0, -3.0]))
    return m


def _lp_no_rows() -> Model:
    m = Model()
    x = m.add_variable("x", 2, lb=np.array([1.0, -2.0]), ub=np.array([3.0, 5.0]))
    m.minimize(x.dot(np.array([1.0, -1.0])) + 0.5)
    return m


LPS = {
    "lp_max": Case(_lp_max, 36.0, {"x": [2.0, 6.0]}, {"limits": [0.0, 1.5], "mix": [1.0]}),
    "lp_min": Case(_lp_min, 9.0, {"x": [3.0, 1.0]}, {"cover": [1.5, 0.5]}),
    "lp_equality": Case(_lp_equality, 8.0, {"x": [5.0, 1.0, 0.0]}, {"total": [1.0], "balance": [2.0]}),
    "lp_ranged": Case(_lp_ranged, 11.5, {"x": [4.5, 3.5]}, {"band": [-0.5, 1.5], "free_row": [0.0]}),
    "lp_free": Case(_lp_free, -1.0, {"x": [-2.0], "max_value": [-1.0]}, {"max_value": [-0.5, -0.5]}),
    "lp_no_rows": Case(_lp_no_rows, -3.5, {"x": [1.0, 5.0]}),
}


def _milp_integer() -> Model:
    # max 5x + 4y s.t. 6x + 4y <= 24, x + 2y <= 6, x, y integer: 20 at (4, 0); LP relaxation 21
    m = Model()
    x = m.add_variable("x", 2, kind="integer")
    m.add_constraint("rows", (x[None, :] * np.array([[6.0, 4.0], [1.0, 2.0]])).sum(axis=1) <= [24.0, 6.0])
    m.maximize(x.dot(np.array([5.0, 4.0])))
    return m


def _milp_knapsack() -> Model:
    # binary knapsack plus a continuous filler s in [0, 1]: items 2 and 3 and s = 0.5 give 20.25
    m = Model()
    pick = m.add_variable("pick", 3, kind="binary")
    s = m.add_variable("s", ub=1.0)
    m.add_constraint("weight", pick.dot(np.array([4.0, 6.0, 3.0])) + s <= 9.5)
    m.maximize(pick.dot(np.array([10.0, 13.0, 7.0])) + 0.5 * s)
    return m


def _milp_no_rows() -> Model:
    m = Model()
    x = m.add_variable("x", lb=0.2, ub=3.7, kind="integer")
    m.minimize(x + 0.0)
    return m


MILPS = {
    "milp_integer": (Case(_milp_integer, 20.0, {"x": [4.0, 0.0]}), 21.0),
    "milp_knapsack": (Case(_milp_knapsack, 20.25, {"pick": [0.0, 1.0, 1.0], "s": [0.5]}),
                      17.0 + 13.0 * 2.5 / 6.0),
    "milp_no_rows": (Case(_milp_no_rows, 1.0, {"x": [1.0]}), 0.2),
}


def _relaxed(model: CompiledModel) -> CompiledModel:
    return replace(model, integrality=np.zeros_like(model.integrality))


def _shifted(model: CompiledModel, row: int, delta: float) -> CompiledModel:
    row_lb, row_ub = model.row_lb.copy(), model.row_ub.copy()
    row_lb[row] += delta
    row_ub[row] += delta
    return replace(model, row_lb=row_lb, row_ub=row_ub)


@pytest.mark.parametrize("case_name", LPS)
def test_lp_optimum_values_and_duals(backend: Backend, case_name: str) -> None:
    case = LPS[case_name]
    model = case.compile()
    sol = _solve(backend, model)
    tol = _tol(backend)
    assert sol.status is Status.OPTIMAL, sol.message
    assert sol.success and sol.backend == backend.name
    assert sol.objective == pytest.approx(case.objective, rel=tol, abs=tol)
    for name, expected in case.values.items():
        np.testing.assert_allclose(sol.values[name].ravel(), expected, rtol=tol, atol=10 * tol)
    assert set(sol.duals) == set(case.duals)
    for name, expected in case.duals.items():
        np.testing.assert_allclose(sol.duals[name].ravel(), expected, rtol=tol, atol=10 * tol)


@pytest.mark.parametrize("case_name", LPS)
def test_duals_match_finite_differences(backend: Backend, case_name: str) -> None:
    model = LPS[case_name].compile()
    base = _solve(backend, model)
    assert base.status is Status.OPTIMAL, base.message
    for block, (rows, _) in model.constraints.items():
        for k, row in enumerate(range(rows.start, rows.stop)):
            shifted = _solve(backend, _shifted(model, row, DELTA))
            assert shifted.status is Status.OPTIMAL, shifted.message
            slope = (shifted.objective - base.objective) / DELTA
            assert base.duals[block].ravel()[k] == pytest.approx(slope, abs=100 * _tol(backend)), (
                f"{block}[{k}]: dual {base.duals[block].ravel()[k]} vs finite difference {slope}")


@pytest.mark.parametrize("case_name", MILPS)
def test_milp_optimum_differs_from_relaxation(backend: Backend, case_name: str) -> None:
    case, relaxation = MILPS[case_name]
    model = case.compile()
    sol = _solve(backend, model)
    assert sol.status is Status.OPTIMAL, sol.message
    assert sol.objective == pytest.approx(case.objective, abs=1e-6)
    for name, expected in case.values.items():
        np.testing.assert_allclose(sol.values[name].ravel(), expected, atol=1e-6)
    assert sol.duals == {}
    relaxed = _solve(backend, _relaxed(model))
    assert relaxed.status is Status.OPTIMAL, relaxed.message
    assert relaxed.objective == pytest.approx(relaxation, rel=_tol(backend))
    assert abs(relaxed.objective - sol.objective) > 0.5


def test_model_without_columns(backend: Backend) -> None:
    sol = _solve(backend, Model().compile())
    assert sol.status is Status.OPTIMAL, sol.message
    assert sol.objective == 0.0
    assert sol.x is not None and sol.x.size == 0


@pytest.mark.parametrize("row_lb, row_ub, status",
                         [(-1.0, 1.0, Status.OPTIMAL), (1.0, 2.0, Status.INFEASIBLE)])
def test_rows_without_columns(backend: Backend, row_lb: float, row_ub: float, status: Status) -> None:
    model = replace(Model().compile(), matrix=CSR.empty(1, 0), row_lb=np.array([row_lb]),
                    row_ub=np.array([row_ub]), constraints={"empty": (slice(0, 1), (1,))})
    assert _solve(backend, model).status is status


def test_verbose_controls_the_solver_log(backend: Backend, capfd: pytest.CaptureFixture[str]) -> None:
    model = LPS["lp_max"].compile()
    assert _solve(backend, model, verbose=True).status is Status.OPTIMAL
    assert capfd.readouterr().out.strip()
    assert _solve(backend, model).status is Status.OPTIMAL
    if backend.name != "cvxpy":  # cvxpy's Gurobi interface prints Gurobi's license banner once
        assert capfd.readouterr().out == ""


# ----- statuses ----------------------------------------------------------------

def _infeasible(kind: str) -> CompiledModel:
    m = Model()
    x = m.add_variable("x", 2, kind=kind)
    m.add_constraint("at_most", x.sum() <= 1.0)
    m.add_constraint("at_least", x.sum() >= 2.0)
    m.minimize(x.sum())
    return m.compile()


def _unbounded() -> CompiledModel:
    m = Model()
    x = m.add_variable("x", 2)
    m.add_constraint("gap", x[0] - x[1] <= 1.0)
    m.maximize(x.sum())
    return m.compile()


def _infeasible_with_a_ray() -> CompiledModel:
    """Infeasible rows next to an unbounded free column: Gurobi's presolve says INF_OR_UNBD."""
    m = Model()
    x = m.add_variable("x", lb=-np.inf)
    y = m.add_variable("y", 2)
    m.add_constraint("at_most", y.sum() <= 1.0)
    m.add_constraint("at_least", y.sum() >= 2.0)
    m.add_constraint("link", x - y[0] <= 5.0)
    m.maximize(x + 0.0)
    return m.compile()


@pytest.mark.parametrize("make", [functools.partial(_infeasible, "continuous"),
                                  functools.partial(_infeasible, "integer"), _infeasible_with_a_ray],
                         ids=["lp", "milp", "lp_with_ray"])
def test_infeasible(backend: Backend, make: Callable[[], CompiledModel]) -> None:
    # Every backend proves infeasibility outright, so INFEASIBLE_OR_UNBOUNDED is not accepted:
    # on INF_OR_UNBD Gurobi re-solves without dual reductions (our gurobi backend, and cvxpy's
    # through reoptimize=True).
    sol = _solve(backend, make())
    assert sol.status is Status.INFEASIBLE, sol.message
    assert not sol.success and sol.objective is None


def test_unbounded(backend: Backend) -> None:
    sol = _solve(backend, _unbounded())
    assert sol.status in (Status.UNBOUNDED, Status.INFEASIBLE_OR_UNBOUNDED), sol.message


# ----- limits and options ------------------------------------------------------

def _set_cover(n_cols: int = 300, n_rows: int = 150, seed: int = 0) -> tuple[CompiledModel, np.ndarray]:
    """A random set-cover MILP: HiGHS needs about a second, far more than the tiny limit."""
    rng = np.random.default_rng(seed)
    A = (rng.random((n_rows, n_cols)) < 0.05).astype(float)
    A[np.arange(n_rows), rng.integers(0, n_cols, n_rows)] = 1.0
    cost = rng.integers(1, 100, n_cols).astype(float)
    m = Model()
    x = m.add_variable("x", n_cols, kind="binary")
    m.add_constraint("cover", (x[None, :] * A).sum(axis=1) >= 1.0)
    m.minimize(x.dot(cost))
    return m.compile(), A


@functools.lru_cache(maxsize=1)
def _set_cover_optimum() -> float:
    sol = solve_model(_set_cover()[0], "highs")
    assert sol.status is Status.OPTIMAL
    return sol.objective


@pytest.mark.filterwarnings("ignore:Solution may be inaccurate")  # cvxpy's word for user_limit
def test_time_limit_is_never_a_wrong_optimum(backend: Backend) -> None:
    model, A = _set_cover()
    sol = _solve(backend, model, time_limit_s=0.01)
    assert sol.status in (Status.TIME_LIMIT, Status.OPTIMAL), sol.message
    if sol.status is Status.OPTIMAL:
        assert sol.objective == pytest.approx(_set_cover_optimum(), abs=1e-6)
    if sol.x is not None:  # an incumbent must be a feasible cover
        x = sol.values["x"]
        np.testing.assert_allclose(x, np.round(x), atol=1e-6)
        assert np.all(A @ x >= 1.0 - 1e-6)


def _correlated_knapsack(n: int = 300, k: int = 5, seed: int = 0) -> tuple[CompiledModel, np.ndarray]:
    """A multi-dimensional knapsack with values correlated to weights: HiGHS needs over a
    minute for a third of it, yet every solver finds a feasible packing within a second."""
    rng = np.random.default_rng(seed)
    weight = rng.integers(20, 100, size=(k, n)).astype(float)
    value = weight.mean(axis=0) + rng.integers(-10, 10, size=n)
    m = Model()
    x = m.add_variable("x", n, kind="binary")
    m.add_constraint("capacity", (x[None, :] * weight).sum(axis=1) <= weight.sum(axis=1) / 2)
    m.maximize(x.dot(value))
    return m.compile(), weight


@pytest.mark.filterwarnings("ignore:Solution may be inaccurate")  # cvxpy's word for user_limit
def test_time_limit_keeps_the_incumbent(backend: Backend) -> None:
    model, weight = _correlated_knapsack()
    sol = _solve(backend, model, time_limit_s=0.5)
    assert sol.status is Status.TIME_LIMIT, sol.message
    assert sol.x is not None and not sol.success
    x = sol.values["x"]
    np.testing.assert_allclose(x, np.round(x), atol=1e-6)
    assert np.all(weight @ x <= weight.sum(axis=1) / 2 + 1e-6)
    assert sol.objective > 0.0


def test_unknown_solver_option_is_rejected(backend: Backend) -> None:
    with pytest.raises(InvalidOptionError, match="definitely_not_an_option"):
        _solve(backend, LPS["lp_max"].compile(), solver_options={"definitely_not_an_option": 1})


def test_threads(backend: Backend) -> None:
    model = LPS["lp_max"].compile()
    if backend.name == "scipy":
        with pytest.raises(InvalidOptionError, match="threads"):
            _solve(backend, model, threads=1)
        return
    sol = _solve(backend, model, threads=1)
    assert sol.status is Status.OPTIMAL, sol.message
    assert sol.objective == pytest.approx(36.0, rel=_tol(backend))


def test_generic_options_reach_the_solver(backend: Backend) -> None:
    sol = _solve(backend, MILPS["milp_knapsack"][0].compile(), time_limit_s=30.0, mip_gap=1e-6)
    assert sol.status is Status.OPTIMAL, sol.message
    assert sol.objective == pytest.approx(20.25, abs=1e-6)


# ----- cvxpy: explicit solvers -------------------------------------------------

CVXPY_SOLVERS = {"CLARABEL": 1e-5, "HIGHS": 1e-7, "SCIPY": 1e-7, "GUROBI": 1e-7, "SCS": 1e-3}


def _cvxpy_solver(name: str) -> Backend:
    backend = _backend("cvxpy")
    import cvxpy

    if name not in cvxpy.installed_solvers():
        pytest.skip(f"cvxpy solver {name} is not installed")
    if name == "GUROBI" and get_backend("gurobi").unavailable_reason():
        pytest.skip(get_backend("gurobi").unavailable_reason())
    return backend


@pytest.mark.parametrize("solver", CVXPY_SOLVERS)
@pytest.mark.parametrize("case_name", ["lp_min", "lp_ranged", "lp_equality"])
def test_cvxpy_duals_per_solver(solver: str, case_name: str) -> None:
    backend = _cvxpy_solver(solver)
    case, tol = LPS[case_name], CVXPY_SOLVERS[solver]
    threads = 1 if solver in ("CLARABEL", "HIGHS", "GUROBI") else None
    sol = _solve(backend, case.compile(), solver_options={"solver": solver}, time_limit_s=30.0,
                 threads=threads)
    assert sol.status is Status.OPTIMAL, sol.message
    assert solver in sol.raw_status
    assert sol.objective == pytest.approx(case.objective, rel=tol, abs=tol)
    for name, expected in case.duals.items():
        np.testing.assert_allclose(sol.duals[name].ravel(), expected, rtol=tol, atol=10 * tol)


@pytest.mark.parametrize("solver", ["HIGHS", "SCIPY", "GUROBI"])
def test_cvxpy_milp_per_solver(solver: str) -> None:
    backend = _cvxpy_solver(solver)
    case, _ = MILPS["milp_knapsack"]
    sol = _solve(backend, case.compile(), solver_options={"solver": solver}, time_limit_s=30.0, mip_gap=1e-6)
    assert sol.status is Status.OPTIMAL, sol.message
    assert sol.objective == pytest.approx(case.objective, abs=1e-6)


@pytest.mark.parametrize("solver, option, value", [("SCS", "mip_gap", 1e-3), ("SCS", "threads", 1),
                                                   ("CLARABEL", "mip_gap", 1e-3), ("SCIPY", "threads", 1)])
def test_cvxpy_generic_option_the_solver_cannot_take(solver: str, option: str, value: Any) -> None:
    backend = _cvxpy_solver(solver)
    with pytest.raises(InvalidOptionError, match=f"{option}.*{solver}"):
        _solve(backend, LPS["lp_max"].compile(), solver_options={"solver": solver}, **{option: value})


def test_cvxpy_unknown_solver_name() -> None:
    backend = _backend("cvxpy")
    with pytest.raises(InvalidOptionError, match="NOT_A_SOLVER"):
        _solve(backend, LPS["lp_max"].compile(), solver_options={"solver": "NOT_A_SOLVER"})


# ----- Gurobi's size-limited license ---------------------------------------------

def _big_lp(n: int = 2001) -> CompiledModel:
    m = Model()
    x = m.add_variable("x", n, ub=1.0)
    m.maximize(x.sum())
    return m.compile()


@pytest.fixture(scope="module")
def size_limited_gurobi() -> Backend:
    backend = _backend("gurobi")
    try:
        backend.solve(_big_lp())
    except LicenseLimitError:
        return backend
    pytest.skip("a full Gurobi license is present: no size limit to test")


def test_gurobi_license_limit(size_limited_gurobi: Backend) -> None:
    with pytest.raises(LicenseLimitError, match=r"2001 variables.*backend='highs'.*backend='auto'"):
        size_limited_gurobi.solve(_big_lp())


def test_auto_falls_back_to_highs(size_limited_gurobi: Backend, caplog) -> None:
    with caplog.at_level("WARNING", logger="allocopt"):
        sol = solve_model(_big_lp(), "auto")
    assert any("falling back to highs" in r.getMessage() and r.name == "allocopt.backends" for r in caplog.records)
    assert sol.backend == "highs"
    assert sol.status is Status.OPTIMAL and sol.objective == pytest.approx(2001.0)


def test_auto_prefers_gurobi_when_it_can() -> None:
    _backend("gurobi")
    sol = solve_model(LPS["lp_max"].compile(), "auto")
    assert sol.backend == "gurobi" and sol.objective == pytest.approx(36.0)


# ----- registry ------------------------------------------------------------------

def test_unknown_backend() -> None:
    with pytest.raises(UnknownBackendError, match="nope"):
        get_backend("nope")


class _MissingBackend(Backend):
    """A backend whose solver package does not exist."""

    name: ClassVar[str] = "missing"
    required_modules: ClassVar[tuple[str, ...]] = ("allocopt_no_such_solver_module",)
    install_hint: ClassVar[str] = "pip install 'allocopt[missing]'"

    def build(self, model: CompiledModel, options: SolveOptions) -> Any:
        raise AssertionError("never reached: the backend is not installed")

    def run(self, handle: Any, model: CompiledModel, options: SolveOptions) -> Any:
        raise AssertionError("never reached: the backend is not installed")


def test_backend_not_installed_names_the_extra() -> None:
    backend = _MissingBackend()
    assert not backend.is_installed()
    with pytest.raises(BackendNotInstalledError,
                       match=r"allocopt_no_such_solver_module.*allocopt\[missing\]"):
        backend.solve(LPS["lp_max"].compile())


def test_backend_modules_do_not_import_their_solvers() -> None:
    code = ("import sys, allocopt.backends as b\n"
            "for name in b.BACKENDS: b.get_backend(name)\n"
            "print(sorted(m for m in ('gurobipy', 'pulp', 'cvxpy', 'highspy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_pulp_reads_cbc_values_and_duals_in_full() -> None:
    """CBC's text solution file holds 8 significant digits; an LP's answer comes from its binary file."""
    backend = _backend("pulp")
    m = Model()
    x = m.add_variable("x", 2)
    m.add_constraint("thirds", x * np.array([3.0, 7.0]) <= np.array([1.0, 1.0]))
    m.maximize(x.dot(np.array([1.0, 1.0])))
    solution = _solve(backend, m.compile())
    assert solution.status is Status.OPTIMAL
    np.testing.assert_allclose(solution.values["x"], [1 / 3, 1 / 7], rtol=1e-14)
    np.testing.assert_allclose(solution.duals["thirds"], [1 / 3, 1 / 7], rtol=1e-14)
    assert solution.objective == pytest.approx(1 / 3 + 1 / 7, rel=1e-14)


# ----- GLPK's exact simplex (water-filling's small runs; not a selectable backend) ----------------

@pytest.mark.parametrize("case_name", LPS)
def test_glpk_exact_on_the_lp_battery(case_name: str) -> None:
    from allocopt.backends.glpk import GlpkExactBackend

    exact = _backend_class(GlpkExactBackend)
    test_lp_optimum_values_and_duals(exact, case_name)
    test_duals_match_finite_differences(exact, case_name)


def test_glpk_exact_infeasible_and_unbounded() -> None:
    from allocopt.backends.glpk import GlpkExactBackend

    exact = _backend_class(GlpkExactBackend)
    for make in (functools.partial(_infeasible, "continuous"), _infeasible_with_a_ray):
        assert _solve(exact, make()).status is Status.INFEASIBLE
    assert _solve(exact, _unbounded()).status is Status.UNBOUNDED


def test_glpk_exact_solves_the_model_as_given() -> None:
    """glp_exact replaces a non-integral double by a nearby small fraction (0.3333333333 by 1/3, 1e-10 away);
    the backend hands it the model scaled to integers, so the answer is the given model's."""
    from allocopt.backends.glpk import GlpkExactBackend

    exact = _backend_class(GlpkExactBackend)
    m = Model()
    x = m.add_variable("x", 2, ub=np.array([np.inf, 0.7000000001]))
    m.add_constraint("third", x * np.array([0.3333333333, 1.0]) <= np.array([1.0, np.inf]))
    m.add_constraint("sum", x.sum() <= 3.1000000001)
    m.maximize(x.dot(np.array([1.0, 0.1000000001])))
    solution = _solve(exact, m.compile())
    assert solution.status is Status.OPTIMAL
    assert solution.values["x"][0] == 1 / 0.3333333333  # 3.0000000003, where 1/3 gives 3.0
    assert solution.values["x"][1] == pytest.approx(3.1000000001 - 1 / 0.3333333333, rel=1e-15)
    assert solution.duals["third"][0] == pytest.approx(0.8999999999 / 0.3333333333, rel=1e-15)
    assert float(solution.duals["sum"]) == pytest.approx(0.1000000001, rel=1e-15)


def test_glpk_exact_refuses_a_model_it_cannot_make_integral() -> None:
    """1e300 and 1e-300 in one row: no power of two makes both integral within doubles."""
    from allocopt.backends.glpk import GlpkExactBackend

    exact = _backend_class(GlpkExactBackend)
    m = Model()
    x = m.add_variable("x", 2, ub=1.0)
    m.add_constraint("wide", x * np.array([1e300, 1e-300]) <= np.array([1.0]))
    m.maximize(x.sum())
    solution = _solve(exact, m.compile())
    assert solution.status is Status.ERROR
    assert "powers of two" in solution.message


def _backend_class(cls: type[Backend]) -> Backend:
    reason = cls.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return cls()
