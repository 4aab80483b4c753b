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
``extras["mip_gap"]`` is the proven gap. By default the same optimum comes from an
equivalent MILP without per-node variables (:mod:`allocopt.formulations.pollux_groups`).

**Genetic** (``technique="genetic"``, :mod:`allocopt.formulations.pollux_genetic`):
Pollux's own NSGA-II search over allocation matrices, seeded.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from allocopt.allocation import Timings
from allocopt.backends import solve_model
from allocopt.errors import InvalidOptionError, SolverError
from allocopt.formulations.base import ModelSolver, Policy, PolicyResult
from allocopt.formulations.pollux_shapes import ZERO_GAP, _by_job, _Choices, choices
from allocopt.model import Model
from allocopt.pollux_problem import PolluxAllocation, PolluxProblem
from allocopt.solution import Status

logger = logging.getLogger(__name__)

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
        Solve the MILP over groups of identical nodes with continuous flows first, then fix its
        decisions and find integer flows (:func:`allocopt.formulations.pollux_groups.solve_by_groups`,
        exact, no variable per job and node); False solves the MILP over shapes and nodes below.
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
        if relaxation_first:
            from allocopt.formulations.pollux_groups import solve_by_groups as exact
        else:
            exact = solve_exact
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
