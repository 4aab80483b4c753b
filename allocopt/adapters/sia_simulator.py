"""A stand-in for the ``SiaPolicy`` object of Sia's simulator, computed by allocopt.

Sia's simulator (siasosp23/artifacts, ``sia-simulator``) builds its policy with
``SiaPolicy(p_fairness=..., restart_penalty=30, lambda_a=..., lambda_n=...,
project_throughputs=..., share_max_replicas=..., enable_bsz_tuning=...)``,
calls ``populate_valid_configs(cluster_num_nodes, cluster_num_gpus,
cluster_max_physical_nnodes)`` once and then, every round,
``optimize(jobs, nodes, base_allocations)`` with its ``JobInfo`` objects, its
``NodeInfo`` objects per GPU type and the previous round's answer; the answer
is ``{job_name: (gpu_type, [node id per GPU])}``, ``(None, ())`` for a job
without GPUs. :class:`SiaSimulatorPolicy` has that constructor and those
methods. A module (or shim) that binds it as ``sia.SiaPolicy`` makes Sia's
``Cluster`` treat it as Sia's own (``benchmarks/conformance_sia.py``).

Each round, as Sia's policy does: each job's goodput in every configuration
of each GPU type from its ``speedup_fn`` (projected from another type by
``cluster_throughput_ratios`` where the job has no model there yet, with
``project_throughputs``; its smallest configuration alone where no model
exists), normalized so the job's smallest goodput is 1; Pollux's restart
factor from the job's age and restarts; jobs in checkpoint-restore keep their
configuration. The configuration MILP is :func:`allocopt.solve`'s ``sia``
policy; each type's configurations are placed on nodes with Sia's simulator
placement (largest job first, whole nodes first, round-robin over nodes).

Differences from Sia's code, on purpose:

* The MILP gap is explicit: ``mip_gap`` (default 1e-4, the relative gap of
  Sia's CBC call); :attr:`SiaSimulatorPolicy.last_status` says whether the
  round's answer is proven optimal or within the gap. ``mip_gap=0`` is exact.
* Sia gives configurations a job cannot use a goodput of 1e-4 (so with
  ``p > 0`` its MILP may choose them); here they are not in the model.
* Sia rounds ``goodput ** p`` to 2 decimals and clips it at 3,000; so does the
  stand-in by default (the ``sia`` policy's ``utility_decimals=2,
  utility_clip=3000``), and ``utility_decimals=None`` gives exact utilities.
  Ties (the rounding creates many) go to the later configuration
  (``prefer_later``): the larger of two GPU counts, the later GPU type, which is
  what Sia's CBC solve returns in effect; it matters, as a job that takes fewer
  GPUs explores larger configurations later (Sia's ``max_replicas`` doubles).
  Ties across jobs are still broken by allocopt's technique (on Sia's 64-GPU
  cluster its dynamic programming, which keeps the first of tied choices), not CBC. With ``sia_program="CBC"``
  the stand-in instead writes Sia's own program (float32 utilities with Sia's
  1e-4 goodputs for unusable configurations, Sia's cvxpy expression and
  constraint order; :mod:`allocopt.formulations.sia_programs`) and solves it with
  CBC through cvxpy (needs cylp), so CBC sees Sia's matrices and returns Sia's
  answers, ties included.
* ``lambda_a`` is accepted and ignored, as in Sia's MILP.
* Rigid jobs (``category == "rigid"``) are rejected with a clear error: Sia
  gives them GPU counts outside its configuration set.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from allocopt.api import solve
from allocopt.cluster import Cluster
from allocopt.configurations import Configurations, sia_configurations
from allocopt.errors import InvalidOptionError, InvalidProblemError, SolverError
from allocopt.formulations.sia_programs import ZERO_GOODPUT, solve_sia_round
from allocopt.goodput_problem import ConfigurationAllocation, GoodputProblem, restart_factor
from allocopt.mechanism.sia_rounds import restart_delay_s
from allocopt.solution import Status

MIN_RESTART_FACTOR = 1e-6  # a restart factor of 0 (restarts ate the job's age) makes every move prohibitive
SIA_MAX_GPUS = 64  # Sia's configuration tables end at 64 GPUs


def restart_penalty_s(job_name: str) -> float:
    """Sia's measured checkpoint-restore cost of a job named ``<application>-<number>``, in seconds."""
    return restart_delay_s(str(job_name).split("-")[0])


