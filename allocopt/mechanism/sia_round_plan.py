"""Sia-style rounds: solve the ``sia`` policy, place its configurations on GPUs, charge restarts.

Follows the simulator of Sia (SOSP 2023, siasosp23/artifacts, ``sia.py`` and
``job.py``): each round the ``sia`` MILP picks one configuration per job from
goodputs scaled by Pollux's restart factor (age, restarts, restart delay), jobs
mid checkpoint-restore are pinned to their configuration, the configurations are
placed on nodes (Sia's placement with evictions, :func:`place_configurations`)
and every job whose GPUs changed -- including its first start -- pays its
checkpoint-restore delay before it trains again.

How a simulator drives it, once per round of ``round_seconds`` (Sia: 60 s)::

    jobs = []                                    # SiaJobState of every arrived, unfinished job
    gpu_ids = {}                                 # job id -> GPU ids it held last round
    for k in itertools.count():
        jobs += [SiaJobState(...) for each arrival]             # restart_delay_s=restart_delay_s(app)
        goodput = goodput_matrix([models of job], configurations)  # (n_jobs, n_configs), same order as jobs
        plan = plan_round(jobs, cluster, configurations, goodput, gpu_ids,
                          round_index=k, start_s=now, round_seconds=60.0)
        commit_plan(jobs, plan)                  # previous configuration, restarts, restore time
        train_s = advance(jobs, 60.0)            # age; seconds each job trains after its restore delay
        # run the plan: job i progresses by its true goodput on plan.leases' GPUs x train_s[i];
        # drop finished jobs from `jobs`
        gpu_ids = plan.gpu_ids

Inputs the simulator supplies each round: the job states (in a fixed order),
their goodput matrix in that order, and last round's GPU ids per job. Outputs:
a :class:`SiaRoundPlan` (a :class:`~allocopt.runtime.executor.RoundPlan`, so
any executor runs it) whose leases are extended exactly when a job keeps its
GPUs, plus per job its configuration index, the checkpoint-restore delay
charged this round (``restore_delay_s``) and the jobs evicted by placement.
GPU ids are cluster-wide, numbered type by type in cluster order, node by node
(as :class:`allocopt.mechanism.placement.GpuLayout`).

:class:`~allocopt.mechanism.sia_rounds.SiaPlanner` is this loop as the simulator's ``RoundPlanner``
(:mod:`allocopt.mechanism.sia_rounds`, Sia's simulation model), and the same functions plan the rounds
of a real cluster.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from allocopt.allocation import Timings
from allocopt.api import solve
from allocopt.cluster import Cluster
from allocopt.configurations import Configurations
from allocopt.errors import InvalidOptionError, SolverError
from allocopt.formulations.sia_programs import sia_goodput, solve_sia_round
from allocopt.goodput_problem import ConfigurationAllocation, GoodputProblem, restart_factor
from allocopt.runtime.executor import Lease, RoundPlan
from allocopt.solution import Status


#: Checkpoint-restore delay per application in seconds, measured on Sia's physical cluster
#: (``get_restart_penalty`` of the published ``sia.py``).
RESTART_DELAY_S: Mapping[str, float] = {"deepspeech2": 25.0, "imagenet": 250.0, "cifar10": 30.0, "bert": 120.0,
                                        "yolov3": 45.0}
DEFAULT_RESTART_DELAY_S = 30.0
#: Smallest restart factor passed to the MILP (a factor of 0 would make every move worthless).
MIN_RESTART_FACTOR = 1e-3


def restart_delay_s(application: str) -> float:
    """Sia's checkpoint-restore delay of ``application`` in seconds (30 s when unknown)."""
    return RESTART_DELAY_S.get(application, DEFAULT_RESTART_DELAY_S)


