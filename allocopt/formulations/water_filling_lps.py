"""The LPs of water-filling (:mod:`allocopt.formulations.water_filling`) and how they are solved:
one template patched per solve, row scaling, iterative refinement, the backends' retries, and exact
rational arithmetic for small runs.

Numerics. The level is ``t = t_low + tau t_unit``, where ``t_low`` is the level
the current exactly feasible point already reaches, and every job's row is
divided by its natural magnitude ``r_i``: its target at ``t_low`` (or, for a job
whose target starts at 0, what ``t_low`` itself is worth to it), clipped to
``[10^{-6} u_i, u_i]`` where ``u_i`` is the most ``n_i`` can be; ``t_unit`` is the
rise that lifts the most sensitive job by its ``r_i``. Solver tolerances are so
relative to each job's own level whatever the throughputs and weights; scales
are kept while within a factor 4, so few coefficients change from one LP to
the next. Types a job does not fit on stay out of its row. On the backends that
run HiGHS (``highs``, ``scipy``, ``cvxpy``'s default) every LP is solved with
primal and dual feasibility tolerances of ``10^{-9}`` (HiGHS's default
``10^{-7}`` let a time fraction of ``-6 \\cdot 10^{-8}`` through, which coefficients
of up to ``10^6`` turned into a level ``10^{-4}`` too high), and where the tight
tolerances end in numerical trouble, with the solver's own. A level LP's (and
the last LP's) answer is then refined where its duals do not prove it within
``10^{-15}`` (relative) of the optimum: the same LP around the solver's point
``x``, zoomed ``2^{20}`` times (``x + dx / 2^{20}``, every bound and the objective
scaled alike, so the duals carry over, divided by ``2^{20}``), solved again, at most twice. The
solvers' ``10^{-9}`` then hold ``10^{-15}`` and better: a level LP that ill-conditioning
had left ``10^{-11}`` off (scipy) moved a later level by ``1.7 \\cdot 10^{-5} u_i``,
one proved within ``10^{-14}`` but not ``10^{-15}`` moved one by ``2.6 \\cdot 10^{-5} u_i``
(HiGHS against scipy and cvxpy, which refined theirs), and one CBC answered 35 times
too high at its default tolerances. (Cap probes are not refined: they decide at
``CAP_REACHED``, far above the tolerances.) Each LP's point is
clipped to its bounds and scaled into the capacity, so it is exactly feasible,
and targets and floors are capped at what it achieves: every LP has a
feasible point, with no margin needed. CBC (``pulp``) solves with its primal
and dual tolerances at ``10^{-9}``, and its values come from its binary
solution file (full doubles, not the 8 digits of its text file). Where a
solve still fails (an error, or a stop at a limit the caller did not set: CBC
stops "on iterations" where it cycles), on ``highs`` it is repeated from
scratch with dual simplex, then with HiGHS's dual simplex with independent
pricing (``simplex_strategy`` 2), then in a fresh HiGHS with its default
scaling and presolve (tight tolerances, then its own), then with its interior
point method; on the other backends (scipy's and cvxpy's HiGHS first without
presolve, as ``highs`` solves: its presolve called feasible level LPs
infeasible) with the solver's own tolerances, then on
the model equilibrated here (rows, then columns, divided by their largest
coefficient), then (scipy, cvxpy's HiGHS) with independent pricing and (scipy)
interior point, (CBC) with its primal simplex (not its barrier: one of its
iterations never ended on a 75-job wide level LP, past CBC's time and
iteration limits). These last retries have iteration limits (scipy's HiGHS
looped without end on one interior point solve). Independent pricing finishes
level LPs that HiGHS's serial dual and primal simplex and its interior point
method give up on (coefficients ``3 \\cdot 10^{-5}..10^6``). An LP that no
retry answers is solved by GLPK's exact simplex (Exact levels, below), before
any other fallback: CBC called level LPs of an 85-job wide run infeasible in
every setting. A level LP reported infeasible even so (it has a feasible
point: the floors are at most what the last point achieved, but that float
sum can exceed the exact one by a unit in the last place) is solved again
with the floors 8 units in the last place lower. If it fails even so, the rest
of the run divides every row by ``u_i`` (coefficients at most 1), and after
that the frozen levels give way by ``WIDER_GIVE_WAY = 10^{-5}`` for the rest
of the run.
Finally each job's time alone is trimmed so that ``n_i`` is its level.

Exact levels. Runs whose LPs have at most ``EXACT_MAX_COLUMNS = 1024`` columns (one per job and
type, one per job and ``t``: about 113 jobs on 8 types, 204 on 4) solve every LP with GLPK's exact
simplex (:mod:`allocopt.backends.glpk`: rational arithmetic on the model's doubles), whatever the
backend, and decide on its answers (exact optima and duals rounded to doubles) without the
tolerances above: a job stays active when it can rise by more than ``EXACT_RISE = 10^{-12}`` of its
target, a positive dual certifies a bottleneck, a cap probe must reach its cap within
``EXACT_RISE``, and frozen levels give way by ``EXACT_GIVE_WAY = 10^{-14}`` only (each answer is
rounded). Such a run returns the lexicographic max-min vector itself, and every backend the same
allocation. Checked against the test suite's own dense formulation with each LP solved exactly
(``dense_water_filling(..., exact=True)`` in ``tests/test_properties.py``, one LP per level and job):
within ``2.6 \\cdot 10^{-10} u_i`` on all 2,515 problems of at most 6 jobs among 5,000 of the property
suite (seed 5, both families, with and without entities; median ``10^{-14} u_i``;
heterogeneity-agnostic: within ``8 \\cdot 10^{-14} u_i`` on 283 such problems of seed 11), within
``4 \\cdot 10^{-8} u_i`` on the property suite's wide family at 12 jobs on 4 types (13
problems; most within ``10^{-12} u_i``) and ``5 \\cdot 10^{-6} u_i`` at 40 jobs on 8 types (8 problems;
6 within ``10^{-9} u_i``), where the tolerances above (the floating-point runs) end up to
``0.18 u_i`` and ``0.96 u_i`` from it. What remains is the vector's own sensitivity: there, levels
``10^{-12}`` apart (a job the reference's held targets let rise by ``10^{-12}``, which an exact
positive dual freezes here) became later levels ``3 \\cdot 10^{-7}`` apart. The
floating-point solvers, each within its tolerances, also disagreed among themselves (Limits,
below): on a fresh seed of the property suite's wide family they ended up to ``0.79 u_i`` apart on
6 of 5,000 problems. ``benchmarks/property_suite.py --seed 3 --policies
water_filling,water_filling/float`` (5,000 problems): highs, scipy, cvxpy and CBC agree on all
5,000 and with the exact reference on its 492 (one after a fix of the reference's own rounding);
with ``exact=False`` scipy, CBC and cvxpy disagreed with HiGHS on 8, 6 and 7. Exact answers rounded
to doubles can leave a later LP infeasible by a unit in the last place (a fixed ``tau`` or a floor a
rounding above its exact value): it is solved again with the level rows ``EXACT_SLACK = 10^{-12}``
lower (rows scaled to about 1). Exact LPs are not refined. Their time grows with the size faster
than the floating-point solvers' (the bits of the rationals): a whole run took a median of 0.02 s
at 12 jobs on 4 types, 0.1 s at 28 on 8 and 0.4 s at 55 on 8 (wide family; about what HiGHS took).
Between 512 and 1,024 columns (30 problems, 65-299 jobs on 2-8 types): wide family a median of 0.63 s
(max 8.9 s; HiGHS 0.31 s, max 6.5 s), where HiGHS's floating-point run ended more than
``10^{-5} u_i`` from the exact vector on 12 of 15 (up to ``0.6 u_i``), and scipy, CBC and cvxpy took
0.4-4.6 s; moderate family a median of 0.09 s (max 0.14 s; HiGHS 0.01 s), 4 of 15 more than
``10^{-5} u_i`` apart (up to ``10^{-4} u_i``). Between 1,024 and 2,048 columns (20 problems) the wide
family took a median of 5.8 s (max 16.5 s) and 3 of 10 runs reached the exact LPs' time limit, which is
why the default stops at 1,024. An LP that takes more
than ``EXACT_TIME_LIMIT_S = 10`` s is solved by the backend, as is the rest of the run, with the
tolerances above. ``exact=False`` solves every LP on the backend (as
larger runs do), ``exact=True`` exactly whatever the size. So a run's answer depends on its path on
data at the edges of the supported range (on the wide family, up to ``0.2 u_i`` at 12 jobs and
``u_i`` at 100 jobs on 8 types), hardly on moderate data (within ``10^{-4} u_i``; ``10^{-5} u_i`` at
the property suite's sizes, its dense check).

Limits. A level LP can itself be ill-conditioned: a violation of a row by
``10^{-8}`` (within a solver's tolerance) can raise ``t*`` by 10% and more,
where a frozen job's floor is held with a sliver of a slow type (checked in
exact rational arithmetic: optimum 57.7 where HiGHS, within ``10^{-8}``, found
113.9; 3.588 where CBC found 3.87 at ``10^{-9}`` and 126.5 at its default
tolerances). Refinement and the retries above answer such LPs to the digits
the data have; the wider give stays for an LP no retry finishes. This holds for the LPs
solved in floating point (``exact=False``, and runs above ``EXACT_MAX_COLUMNS``). Measured with
``benchmarks/property_suite.py`` (all of its wide family): ``scipy`` apart from
``highs`` by more than ``10^{-5} u_i`` on none of 5,000 problems with highspy 1.16 and scipy 1.17 (on 1
while refinement stopped at ``10^{-13}``; on that one, 2823835977, with highspy 1.8 and scipy 1.13 still:
``3.1 \\cdot 10^{-5} u_i``, two level LPs whose duals lean on the free level, which each round of
refinement moves by the same ``3.6 \\cdot 10^{-10}``), ``pulp`` and ``cvxpy`` on none of 2,000. CBC ended a former
failure (893998634) about ``u_i`` from the exact vector, where its dual simplex called feasible level and
improvement LPs infeasible and its primal simplex answered them wrongly; with the LPs it fails in every
setting solved exactly (one of 25 there) it ends ``5.0 \\cdot 10^{-5} u_i`` from the exact vector, where
HiGHS, scipy and cvxpy end too.
The former failures are pinned in ``tests/test_properties.py``, each
checked against an exact rational-arithmetic run of this definition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from allocopt.backends import RawResult, SolveOptions, solve_model
from allocopt.backends.glpk import GlpkExactBackend
from allocopt.csr import CSR
from allocopt.errors import SolverError
from allocopt.formulations.base import AllocationModel, ModelSolver, base_model
from allocopt.model import CompiledModel, LinExpr
from allocopt.problem import Problem
from allocopt.solution import Solution, Status

logger = logging.getLogger(__name__)

IMPROVEMENT = 1e-3  # epsilon: the raise an improvement LP asks of a job, as a fraction of its row scale
ZOOM = 2.0**20  # iterative refinement: the LP around a solver's point, its bounds and objective this much larger
REFINEMENTS = 2  # rounds of it at most per level LP, where the point is off by more than EXACT ...
EXACT = 1e-15  # (relative; the LP's rows and objective are scaled to about 1)
REFINED = 1e-13  # ... ending when a round moves the objective by at most this (relative)
DUAL_NOISE = 1e-13  # a reduced cost this small on a column with an infinite bound is rounding (_gap)

# HiGHS options of the LPs: simplex (its bases carry over from one LP to the next), without
# presolve (it removes little from these LPs), without HiGHS's own scaling (the rows are scaled
# here; scale factors HiGHS keeps from the first LP made later LPs changed in place stop short
# of their optimum: 1.64324 for 1.64344 on one problem), with tight tolerances (TOLERANCES).
SOLVER_DEFAULTS = {"solver": "simplex", "presolve": "off", "simplex_scale_strategy": 0,
                   "primal_feasibility_tolerance": 1e-9, "dual_feasibility_tolerance": 1e-9}
# The HiGHS of every backend but CBC (scipy's, cvxpy's default) holds the bounds and reduced costs to
# 1e-9, not its default 1e-7 (see Numerics in the module docstring).
TOLERANCES = {"primal_feasibility_tolerance": 1e-9, "dual_feasibility_tolerance": 1e-9}
CBC_TOLERANCES = {"options": ["primalTolerance 1e-9", "dualTolerance 1e-9"]}  # CBC's names for them
# A first (cold) LP of at least this many columns is solved with primal simplex: at 4,096 jobs x 8 types
# in 0.3-0.4 of the time of HiGHS's dual simplex. Smaller ones keep dual simplex, whose first vertex the
# pinned ill-conditioned problems of the property suite were checked with (on one of them primal simplex's
# vertex leaves a fifo job able to rise by RISE within the give, and a later level falls 300-fold).
PRIMAL_FIRST = 4096
# The LPs of such runs are also solved with primal simplex's bounds unperturbed: each starts from the
# previous one's basis, and HiGHS spent a quarter of its time cleaning up with dual simplex the
# infeasibilities that removing the perturbation left (2,048 distinct jobs x 8 types: 2.0 s -> 1.4 s; a
# 520-job problem of the property suite's wide family: 115 s -> 0.6 s). Smaller runs keep the
# perturbation, with which the pinned problems were checked (unperturbed, 2 of them end elsewhere).
PERTURBATION = "primal_simplex_bound_perturbation_multiplier"
# where a re-solve in place fails: first in place with the bounds perturbed where they were not (HiGHS's
# default), then from scratch with dual simplex (then _last_retries' first and a fresh HiGHS, see
# _HighsSession.solve); interior point or primal simplex there found other vertices, whose duals froze
# other jobs than the other backends did. Each retry: (options, from scratch).
RETRIES = (({PERTURBATION: 1.0}, False), ({"simplex_strategy": 1}, True))
HIGHS_OWN = {"simplex_strategy": 1, "simplex_iteration_limit": 2**31 - 1}  # HiGHS's defaults, restored after a retry
# Runs whose LPs have at most this many columns solve them in exact rational arithmetic (GLPK's exact
# simplex), whatever the backend: there the floating-point solvers, each within its tolerances, ended
# up to u_i apart on the property suite's wide family (see Exact levels in the module docstring). Its time
# grows faster with the size than theirs: up to here a median of 0.6 s per run on the wide family (HiGHS
# 0.3 s), past it 5.8 s, with exact LPs at their time limit in 3 of 10 runs.
EXACT_MAX_COLUMNS = 1024
EXACT_TIME_LIMIT_S = 10.0  # per LP; an LP that takes longer is solved by the backend
EXACT_SLACK = 1e-12  # (rows scaled to about 1) what an exact LP infeasible by rounding gives way
# Runs whose LPs are exact decide at these instead (see Exact levels in the module docstring): a job rises
# when it can rise by more than EXACT_RISE of its scale (and a cap probe succeeds within it), a positive dual
# certifies, and frozen levels give way by EXACT_GIVE_WAY only (the exact answers are rounded to doubles)
EXACT_RISE = 1e-12
EXACT_GIVE_WAY = 1e-14


def _last_retries(backend: str, size: int) -> tuple[dict[str, Any], ...]:
    """The last retries of a backend, for an LP of ``size`` rows and columns; where it runs HiGHS, its dual
    simplex with independent pricing (which finishes ill-conditioned level LPs its serial dual and
    primal simplex give up on), then its interior point method (with crossover). Each with an
    iteration limit: scipy's HiGHS 1.17 looped without end in one interior point solve."""
    limit = 20 * size + 1000
    return {"highs": ({"simplex_strategy": 2, "simplex_iteration_limit": limit},
                      {"solver": "ipm", "ipm_iteration_limit": 1000, "simplex_iteration_limit": limit}),
            # HiGHS's presolve behind scipy and cvxpy called feasible level LPs infeasible
            "scipy": ({"presolve": False}, {"simplex_strategy": 2, "maxiter": limit},
                      {"method": "highs-ipm", "maxiter": limit}),
            "cvxpy": ({"presolve": "off"}, {"simplex_strategy": 2, "simplex_iteration_limit": limit}),
            # CBC's dual simplex called feasible level LPs infeasible that its primal simplex solves. Not its
            # barrier: on a 75-job wide run one barrier iteration never ended, and CBC's time and iteration
            # limits do not stop it (the exact rescue, _Lps._rescue, takes what primal simplex leaves)
            "pulp": ({"options": [*CBC_TOLERANCES["options"], f"maxIterations {limit}", "primalSimplex"]},),
            }.get(backend, ())


