"""A stand-in for Sia's port of Pollux's policy (``PolluxPolicyUnaware``), computed by allocopt.

Sia's heterogeneity-unaware simulator (siasosp23/artifacts,
``sia-simulator/multi_simulator_unaware.py``) builds ``PolluxPolicyUnaware(p)``
and every round calls ``optimize(jobs, nodes, base_allocations, node_template)``
with its ``JobInfo`` objects (``speedup_fn``, ``max_replicas``, ``age``,
``num_restarts``, ``attained_service``, ``creation_timestamp``), its ``NodeInfo``
objects (4-GPU virtual nodes) and the previous answer; the answer is
``({job: [node key per replica]}, desired_nodes)``. :class:`PolluxSimulatorPolicy`
has that constructor and method; a module that binds it as
``pollux_unaware.PolluxPolicyUnaware`` makes Sia's simulator treat it as its own
(``benchmarks/conformance_pollux.py``).

Each round, as Pollux's ``Problem`` does: the fair share is ``ceil(GPUs / jobs)``
replicas on ``ceil(nodes / GPUs)`` nodes; a job's speedup is its ``speedup_fn``
with the goodput at the fair share as base (``r / fair`` for jobs without a
goodput model); the restart factor ``max(age - 30 restarts, 0) / (age + 30)``;
at most 16 nodes per job; jobs in Pollux's order (by attained service, then
creation). The policy is :func:`allocopt.solve`'s ``pollux``: exact by default,
``technique="genetic"`` for Pollux's own NSGA-II search (seeded, carrying its
final population to the next round as Pollux does).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from allocopt.api import solve
from allocopt.cluster import Cluster
from allocopt.errors import InvalidProblemError
from allocopt.pollux_problem import PolluxAllocation, PolluxProblem, pollux_restart_factor
from allocopt.solution import Status


def pollux_problem_from_sia(jobs: Mapping[Hashable, Any], nodes: Mapping[Hashable, Any],
                            base_allocations: Mapping[Hashable, Any], *, restart_delay_s: float = 30.0,
                            max_nodes: int = 16) -> tuple[PolluxProblem, list, list]:
    """The :class:`PolluxProblem` of one call of Sia's ``PolluxPolicyUnaware.optimize``, with the
    job keys and node keys in Pollux's order (jobs by attained service, then creation; nodes
    non-preemptible first, then by key). Each job's ``speedup_fn`` gets the fair share's goodput
    as its base, as Pollux's ``Problem`` sets it."""
    order = sorted(jobs, key=lambda key: (not (not jobs[key].preemptible and base_allocations.get(key)),
                                          jobs[key].attained_service, jobs[key].creation_timestamp))
    node_keys = sorted(nodes, key=lambda key: (nodes[key].preemptible, key))
    gpus = np.array([int(nodes[key].resources.get("nvidia.com/gpu", 0)) for key in node_keys])
    total = int(gpus.sum())
    n = len(order)
    fair_replicas = math.ceil(total / max(n, 1))
    fair_nodes = math.ceil(len(node_keys) / total)
    R = max([int(jobs[key].max_replicas) for key in order] + [1])
    S = np.zeros((n, 1, 2, R + 1))
    largest = int(gpus.max(initial=1))
    for i, key in enumerate(order):
        fn = jobs[key].speedup_fn
        top = int(jobs[key].max_replicas)
        r = np.arange(1, top + 1)
        if not hasattr(fn, "_goodput_fn"):
            S[i, 0, 0, 1:top + 1] = np.where(r <= largest, r / fair_replicas, 0.0)
            S[i, 0, 1, 2:top + 1] = r[1:] / fair_replicas
            continue
        fn._base_goodput = fn._goodput_fn.optimize(
            num_nodes=fair_nodes, num_replicas=fair_replicas, max_batch_size=fn._max_batch_size,
            atomic_bsz_range=fn._atomic_bsz_range, accumulation=fn._accumulation)[0]
        one = r[r <= largest]
        S[i, 0, 0, one] = np.asarray(fn(np.ones_like(one), one), dtype=np.float64)
        several = r[r >= 2]
        if several.size:
            S[i, 0, 1, several] = np.asarray(fn(np.full_like(several, 2), several), dtype=np.float64)
    index = {key: k for k, key in enumerate(node_keys)}
    previous = np.zeros((n, len(node_keys)), dtype=np.int64)
    for i, key in enumerate(order):
        for node in base_allocations.get(key, ()) or ():
            if node in index:
                previous[i, index[node]] += 1
    age = np.array([float(getattr(jobs[key], "age", 0.0)) for key in order])
    restarts = np.array([int(getattr(jobs[key], "num_restarts", 0) or 0) for key in order])
    if not np.all(gpus == gpus.max(initial=1)):
        raise InvalidProblemError("pollux_problem_from_sia: Sia's unaware simulator gives nodes of one size; got "
                                  f"{sorted(set(gpus.tolist()))} GPUs", field="nodes")
    cluster = Cluster({"gpu": total}, gpus_per_node=int(gpus.max(initial=1)))
    problem = PolluxProblem(S, cluster, job_ids=order, previous=previous,
                            restart_factor=pollux_restart_factor(age, restarts, restart_delay_s),
                            max_nodes=max_nodes)
    return problem, order, node_keys


