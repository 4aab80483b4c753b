"""Pollux: goodput-optimized allocation of elastic jobs (Qiao et al., "Pollux: Co-adaptive
cluster scheduling for goodput-optimized deep learning", OSDI 2021; published code:
petuum/adaptdl, ``sched/adaptdl_sched/policy/pollux.py`` and the ``osdi21-artifact``
branch's ``simulator/pollux.py``; Sia's port: siasosp23/artifacts ``sia-simulator/pollux_unaware.py``).

Over a :class:`~allocopt.pollux_problem.PolluxProblem` (replicas ``a[i, n]`` of
job ``i`` on node ``n``) Pollux maximizes its fitness, the power mean of the
jobs' scaled speedups::

    F(a) = ( (1 / N) sum_i (c * S_i(a_i) * f_i(a_i) + eps) ** p ) ** (1 / p)

``S_i`` is the job's speedup (its goodput at the best batch size for the
number of replicas ``sum_n a[i, n]`` and whether they span one node or several,
over its goodput at a fair share), ``c`` Pollux's scaling (the dominant
resource share of a replica times the number of nodes: nodes / GPUs for
one-GPU replicas), ``eps = 1e-3``, and ``f_i`` the problem's restart factor
where ``a_i`` differs from the previous allocation on any node, else 1.
The allocation obeys: replicas on a node within its GPUs; at most one job that
spans several nodes on each node (Pollux's interference avoidance); a job's
nodes at most ``max_nodes``; its replicas within its speedup table (its
batch-size limits); in a heterogeneity-aware problem, one GPU type per job.

**Exact (default).** For ``p < 0`` maximizing ``F`` is minimizing
``sum_i (c S_i f_i + eps) ** p``, which is linear in a one-hot choice per job
of a *shape* ``e = (type, one node or several, replicas)`` with value
``U_e = (c S_e f_i + eps) ** p``, of *keeping* its previous allocation (value
without the restart factor), or of nothing (value ``eps ** p``). The MILP
(constraint blocks named as below)::

    minimize   sum_e (U_e - eps**p) z_e + sum_i (U_keep_i - eps**p) k_i
    one_choice     sum_{e of i} z_e + k_i <= 1
    replicas       sum_n y[i, n] = sum_e r_e z_e + r_prev_i k_i
    on_node        u[i, n] <= y[i, n] <= gpus_n u[i, n]
    node_count     sum_n u[i, n] <= 1 (one node) or max_nodes_i (several), and >= 2 for several
    keep           y[i, n] >= prev[i, n] k_i
    capacity       sum_i y[i, n] <= gpus_n
    interference   d[i, n] >= u[i, n] + M_i - 1,  sum_i d[i, n] <= 1   (M_i: i spans several nodes)
    one_type       y[i, n] <= gpus_n * (choices of i on the type of n)   (aware problems)

with ``z, k, u`` binary, ``y`` integer and ``d`` in ``[0, 1]``. A shape is built only
where it beats every shape of the same job, type and spread with fewer
replicas (else that one uses fewer GPUs on the same nodes and is no worse)
and beats idling. The MILP is solved to zero gap unless ``mip_gap`` is given;
``extras["mip_gap"]`` is the proven gap.

**Genetic** (``technique="genetic"``, :mod:`allocopt.formulations.pollux_genetic`):
Pollux's own NSGA-II search over allocation matrices, seeded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from allocopt.allocation import Timings
from allocopt.backends import solve_model
from allocopt.errors import InvalidOptionError, SolverError
from allocopt.formulations.base import ModelSolver, Policy, PolicyResult
from allocopt.model import Model
from allocopt.pollux_problem import PolluxAllocation, PolluxProblem
from allocopt.solution import Status

logger = logging.getLogger(__name__)

#: Zero gap also in absolute terms (HiGHS stops at an absolute gap of 1e-6 by default; the objective
#: is a sum of values near ``eps ** p`` = 1000 per job, so that gap hid differences of 1e-8 in the fitness).
ZERO_GAP = {"highs": {"mip_abs_gap": 0.0}, "scipy": {}, "gurobi": {"MIPGapAbs": 0.0}}

#: Pollux's offset inside the power mean (an idle job counts as speedup 0, value eps ** p).
EPSILON = 1e-3


class Pollux(Policy):
    """Pollux's allocation (see the module docstring).

    Options
    -------
    p : float < 0, default -1
        Exponent of the power mean (Pollux's default -1; more negative is fairer).
        The exact MILP needs ``p < 0``; the genetic search takes any ``p``.
    speedup_scale : float > 0, optional
        ``c``: factor on every speedup; default Pollux's, nodes / GPUs of the cluster.
    epsilon : float > 0, default 1e-3
        Pollux's offset in the power mean.
    genetic : bool, default False
        Pollux's NSGA-II search instead of the exact MILP (``technique="genetic"``).
    population, generations : int, default 100, 100
        The genetic search's population size and generations (Pollux's).
    seed : int, default 0
        The genetic search's random seed.
    seed_population : array-like, optional
        Allocations (k, n_jobs, n_nodes) the genetic search starts from besides the
        previous allocation (Pollux carries its last population over rounds).
    relaxation_first : bool, default True
        Solve the relaxation over shapes first and place its optimum
        (:func:`solve_by_shapes`); False solves the whole MILP over shapes and nodes.
    """

    name = "pollux"
    options = {"p": -1.0, "speedup_scale": None, "epsilon": EPSILON, "genetic": False, "population": 100,
               "generations": 100, "seed": 0, "seed_population": None, "relaxation_first": True}
    problem_type = PolluxProblem
    warm_starts = False

    def allocate(self, problem: PolluxProblem, solver: ModelSolver, *, p: float = -1.0,
                 speedup_scale: float | None = None, epsilon: float = EPSILON, genetic: bool = False,
                 population: int = 100, generations: int = 100, seed: int = 0,
                 seed_population: Any = None, relaxation_first: bool = True) -> PolicyResult:
        p, scale, epsilon = check_options(problem, p, speedup_scale, epsilon, exact=not genetic)
        if genetic:
            from allocopt.formulations.pollux_genetic import genetic_search
            replicas, extras = genetic_search(problem, p=p, scale=scale, epsilon=epsilon, population=population,
                                              generations=generations, seed=seed, seed_population=seed_population)
            solver.backend_used = None
            return PolicyResult(replicas.astype(np.float64), fitness(problem, replicas, p, scale, epsilon),
                                Status.APPROXIMATE,
                                message="Pollux's genetic search (no optimality proof).", extras=extras)
        exact = solve_by_shapes if relaxation_first else solve_exact
        replicas, extras, status, message = exact(problem, solver, p, scale, epsilon)
        return PolicyResult(replicas.astype(np.float64), fitness(problem, replicas, p, scale, epsilon), status,
                            message=message, extras=extras)

    def to_allocation(self, problem: PolluxProblem, result: PolicyResult, *, backend: str | None,
                      timings: Timings) -> PolluxAllocation:
        replicas = np.rint(result.matrix).astype(np.int64).reshape(problem.num_jobs, problem.num_nodes)
        replicas.setflags(write=False)
        return PolluxAllocation(problem=problem, replicas=replicas, policy=self.name, backend=backend,
                                status=result.status, objective=result.objective, message=result.message,
                                timings=timings, extras=result.extras)


def check_options(problem: PolluxProblem, p: Any, speedup_scale: Any, epsilon: Any, *,
                  exact: bool) -> tuple[float, float, float]:
    """Validated ``p``, ``c`` and ``eps``."""
    for name, value in (("p", p), ("epsilon", epsilon)) + ((("speedup_scale", speedup_scale),)
                                                          if speedup_scale is not None else ()):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                or not np.isfinite(value):
            raise InvalidOptionError(f"pollux: {name} must be a finite number, got {value!r}")
    if exact and p >= 0:
        raise InvalidOptionError(f"pollux: the exact MILP needs p < 0 (Pollux's default is -1), got p={p}: for "
                                 "p < 0 maximizing the power mean is minimizing sum (speedup ** p), linear in a "
                                 "choice of shape per job; use technique='genetic' for p >= 0")
    if epsilon <= 0:
        raise InvalidOptionError(f"pollux: epsilon must be > 0 (Pollux's is 1e-3), got {epsilon}")
    if speedup_scale is not None and speedup_scale <= 0:
        raise InvalidOptionError(f"pollux: speedup_scale must be > 0, got {speedup_scale}")
    scale = (problem.num_nodes / float(problem.node_gpus.sum())) if speedup_scale is None else float(speedup_scale)
    return float(p), scale, float(epsilon)


def scaled_speedups(problem: PolluxProblem, replicas: np.ndarray, scale: float) -> np.ndarray:
    """``c * S_i * f_i`` of each job (``f_i`` where the job's replicas per node change)."""
    replicas = np.asarray(replicas)
    changed = np.any(replicas != problem.previous, axis=-1)
    return scale * problem.speedup_of(replicas) * np.where(changed, problem.restart_factor, 1.0)


def fitness(problem: PolluxProblem, replicas: np.ndarray, p: float = -1.0, scale: float | None = None,
            epsilon: float = EPSILON) -> float:
    """Pollux's fitness of ``replicas`` (n_jobs, n_nodes): the power mean with exponent ``p`` of
    ``c * S_i * f_i + eps`` (``p = 0``: the geometric mean of ``max(c S f, eps)``, as Pollux)."""
    if scale is None:
        scale = problem.num_nodes / float(problem.node_gpus.sum())
    if problem.num_jobs == 0:
        return float("nan")
    s = scaled_speedups(problem, replicas, scale)
    if p == 0:
        return float(np.exp(np.mean(np.log(np.maximum(s, epsilon)))))
    return float(np.mean((s + epsilon) ** p) ** (1.0 / p))


def shape_entries(problem: PolluxProblem, p: float, scale: float, epsilon: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The shapes worth building: job, type, spread (0 one node, 1 several), replicas and
    coefficient ``U - eps ** p`` of each, sorted by job (see the module docstring)."""
    S = problem.speedup
    n, T, _, R1 = S.shape
    r = np.arange(R1)
    gpus, types = problem.node_gpus, problem.node_type
    if T == 1:
        largest = np.array([gpus.max(initial=0)])
        total = np.array([gpus.sum()])
        nodes = np.array([gpus.size])
    else:
        largest = np.array([gpus[types == t].max(initial=0) for t in range(T)])
        total = np.array([gpus[types == t].sum() for t in range(T)])
        nodes = np.bincount(types, minlength=T)
    fits = np.zeros((n, T, 2, R1), dtype=bool)
    fits[:, :, 0, :] = (r[None, :] <= largest[:, None])[None]
    spread_ok = (r[None, None, :] <= np.minimum(total[None, :, None], problem.max_nodes[:, None, None]
                                                * largest[None, :, None])) \
        & (nodes[None, :, None] >= 2) & (problem.max_nodes[:, None, None] >= 2) & (r >= 2)
    fits[:, :, 1, :] = spread_ok
    valid = (S > 0) & fits
    idle = epsilon ** p
    U = (scale * S * problem.restart_factor[:, None, None, None] + epsilon) ** p
    coef = np.where(valid, U - idle, np.inf)
    best_before = np.minimum.accumulate(np.concatenate([np.zeros((n, T, 2, 1)), coef[..., :-1]], axis=3), axis=3)
    keep = valid & (coef < best_before) & (coef < 0)
    job, t, s, rep = np.nonzero(keep)
    return job, t, s, rep, coef[job, t, s, rep]


@dataclass
class _Choices:
    """Everything a job may choose: shapes ``job, t, s, rep`` with coefficients ``coef``, and keeping
    the previous allocation (``keepers``, coefficients ``kcoef``)."""

    job: np.ndarray
    t: np.ndarray
    s: np.ndarray
    rep: np.ndarray
    coef: np.ndarray
    keepers: np.ndarray
    kcoef: np.ndarray
    ktype: np.ndarray  # group (type, or 0 unaware) of each keeper's previous nodes
    kspread: np.ndarray  # 1 where a keeper's previous allocation spans several nodes


def choices(problem: PolluxProblem, p: float, scale: float, epsilon: float) -> _Choices:
    """Shapes worth building (:func:`shape_entries`) and the jobs that may keep their allocation."""
    job, t, s, rep, coef = shape_entries(problem, p, scale, epsilon)
    prev = problem.previous
    prev_total, prev_nodes = prev.sum(axis=1), np.count_nonzero(prev, axis=1)
    keep_value = (scale * problem.speedup_of(prev) + epsilon) ** p - epsilon ** p
    keepers = np.flatnonzero((prev_total > 0) & (keep_value < 0) & (prev_nodes <= problem.max_nodes))
    first = np.argmax(prev[keepers] > 0, axis=1) if keepers.size else np.zeros(0, dtype=np.int64)
    ktype = problem.node_type[first] if problem.speedup.shape[1] > 1 else np.zeros(keepers.size, dtype=np.int64)
    return _Choices(job, t, s, rep, coef, keepers, keep_value[keepers], ktype,
                    (prev_nodes[keepers] > 1).astype(np.float64))


def _by_job(n: int, rows: np.ndarray, values: Any, width: int) -> sp.csr_matrix:
    values = np.broadcast_to(np.asarray(values, dtype=np.float64), rows.shape)
    return sp.csr_matrix((values, (rows, np.arange(rows.size))), shape=(n, width))


def node_model(problem: PolluxProblem, c: _Choices, fixed: tuple[np.ndarray, np.ndarray] | None = None
               ) -> tuple[Model, np.ndarray, np.ndarray]:
    """The MILP over shapes and nodes (module docstring); with ``fixed`` (0/1 per shape, per keeper)
    the choices are fixed and the model only places them (a feasibility problem). Returns the
    model and the job and node of each ``y`` entry."""
    n, m = problem.num_jobs, problem.num_nodes
    gpus, types, prev = problem.node_gpus.astype(np.float64), problem.node_type, problem.previous
    job, t, s, rep, keepers = c.job, c.t, c.s, c.rep, c.keepers
    aware = problem.speedup.shape[1] > 1
    usable = np.zeros((n, m), dtype=bool)
    if aware:
        on_type = np.zeros((n, problem.cluster.num_gpu_types), dtype=bool)
        on_type[job, t] = True
        usable |= on_type[:, types]
    else:
        usable[np.unique(job), :] = True
    usable[keepers] |= prev[keepers] > 0
    if fixed is not None:  # only the chosen jobs need nodes
        chosen = np.zeros(n, dtype=bool)
        chosen[job[fixed[0] > 0.5]] = True
        chosen[keepers[fixed[1] > 0.5]] = True
        usable &= chosen[:, None]
    pj, pn = np.nonzero(usable)
    E, K, Pn = job.size, keepers.size, pj.size
    model = Model("pollux")
    lz, uz = (0.0, 1.0) if fixed is None else (fixed[0], fixed[0])
    lk, uk = (0.0, 1.0) if fixed is None else (fixed[1], fixed[1])
    z = model.add_variable("z", E, lb=lz, ub=uz, kind="binary")
    k = model.add_variable("keep", K, lb=lk, ub=uk, kind="binary")
    y = model.add_variable("y", Pn, lb=0.0, ub=gpus[pn], kind="integer")
    u = model.add_variable("u", Pn, kind="binary")
    d = model.add_variable("d", Pn, lb=0.0, ub=1.0)
    Jz, Jk, Jp = _by_job(n, job, 1.0, E), _by_job(n, keepers, 1.0, K), _by_job(n, pj, 1.0, Pn)
    multi_z, multi_k = _by_job(n, job, s, E), _by_job(n, keepers, c.kspread, K)
    prev_total, prev_nodes = prev.sum(axis=1), np.count_nonzero(prev, axis=1)
    model.add_constraint("one_choice", Jz @ z + Jk @ k <= 1.0)
    model.add_constraint("replicas", Jp @ y - _by_job(n, job, rep, E) @ z
                         - _by_job(n, keepers, prev_total[keepers], K) @ k == 0.0)
    model.add_constraint("on_node_upper", y - u * gpus[pn] <= 0.0)
    model.add_constraint("on_node_lower", u - y <= 0.0)
    span_z = np.where(s == 1, problem.max_nodes[job], 1)
    model.add_constraint("node_count_upper", Jp @ u - _by_job(n, job, span_z, E) @ z
                         - _by_job(n, keepers, prev_nodes[keepers], K) @ k <= 0.0)
    model.add_constraint("node_count_lower", Jp @ u - (multi_z @ z) * 2.0 - (multi_k @ k) * 2.0 >= 0.0)
    kp = np.flatnonzero(np.isin(pj, keepers) & (prev[pj, pn] > 0))
    if kp.size:
        where_k = np.searchsorted(keepers, pj[kp])
        sel_y = sp.csr_matrix((np.ones(kp.size), (np.arange(kp.size), kp)), shape=(kp.size, Pn))
        sel_k = sp.csr_matrix((prev[pj[kp], pn[kp]].astype(np.float64), (np.arange(kp.size), where_k)),
                              shape=(kp.size, K))
        model.add_constraint("keep", sel_y @ y - sel_k @ k >= 0.0)
    Np = sp.csr_matrix((np.ones(Pn), (pn, np.arange(Pn))), shape=(m, Pn))
    model.add_constraint("capacity", Np @ y <= gpus)
    Pj = sp.csr_matrix((np.ones(Pn), (np.arange(Pn), pj)), shape=(Pn, n))
    model.add_constraint("interference_link", d - u - Pj @ (multi_z @ z) - Pj @ (multi_k @ k) >= -1.0)
    model.add_constraint("interference", Np @ d <= 1.0)
    if aware:
        T = problem.cluster.num_gpu_types
        Tz = sp.csr_matrix((np.ones(E), (job * T + t, np.arange(E))), shape=(n * T, E))
        Tk = sp.csr_matrix((np.ones(K), (keepers * T + c.ktype, np.arange(K))), shape=(n * T, K))
        R = sp.csr_matrix((np.ones(Pn), (np.arange(Pn), pj * T + types[pn])), shape=(Pn, n * T))
        model.add_constraint("one_type", y - ((R @ Tz) @ z) * gpus[pn] - ((R @ Tk) @ k) * gpus[pn] <= 0.0)
    # symmetry: nodes of one type and size that no (kept) previous allocation tells apart are
    # interchangeable, so some optimum has them in order of decreasing load
    relevant = keepers if fixed is None else keepers[fixed[1] > 0.5]
    blank = ~(prev[relevant] > 0).any(axis=0)
    order = np.lexsort((np.arange(m), problem.node_gpus, types, ~blank))
    a, b = order[:-1], order[1:]
    same = blank[a] & blank[b] & (types[a] == types[b]) & (problem.node_gpus[a] == problem.node_gpus[b])
    if same.any():
        a, b = a[same], b[same]
        rows = np.arange(a.size)
        pair = sp.csr_matrix((np.ones(a.size), (rows, a)), shape=(a.size, m)) \
            - sp.csr_matrix((np.ones(b.size), (rows, b)), shape=(a.size, m))
        model.add_constraint("symmetry", pair @ (Np @ y) >= 0.0)
    if fixed is None:
        model.minimize(z.dot(c.coef) + k.dot(c.kcoef))
    return model, pj, pn


def solve_exact(problem: PolluxProblem, solver: ModelSolver, p: float, scale: float, epsilon: float
                ) -> tuple[np.ndarray, dict[str, Any], Status, str]:
    """The MILP over shapes and nodes of the module docstring, whole, to zero gap (or the caller's ``mip_gap``)."""
    n, m = problem.num_jobs, problem.num_nodes
    c = choices(problem, p, scale, epsilon)
    if c.job.size + c.keepers.size == 0:
        return np.zeros((n, m), dtype=np.int64), {"mip_gap": 0.0, "milp_binaries": 0}, Status.OPTIMAL, \
            "No job gains from an allocation: every job idles."
    model, pj, pn = node_model(problem, c)
    options = replace(solver.options, mip_gap=solver.options.mip_gap or 0.0)
    solution = solver.check(solver.record(solve_model(model.compile(), solver.backend, options, ZERO_GAP)),
                            "pollux (the MILP over shapes and nodes)")
    replicas = _replicas(problem, pj, pn, solution.values["y"])
    gap = 0.0 if solution.mip_gap is None else float(solution.mip_gap)
    return replicas, {"mip_gap": gap, "milp_binaries": int(solution.values["z"].size + solution.values["keep"].size
                                                           + 2 * pj.size)}, solution.status, solution.message


def _replicas(problem: PolluxProblem, pj: np.ndarray, pn: np.ndarray, y: np.ndarray) -> np.ndarray:
    replicas = np.zeros((problem.num_jobs, problem.num_nodes), dtype=np.int64)
    replicas[pj, pn] = np.rint(y).astype(np.int64)
    if np.any(replicas.sum(axis=0) > problem.node_gpus):
        raise SolverError("pollux: the solver's answer overfills a node (numerical trouble); try another backend")
    return replicas


# ----- shapes first: an aggregate relaxation, then placement ---------------------------------

def _groups(problem: PolluxProblem) -> tuple[np.ndarray, int]:
    """Group of each node (its type in an aware problem, else 0) and the number of groups."""
    if problem.speedup.shape[1] > 1:
        return problem.node_type, problem.cluster.num_gpu_types
    return np.zeros(problem.num_nodes, dtype=np.int64), 1


def aggregate_model(problem: PolluxProblem, c: _Choices, size: np.ndarray | None = None,
                    keeper_rows: np.ndarray | None = None) -> Model:
    """The relaxation over shapes only: per group of nodes, GPUs within capacity, nodes of jobs
    spanning several within the node count, and an arc-flow packing of the group's nodes
    (:func:`_arc_flow`; exact for single-node jobs). Every placement satisfies it.

    With ``size``, ``c.job`` and ``c.keepers`` index *classes* of identical jobs (``size`` jobs
    each; :func:`job_classes`) and ``z`` counts the class's jobs in each shape; ``keeper_rows`` are
    the problem rows of the keepers (classes of one job)."""
    n = int(np.max(np.r_[c.job, c.keepers], initial=-1)) + 1 if size is None else size.size
    size = np.ones(n) if size is None else np.asarray(size, dtype=np.float64)
    keeper_rows = c.keepers if keeper_rows is None else keeper_rows
    group, G = _groups(problem)
    gpus = problem.node_gpus
    prev = problem.previous
    E, K = c.job.size, c.keepers.size
    model = Model("pollux_shapes")
    whole = bool(np.all(size == 1))
    z = model.add_variable("z", E, lb=0.0, ub=size[c.job], kind="binary" if whole else "integer")
    k = model.add_variable("keep", K, kind="binary")
    model.add_constraint("one_choice", _by_job(n, c.job, 1.0, E) @ z + _by_job(n, c.keepers, 1.0, K) @ k <= size)
    zg = c.t if problem.speedup.shape[1] > 1 else np.zeros(E, dtype=np.int64)
    kg = c.ktype
    cap = np.bincount(group, gpus, minlength=G).astype(np.float64)
    nodes = np.bincount(group, minlength=G).astype(np.float64)
    largest = np.array([gpus[group == j].max(initial=1) for j in range(G)])
    prev_total, prev_nodes = prev.sum(axis=1)[keeper_rows], np.count_nonzero(prev, axis=1)[keeper_rows]

    def rows(zw: np.ndarray, kw: np.ndarray):
        return (sp.csr_matrix((zw, (zg, np.arange(E))), shape=(G, E)) @ z
                + sp.csr_matrix((kw, (kg, np.arange(K))), shape=(G, K)) @ k)

    model.add_constraint("capacity", rows(c.rep.astype(np.float64), prev_total.astype(np.float64)) <= cap)
    span = np.maximum(2, -(-c.rep // largest[zg]))
    model.add_constraint("spread_nodes", rows(np.where(c.s == 1, span, 0).astype(np.float64),
                                              np.where(c.kspread > 0, prev_nodes, 0).astype(np.float64)) <= nodes)
    kr = prev_total.astype(np.float64)
    for j in range(G):
        _arc_flow(model, f"group_{j}", gpus[group == j], z, k,
                  zsize=np.where((zg == j) & (c.s == 0), c.rep, 0), ksize=np.where((kg == j) & (c.kspread == 0),
                                                                                  prev_total, 0),
                  zspread=np.where((zg == j) & (c.s == 1), c.rep, 0).astype(np.float64),
                  zspan=np.where((zg == j) & (c.s == 1), span, 0).astype(np.float64),
                  kspread=np.where((kg == j) & (c.kspread > 0), kr, 0.0),
                  kspan=np.where((kg == j) & (c.kspread > 0), prev_nodes, 0).astype(np.float64))
    model.minimize(z.dot(c.coef) + k.dot(c.kcoef))
    return model


def _arc_flow(model: Model, name: str, sizes: np.ndarray, z: Any, k: Any, *, zsize: np.ndarray,
              ksize: np.ndarray, zspread: np.ndarray, zspan: np.ndarray, kspread: np.ndarray,
              kspan: np.ndarray) -> None:
    """Valério de Carvalho's arc-flow packing of one group of nodes (``sizes``: GPUs of each), added
    to ``model``: each node is a path from 0 to its size whose arcs are the replicas of one
    single-node job (any start), a part of a job spanning several nodes (only first: at most one
    per node) or an idle GPU. Single-node jobs (``zsize``/``ksize``: their replicas per shape and
    keeper, 0 elsewhere) then pack exactly; jobs spanning several nodes need parts with at least
    their replicas (``zspread``, ``kspread``) and their nodes (``zspan``, ``kspan``)."""
    g = int(sizes.max(initial=0))
    if g == 0:
        return
    a_item, s_item = np.nonzero(np.add.outer(np.arange(g), np.arange(1, g + 1)) <= g)
    s_item = s_item + 1
    item = model.add_variable(f"{name}_items", a_item.size, kind="integer")
    part = model.add_variable(f"{name}_parts", g, kind="integer")
    idle = model.add_variable(f"{name}_idle", g, kind="integer")
    d = np.arange(1, g + 1)
    ends = np.bincount(sizes, minlength=g + 1).astype(np.float64)
    # into vertex v minus out of it: v = 0 sends every node, v >= 1 ends the nodes of size v
    into = (sp.csr_matrix((np.ones(a_item.size), (a_item + s_item, np.arange(a_item.size))), shape=(g + 1, a_item.size))
            @ item + sp.csr_matrix((np.ones(g), (d, np.arange(g))), shape=(g + 1, g)) @ part
            + sp.csr_matrix((np.ones(g), (d, np.arange(g))), shape=(g + 1, g)) @ idle)
    out = (sp.csr_matrix((np.ones(a_item.size), (a_item, np.arange(a_item.size))), shape=(g + 1, a_item.size))
           @ item + sp.csr_matrix((np.ones(g), (np.zeros(g, dtype=np.int64), np.arange(g))), shape=(g + 1, g))
           @ part + sp.csr_matrix((np.ones(g), (d - 1, np.arange(g))), shape=(g + 1, g)) @ idle)
    ends[0] = -ends[1:].sum()
    model.add_constraint(f"{name}_flow", into - out == ends)
    E, K = zsize.size, ksize.size
    by_size = sp.csr_matrix((np.ones(a_item.size), (s_item - 1, np.arange(a_item.size))), shape=(g, a_item.size))
    zs, ks = np.flatnonzero(zsize), np.flatnonzero(ksize)
    demand_z = sp.csr_matrix((np.ones(zs.size), (zsize[zs] - 1, zs)), shape=(g, E))
    demand_k = sp.csr_matrix((np.ones(ks.size), (ksize[ks] - 1, ks)), shape=(g, K))
    model.add_constraint(f"{name}_single_node", by_size @ item - demand_z @ z - demand_k @ k >= 0.0)
    model.add_constraint(f"{name}_spread_gpus", part.dot(d.astype(np.float64)) - z.dot(zspread) - k.dot(kspread)
                         >= 0.0)
    model.add_constraint(f"{name}_spread_nodes", part.sum() - z.dot(zspan) - k.dot(kspan) >= 0.0)


def place(problem: PolluxProblem, c: _Choices, zc: np.ndarray, kc: np.ndarray) -> np.ndarray | None:
    """Replicas per job and node realizing the chosen shapes (``zc`` 0/1 per shape, ``kc`` per
    keeper), greedily: keepers where they were; then, largest first, jobs spanning several nodes
    on whole free nodes with their remainder on the fullest node that holds it, and single-node
    jobs on the fullest node that holds them (in both orders). None when both orders fail (which
    does not prove that no placement exists)."""
    for spread_first in (True, False):
        replicas = _place_greedily(problem, c, zc, kc, spread_first)
        if replicas is not None:
            return replicas
    return None


def _place_greedily(problem: PolluxProblem, c: _Choices, zc: np.ndarray, kc: np.ndarray,
                    spread_first: bool) -> np.ndarray | None:
    n, m = problem.num_jobs, problem.num_nodes
    group, _ = _groups(problem)
    replicas = np.zeros((n, m), dtype=np.int64)
    kept = c.keepers[kc > 0.5]
    replicas[kept] = problem.previous[kept]
    free = problem.node_gpus - replicas.sum(axis=0)
    spread_kept = kept[np.count_nonzero(problem.previous[kept], axis=1) > 1]
    spread_taken = (replicas[spread_kept] > 0).any(axis=0)
    chosen = np.flatnonzero(zc > 0.5)
    zg = c.t if problem.speedup.shape[1] > 1 else np.zeros(c.job.size, dtype=np.int64)
    multi = chosen[c.s[chosen] == 1]
    single = chosen[c.s[chosen] == 0]

    def place_multi() -> bool:
        for e in multi[np.argsort(-c.rep[multi], kind="stable")]:
            i, need = c.job[e], int(c.rep[e])
            take: list[tuple[int, int]] = []
            ok = (group == zg[e]) & ~spread_taken & (free > 0)
            whole = np.flatnonzero(ok & (free == problem.node_gpus))
            for node in whole:  # whole free nodes while more than one node's worth remains
                if need <= free[node] or len(take) + 1 >= problem.max_nodes[i]:
                    break
                take.append((int(node), int(free[node])))
                need -= int(free[node])
            used = np.zeros(m, dtype=bool)
            used[[node for node, _ in take]] = True
            while need:
                rest = np.flatnonzero(ok & ~used)
                if not rest.size or len(take) >= problem.max_nodes[i]:
                    return False
                # a 2nd node is needed: leave at least 1 replica for it
                cap = need - 1 if not take else need
                fits = rest[free[rest] >= cap]
                node = int(fits[np.argmin(free[fits])]) if fits.size else int(rest[np.argmax(free[rest])])
                share = min(int(free[node]), cap)
                take.append((node, share))
                used[node] = True
                need -= share
            if len(take) < 2:
                return False
            for node, share in take:
                replicas[i, node] = share
                free[node] -= share
                spread_taken[node] = True
        return True

    def place_single() -> bool:
        for e in single[np.argsort(-c.rep[single], kind="stable")]:
            ok = np.flatnonzero((group == zg[e]) & (free >= c.rep[e]))
            if not ok.size:
                return False
            node = ok[np.argmin(free[ok])]
            replicas[c.job[e], node] = c.rep[e]
            free[node] -= c.rep[e]
        return True

    steps = (place_multi, place_single) if spread_first else (place_single, place_multi)
    return replicas if all(step() for step in steps) else None


@dataclass
class _Classes:
    """Jobs with identical choices merged (:func:`job_classes`)."""

    choices: _Choices  # job: class index; keepers: class index of each keeper
    size: np.ndarray  # jobs per class
    members: list  # problem rows of each class
    offset: np.ndarray  # per class: its first entry in ``choices``
    job_start: np.ndarray  # per problem row: its first entry in the per-job choices

    def per_job(self, counts: np.ndarray, entries: int) -> np.ndarray:
        """0/1 per per-job entry from the class counts: a class's jobs take its shapes in turn."""
        x = np.zeros(entries)
        for u, rows in enumerate(self.members):
            lo = self.offset[u]
            hi = self.offset[u + 1] if u + 1 < self.offset.size else counts.size
            taken = 0
            for e in range(lo, hi):
                for _ in range(int(counts[e])):
                    x[self.job_start[rows[taken]] + e - lo] = 1.0
                    taken += 1
        return x


def job_classes(problem: PolluxProblem, c: _Choices) -> _Classes:
    """Merge jobs that have the same shapes with the same coefficients and cannot keep a previous
    allocation: a round of many copies of few jobs (Sia's scale workloads) then has one integer
    count per class and shape instead of symmetric binaries, which branch and bound cannot tell
    apart. Jobs that may keep their allocation stay classes of their own."""
    n = problem.num_jobs
    bounds = np.searchsorted(c.job, np.arange(n + 1))
    keeper = np.zeros(n, dtype=bool)
    keeper[c.keepers] = True
    unit_of: dict[bytes, int] = {}
    members: list[list[int]] = []
    for i in range(n):
        lo, hi = bounds[i], bounds[i + 1]
        if hi == lo and not keeper[i]:
            continue  # nothing to choose
        key = (b"" if keeper[i] else
               np.stack([c.t[lo:hi], c.s[lo:hi], c.rep[lo:hi]]).tobytes() + c.coef[lo:hi].tobytes())
        if keeper[i] or key not in unit_of:
            if not keeper[i]:
                unit_of[key] = len(members)
            members.append([i])
        else:
            members[unit_of[key]].append(i)
    first = np.array([rows[0] for rows in members], dtype=np.int64)
    take = np.concatenate([np.arange(bounds[i], bounds[i + 1]) for i in first]) if first.size else \
        np.zeros(0, dtype=np.int64)
    lengths = bounds[first + 1] - bounds[first]
    unit_job = np.repeat(np.arange(first.size), lengths)
    unit_index = {int(row): u for u, row in enumerate(first)}
    keepers = np.array([unit_index[int(i)] for i in c.keepers], dtype=np.int64)
    choices = _Choices(unit_job, c.t[take], c.s[take], c.rep[take], c.coef[take], keepers, c.kcoef, c.ktype,
                       c.kspread)
    offset = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if first.size else \
        np.zeros(0, dtype=np.int64)
    return _Classes(choices, np.array([len(rows) for rows in members], dtype=np.float64), members, offset,
                    bounds[:-1])


#: Candidates (optima of the aggregate relaxation, each excluding the earlier unplaceable ones) tried
#: before the whole MILP over shapes and nodes is solved instead.
MAX_CANDIDATES = 50
#: Seconds the placement MILP of one candidate may take before the whole MILP is solved instead.
PLACEMENT_TIME_LIMIT_S = 5.0


def solve_by_shapes(problem: PolluxProblem, solver: ModelSolver, p: float, scale: float, epsilon: float
                    ) -> tuple[np.ndarray, dict[str, Any], Status, str]:
    """Pollux's MILP through its relaxation over shapes (:func:`aggregate_model`): its optimum is
    placed on nodes (greedily, else by the placement MILP); when it cannot be placed, a cut excludes
    that choice (and every choice that allocates a superset of it) and the next optimum is tried.
    The first placeable optimum is the whole MILP's optimum. After :data:`MAX_CANDIDATES`, or a
    placement MILP that does not finish, the whole MILP is solved."""
    n, m = problem.num_jobs, problem.num_nodes
    c = choices(problem, p, scale, epsilon)
    if c.job.size + c.keepers.size == 0:
        return np.zeros((n, m), dtype=np.int64), {"mip_gap": 0.0, "candidates": 0}, Status.OPTIMAL, \
            "No job gains from an allocation: every job idles."
    classes = job_classes(problem, c)
    model = aggregate_model(problem, classes.choices, classes.size, c.keepers)
    z, k = model.variables["z"], model.variables["keep"]
    options = replace(solver.options, mip_gap=solver.options.mip_gap or 0.0)
    placement_options = replace(solver.options, mip_gap=None, time_limit_s=PLACEMENT_TIME_LIMIT_S)
    placement_milps = 0
    for candidate in range(1, MAX_CANDIDATES + 1):
        solution = solver.check(solver.record(solve_model(model.compile(), solver.backend, options, ZERO_GAP)),
                                "pollux (the relaxation over shapes)")
        zu, kc = np.rint(solution.values["z"]), np.rint(solution.values["keep"])
        zc = classes.per_job(zu, c.job.size)
        replicas = place(problem, c, zc, kc)
        if replicas is None:
            placement_milps += 1
            placing, pj, pn = node_model(problem, c, fixed=(zc, kc))
            placed = solver.record(solve_model(placing.compile(), solver.backend, placement_options, None))
            if placed.status is Status.OPTIMAL:
                replicas = _replicas(problem, pj, pn, placed.values["y"])
            elif placed.status not in (Status.INFEASIBLE, Status.INFEASIBLE_OR_UNBOUNDED):
                break  # undecided in time: solve the whole MILP
        if replicas is not None:
            gap = 0.0 if solution.mip_gap is None else float(solution.mip_gap)
            return replicas, {"mip_gap": gap, "candidates": candidate, "placement_milps": placement_milps,
                              "milp_binaries": int(c.job.size + c.keepers.size), "job_classes": int(classes.size.size)
                              }, solution.status, solution.message
        # no choice that gives at least these counts of jobs these shapes can be placed
        chosen_z, chosen_k = np.flatnonzero(zu > 0.5), np.flatnonzero(kc > 0.5)
        counts = zu[chosen_z]
        reached = model.add_variable(f"reached_{candidate}", chosen_z.size, kind="binary")
        bound = classes.size[classes.choices.job[chosen_z]]
        # reached = 1 where z >= its count in this choice (z <= count - 1 + bound * reached)
        model.add_constraint(f"reached_{candidate}", z[chosen_z] - reached * bound <= counts - 1.0)
        cut = reached.sum() + k[chosen_k].sum() if chosen_k.size else reached.sum()
        model.add_constraint(f"unplaceable_{candidate}", cut <= float(chosen_z.size + chosen_k.size - 1))
    logger.info("pollux: %d optima of the relaxation over shapes could not be placed; solving the whole MILP",
                candidate)
    replicas, extras, status, message = solve_exact(problem, solver, p, scale, epsilon)
    return replicas, {**extras, "candidates": candidate, "placement_milps": placement_milps}, status, message