@dataclass(slots=True)
class SiaJobState:
    """What a Sia round needs to know about one job; the simulator updates it between rounds.

    Attributes
    ----------
    job_id : hashable
    application : str
    arrival_s : float
        Submission time, seconds.
    restart_delay_s : float
        Checkpoint-restore delay of one (re)start, seconds (> 0).
    age_s : float
        Seconds since submission.
    started : bool
        Has held GPUs at least once.
    num_restarts : int
        (Re)starts after the first start.
    previous : int
        Configuration index held last round, -1 for none.
    restore_remaining_s : float
        Seconds of checkpoint-restore still to do; while > 0 the job is pinned.
    progress, total : float
        Training progress so far and at completion (samples or epochs, the simulator's unit).
    rigid_gpus : int or None
        GPUs a rigid job needs, None for an adaptive one.
    batch_size : int or None
        Requested global batch size (samples), None to let the goodput model tune it.
    grad_sqr, grad_var : float or None
        Latest gradient statistics (for the job's statistical efficiency).
    restore_s : float or None
        Seconds a (re)start actually costs, where it differs from the ``restart_delay_s``
        the policy prices (Sia's simulator: :data:`~allocopt.mechanism.sia_rounds.SIA_SIMULATOR_RESTORE_S`); None: ``restart_delay_s``.
    """

    job_id: Hashable
    application: str
    arrival_s: float
    restart_delay_s: float = DEFAULT_RESTART_DELAY_S
    age_s: float = 0.0
    started: bool = False
    num_restarts: int = 0
    previous: int = -1
    restore_remaining_s: float = 0.0
    progress: float = 0.0
    total: float = float("inf")
    rigid_gpus: int | None = None
    batch_size: int | None = None
    grad_sqr: float | None = None
    grad_var: float | None = None
    restore_s: float | None = None


@dataclass(frozen=True)
class SiaPlacement:
    """GPU ids of the placed jobs, and the allocated jobs that placement could not fit.

    Attributes
    ----------
    gpu_ids : dict of job id to tuple of int
        Sorted cluster-wide GPU ids of every job placed.
    evicted : tuple
        Jobs the allocation gave a configuration but that lost it to fragmentation this round.
    """

    gpu_ids: dict[Hashable, tuple[int, ...]]
    evicted: tuple[Hashable, ...] = ()


@dataclass(frozen=True)
class SiaRoundPlan(RoundPlan):
    """A :class:`RoundPlan` with what a Sia round decided per job.

    Attributes
    ----------
    allocation : ConfigurationAllocation or None
        The ``sia`` policy's answer (None when there were no jobs).
    configuration : dict of job id to int
        Configuration index of each job of the round, -1 for none (evicted jobs included as -1).
    restore_delay_s : dict of job id to float
        Checkpoint-restore seconds charged this round to each job whose GPUs changed
        (started, moved or resized); it trains only after them.
    evicted : tuple
        Jobs allocated by the policy but not placed (fragmentation).
    samples_per_s, train_s : dict of job id to float
        Set by :class:`SiaPlanner` for a simulation: each leased job's true progress rate and the
        seconds it trains this round after its checkpoint-restore (what :class:`SiaExecutor` runs).
    """

    allocation: ConfigurationAllocation | None = None
    configuration: dict[Hashable, int] = field(default_factory=dict)
    restore_delay_s: dict[Hashable, float] = field(default_factory=dict)
    evicted: tuple[Hashable, ...] = ()
    samples_per_s: dict[Hashable, float] = field(default_factory=dict)
    train_s: dict[Hashable, float] = field(default_factory=dict)

    @property
    def gpu_ids(self) -> dict[Hashable, tuple[int, ...]]:
        """GPU ids of each job with a lease (the ``previous_gpu_ids`` of the next round)."""
        return {lease.job_id: lease.gpu_ids for lease in self.leases}