class PolluxSimulatorPolicy:
    """Sia's ``PolluxPolicyUnaware`` (constructor ``(p_fairness=-1)``, ``optimize``), by allocopt.

    Parameters
    ----------
    p_fairness : float, default -1
        Pollux's power-mean exponent.
    technique : {"auto", "milp", "genetic"}, default "auto"
        ``auto``/``milp``: the exact MILP; ``genetic``: Pollux's NSGA-II search.
    seed : int, default 0
        The genetic search's seed in the first round (round ``k`` uses ``seed + k``).
    backend : str, default "highs"
    **options
        Further options of the ``pollux`` policy (``population``, ``generations``, ...).

    Attributes
    ----------
    last : PolluxAllocation or None
        The last round's allocation (its ``objective`` is Pollux's fitness).
    """

    def __init__(self, p_fairness: float = -1, *, technique: str = "auto", seed: int = 0, backend: str = "highs",
                 **options: Any):
        self.p_fairness = p_fairness
        self.technique = technique
        self.seed = int(seed)
        self.backend = backend
        self.options = options
        self.rounds = 0
        self.last: PolluxAllocation | None = None
        self._population: tuple[list, list, np.ndarray] | None = None

    def optimize(self, jobs: Mapping[Hashable, Any], nodes: Mapping[Hashable, Any],
                 base_allocations: Mapping[Hashable, Any], node_template: Any = None) -> tuple[dict, int]:
        """One round: ``({job: [node key per replica]}, number of nodes)``, as Sia's ``optimize``."""
        problem, order, node_keys = pollux_problem_from_sia(jobs, nodes, base_allocations)
        options = dict(self.options)
        if self.technique == "genetic":
            options["seed"] = self.seed + self.rounds
            options["seed_population"] = self._carried(order, node_keys)
        alloc = solve(problem, "pollux", backend=self.backend, technique=self.technique, p=float(self.p_fairness),
                      best_effort=True, **options)
        if alloc.status not in (Status.OPTIMAL, Status.APPROXIMATE):
            raise RuntimeError(f"pollux stand-in: the round ended {alloc.status.value}: {alloc.message}")
        if "population" in alloc.extras:
            self._population = (order, node_keys, alloc.extras["population"])
        self.rounds += 1
        self.last = alloc
        answer = {key: [node_keys[n] for n in np.repeat(np.arange(len(node_keys)), alloc.replicas[i])]
                  for i, key in enumerate(order)}
        return answer, len(node_keys)

    def _carried(self, order: list, node_keys: list) -> np.ndarray | None:
        """The last round's final population on this round's jobs and nodes (new jobs idle)."""
        if self._population is None:
            return None
        jobs, nodes, states = self._population
        job_at = {key: i for i, key in enumerate(jobs)}
        node_at = {key: k for k, key in enumerate(nodes)}
        out = np.zeros((states.shape[0], len(order), len(node_keys)), dtype=np.int64)
        src = [job_at[key] for key in order if key in job_at]
        dst = [i for i, key in enumerate(order) if key in job_at]
        cols = [(k, node_at[key]) for k, key in enumerate(node_keys) if key in node_at]
        for k, c in cols:
            out[:, dst, k] = states[:, src, c]
        return out


__all__ = ["PolluxSimulatorPolicy", "pollux_problem_from_sia"]