NUMERICAL_TROUBLE = (Status.ERROR, Status.INFEASIBLE, Status.INFEASIBLE_OR_UNBOUNDED, Status.UNBOUNDED)


def _trouble(solution: Solution, solver: ModelSolver) -> bool:
    """Numerical trouble: a failed solve of an LP that has a feasible point, or one that stopped at a limit
    the caller did not set (CBC stops "on iterations" where it cycles)."""
    return solution.status in NUMERICAL_TROUBLE or (solution.status is Status.TIME_LIMIT
                                                   and solver.options.time_limit_s is None)


def _equilibrated(model: CompiledModel) -> tuple[CompiledModel, np.ndarray, np.ndarray]:
    """``model`` with each row, then each column, divided by about its largest coefficient (a power of
    2, so exactly), and those row and column factors."""
    def power(largest: np.ndarray) -> np.ndarray:
        return np.exp2(np.round(np.log2(np.where(largest > 0, largest, 1.0))))

    A = abs(model.A)
    rows = power(A.max(axis=1).toarray().ravel())
    cols = power((sp.diags(1.0 / rows) @ A).max(axis=0).toarray().ravel())
    A = (sp.diags(1.0 / rows) @ model.A @ sp.diags(1.0 / cols)).tocsr()
    return replace(model, matrix=CSR.from_any(A), row_lb=model.row_lb / rows, row_ub=model.row_ub / rows, col_lb=model.col_lb * cols,
                   col_ub=model.col_ub * cols, c=model.c / cols), rows, cols