def sia_round(jobs: Sequence[SiaJobState], cluster: Cluster, configurations: Configurations, goodput: np.ndarray,
              *, p: float = -0.5, lambda_n: float = 1.1, lambda_a: float = 0.0, backend: str = "highs",
              sia_program: str | None = None, sia_threads: int = 8, policy: str = "sia",
              **solve_options) -> ConfigurationAllocation:
    """Solve the ``sia`` policy for one round.

    Goodput outside a job's previous configuration is scaled by its restart
    factor (:func:`allocopt.goodput_problem.restart_factor` of ``age_s``,
    ``num_restarts``, ``restart_delay_s``, clipped to ``[1e-3, 1]``); a job
    mid checkpoint-restore (``restore_remaining_s > 0``) is pinned to its
    previous configuration with factor 1, as in Sia.

    Parameters
    ----------
    jobs : sequence of SiaJobState
    cluster : Cluster
    configurations : Configurations
    goodput : array-like of shape (n_jobs, n_configurations)
        Goodput of each job in each configuration (e.g. from
        :func:`allocopt.throughput.goodput.goodput_matrix`), rows in ``jobs`` order.
    p, lambda_n, lambda_a : float
        Options of the ``sia`` policy.
    backend : str, default "highs"
    sia_program : str, optional
        A cvxpy solver name (Sia's: "CBC", which needs cylp): solve Sia's own cvxpy program
        (:func:`allocopt.formulations.sia_programs.solve_sia_round`: Sia's float32 normalized goodputs with
        1e-4 where a job cannot run, its unclipped re-allocation factors, ``utility_decimals`` (2) and
        ``utility_clip`` (3000)) with it instead of the ``sia`` policy, so the solver breaks ties as in
        Sia's runs; ``lambda_a``, ``backend`` and ``prefer_later`` are then unused, ``mip_gap``
        (default 1e-4, Sia's) is the solver's relative gap. No rigid jobs.
    sia_threads : int, default 8
        CBC's ``numberThreads`` with ``sia_program`` (Sia's ``sia_solver_num_threads``).
    policy : str, default "sia"
        Another policy over :class:`~allocopt.goodput_problem.GoodputProblem` to solve the same problem
        (restart factors and pinned jobs as above) with; ``p``, ``lambda_n`` and ``lambda_a`` are Sia's
        and not passed to it (give its options in ``solve_options``).
    **solve_options
        Passed to :func:`allocopt.solve` (``time_limit_s``, ``mip_gap``, ...).

    Returns
    -------
    ConfigurationAllocation
    """
    G = np.asarray(goodput, dtype=np.float64).reshape(len(jobs), len(configurations))
    age = np.array([j.age_s for j in jobs], dtype=np.float64)
    restarts = np.array([j.num_restarts for j in jobs], dtype=np.float64)
    delay = np.array([j.restart_delay_s for j in jobs], dtype=np.float64)
    previous = np.array([j.previous for j in jobs], dtype=np.int64)
    restoring = np.array([j.restore_remaining_s > 0 for j in jobs], dtype=bool)
    rigid = np.array([j.rigid_gpus or 0 for j in jobs], dtype=np.int64)
    has_previous = previous >= 0
    prev_goodput = np.where(has_previous, G[np.arange(len(jobs)), np.maximum(previous, 0)], 0.0) \
        if len(jobs) else np.zeros(0)
    pinned = restoring & has_previous & (prev_goodput > 0)
    if rigid.size:
        pinned &= (rigid == 0) | (configurations.num_gpus[np.maximum(previous, 0)] == rigid)
    raw_factor = restart_factor(age, restarts, delay) if len(jobs) else np.ones(0)
    factor = np.clip(raw_factor, MIN_RESTART_FACTOR, 1.0)
    factor[pinned] = 1.0
    problem = GoodputProblem(G, configurations, cluster, job_ids=[j.job_id for j in jobs], previous=previous,
                             restart_factor=factor, pinned=pinned, rigid_gpus=rigid)
    if sia_program is not None:
        return _solve_sia_program(problem, raw_factor, p, lambda_n, sia_program, sia_threads, **solve_options)
    if policy != "sia":
        return solve(problem, policy, backend=backend, **solve_options)
    return solve(problem, "sia", backend=backend, p=p, lambda_n=lambda_n, lambda_a=lambda_a, **solve_options)


