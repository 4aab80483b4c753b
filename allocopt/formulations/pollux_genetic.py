"""Pollux's own search: NSGA-II over allocation matrices (``technique="genetic"``).

The search of Pollux's simulator (petuum/adaptdl ``osdi21-artifact`` branch,
``simulator/pollux.py``; Sia's port ``sia-simulator/pollux_unaware.py``), on
:mod:`pymoo` (``pip install allocopt[pollux]``). An individual is the matrix of
replicas per job and node; the objectives are Pollux's fitness and its cluster
utility (both maximized), and the answer is the individual of best fitness in
the final non-dominated front. Its operators follow Pollux's rules:

crossover
    single-point over jobs between two parents (rows before the point from one, the rest from the other);
mutation
    per job with probability 0.1 back to its previous allocation; per job with
    probability 0.1 each entry zeroed with probability 0.1; then each entry
    raised to a random count between its value and the node's GPUs, with the
    probability that a node with a free GPU (or one the job is on) is picked, one
    such node per job on average;
repair
    on each node only the first job (in job order) that spans several nodes
    keeps its replicas there (interference avoidance); each job's replicas and
    nodes cut to its most (nodes in random order); each node's replicas cut to
    its GPUs, earlier jobs first; in a heterogeneity-aware problem a job keeps
    only the replicas on the type where it has most.

The first population is the previous allocation (and ``seed_population``, e.g.
the last round's final population, as Pollux carries it over). The operators
draw from their own generator and pymoo from its own, both seeded by ``seed``.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np

from allocopt.errors import BackendNotInstalledError, InvalidOptionError
from allocopt.pollux_problem import PolluxProblem


def _pymoo() -> Any:
    try:
        import pymoo  # noqa: F401
    except ImportError:
        raise BackendNotInstalledError("technique='genetic' needs pymoo: pip install 'allocopt[pollux]'") from None
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.core.crossover import Crossover
    from pymoo.core.mutation import Mutation
    from pymoo.core.problem import Problem
    from pymoo.core.repair import Repair
    from pymoo.optimize import minimize
    from pymoo.util.nds.non_dominated_sorting import NonDominatedSorting
    return NSGA2, Crossover, Mutation, Problem, Repair, minimize, NonDominatedSorting


def batch_fitness(problem: PolluxProblem, states: np.ndarray, p: float, scale: float, epsilon: float
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Pollux's fitness and cluster utility of each state (``(k, n_jobs, n_nodes)``)."""
    k, n, m = states.shape
    S = problem.speedup
    total = states.sum(axis=2)
    spread = (np.count_nonzero(states, axis=2) > 1).astype(np.int64)
    if S.shape[1] == 1:
        t = np.zeros((k, n), dtype=np.int64)
        one_type = np.ones((k, n), dtype=bool)
    else:
        on = states > 0
        per_type = np.stack([on[:, :, problem.node_type == j].any(axis=2) for j in range(S.shape[1])], axis=2)
        one_type = per_type.sum(axis=2) <= 1
        t = per_type.argmax(axis=2)
    jobs = np.broadcast_to(np.arange(n), (k, n))
    inside = total < S.shape[3]
    speedup = np.where(inside & one_type, S[jobs, t, spread, np.minimum(total, S.shape[3] - 1)], 0.0)
    changed = np.any(states != problem.previous[None], axis=2)
    scaled = scale * speedup * np.where(changed, problem.restart_factor[None], 1.0)
    if n == 0:
        value = np.zeros(k)
    elif p == 0:
        value = np.exp(np.mean(np.log(np.maximum(scaled, epsilon)), axis=1))
    else:
        value = np.mean((scaled + epsilon) ** p, axis=1) ** (1.0 / p)
    # cluster utility: speedup per replica, weighted by each job's share of the GPUs in use
    used = (states.sum(axis=1) > 0) * problem.node_gpus[None]
    in_use = used.sum(axis=1, keepdims=True).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(total > 0, total / np.maximum(in_use, 1), 0.0)
        efficiency = np.where(total > 0, speedup / np.maximum(total, 1), 0.0)
    return value, (efficiency * share).sum(axis=1)