EXACT_GAP = 1e-9  # a proven relative gap this small counts as optimal


class SiaSimulatorPolicy:
    """Sia's ``SiaPolicy`` for Sia's simulator, computed by allocopt (module docstring).

    Parameters
    ----------
    p_fairness, restart_penalty, migrate_penalty, lambda_a, lambda_n, project_throughputs,
    share_max_replicas, sched_interval, enable_bsz_tuning
        Sia's constructor arguments (``lambda_a``, ``migrate_penalty``, ``sched_interval``,
        ``enable_bsz_tuning`` are recorded, unused, as in Sia's policy).
    backend : str, default "highs"
    mip_gap : float, default 1e-4
        Relative MILP gap (Sia's CBC uses 1e-4); 0 for a proven optimum every round.
    time_limit_s : float, optional
    read_throughputs_before_first_run : bool, default False
        Sia's ``sim_config.sia_read_throughputs_before_first_run``.
    utility_decimals : int or None, default 2
        Decimals the MILP's utilities ``G ** p`` are rounded to (Sia: 2); None for exact values.
    utility_clip : float or None, default 3000
        Cap on the utilities (Sia's ``sia_goodput_clip_val``); None for none.
    sia_program : str, optional
        A cvxpy solver name (Sia's: "CBC", which needs cylp): solve Sia's own program
        (:mod:`allocopt.formulations.sia_programs`: Sia's float32 utility matrix with its 1e-4 goodputs,
        its cvxpy expression and constraint order) with it instead of allocopt's ``sia`` policy, so the
        solver sees Sia's matrices and breaks ties as in Sia's runs. ``backend`` is then unused.
    threads : int, default 8
        CBC's ``numberThreads`` with ``sia_program`` (Sia's ``sia_solver_num_threads``).

    Attributes
    ----------
    last_allocation : ConfigurationAllocation or None
        The last round's allocopt answer.
    last_status : dict
        ``status`` ("optimal" or "within_gap"), ``mip_gap`` (the gap proven, or the limit when the
        solve reports none), ``mip_gap_limit`` (the limit used),
        ``exact`` (whether the answer is a proven optimum) and ``message``.
    """

    def __init__(self, p_fairness: float = -0.5, restart_penalty: float = 30, migrate_penalty: float = 45,
                 lambda_a: float | None = 0.01, lambda_n: float | None = 1.1, project_throughputs: bool = False,
                 share_max_replicas: bool = False, sched_interval: float = 60, enable_bsz_tuning: bool = True, *,
                 backend: str = "highs", mip_gap: float = 1e-4, time_limit_s: float | None = None,
                 read_throughputs_before_first_run: bool = False, utility_decimals: int | None = 2,
                 utility_clip: float | None = 3000.0, sia_program: str | None = None, threads: int = 8):
        if p_fairness == 0:
            raise InvalidOptionError("p_fairness must not be 0 (Sia's fairness exponent)")
        self.p_fairness = float(p_fairness)
        self.restart_penalty, self.migrate_penalty = restart_penalty, migrate_penalty
        self.lambda_a = lambda_a
        self.lambda_n = float(lambda_n) if lambda_n else -1.0  # Sia's fallback
        self.project_throughputs = bool(project_throughputs)
        self.share_max_replicas = bool(share_max_replicas) or self.project_throughputs
        self.sched_interval, self.enable_bsz_tuning = sched_interval, enable_bsz_tuning
        self.backend, self.mip_gap, self.time_limit_s = backend, float(mip_gap), time_limit_s
        self.read_throughputs_before_first_run = read_throughputs_before_first_run
        self.utility_decimals, self.utility_clip = utility_decimals, utility_clip
        if sia_program is not None and (utility_decimals is None or utility_clip is None):
            raise InvalidOptionError("sia_program writes Sia's program, which rounds and clips its utilities: "
                                     "give utility_decimals and utility_clip (Sia: 2 and 3000)")
        self.sia_program, self.threads = sia_program, int(threads)
        self.cluster: Cluster | None = None
        self.configurations: Configurations | None = None
        self.cluster_ordering: list[str] = []
        self.prev_configuration: dict[Hashable, int] = {}
        self.last_allocation: ConfigurationAllocation | None = None
        self.last_status: dict[str, Any] = {}

    def populate_valid_configs(self, cluster_num_nodes: Mapping[str, int], cluster_num_gpus: Mapping[str, int],
                               cluster_max_physical_nnodes: Mapping[str, int] | None = None) -> None:
        """Sia's configurations: per GPU type (in ``cluster_num_gpus`` order) with ``g`` GPUs per node,
        1, 2, 4, ..., g GPUs on one node and whole nodes up to the type's node count, its
        physical node cap and 64 GPUs."""
        self.cluster_ordering = list(cluster_num_gpus)
        self.cluster = Cluster({t: int(cluster_num_nodes[t]) * int(cluster_num_gpus[t]) for t in self.cluster_ordering},
                               gpus_per_node={t: int(cluster_num_gpus[t]) for t in self.cluster_ordering})
        caps = {t: max(1, min(int(cluster_num_nodes[t]), SIA_MAX_GPUS // int(cluster_num_gpus[t]),
                              int((cluster_max_physical_nnodes or {}).get(t, cluster_num_nodes[t]))))
                for t in self.cluster_ordering}
        self.configurations = sia_configurations(self.cluster, max_nodes=caps)
        self._type = np.asarray(self.configurations.gpu_type)
        self._nodes = np.asarray(self.configurations.num_nodes)
        self._gpus = np.asarray(self.configurations.num_gpus)

    def optimize(self, jobs: Mapping[Hashable, Any], nodes: Mapping[str, Mapping[int, Any]],
                 base_allocations: Mapping[Hashable, tuple]) -> dict[Hashable, tuple]:
        """This round's ``{job_name: (gpu_type, [node id per GPU])}`` (``(None, ())`` without GPUs)."""
        if self.configurations is None:
            raise InvalidOptionError("call populate_valid_configs(...) before optimize(...)")
        names = list(jobs)
        self.prev_configuration = {k: v for k, v in self.prev_configuration.items() if k in jobs}
        if not names:
            return {}
        rigid = [name for name in names if getattr(jobs[name], "category", None) == "rigid"]
        if rigid:
            raise InvalidProblemError(f"job {rigid[0]!r} is rigid; the allocopt stand-in for Sia's policy handles "
                                      "adaptive and scale-gpus jobs only", field="category", job=rigid[0])
        goodput = np.vstack([self._goodput_row(name, jobs[name]) for name in names])
        previous = np.array([self.prev_configuration.get(name, -1) for name in names])
        pinned = np.array([bool(getattr(jobs[name], "scaling_underway", False)) for name in names]) & (previous >= 0)
        rows = np.flatnonzero(pinned)
        goodput[rows, previous[rows]] = np.maximum(goodput[rows, previous[rows]], ZERO_GOODPUT)
        factor = restart_factor([jobs[n].age for n in names], [jobs[n].num_restarts for n in names],
                                [restart_penalty_s(str(n)) for n in names])
        if self.sia_program is not None:
            configuration = self._solve_sia_program(names, jobs, previous, pinned, factor)
            self.prev_configuration = {name: int(c) for name, c in zip(names, configuration) if c >= 0}
            return self._place(names, configuration, nodes)
        problem = GoodputProblem(goodput, self.configurations, self.cluster, job_ids=names, previous=previous,
                                 restart_factor=np.maximum(factor, MIN_RESTART_FACTOR), pinned=pinned)
        allocation = solve(problem, "sia", p=self.p_fairness, lambda_n=self.lambda_n, lambda_a=0.0,
                           utility_decimals=self.utility_decimals, utility_clip=self.utility_clip, prefer_later=True,
                           backend=self.backend, mip_gap=self.mip_gap, time_limit_s=self.time_limit_s)
        self.last_allocation = allocation
        self.last_status = self._status(allocation)
        configuration = allocation.configuration
        self.prev_configuration = {name: int(c) for name, c in zip(names, configuration) if c >= 0}
        return self._place(names, configuration, nodes)

    def _solve_sia_program(self, names: Sequence[Hashable], jobs: Mapping[Hashable, Any], previous: np.ndarray,
                           pinned: np.ndarray, factor: np.ndarray) -> np.ndarray:
        """This round's configuration per job from Sia's own program (``sia_program``)."""
        goodput = np.vstack([self._sia_goodput_row(name, jobs[name])[0] for name in names])
        result = solve_sia_round(goodput, self._type, self._gpus, self.cluster.capacity, previous, pinned, factor,
                                 self.p_fairness, self.lambda_n, decimals=self.utility_decimals,
                                 clip=self.utility_clip, solver=self.sia_program, mip_gap=self.mip_gap,
                                 threads=self.threads)
        self.last_allocation = None
        exact = result.status == "optimal" and self.mip_gap == 0
        self.last_status = {"status": "optimal" if exact else "within_gap" if result.status == "optimal"
                            else result.status, "exact": exact, "mip_gap_limit": self.mip_gap,
                            "mip_gap": self.mip_gap, "objective": result.objective, "solver": result.solver,
                            "program": "sia", "build_s": result.build_s, "solve_s": result.solve_s,
                            "message": f"Sia's program, {result.solver} through cvxpy: {result.status}"
                            + ("" if exact else f", within a relative MIP gap of {self.mip_gap:g}.")}
        if result.status != "optimal":
            raise SolverError(f"Sia's program did not solve: {result.solver} through cvxpy says {result.status!r}")
        return result.configuration

    # -- goodputs ---------------------------------------------------------------------------------

    def _goodput_row(self, name: Hashable, job: Any) -> np.ndarray:
        """Sia's normalized goodput of one job in every configuration (0 where it cannot run)."""
        row, filled = self._sia_goodput_row(name, job)
        return np.where(filled & (row > ZERO_GOODPUT), row, 0.0).astype(np.float64)

    def _sia_goodput_row(self, name: Hashable, job: Any) -> tuple[np.ndarray, np.ndarray]:
        """The job's row of Sia's goodput matrix (float32, as Sia computes it: configurations the job
        cannot use start at 1e-4 and are scaled with the row, then raised to at least 1e-4) and the
        mask of the configurations the job can use."""
        row = np.zeros(len(self.configurations), dtype=np.float32)
        filled = np.zeros(len(self.configurations), dtype=bool)
        missing = []  # types where the job gets only its smallest configuration, at goodput = scale unit
        for j, cluster in enumerate(self.cluster_ordering):
            fn = job.speedup_fn.get(cluster)
            unit = int(job.scale_unit[cluster])
            if self.share_max_replicas:
                low, high = min(job.min_replicas.values()), max(job.max_replicas.values())
            else:
                low, high = job.min_replicas[cluster], job.max_replicas[cluster]
            low, high = max(1, low), max(1, high)
            if "gpt-pmp" in str(name) and high == 6 and cluster == "dgx-ext":
                high = 8  # Sia's corner case for pipeline-parallel GPT jobs
            if fn is None and not self.read_throughputs_before_first_run and (
                    not self.project_throughputs or all(f is None for f in job.speedup_fn.values())):
                missing.append(j)
                continue
            cols = np.flatnonzero((self._type == j) & (self._gpus <= high * unit) & (self._gpus >= low * unit)
                                  & ((self._gpus % unit == 0) if unit > 1 else True))
            if cols.size == 0:
                missing.append(j)
                continue
            row[cols] = self._goodputs(job, cluster, self._nodes[cols], self._gpus[cols] // unit)
            filled[cols] = True
        counted = np.isin(self._type, [j for j in range(len(self.cluster_ordering)) if j not in missing])
        usable = counted & (row > ZERO_GOODPUT)
        smallest = row[usable].min() if usable.any() else 1.0  # a float32 scalar, as Sia's
        unit_of_smallest = 1
        for j, cluster in enumerate(self.cluster_ordering):
            if j not in missing and np.any(row[self._type == j] == smallest):
                unit_of_smallest = int(job.scale_unit[cluster])
        scale = 1.0 / smallest  # Sia's order of operations, so the float32 row is Sia's to the bit
        scale *= unit_of_smallest
        row[~filled] = np.float32(ZERO_GOODPUT)
        row *= scale
        for j in missing:
            unit = int(job.scale_unit[self.cluster_ordering[j]])
            at_unit = (self._type == j) & (self._gpus == unit)
            row[at_unit] = unit
            filled |= at_unit
        row[row <= ZERO_GOODPUT] = np.float32(ZERO_GOODPUT)
        return row, filled

    def _goodputs(self, job: Any, cluster: str, num_nodes: np.ndarray, num_replicas: np.ndarray) -> np.ndarray:
        """Sia's ``_compute_goodputs_v2``: the job's model on ``cluster``, else projected from another type."""
        fn = job.speedup_fn.get(cluster)
        if fn is not None:
            return np.asarray(fn.get_goodput(num_nodes.astype(np.float32), num_replicas.astype(np.float32)),
                              dtype=np.float32)
        others = [t for t, f in job.speedup_fn.items() if f is not None]
        if not others:
            return np.full(num_nodes.shape, job.cluster_throughputs[cluster], dtype=np.float32)
        source = others[0]
        per_node = int(self.cluster.gpus_per_node[self.cluster.index(source)])
        nodes = np.ceil(num_replicas * int(job.scale_unit[source]) / per_node).astype(np.uint32)
        values = np.asarray(job.speedup_fn[source].get_goodput(nodes.astype(np.float32),
                                                               num_replicas.astype(np.float32)), dtype=np.float32)
        return values * job.cluster_throughput_ratios[cluster][source]

    def _status(self, allocation: ConfigurationAllocation) -> dict[str, Any]:
        proven = allocation.extras.get("mip_gap")  # the gap the solve proved, when it reports one
        exact = allocation.status is Status.OPTIMAL and (
            self.mip_gap == 0 or bool(allocation.extras.get("relaxation_integral"))
            or (proven is not None and proven <= EXACT_GAP))
        status = ("optimal" if exact else
                  "within_gap" if allocation.status is Status.OPTIMAL else allocation.status.value)
        message = (allocation.message if exact else
                   f"{allocation.message} Feasible, within a relative MIP gap of {self.mip_gap:g} of the optimum."
                   if allocation.status is Status.OPTIMAL else allocation.message)
        return {**allocation.extras, "status": status, "exact": exact, "mip_gap_limit": self.mip_gap,
                "mip_gap": self.mip_gap if proven is None else proven, "message": message}

    # -- placement --------------------------------------------------------------------------------

    def _place(self, names: Sequence[Hashable], configuration: np.ndarray,
               nodes: Mapping[str, Mapping[int, Any]]) -> dict[Hashable, tuple]:
        """Sia's simulator placement (``alloc_to_placement_fast``) of each type's configurations."""
        out: dict[Hashable, tuple] = {name: (None, ()) for name in names}
        for j, cluster in enumerate(self.cluster_ordering):
            members = [(name, int(self._gpus[c])) for name, c in zip(names, configuration) if c >= 0 and
                       self._type[c] == j]
            if not members:
                continue
            free = np.array([node.resources["nvidia.com/gpu"] for node in nodes[cluster].values()], dtype=np.int64)
            for name, gpus in _place_fast(members, free).items():
                out[name] = (cluster, gpus)
        return out


def _place_fast(members: Sequence[tuple[Hashable, int]], free: np.ndarray) -> dict[Hashable, list[int]]:
    """Largest job first; whole free nodes first, then any free GPUs, round-robin from where
    the previous job stopped (Sia's simulator placement)."""
    per_node = int(free.max())
    count = free.size
    start = 0
    placements = {}
    for name, gpus in sorted(members, key=lambda m: m[1], reverse=True):
        node, placement = start, []
        full = gpus // per_node
        checked = 0
        while full > 0 and checked < count:
            if free[node] == per_node:
                free[node] = 0
                gpus -= per_node
                placement.extend([node] * per_node)
                full -= 1
            node = (node + 1) % count
            checked += 1
        while gpus > 0:
            take = min(gpus, int(free[node]))
            if take:
                gpus -= take
                free[node] -= take
                placement.extend([node] * take)
            node = (node + 1) % count
        placements[name] = placement
        start = node
    return placements


from allocopt.adapters.pollux_simulator import PolluxSimulatorPolicy  # noqa: E402  (Sia's Pollux port)

__all__ = ["PolluxSimulatorPolicy", "SiaSimulatorPolicy", "restart_penalty_s"]