def _solve_sia_program(problem: GoodputProblem, realloc_factor: np.ndarray, p: float, lambda_n: float, solver: str,
                       threads: int, *, utility_decimals: int | None = 2, utility_clip: float | None = 3000.0,
                       mip_gap: float = 1e-4, **others: Any) -> ConfigurationAllocation:
    """:func:`sia_round` with ``sia_program``: Sia's own program, as a :class:`ConfigurationAllocation`
    (``prefer_later`` and ``relaxation_first``, options of allocopt's own MILP, do not apply)."""
    unknown = sorted(set(others) - {"prefer_later", "relaxation_first"})
    if unknown:
        raise InvalidOptionError(f"sia_program solves Sia's own program, which takes no {', '.join(unknown)}; "
                                 "leave them out or leave sia_program out")
    if utility_decimals is None or utility_clip is None:
        raise InvalidOptionError("sia_program writes Sia's program, which rounds and clips its utilities: "
                                 "give utility_decimals and utility_clip (Sia: 2 and 3000)")
    rigid = np.flatnonzero(problem.rigid_gpus > 0)
    if rigid.size:
        raise InvalidOptionError(f"job {problem.job_ids[rigid[0]]!r} is rigid; sia_program solves Sia's program, "
                                 "which has no rigid jobs: leave sia_program out")
    configs = problem.configurations
    result = solve_sia_round(sia_goodput(problem.goodput), configs.gpu_type, configs.num_gpus,
                             problem.cluster.capacity, problem.previous, problem.pinned, realloc_factor, p, lambda_n,
                             decimals=utility_decimals, clip=utility_clip, solver=solver, mip_gap=float(mip_gap),
                             threads=threads)
    if result.status != "optimal":
        raise SolverError(f"Sia's program did not solve: {result.solver} through cvxpy says {result.status!r}")
    timings = Timings(model_build_s=result.build_s, solve_s=result.solve_s, total_s=result.build_s + result.solve_s,
                      num_solves=1)
    return ConfigurationAllocation(problem, result.configuration, "sia", f"cvxpy-{result.solver}", Status.OPTIMAL,
                                   result.objective, f"Sia's program, {result.solver} through cvxpy: optimal within "
                                   f"a relative MIP gap of {mip_gap:g}.", timings,
                                   {"program": "sia", "solver": result.solver, "mip_gap": float(mip_gap)})


def place_configurations(cluster: Cluster, allocation: ConfigurationAllocation,
                         previous_gpu_ids: Mapping[Hashable, Sequence[int]]) -> SiaPlacement:
    """Place each job's configuration on GPU ids, with Sia's placement rules.

    Per GPU type: (1) a job with the same GPU type and count as last round keeps
    its previous GPUs (when they are of the type, distinct, free, on one node
    for a partial-node job and whole nodes for a whole-node one); (2) other
    whole-node jobs (``num_gpus >= gpus_per_node``), largest first, take whole
    free nodes, from the last node backwards; (3) other partial-node jobs,
    largest first, go to the fullest node that fits them (best fit), never
    spanning nodes. When nothing fits, kept partial-node jobs are evicted --
    for a whole-node job from the node with the most free GPUs, for a
    partial-node one from the node closest to fitting, smallest jobs first --
    and placed again; a job that still fits nowhere loses its allocation
    this round (``evicted``). Jobs pinned by the problem are never evicted.

    Parameters
    ----------
    cluster : Cluster
    allocation : ConfigurationAllocation
    previous_gpu_ids : mapping of job id to sequence of int
        GPU ids each job held last round (jobs absent or with none: not kept).

    Returns
    -------
    SiaPlacement
    """
    configs = allocation.problem.configurations
    ids = allocation.job_ids
    conf = np.asarray(allocation.configuration)
    pinned = np.asarray(allocation.problem.pinned)
    type_start = np.concatenate([[0], np.cumsum(cluster.capacity)])
    gpu_ids: dict[Hashable, tuple[int, ...]] = {}
    evicted: list[Hashable] = []
    for j in range(cluster.num_gpu_types):
        members = np.flatnonzero((conf >= 0) & (configs.gpu_type[np.maximum(conf, 0)] == j))
        if not members.size:
            continue
        placer = _TypePlacer(int(cluster.capacity[j]), int(cluster.gpus_per_node[j]))
        sizes = configs.num_gpus[conf[members]]
        previous = [np.asarray(previous_gpu_ids.get(ids[i], ()), dtype=np.int64) - type_start[j] for i in members]
        local, dropped = placer.place(sizes, previous, pinned[members])
        for k, i in enumerate(members):
            if local[k] is None:
                continue
            gpu_ids[ids[i]] = tuple((np.sort(local[k]) + type_start[j]).tolist())
        evicted += [ids[members[k]] for k in dropped]
    order = {job: n for n, job in enumerate(ids)}
    return SiaPlacement(gpu_ids, tuple(sorted(evicted, key=order.__getitem__)))