def _unscaled(solution: Solution, scaled: CompiledModel, rows: np.ndarray, cols: np.ndarray) -> Solution:
    """The solution of :func:`_equilibrated`'s model in the original model's columns and rows."""
    if solution.x is None:
        return solution
    x = solution.x / cols
    values = {name: x[c].reshape(shape) for name, (c, shape) in scaled.variables.items()}
    duals = {}
    if solution.duals:
        y = np.zeros(rows.size)
        for name, (r, _) in scaled.constraints.items():
            y[r] = solution.duals[name].ravel()
        y /= rows
        duals = {name: y[r].reshape(shape) for name, (r, shape) in scaled.constraints.items()}
    return replace(solution, x=x, values=values, duals=duals)


def _gap(model: CompiledModel, solution: Solution) -> float:
    """How far the solution may be from the optimum of ``model`` (a maximization), relative to its
    objective: the point's largest violation of a bound (rows and columns) plus the gap between its
    objective and the upper bound its duals prove (weak duality; ``inf`` without duals or where the duals
    lean on an infinite bound)."""
    x, y = solution.x, np.zeros(model.num_rows)
    if not solution.duals:
        return np.inf
    for name, (rows, _) in model.constraints.items():
        y[rows] = solution.duals[name].ravel()
    Ax = model.A @ x
    violation = max(float(np.max(np.maximum(model.row_lb - Ax, Ax - model.row_ub), initial=0.0)),
                    float(np.max(np.maximum(model.col_lb - x, x - model.col_ub), initial=0.0)))
    z = model.c - model.A.T @ y  # reduced costs

    def most(multiplier: np.ndarray, value: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> np.ndarray:
        # the most multiplier * v can be over lb <= v <= ub; at the point's value where the bound it leans
        # on is infinite and the multiplier is rounding noise (a free column's reduced cost: 1e-16)
        bound = np.where(multiplier > 0, ub, lb)
        noise = np.abs(multiplier) <= DUAL_NOISE
        return np.where(np.isfinite(bound), multiplier * np.where(np.isfinite(bound), bound, 0.0),
                        np.where(noise, multiplier * value, np.inf))

    objective = float(model.c @ x)
    bound = float(most(y, Ax, model.row_lb, model.row_ub).sum() + most(z, x, model.col_lb, model.col_ub).sum())
    return (violation + max(bound - objective, 0.0)) / max(abs(objective), 1.0)


def _failed(message: str, backend: str) -> Solution:
    """The Solution of a solve the backend gave up on (it raised ``message``)."""
    return Solution(status=Status.ERROR, message=message, objective=None, x=None, backend=backend,
                    raw_status=message, build_seconds=0.0, solve_seconds=0.0)


@dataclass
class _Level:
    """One level LP's optimum."""

    t: float  # the water level t*
    tau: float  # t* in the LP's units
    target: np.ndarray  # b_i(t*), capped at what the point achieves (0 for frozen jobs)
    dual_share: np.ndarray  # each row's share of tau's dual weight (they sum to 1)
    dual: np.ndarray  # each row's dual: the fall of tau per unit of its right-hand side
    weight: np.ndarray  # tau's coefficients in the LP
    rhs: np.ndarray  # the LP's right-hand sides


class _Lps:
    """The level and improvement LPs of a run, all one template with the same sparsity: job ``i``'s row
    ``n_i / r_i - a_i tau - epsilon d_i >= rhs_i`` (``t = tau t_unit``), patched per solve. On ``highs`` one
    HiGHS instance is changed in place, so each LP starts from the previous one's basis and factorization;
    other backends solve each LP from scratch."""

    def __init__(self, problem: Problem, solver: ModelSolver, n_of: Callable[[AllocationModel], LinExpr],
                 space_sharing: bool, count: np.ndarray | None = None, exact: bool | None = None):
        self.solver = solver
        base = base_model(problem, name="water_filling", space_sharing=space_sharing, multiplicity=count)
        n = n_of(base)
        tau = base.model.add_variable("water_level", lb=-np.inf)
        d = base.model.add_variable("improvement", n.size, lb=0.0, ub=0.0)
        base.model.add_constraint("level", n - tau * np.ones(n.size) - d * IMPROVEMENT >= 0.0)
        base.model.maximize(tau)
        self.base, self.n = base, n
        self.template = model = base.model.compile()
        self.tau_col, self.d_cols = tau.columns.start, d.columns
        rows = model.constraints["level"][0]
        A = model.A
        self.entries = slice(A.indptr[rows.start], A.indptr[rows.stop])
        self.entry_job = np.repeat(np.arange(n.size), np.diff(A.indptr[rows.start:rows.stop + 1]))
        cols = A.indices[self.entries]
        self.on_tau = cols == self.tau_col
        self.on_d = (cols >= d.columns.start) & (cols < d.columns.stop)
        self.on_n = ~self.on_tau & ~self.on_d
        # columns fixed at 0 (a type a job does not fit on) keep out of the rows: their throughputs
        # only widen the coefficient range
        A.data[self.entries][self.on_n & (model.col_ub[cols] == 0)] = 0.0
        self.level_rows = rows
        self.refinements = 0  # zoomed LPs solved by refine
        cvxpy_highs = solver.options.solver_options.get("solver", "HIGHS") == "HIGHS"  # cvxpy's solver
        self.defaults = {"highs": SOLVER_DEFAULTS, "scipy": TOLERANCES, "cvxpy": TOLERANCES if cvxpy_highs else {},
                         "pulp": CBC_TOLERANCES}
        backend = solver.backend
        # by default exact where small, unless the caller's time limit is below an exact LP's
        limit = solver.options.time_limit_s
        if exact is None:
            exact = model.num_cols <= EXACT_MAX_COLUMNS and (limit is None or limit >= EXACT_TIME_LIMIT_S)
            missing = GlpkExactBackend.unavailable_reason() if exact else None
            if missing is not None:  # a core dependency, missing where allocopt runs from a path, not installed
                logger.warning("water_filling: %s; its LPs are solved in floating point, without exact levels",
                               missing)
                exact = False
        if exact:
            GlpkExactBackend.check_installed()
        self.exact = bool(exact)
        self.exact_solves = 0
        self.exact_too_slow = False  # an exact LP reached EXACT_TIME_LIMIT_S
        last = _last_retries(backend, model.num_rows + model.num_cols) if backend != "cvxpy" or cvxpy_highs else ()
        self.session = _HighsSession(solver, last) if backend == "highs" and not self.exact else None
        last = [({backend: {**self.defaults.get(backend, {}), **options}}, False) for options in last]
        # HiGHS without presolve (scipy, cvxpy) right after the tight tolerances, as the highs backend solves
        early = 1 if backend in ("scipy", "cvxpy") else 0
        self.attempts = [(self.defaults, False), *last[:early], ({}, False), (self.defaults, True), *last[early:]]

    def model(self, rows: np.ndarray, weight: np.ndarray, rhs: np.ndarray, tau: float | None,
              candidates: np.ndarray | None, raise_unit: np.ndarray | None = None) -> CompiledModel:
        """The level LP (``tau`` None: maximize it) or the improvement LP of the mask ``candidates`` with
        ``tau`` fixed, for row scales ``rows``, tau's coefficients ``weight`` and right-hand sides ``rhs``;
        ``d_i = 1`` raises job ``i`` by ``IMPROVEMENT raise_unit_i`` (default: its row scale)."""
        tpl = self.template
        data = tpl.matrix.data.copy()
        level = data[self.entries]
        level[self.on_n] /= rows[self.entry_job[self.on_n]]
        level[self.on_tau] = -weight[self.entry_job[self.on_tau]]
        if raise_unit is not None:  # the candidates' only (the others' d is 0): few changes in place
            raised = self.on_d & (candidates > 0)[self.entry_job]
            level[raised] = -IMPROVEMENT * (raise_unit / rows)[self.entry_job[raised]]
        data[self.entries] = level
        row_lb = tpl.row_lb.copy()
        row_lb[self.level_rows] = rhs
        col_lb, col_ub, c = tpl.col_lb.copy(), tpl.col_ub.copy(), np.zeros_like(tpl.c)
        if tau is None:
            c[self.tau_col] = 1.0
        else:
            col_lb[self.tau_col] = col_ub[self.tau_col] = tau
            col_ub[self.d_cols] = candidates
            c[self.d_cols] = 1.0
        A = CSR(data, tpl.matrix.indices, tpl.matrix.indptr, tpl.matrix.shape)
        return replace(tpl, matrix=A, row_lb=row_lb, col_lb=col_lb, col_ub=col_ub, c=c)

    def solve(self, model: CompiledModel, refine: bool = False, dual: bool = False) -> Solution:
        """Solve ``model``, whatever the status; with ``refine``, an optimal point not proved within ``EXACT``
        of the optimum by its duals is refined (:meth:`refine`); ``dual``: on ``highs``, by dual simplex from
        the previous LP's basis (else primal simplex)."""
        solution = self._solve_once(model, dual)
        for _ in range(REFINEMENTS if refine and not self.exact else 0):
            if solution.status is not Status.OPTIMAL or solution.x is None or _gap(model, solution) <= EXACT:
                break
            refined = self.refine(model, solution)
            if refined is None:
                break
            step, solution = refined
            if step <= REFINED:
                break
        return solution

    def refine(self, model: CompiledModel, solution: Solution) -> tuple[float, Solution] | None:
        """One round of iterative refinement: the same LP around the solution's point ``x``, zoomed
        ``ZOOM`` times (``x + dx / ZOOM``, every bound and the objective scaled by ``ZOOM``), so the
        solver's tolerances hold ``ZOOM`` times tighter. Returns the change of the objective (relative)
        and the refined solution, or None where the zoomed LP is not solved to optimality."""
        self.refinements += 1
        x = solution.x
        Ax = model.A @ x
        zoomed = replace(model, row_lb=ZOOM * (model.row_lb - Ax), row_ub=ZOOM * (model.row_ub - Ax),
                         col_lb=ZOOM * (model.col_lb - x), col_ub=ZOOM * (model.col_ub - x), c=ZOOM * model.c,
                         offset=0.0)
        correction = self._solve_once(zoomed, rescue=False)  # the point stands where it fails
        if correction.status is not Status.OPTIMAL or correction.x is None:
            return None
        x = x + correction.x / ZOOM
        objective = float(model.c @ x) + model.offset
        # the zoomed LP's objective is ZOOM c on dx = ZOOM (x' - x) and its bounds ZOOM times the room:
        # its duals (objective per unit of a bound) are ZOOM times the LP's own
        values = {name: x[c].reshape(shape) for name, (c, shape) in model.variables.items()}
        duals = {name: y / ZOOM for name, y in correction.duals.items()} if correction.duals else correction.duals
        step = abs(objective - solution.objective) / max(abs(objective), 1e-300)
        return step, replace(correction, x=x, values=values, objective=objective, duals=duals)

    def basis(self) -> Any:
        """The basis of the HiGHS instance changed in place (``highs``), else None."""
        session = self.session
        return None if session is None or session.handle is None else session.handle.getBasis()

    def set_basis(self, basis: Any) -> None:
        """The next LP starts from ``basis`` (of :meth:`basis`; None: from the last LP's)."""
        if basis is not None and self.session.handle is not None:
            self.session.handle.setBasis(basis)

    def _solve_once(self, model: CompiledModel, dual: bool = False, rescue: bool = True) -> Solution:
        if self.exact:
            solution = self._exact(model)
            if solution.status is Status.OPTIMAL:
                return solution
            if solution.status is Status.TIME_LIMIT:  # the next LPs, alike, would take as long
                self.exact = False
                self.exact_too_slow = True
            logger.info("water_filling: GLPK's exact simplex did not solve an LP (%s); %s solves it%s",
                        solution.message, self.solver.backend, "" if self.exact else " and the rest of the run")
        if self.session is not None:
            solution = self.session.solve(model, dual)
        else:
            A = model.A.copy()
            A.eliminate_zeros()
            stripped = replace(model, matrix=CSR.from_any(A))
            # where the tight tolerances fail, the solver's own, then the model equilibrated here (HiGHS
            # behind scipy and cvxpy found optima on it that it missed on the model as it is), then the
            # backend's _last_retries
            for defaults, scaled in self.attempts:
                solution = self._solve(stripped, defaults, scaled)
                if not _trouble(solution, self.solver):
                    break
            solution = self.solver.record(solution)
        return self._rescue(model, solution) if rescue and _trouble(solution, self.solver) else solution

    def _rescue(self, model: CompiledModel, solution: Solution) -> Solution:
        """``model``, which the backend failed on in every setting, by GLPK's exact simplex where it has not
        tried and is installed; its solution where optimal, else ``solution``. Before the callers' own
        fallbacks (a level LP's rows scaled otherwise, wider give): the LP as it is, answered exactly."""
        if self.exact or self.exact_too_slow or not GlpkExactBackend.is_installed():
            return solution
        exact = self._exact(model)
        logger.info("water_filling: %s did not solve an LP (%s); GLPK's exact simplex: %s",
                    self.solver.backend, solution.message, exact.message)
        return exact if exact.status is Status.OPTIMAL else solution

    def _exact(self, model: CompiledModel) -> Solution:
        """``model`` by GLPK's exact simplex (recorded where optimal)."""
        options = SolveOptions(time_limit_s=EXACT_TIME_LIMIT_S, verbose=self.solver.options.verbose)
        solution = GlpkExactBackend().solve(model, options)
        if solution.status is Status.INFEASIBLE:
            # the levels, floors and fixed tau the rows hold are exact optima rounded to doubles, a unit
            # in the last place above them at times: once more with the level rows EXACT_SLACK lower
            row_lb = model.row_lb.copy()
            row_lb[self.level_rows] -= EXACT_SLACK
            solution = GlpkExactBackend().solve(replace(model, row_lb=row_lb), options)
        if solution.status is Status.OPTIMAL:
            self.exact_solves += 1
            self.solver.record(solution)
        return solution

    def _solve(self, model: CompiledModel, defaults: Mapping[str, Any], scaled: bool) -> Solution:
        rows = cols = None
        if scaled:
            model, rows, cols = _equilibrated(model)
        try:
            solution = solve_model(model, self.solver.backend, self.solver.options, defaults)
        except (SolverError, ValueError) as err:  # the solver gave up on the model (cvxpy raises
            return _failed(str(err), self.solver.backend)  # ValueError for an unknown status)
        return solution if rows is None else _unscaled(solution, model, rows, cols)


class _HighsSession:
    """One HiGHS instance whose model is changed in place between solves (``highs`` backend)."""

    def __init__(self, solver: ModelSolver, last_retries: tuple[dict[str, Any], ...]):
        from allocopt.backends.highs import HighsBackend

        self.solver, self.backend = solver, HighsBackend()
        self.options = replace(solver.options, solver_options={**SOLVER_DEFAULTS, **solver.options.solver_options})
        self.fresh_options = replace(solver.options, solver_options={**TOLERANCES, **solver.options.solver_options})
        self.retries = (*RETRIES, (last_retries[0], True))
        self.ipm_options = replace(solver.options, solver_options={**TOLERANCES, **last_retries[1],
                                                                   **solver.options.solver_options})
        self.handle: Any = None
        self.last: CompiledModel | None = None

    def solve(self, model: CompiledModel, dual: bool = False) -> Solution:
        """Solve ``model`` (a maximization), changing the previous one in place (``dual``: by dual simplex)."""
        t0 = time.perf_counter()
        low = replace(model, c=-model.c, sense="min")  # HiGHS gets the minimization form
        if self.last is not None:
            self._change(low)
            if dual and "simplex_strategy" not in self.options.solver_options:
                self.handle.setOptionValue("simplex_strategy", 1)
        else:
            large = low.num_cols >= PRIMAL_FIRST
            if large:
                self.options = replace(self.options, solver_options={PERTURBATION: 0.0,
                                                                     **self.options.solver_options})
            self.handle = self.backend.build(low, self.options)
            if large and "simplex_strategy" not in self.options.solver_options:
                self.handle.setOptionValue("simplex_strategy", 4)
        self.last = low
        t1 = time.perf_counter()
        raw = self._run(low)
        for retry, from_scratch in self.retries if raw.status is not Status.OPTIMAL else ():
            # numerical trouble: again, with other settings and algorithms
            if set(retry) & set(self.solver.options.solver_options) or retry.get(PERTURBATION) == \
                    self.options.solver_options.get(PERTURBATION, 1.0):
                continue  # not where the caller chose that option, nor the setting the LP already had
            if from_scratch:
                self.handle.clearSolver()
            self._set(retry)
            raw = self._run(low)
            self._set({key: self.options.solver_options.get(key, HIGHS_OWN.get(key)) for key in retry})
            if raw.status is Status.OPTIMAL:
                break
        t2 = time.perf_counter()
        if raw.status is not Status.OPTIMAL:  # last, a fresh HiGHS with its own defaults (scaling, presolve)
            self.last = None  # and the next solve starts afresh too
            # tight tolerances, then its own, then interior point (with crossover: HiGHS's simplex fails in
            # every setting on some ill-conditioned level LPs its interior point method solves exactly)
            for options in (self.fresh_options, self.solver.options, self.ipm_options):
                try:
                    solution = self.backend.solve(model, options)
                except SolverError as err:
                    solution = _failed(str(err), "highs")
                if not _trouble(solution, self.solver):
                    break
            return self.solver.record(solution)
        return self.solver.record(self.backend._to_solution(model, raw, t1 - t0, t2 - t1))

    def _set(self, options: Mapping[str, Any]) -> None:
        for key, value in options.items():
            self.handle.setOptionValue(key, value)

    def _run(self, model: CompiledModel) -> RawResult:
        try:
            return self.backend.run(self.handle, model, self.options)
        except SolverError as err:
            return RawResult(Status.ERROR, raw_status=str(err))

    def _change(self, new: CompiledModel) -> None:
        h, old = self.handle, self.last
        A = new.matrix
        changed = np.flatnonzero(A.data != old.matrix.data)
        rows = np.searchsorted(A.indptr, changed, side="right") - 1
        for row, col, value in zip(rows.tolist(), A.indices[changed].tolist(), A.data[changed].tolist()):
            h.changeCoeff(row, col, value)  # (HiGHS has no call for many coefficients at once)
        rows = np.flatnonzero((new.row_lb != old.row_lb) | (new.row_ub != old.row_ub))
        if rows.size:
            if hasattr(h, "changeRowsBounds"):
                h.changeRowsBounds(rows.size, rows.astype(np.int32), new.row_lb[rows], new.row_ub[rows])
            else:  # older highspy has no batch call for row bounds
                for row in rows.tolist():
                    h.changeRowBounds(row, float(new.row_lb[row]), float(new.row_ub[row]))
        cols = np.flatnonzero((new.col_lb != old.col_lb) | (new.col_ub != old.col_ub))
        if cols.size:
            h.changeColsBounds(cols.size, cols.astype(np.int32), new.col_lb[cols], new.col_ub[cols])
        cols = np.flatnonzero(new.c != old.c)
        if cols.size:
            h.changeColsCost(cols.size, cols.astype(np.int32), new.c[cols])
        # a changed model keeps its basis: primal simplex goes on from a point that is still feasible
        if "simplex_strategy" not in self.options.solver_options:
            h.setOptionValue("simplex_strategy", 4)