def genetic_search(problem: PolluxProblem, *, p: float, scale: float, epsilon: float, population: int = 100,
                   generations: int = 100, seed: int = 0, seed_population: Any = None
                   ) -> tuple[np.ndarray, dict[str, Any]]:
    """Pollux's NSGA-II search (module docstring). Returns the replicas of the best individual and
    extras: ``population`` (the final non-dominated front, which Pollux carries to the next round:
    pass it as ``seed_population``),
    ``generations`` and ``search_s``."""
    for name, value in (("population", population), ("generations", generations), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (0 if name == "seed" else 1):
            raise InvalidOptionError(f"pollux: {name} must be a whole number >= {0 if name == 'seed' else 1}, "
                                     f"got {value!r}")
    NSGA2, Crossover, Mutation, Problem, Repair, minimize, NonDominatedSorting = _pymoo()
    n, m = problem.num_jobs, problem.num_nodes
    base = problem.previous.astype(np.int64)
    states = base[None]
    if seed_population is not None:
        extra = np.asarray(seed_population)
        if extra.ndim != 3 or extra.shape[1:] != (n, m) or extra.dtype.kind not in "iuf" or np.any(extra < 0):
            raise InvalidOptionError(f"pollux: seed_population must be replicas of shape (k, n_jobs, n_nodes) = "
                                     f"(k, {n}, {m}), whole numbers >= 0; got shape {extra.shape}")
        states = np.concatenate([states, np.rint(extra).astype(np.int64)])[:population]
    max_total = problem.speedup.shape[3] - 1
    node_gpus = problem.node_gpus
    # this search's own draws, from ``seed``: pymoo >= 0.6.2 no longer seeds numpy's global generator
    rng_draws = np.random.default_rng(seed)

    def repair(X: np.ndarray) -> np.ndarray:
        s = X.reshape(-1, n, m).astype(np.int64)
        s = np.maximum(s, 0)
        spread = np.count_nonzero(s, axis=2) > 1
        on = (s * spread[:, :, None]) > 0
        s[np.cumsum(on, axis=1) > 1] = 0  # a node keeps the first job spanning several nodes
        if problem.speedup.shape[1] > 1:
            per_type = np.stack([s[:, :, problem.node_type == j].sum(axis=2) for j in range(problem.speedup.shape[1])],
                                axis=2)
            best = per_type.argmax(axis=2)
            s[problem.node_type[None, None, :] != best[:, :, None]] = 0
        shuffle = np.argsort(rng_draws.random(s.shape), axis=2)
        s = np.take_along_axis(s, shuffle, axis=2)
        s = np.diff(np.minimum(np.cumsum(s, axis=2), max_total), axis=2, prepend=0)
        nodes_seen = np.cumsum(s > 0, axis=2)
        s[nodes_seen > problem.max_nodes[None, :, None]] = 0
        s = np.take_along_axis(s, np.argsort(shuffle, axis=2), axis=2)
        s = np.diff(np.minimum(np.cumsum(s, axis=1), node_gpus[None, None, :]), axis=1, prepend=0)
        return s.reshape(len(X), -1)

    class _Problem(Problem):
        def __init__(self) -> None:
            super().__init__(n_var=n * m, n_obj=2, xl=0, xu=np.tile(node_gpus, n), vtype=int)

        def _evaluate(self, X: np.ndarray, out: dict, *args: Any, **kwargs: Any) -> None:
            value, utility = batch_fitness(problem, X.reshape(-1, n, m).astype(np.int64), p, scale, epsilon)
            out["F"] = np.column_stack([-value, -utility])

    class _Crossover(Crossover):
        def __init__(self) -> None:
            super().__init__(n_parents=2, n_offsprings=2)

        def _do(self, _: Any, X: np.ndarray, **kwargs: Any) -> np.ndarray:
            parents, matings, _v = X.shape
            s = X.reshape(parents, matings, n, m)
            point = rng_draws.integers(max(n, 1), size=(matings, 1))
            first = np.arange(n)[None, :] < point  # (matings, jobs): rows taken from the own parent
            out = np.where(first[None, :, :, None], s, s[::-1])
            return out.reshape(parents, matings, -1)

    class _Mutation(Mutation):
        def _do(self, _: Any, X: np.ndarray, **kwargs: Any) -> np.ndarray:
            s = X.reshape(-1, n, m).astype(np.int64)
            back = rng_draws.random(s.shape[:2]) < 0.1
            s = np.where(back[:, :, None], base[None], s)
            zero_prob = np.where(rng_draws.random(s.shape[:2]) < 0.1, 0.1, 0.0)
            s[rng_draws.random(s.shape) < zero_prob[:, :, None]] = 0
            free = node_gpus[None] - s.sum(axis=1)  # (k, nodes)
            room = np.broadcast_to((free > 0)[:, None, :], s.shape)
            prob1 = room / np.maximum(room.sum(axis=2, keepdims=True), 1.0)
            own = room & (s > 0)
            prob2 = own / np.maximum(own.sum(axis=2, keepdims=True), 1.0)
            raise_it = rng_draws.random(s.shape) < prob1 + prob2 - prob1 * prob2
            drawn = rng_draws.integers(s, node_gpus[None, None, :] + 1)
            s[raise_it] = drawn[raise_it]
            return s.reshape(len(X), -1)

    class _Repair(Repair):
        def _do(self, _: Any, X: np.ndarray, **kwargs: Any) -> np.ndarray:
            return repair(X)

    started = time.perf_counter()
    algorithm = NSGA2(pop_size=population, sampling=states.reshape(len(states), -1), crossover=_Crossover(),
                      mutation=_Mutation(), repair=_Repair(), eliminate_duplicates=True)
    with warnings.catch_warnings():  # pymoo 0.6.1 calls numpy's deprecated row_stack
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"pymoo\.")
        result = minimize(_Problem(), algorithm, ("n_gen", generations), seed=seed, verbose=False)
    X = np.atleast_2d(result.pop.get("X")).astype(np.int64)
    F = np.atleast_2d(result.pop.get("F"))
    front = NonDominatedSorting().do(F, only_non_dominated_front=True)
    best = front[np.argmin(F[front, 0])]
    return X[best].reshape(n, m), {"population": X[front].reshape(-1, n, m), "generations": generations,
                                   "search_s": time.perf_counter() - started, "mip_gap": None}