def place_packed(cluster: Cluster, allocation: ConfigurationAllocation,
                 previous_gpu_ids: Mapping[Hashable, Sequence[int]]) -> SiaPlacement:
    """Place configurations as Sia's *simulator* does (``alloc_to_placement_fast``; its policy's
    ``smart_placement`` is off in simulation): per GPU type, every round from empty nodes, jobs
    by GPU count (largest first, ties in job order) are packed round-robin from where the
    previous job stopped -- whole free nodes first for its whole-node share (checking each node
    once), then any free GPUs node after node, so a job may straddle nodes. Previous placements
    are not consulted: a job keeps its GPU ids (no restart) exactly when it lands on the same
    nodes with the same GPUs per node as last round. Never evicts.
    """
    configs = allocation.problem.configurations
    ids = allocation.job_ids
    conf = np.asarray(allocation.configuration)
    type_start = np.concatenate([[0], np.cumsum(cluster.capacity)])
    gpu_ids: dict[Hashable, tuple[int, ...]] = {}
    for j in range(cluster.num_gpu_types):
        members = np.flatnonzero((conf >= 0) & (configs.gpu_type[np.maximum(conf, 0)] == j))
        if not members.size:
            continue
        per_node = int(cluster.gpus_per_node[j])
        n_nodes = -(-int(cluster.capacity[j]) // per_node)
        free = np.minimum(per_node, int(cluster.capacity[j]) - per_node * np.arange(n_nodes))
        sizes = configs.num_gpus[conf[members]]
        nodes_of: dict[int, list[int]] = {}
        node = 0
        for k in np.argsort(-sizes, kind="stable").tolist():
            need, whole, taken = int(sizes[k]), int(sizes[k]) // per_node, []
            checked = 0
            while checked < n_nodes and whole > 0:
                if free[node] == per_node:
                    free[node] = 0
                    need -= per_node
                    taken += [node] * per_node
                    whole -= 1
                node, checked = (node + 1) % n_nodes, checked + 1
            while need > 0:
                take = min(need, int(free[node]))
                free[node] -= take
                need -= take
                taken += [node] * take
                node = (node + 1) % n_nodes
            nodes_of[k] = taken
        # GPU ids: a job on the same nodes as last round keeps its ids; the others take free slots
        owner = np.full(int(cluster.capacity[j]), -1)
        previous = {k: np.asarray(previous_gpu_ids.get(ids[members[k]], ()), dtype=np.int64) - type_start[j]
                    for k in nodes_of}
        kept = {k for k, taken in nodes_of.items()
                if previous[k].size == len(taken) and np.all((previous[k] >= 0) & (previous[k] < owner.size))
                and sorted((previous[k] // per_node).tolist()) == sorted(taken)}
        for k in kept:
            owner[previous[k]] = k
        for k, taken in nodes_of.items():
            if k in kept:
                local = previous[k]
            else:
                local = np.concatenate([np.flatnonzero((np.arange(owner.size) // per_node == n) & (owner < 0))[:c]
                                        for n, c in zip(*np.unique(taken, return_counts=True))])
                owner[local] = k
            gpu_ids[ids[members[k]]] = tuple((np.sort(local) + type_start[j]).tolist())
    return SiaPlacement(gpu_ids)


class _TypePlacer:
    """Placement on the nodes of one GPU type; GPU ids local to the type (0 .. capacity - 1)."""

    def __init__(self, capacity: int, per_node: int):
        self.per_node = per_node
        n_nodes = -(-capacity // per_node)
        self.node_size = np.minimum(per_node, capacity - per_node * np.arange(n_nodes))
        self.node_of = np.arange(capacity) // per_node
        self.owner = np.full(capacity, -1, dtype=np.int64)  # job (index into this type's jobs) per GPU
        self.evictable = np.zeros(0, dtype=bool)  # per job: kept partial-node placement, not pinned

    def node_free(self) -> np.ndarray:
        return np.bincount(self.node_of[self.owner < 0], minlength=self.node_size.size)

    def place(self, sizes: np.ndarray, previous: list[np.ndarray], pinned: np.ndarray
              ) -> tuple[list[np.ndarray | None], list[int]]:
        """GPUs of each job (None: not placed) and the jobs dropped, as positions in ``sizes``."""
        n = sizes.size
        whole = sizes >= self.per_node
        order = np.argsort(-sizes, kind="stable")
        self.evictable = np.zeros(n, dtype=bool)
        out: list[np.ndarray | None] = [None] * n
        for k in np.lexsort((-sizes, ~pinned)):  # pinned jobs first where two claim the same GPUs
            if self._keeps(previous[k], int(sizes[k]), bool(whole[k])):
                self.owner[previous[k]] = k
                out[k] = previous[k]
                self.evictable[k] = not whole[k] and not pinned[k]
        dropped: list[int] = []
        requeue: list[int] = []
        for k in order:
            if whole[k] and out[k] is None:
                requeue += self._take_whole_nodes(int(k), int(sizes[k]) // self.per_node, out)
                if out[k] is None:
                    dropped.append(int(k))
        queue = sorted([int(k) for k in order if not whole[k] and out[k] is None and k not in requeue] + requeue,
                       key=lambda q: -sizes[q])
        while queue:
            k = queue.pop(0)
            requeue = self._take_in_node(k, int(sizes[k]), out)
            if out[k] is None:
                dropped.append(k)
            if requeue:
                queue = sorted(queue + requeue, key=lambda q: -sizes[q])
        return out, sorted(dropped)

    def _keeps(self, gpus: np.ndarray, size: int, whole: bool) -> bool:
        if gpus.size != size or np.any((gpus < 0) | (gpus >= self.owner.size)) or np.unique(gpus).size != size \
                or np.any(self.owner[gpus] >= 0):
            return False
        nodes = np.unique(self.node_of[gpus])
        if not whole:
            return nodes.size == 1
        return bool(np.all(self.node_size[nodes] == self.per_node)) and nodes.size * self.per_node == size

    def _evict_node(self, node: int, until_free: int, out: list) -> list[int]:
        """Evict evictable jobs of ``node``, smallest first, until it has ``until_free`` free GPUs."""
        on_node = self.owner[self.node_of == node]
        jobs = np.unique(on_node[on_node >= 0])
        jobs = jobs[self.evictable[jobs]]
        jobs = jobs[np.argsort([np.count_nonzero(self.owner == q) for q in jobs], kind="stable")]
        evicted = []
        for q in jobs:
            if self.node_free()[node] >= until_free:
                break
            self.owner[self.owner == q] = -1
            self.evictable[q] = False
            out[q] = None
            evicted.append(int(q))
        return evicted

    def _blocked(self) -> np.ndarray:
        """Bool per node: holds a GPU of a job that may not be evicted."""
        held = self.owner >= 0
        stuck = held.copy()
        stuck[held] = ~self.evictable[self.owner[held]]
        return np.bincount(self.node_of[stuck], minlength=self.node_size.size) > 0

    def _take_whole_nodes(self, k: int, need: int, out: list) -> list[int]:
        requeue: list[int] = []
        full = self.node_size == self.per_node
        while True:
            free_nodes = np.flatnonzero(full & (self.node_free() == self.per_node))
            if free_nodes.size >= need:
                chosen = free_nodes[::-1][:need]
                gpus = np.flatnonzero(np.isin(self.node_of, chosen))
                self.owner[gpus] = k
                out[k] = gpus
                return requeue
            candidates = np.flatnonzero(full & ~self._blocked() & (self.node_free() < self.per_node))
            if free_nodes.size + candidates.size < need:
                return requeue
            node = int(candidates[np.argmax(self.node_free()[candidates])])
            requeue += self._evict_node(node, self.per_node, out)

    def _take_in_node(self, k: int, size: int, out: list) -> list[int]:
        free = self.node_free()
        fits = np.flatnonzero(free >= size)
        requeue: list[int] = []
        if not fits.size:
            held = self.owner >= 0
            movable = held.copy()
            movable[held] = self.evictable[self.owner[held]]
            reclaimable = free + np.bincount(self.node_of[movable], minlength=free.size)
            candidates = np.flatnonzero(reclaimable >= size)
            if not candidates.size:
                return requeue
            node = int(candidates[np.argmin(size - free[candidates])])
            requeue = self._evict_node(node, size, out)
            free = self.node_free()
            fits = np.array([node])
        node = int(fits[np.argmin(free[fits])])
        gpus = np.flatnonzero((self.node_of == node) & (self.owner < 0))[:size]
        self.owner[gpus] = k
        out[k] = gpus
        return requeue


def plan_round(jobs: Sequence[SiaJobState], cluster: Cluster, configurations: Configurations, goodput: np.ndarray,
               previous_gpu_ids: Mapping[Hashable, Sequence[int]], *, round_index: int, start_s: float,
               round_seconds: float = 60.0, p: float = -0.5, lambda_n: float = 1.1, lambda_a: float = 0.0,
               backend: str = "highs", packed_placement: bool = False, **solve_options) -> SiaRoundPlan:
    """One Sia round: :func:`sia_round`, :func:`place_configurations`, then leases.

    A lease is ``extended`` exactly when the job holds the same GPU ids as last
    round; every other placed job is charged its ``restore_s`` (else ``restart_delay_s``)
    (``plan.restore_delay_s``, applied by :func:`commit_plan`). Jobs that held
    GPUs last round and hold none now are in ``plan.stop``. Parameters are
    those of :func:`sia_round` and :func:`place_configurations`, plus the
    round's index, start time and length (seconds) for the :class:`RoundPlan`;
    ``packed_placement`` places with :func:`place_packed` (Sia's simulator) instead, and then,
    as Sia's ``Job.reallocate``, a job also continues without a restart (``extended``) when
    only its nodes changed: same GPU type and the same GPUs per node.

    Returns
    -------
    SiaRoundPlan
    """
    if not jobs:
        return SiaRoundPlan(round_index, start_s, round_seconds, ())
    allocation = sia_round(jobs, cluster, configurations, goodput, p=p, lambda_n=lambda_n, lambda_a=lambda_a,
                           backend=backend, **solve_options)
    placement = (place_packed if packed_placement else place_configurations)(cluster, allocation, previous_gpu_ids)
    names = configurations.gpu_type_names
    leases, delays, configuration, stop = [], {}, {}, []
    for job, c in zip(jobs, allocation.configuration.tolist()):
        gpus = placement.gpu_ids.get(job.job_id)
        before = tuple(sorted(previous_gpu_ids.get(job.job_id, ())))
        configuration[job.job_id] = c if gpus is not None else -1
        if gpus is None:
            if before:
                stop.append(job.job_id)
            continue
        extended = gpus == before or (packed_placement and bool(before)
                                      and node_shape(cluster, gpus) == node_shape(cluster, before))
        if not extended:
            delays[job.job_id] = job.restart_delay_s if job.restore_s is None else job.restore_s
        leases.append(Lease(job.job_id, names[c], gpus, float(round_seconds), extended=extended))
    return SiaRoundPlan(round_index, start_s, round_seconds, tuple(leases), tuple(stop), allocation=allocation,
                        configuration=configuration, restore_delay_s=delays, evicted=placement.evicted)


def node_shape(cluster: Cluster, gpu_ids: Sequence[int]) -> tuple[int, tuple[int, ...]]:
    """GPU type and GPUs per node (in node order) of cluster-wide ``gpu_ids``."""
    ids = np.asarray(gpu_ids, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(cluster.capacity)])
    t = int(np.searchsorted(starts, ids[0], side="right")) - 1
    nodes = (ids - starts[t]) // int(cluster.gpus_per_node[t])
    return t, tuple(np.unique(nodes, return_counts=True)[1].tolist())


def commit_plan(jobs: Sequence[SiaJobState], plan: SiaRoundPlan) -> None:
    """Record a round's decisions in the job states (in place), as Sia's ``Job.reallocate`` does.

    Each job gets its configuration as ``previous``; a job charged a
    checkpoint-restore delay restarts it (``restore_remaining_s``) and counts a
    restart unless this is its first start.
    """
    for job in jobs:
        job.previous = plan.configuration.get(job.job_id, -1)
        delay = plan.restore_delay_s.get(job.job_id)
        if delay is not None:
            job.num_restarts += job.started
            job.started = True
            job.restore_remaining_s = delay


def advance(jobs: Sequence[SiaJobState], seconds: float) -> np.ndarray:
    """Let ``seconds`` pass (in place): every job ages; running jobs first finish their restore.

    Returns
    -------
    ndarray of float, shape (n_jobs,)
        Seconds each job trains in the interval (0 for jobs without a configuration).
    """
    running = np.array([j.previous >= 0 for j in jobs], dtype=bool)
    restore = np.array([j.restore_remaining_s for j in jobs], dtype=np.float64)
    spent = np.where(running, np.minimum(restore, seconds), 0.0)
    train = np.where(running, seconds - spent, 0.0)
    for job, s in zip(jobs, spent.tolist()):
        job.age_s += seconds
        job.restore_remaining_s -= s
    return train


__all__ = ["DEFAULT_RESTART_DELAY_S", "MIN_RESTART_FACTOR", "RESTART_DELAY_S", "SiaJobState", "SiaPlacement",
           "SiaRoundPlan", "advance", "commit_plan", "place_configurations", "place_packed", "plan_round",
           "node_shape", "restart_delay_s", "sia_round"]
