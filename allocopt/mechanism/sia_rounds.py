"""Sia's simulation model: :class:`SiaPlanner` drives Sia's rounds (:mod:`allocopt.mechanism.sia_round_plan`)
as the simulator's ``RoundPlanner`` -- each job's goodput model (fitted to its profile, or learned from what it
ran), its progress at its true rate, Sia's simulator's calibration -- and :class:`SiaExecutor` runs its plans in
simulated time (``allocopt.simulate(..., profiles=...)``); :func:`sia_workload` turns a Sia workload into the
simulator's jobs and :func:`rigid_throughputs` gives the fixed-GPU, fixed-batch rates for Gavel-style rounds on
the same workloads. The round logic itself (one Sia round: solve, place, charge restarts) is re-exported here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from allocopt.cluster import Cluster
from allocopt.configurations import sia_configurations
from allocopt.errors import InvalidOptionError
from allocopt.mechanism.fidelity import FIDELITY_PROFILES, Fidelity
from allocopt.mechanism.sia_round_plan import (DEFAULT_RESTART_DELAY_S, MIN_RESTART_FACTOR, RESTART_DELAY_S,
                                              SiaJobState, SiaPlacement, SiaRoundPlan, advance, commit_plan,
                                              place_configurations, place_packed, plan_round, restart_delay_s,
                                              sia_round)
from allocopt.mechanism.sia_job_steps import (MAX_EPOCHS, SIA_POLICY_MAX_LOCAL_BSZ, batch_split, epoch_ends,
                                              sia_optimize, step_round)
from allocopt.mechanism.sia_workloads import SiaWorkloadJob
from allocopt.mechanism.state import SimulationState
from allocopt.mechanism.workload import Workload
from allocopt.runtime.executor import Executor, JobRoundResult, RoundOutcome, RoundPlan
from allocopt.throughput.goodput import GoodputModel, GradParams, PerfParams, fit_perf_params, goodput_matrix
from allocopt.throughput.profiles import ApplicationProfile


#: Checkpoint-restore seconds Sia's *simulator* charges a (re)started job (``rescale_time`` of its
#: ``applications.py``); its policy prices restarts with :data:`RESTART_DELAY_S` instead.
SIA_SIMULATOR_RESTORE_S: Mapping[str, float] = {"cifar10": 50.0, "deepspeech2": 25.0, "bert": 120.0,
                                                "yolov3": 80.0, "imagenet": 250.0, "ncf": 15.0}
#: Sia's simulator divides each job's true goodput by its application's slowdown, "fitted to
#: real-world data" (``SLOWDOWNS`` of its ``simulator_config.py``; 1 for other applications).
SIA_SIMULATOR_SLOWDOWNS: Mapping[str, float] = {"cifar10": 1.8, "imagenet": 1.2, "yolov3": 1.2, "bert": 1.2,
                                                "deepspeech2": 1.2, "ncf": 1.5, "gpt_pmp": 1.0}
#: Sia's simulator's cap on the nodes one configuration spans (``cluster_max_physical_nnodes``).
SIA_SIMULATOR_MAX_NODES: Mapping[str, int] = {"azure": 5, "aws": 16, "dgx": 2, "dgx-ext": 2, "quad": 1, "rtx": 3}
SIA_MAX_REPLICAS = 64  # Sia's simulator caps a job at 64 replicas
#: Requested global batch size Sia's simulator substitutes per application (``cluster.py``: ncf 32,768).
SIA_SIMULATOR_TARGET_BATCH: Mapping[str, int] = {"ncf": 32768}


class SiaPlanner:
    """Sia's rounds as a :class:`allocopt.mechanism.simulator.RoundPlanner` (rows of the state are job ids).

    Each round: sync the job states with the simulation's active jobs and
    progress (``state.remaining_steps`` counts progress samples left, see
    :func:`sia_workload`), build the goodput matrix from the *fitted* models
    (gradient statistics of each job's current epoch), :func:`plan_round`,
    :func:`commit_plan`, :func:`advance`. For each lease it records the *true*
    rate -- measured/interpolated step time
    (:meth:`~allocopt.throughput.profiles.ApplicationProfile.true_times`) of
    the actual placement at the batch size the fitted model chose, times the
    statistical efficiency -- and the seconds left after the checkpoint-restore
    delay in the plan (``samples_per_s``, ``train_s``); :class:`SiaExecutor` runs it.

    Parameters
    ----------
    state : SimulationState
        Built by :func:`allocopt.mechanism.simulator.simulate` from :func:`sia_workload`.
    profiles : mapping of (application, gpu type) to ApplicationProfile
    round_seconds : float, default 60
    p, lambda_n, lambda_a : float
        Options of the ``sia`` policy.
    backend : str, default "highs"
    max_nodes : int or mapping of str to int, optional
        Most nodes one configuration may span (Sia's ``cluster_max_physical_nnodes``,
        :func:`~allocopt.configurations.sia_configurations`); default uncapped.
    explore_replicas : bool, optional (False)
        Sia's simulator's replica cap: a job may take at most twice the GPUs it has
        held so far (1 before it first runs), at most 64 and at most its
        application's ``max_batch_size // min_local_bsz`` (Sia's ``max_replicas``,
        shared across GPU types). Without it every configuration is open.
    slowdowns : mapping of application to float > 0, optional
        Divide each job's true progress rate by its application's factor (Sia's simulator's
        calibration, :data:`SIA_SIMULATOR_SLOWDOWNS`); default none.
    restore_s : mapping of application to float > 0, optional
        Seconds a (re)start actually costs per application, where it differs from the delay
        the policy prices (:func:`restart_delay_s`); Sia's simulator: :data:`SIA_SIMULATOR_RESTORE_S`.
    learn_throughputs : bool, optional (False)
        Sia's simulator's throughput models: each job's model on a GPU type is fitted
        (Pollux's RMSE fit) only to the step times it has measured there so far; on a type
        it has not run on, its goodput is projected from the first type it has a model on
        (same replicas, times the ratio of the two types' one-GPU throughputs in the
        profiles); before its first run only one GPU of any type is offered (goodput 1), and
        a job's first run on a type uses the initial batch size. Without it every job
        plans with its application's model fitted to the whole profile.
    round_grid : bool, optional (False)
        Rounds start only at multiples of ``round_seconds`` from time 0, as in Sia's simulator
        (a job that arrives at an idle cluster waits for the next one); without it a round
        starts at such an arrival.
    sia_stepping : bool, optional (False)
        With ``learn_throughputs``: each job trains through a round as Sia's ``Job.step``
        (:func:`~allocopt.mechanism.sia_job_steps.step_round`): it re-chooses its batch size at
        every epoch boundary from its refitted model and the gradient statistics of its last
        stretch, within its placement's memory limits, and each stretch to an epoch boundary
        takes whole seconds; its throughput models are fitted with Pollux's own optimizer
        (``fit_perf_params(optimizer="pollux")``). Everything in Sia's arithmetic: step times as
        Sia looks them up (:meth:`~allocopt.throughput.profiles.ApplicationProfile.sia_times`),
        progress in Sia's units, batch sizes and the policy's goodputs from Sia's goodput search
        (:func:`~allocopt.mechanism.sia_job_steps.sia_optimize`, float32 on the policy's side);
        with profiles read as Sia reads them (``load_profiles(..., sia_numbers=True)``) the
        simulation is Sia's to the bit up to the MILP's answers. Without it a job runs one batch
        size at one rate per round.
    batch_sizes : sequence of int, optional
        Requested global batch size of each job (row order of the workload; ``simulate`` passes
        the workload's ``batch_size`` column).
    cap_policy_batch : bool, optional (False)
        With ``learn_throughputs`` and ``batch_sizes``: the goodputs the policy sees cap each job's
        batch size at its requested one (ncf: 32,768) and its micro-batch at Sia's policy-side
        memory limit, as Sia's speedup functions (``max_batch_size=target_batch_size``); the job
        itself still trains up to its application's largest batch size.
    packed_placement : bool, optional (False)
        Place configurations as Sia's simulator does (:func:`place_packed`: packed afresh each
        round, jobs may straddle nodes, a job restarts whenever its nodes change) instead of
        :func:`place_configurations` (Sia's policy's placement rules, keeping jobs where they are).
    fidelity : Fidelity, optional
        The switches above as one object (:class:`~allocopt.mechanism.fidelity.Fidelity`; its Sia
        fields): a field that is on turns its option on unless the option is given (False or a value).
        ``sia_node_cap`` is Sia's simulator's node cap (:data:`SIA_SIMULATOR_MAX_NODES`),
        ``sia_slowdowns`` and ``sia_restore_times`` its slowdowns and restore times, and
        ``sia_milp_rounding`` its MILP's rounding and tie-break (``utility_decimals=2,
        utility_clip=3000, prefer_later=True`` unless given). Default: every switch off.
    faithful_to_sia : bool, default False
        Sia's simulator as published: ``fidelity`` the ``"sia"`` preset.
    sia_program : str, optional
        A cvxpy solver name (Sia's: "CBC", needs cylp): each round solves Sia's own cvxpy program with it
        (:func:`sia_round`), so ties in Sia's rounded MILP are broken as in Sia's runs. Off by default,
        also with ``faithful_to_sia``.
    sia_threads : int, default 8
        CBC's ``numberThreads`` with ``sia_program``.
    **solve_options
        Passed to :func:`allocopt.solve`.
    """

    def __init__(self, state: SimulationState, profiles: Mapping[tuple[str, str], ApplicationProfile], *,
                 round_seconds: float = 60.0, p: float = -0.5, lambda_n: float = 1.1, lambda_a: float = 0.0,
                 backend: str = "highs", max_nodes: int | Mapping[str, int] | None = None,
                 explore_replicas: bool | None = None, slowdowns: Mapping[str, float] | None = None,
                 restore_s: Mapping[str, float] | None = None, learn_throughputs: bool | None = None,
                 round_grid: bool | None = None, sia_stepping: bool | None = None,
                 batch_sizes: Sequence[int] | None = None, cap_policy_batch: bool | None = None,
                 packed_placement: bool | None = None, faithful_to_sia: bool = False, sia_program: str | None = None,
                 sia_threads: int = 8, fidelity: Fidelity | None = None, **solve_options: Any):
        self.cluster: Cluster = state.cluster
        fid = FIDELITY_PROFILES["sia"] if faithful_to_sia else (fidelity or FIDELITY_PROFILES["allocopt"])
        round_grid = fid.round_grid if round_grid is None else round_grid
        sia_stepping = fid.sia_stepping if sia_stepping is None else sia_stepping
        cap_policy_batch = fid.cap_policy_batch if cap_policy_batch is None else cap_policy_batch
        packed_placement = fid.packed_placement if packed_placement is None else packed_placement
        explore_replicas = fid.explore_replicas if explore_replicas is None else explore_replicas
        learn_throughputs = fid.learn_throughputs if learn_throughputs is None else learn_throughputs
        if max_nodes is None and fid.sia_node_cap:
            max_nodes = {t: SIA_SIMULATOR_MAX_NODES[t] for t in self.cluster.gpu_types if t in SIA_SIMULATOR_MAX_NODES}
        if slowdowns is None and fid.sia_slowdowns:
            slowdowns = SIA_SIMULATOR_SLOWDOWNS
        if restore_s is None and fid.sia_restore_times:
            restore_s = SIA_SIMULATOR_RESTORE_S
        if fid.sia_milp_rounding:
            solve_options = {"utility_decimals": 2, "utility_clip": 3000.0, "prefer_later": True, **solve_options}
        self.fidelity = fid
        self.slowdowns = _positive_map(slowdowns, "slowdowns")
        self.restore_s = _positive_map(restore_s, "restore_s")
        self.configurations = sia_configurations(self.cluster, max_nodes=max_nodes)
        self.explore_replicas = bool(explore_replicas)
        self.learn_throughputs = bool(learn_throughputs)
        self.sia_stepping = bool(sia_stepping) and self.learn_throughputs
        if batch_sizes is not None and len(batch_sizes) != state.workload.num_jobs:
            raise InvalidOptionError(f"batch_sizes has {len(batch_sizes)} entries; the workload has "
                                     f"{state.workload.num_jobs} jobs")
        self.batch_sizes = None if batch_sizes is None else [
            SIA_SIMULATOR_TARGET_BATCH.get(app, int(b)) if cap_policy_batch else int(b)
            for app, b in zip(state.workload.models, batch_sizes)]
        self.cap_policy_batch = bool(cap_policy_batch) and self.batch_sizes is not None
        self._grad: dict[Hashable, GradParams] = {}  # per job: gradient statistics of its last stretch
        self._progress: dict[Hashable, float] = {}  # per job: exact progress in Sia's units (sia_stepping)
        self._epochs: dict[Hashable, int] = {}  # per job: epochs completed (sia_stepping)
        # per (job, type) with measurements (:meth:`_model_key`: per (job, None) with one model per job)
        self._seen: dict[tuple[Hashable, int | None], dict[tuple[int, int, int], tuple[float, float]]] = {}
        self._learned: dict[tuple[Hashable, int | None], PerfParams] = {}
        self.one_model_per_job = False  # PolluxPlanner's unaware_job_model
        self._batch: dict[Hashable, float] = {}  # per job: the global batch size it last ran with
        self._most_gpus: dict[Hashable, int] = {}  # per job: most GPUs held so far (explore_replicas)
        self.profiles = profiles
        self.round_seconds = float(round_seconds)
        self.round_grid_s = self.round_seconds if round_grid else None  # read by the simulator loop
        self.options = dict(p=p, lambda_n=lambda_n, lambda_a=lambda_a, backend=backend,
                            packed_placement=bool(packed_placement), **solve_options)
        if sia_program is not None:
            self.options.update(sia_program=str(sia_program), sia_threads=int(sia_threads))
        self.solve_seconds: list[float] = []
        self._jobs: dict[int, SiaJobState] = {}
        self._gpu_ids: dict[Hashable, tuple[int, ...]] = {}
        self._fits: dict[tuple[str, str], PerfParams] = {}
        self._models: dict[tuple[str, str, int], GoodputModel] = {}
        self._type_start = np.concatenate([[0], np.cumsum(self.cluster.capacity)])

    def _model(self, application: str, gpu_type: str, epoch: int) -> GoodputModel | None:
        profile = self.profiles.get((application, gpu_type))
        if profile is None:
            return None
        key = (application, gpu_type, epoch)
        if key not in self._models:
            if (application, gpu_type) not in self._fits:
                self._fits[application, gpu_type] = profile.fit()
            self._models[key] = profile.goodput_model(self._fits[application, gpu_type], epoch=epoch)
        return self._models[key]

    def _model_key(self, job_id: Hashable, t: int) -> tuple[Hashable, int | None]:
        """Key of ``job_id``'s measurements on type ``t`` and of the model fitted to them (``_seen``,
        ``_learned``): ``(job_id, t)``; with ``one_model_per_job`` (Sia's heterogeneity-unaware jobs)
        ``(job_id, None)`` for every type, one model fitted to what the job measured on any type."""
        return (job_id, None) if self.one_model_per_job else (job_id, t)

    def _epoch(self, job: SiaJobState) -> int:
        """Sia's ``get_epoch``: epochs completed by ``job.progress``, within the validated range."""
        profile = self._any_profile(job.application)
        curves = profile.validation.values()
        epochs = min(c.progress.size for c in curves)
        done = max(int(np.searchsorted(c.progress * profile.init_batch_size, job.progress, side="right"))
                   for c in curves)
        return min(done, epochs - 1)

    def _any_profile(self, application: str) -> ApplicationProfile:
        return next(prof for (app, _), prof in self.profiles.items() if app == application)

    def plan(self, state: SimulationState, now_s: float, round_index: int) -> SiaRoundPlan:
        wl = state.workload
        for row in state.active_rows().tolist():
            if row not in self._jobs:
                app = wl.models[row]
                self._jobs[row] = SiaJobState(row, app, float(wl.arrival_s[row]), restart_delay_s(app),
                                              age_s=now_s - float(wl.arrival_s[row]),
                                              total=float(wl.total_steps[row]), restore_s=self.restore_s.get(app))
        for row in [r for r in self._jobs if not state.active[r]]:
            del self._jobs[row]
            self._gpu_ids.pop(row, None)
            self._most_gpus.pop(row, None)
            self._batch.pop(row, None)
            self._grad.pop(row, None)
            self._progress.pop(row, None)
            self._epochs.pop(row, None)
            for t in (*range(self.cluster.num_gpu_types), None):
                self._seen.pop((row, t), None)
                self._learned.pop((row, t), None)
        jobs = list(self._jobs.values())
        names = self.cluster.gpu_types
        models, epochs = [], {}
        for job in jobs:
            m0 = float(self._any_profile(job.application).init_batch_size)
            job.progress = max(job.total - float(state.remaining_steps[job.job_id]),
                               self._progress.get(job.job_id, 0.0) * m0)
            epochs[job.job_id] = epoch = self._epochs[job.job_id] if job.job_id in self._epochs \
                else self._epoch(job)
            models.append([self._model(job.application, t, epoch) for t in names])
        plan = self._decide(jobs, models, epochs, now_s, round_index)
        commit_plan(jobs, plan)
        train_s = dict(zip((j.job_id for j in jobs), advance(jobs, self.round_seconds).tolist()))
        by_row = {j.job_id: (j, m) for j, m in zip(jobs, models)}
        leases, rates = [], {}
        for lease in plan.leases:
            job, model = by_row[lease.job_id]
            t = names.index(lease.gpu_type)
            if self.sia_stepping:
                rates[lease.job_id] = self._step(job, t, model[t], lease.gpu_ids, epochs[lease.job_id],
                                                 train_s[lease.job_id], float(state.remaining_steps[lease.job_id]))
            else:
                rates[lease.job_id] = self._true_rate(job.application, t, model[t], lease.gpu_ids,
                                                      epochs[lease.job_id], job_id=job.job_id)
            leases.append(replace(lease, max_steps=int(state.remaining_steps[lease.job_id])))
        self._gpu_ids = plan.gpu_ids
        for lease in plan.leases:
            self._most_gpus[lease.job_id] = max(self._most_gpus.get(lease.job_id, 0), len(lease.gpu_ids))
        return replace(plan, leases=tuple(leases), samples_per_s=rates,
                       train_s={job: train_s[job] for job in rates})

    def _decide(self, jobs: list[SiaJobState], models: list, epochs: Mapping[Hashable, int], now_s: float,
                round_index: int) -> SiaRoundPlan:
        """The round's decision: the goodput matrix, :func:`plan_round` (subclasses decide otherwise)."""
        goodput = self._goodput_matrix(jobs, models, epochs)
        started = time.perf_counter()
        plan = plan_round(jobs, self.cluster, self.configurations, goodput, self._gpu_ids, round_index=round_index,
                          start_s=now_s, round_seconds=self.round_seconds, **self.options)
        if jobs:
            self.solve_seconds.append(time.perf_counter() - started)
        return plan

    def _goodput_matrix(self, jobs: list[SiaJobState], models: list, epochs: Mapping[Hashable, int]) -> np.ndarray:
        """The goodput matrix the policy sees, shape (n_jobs, n_configurations): from each job's fitted
        model (``learn_throughputs``: fitted to what it measured), 0 beyond its replica cap (``explore_replicas``)."""
        if self.learn_throughputs:
            goodput = self._learned_goodput(jobs, epochs)
        else:
            goodput = goodput_matrix(models, self.configurations) if jobs else np.zeros((0, len(self.configurations)))
        if self.explore_replicas and jobs:
            cap = np.array([self._replica_cap(job) for job in jobs])
            goodput = np.where(self.configurations.num_gpus[None, :] <= cap[:, None], goodput, 0.0)
        return goodput

    def _replica_cap(self, job: SiaJobState) -> int:
        """Sia's simulator's ``max_replicas``: ``min(max(2 * most GPUs, 1), 64, max batch / min local batch)``,
        most GPUs held (with ``sia_stepping``: most GPUs it measured a step time on, as Sia's
        ``max_profiled_replicas``; a job restored but moved before it trained did not)."""
        profile = self._any_profile(job.application)
        most = self._most_gpus.get(job.job_id, 0)
        if self.sia_stepping:
            keys = {self._model_key(job.job_id, t) for t in range(self.cluster.num_gpu_types)}
            most = max((point[1] for key in keys for point in self._seen.get(key, ())), default=0)
        return min(max(2 * most, 1), SIA_MAX_REPLICAS, profile.max_batch_size // profile.min_local_bsz)

    def _placement(self, t: int, gpu_ids: tuple[int, ...]) -> tuple[int, ...]:
        """GPUs per node (nodes in id order) of ``gpu_ids`` on type ``t``."""
        local = np.asarray(gpu_ids) - self._type_start[t]
        return tuple(int(c) for c in np.bincount(local // int(self.cluster.gpus_per_node[t])) if c)

    def _step(self, job: SiaJobState, t: int, model: GoodputModel, gpu_ids: tuple[int, ...], epoch: int,
              train_s: float, remaining: float) -> float:
        """Step ``job`` through this round as Sia's job (``sia_stepping``); the progress rate (samples/s)
        that makes :class:`SiaExecutor` reproduce it: its progress over ``train_s``, or its completion
        time when it completes (a placeholder 1.0 when it does not train this round)."""
        if train_s <= 0:
            return 1.0
        placement = self._placement(t, gpu_ids)
        profile = self.profiles[job.application, self.cluster.gpu_types[t]]
        nodes, replicas = len(placement), sum(placement)

        def split() -> tuple[int, int]:
            return batch_split(profile, placement, self._learned.get(self._model_key(job.job_id, t)),
                               self._grad.get(job.job_id))

        def measure(key: tuple[int, int, int], step: float, sync: float, grad: GradParams) -> None:
            self._grad[job.job_id] = grad
            self._measure(job.job_id, t, key, step, sync)

        m0 = float(profile.init_batch_size)
        steps = step_round(profile, placement, self._progress.get(job.job_id, job.progress / m0), epoch, train_s,
                           split, measure,
                           slowdown=self.slowdowns.get(job.application, 1.0),
                           fallback_rate=lambda m, s: float(model.throughput(nodes, replicas, m, s)))
        self._batch[job.job_id] = steps.batch_size
        self._progress[job.job_id] = steps.progress
        self._epochs[job.job_id] = steps.epoch
        if steps.done_s is not None:
            return remaining * (1.0 + 1e-9) / max(steps.done_s, 1e-9)
        return max(steps.progress * m0 - job.progress, 0.0) / train_s

    def _true_rate(self, application: str, t: int, model: GoodputModel, gpu_ids: tuple[int, ...],
                   epoch: int, job_id: Hashable = None) -> float:
        """Progress samples/s on ``gpu_ids``: the fitted model's batch choice, run at the profiled step
        time, times the efficiency of the gradient statistics profiled at that batch size and epoch.

        Where the profile has no step time for that placement and micro-batch
        (outside the measured range) the fitted model's step time stands in.
        """
        placement = self._placement(t, gpu_ids)
        nodes, replicas = len(placement), int(sum(placement))
        profile = self.profiles[application, self.cluster.gpu_types[t]]
        learned = self._learned.get(self._model_key(job_id, t)) if self.learn_throughputs else None
        if self.learn_throughputs and learned is None:
            micro, accum = _initial_batch_split(profile, replicas)
        else:
            chooser = model if learned is None else self._learned_model(job_id, t, epoch)
            _, micro, accum = (float(a) for a in chooser.optimize(nodes, replicas))
        if micro <= 0:
            return 0.0
        batch = replicas * micro * (accum + 1)
        self._batch[job_id] = batch
        step, sync = (float(a) for a in profile.true_times(placement, micro))
        if self.learn_throughputs and np.isfinite(step) and np.isfinite(sync):
            self._measure(job_id, t, (nodes, replicas, int(micro)), step, sync)
        if np.isfinite(step) and np.isfinite(sync):
            throughput = batch / (step + accum * (step - sync))
        else:
            throughput = float(model.throughput(nodes, replicas, micro, accum))
        true_model = replace(model, grad_params=profile.grad_params(batch, epoch))
        return throughput * float(true_model.efficiency(batch)) / self.slowdowns.get(application, 1.0)

    def _measure(self, job_id: Hashable, t: int, key: tuple[int, int, int], step: float, sync: float) -> None:
        """Record a job's measured step time on type ``t``; refit its model there when the point is new."""
        model_key = self._model_key(job_id, t)
        seen = self._seen.setdefault(model_key, {})
        if key in seen:
            return
        seen[key] = (step, sync)
        nodes, replicas, bsz = (np.array(v, dtype=np.float64) for v in zip(*seen))
        times = np.array(list(seen.values()))
        self._learned[model_key] = fit_perf_params(nodes, replicas, bsz, times[:, 0] - times[:, 1], times[:, 0],
                                                   loss="rmse", optimizer="pollux" if self.sia_stepping else "tnc")

    def _learned_model(self, job_id: Hashable, t: int, epoch: int, *, policy: bool = False) -> GoodputModel:
        """The job's model on type ``t`` from its own measurements, with the gradient statistics
        of its epoch at the batch size it last ran with (what Sia's job reports; with ``sia_stepping``
        those of its last stretch), with type ``t``'s batch-size limits. ``policy``: as the policy sees it
        (``cap_policy_batch``: the requested batch size; with ``one_model_per_job``, as Sia's unaware jobs,
        the application's largest, :data:`SIA_SIMULATOR_TARGET_BATCH` where Sia substitutes one)."""
        application = self._jobs[job_id].application
        profile = self.profiles[application, self.cluster.gpu_types[t]]
        perf = self._learned[self._model_key(job_id, t)]
        grad = self._grad.get(job_id) if self.sia_stepping else None
        grad = grad or profile.grad_params(self._batch.get(job_id), epoch)
        if not (policy and self.cap_policy_batch):
            return profile.goodput_model(perf, grad_params=grad)
        local = SIA_POLICY_MAX_LOCAL_BSZ.get((application, self.cluster.gpu_types[t]), profile.max_local_bsz)
        if self.one_model_per_job:
            largest = SIA_SIMULATOR_TARGET_BATCH.get(application, profile.max_batch_size)
        else:
            largest = self.batch_sizes[job_id]  # type: ignore[index]
        return GoodputModel(perf, grad, profile.init_batch_size, max(profile.init_batch_size, largest),
                            max(local, profile.min_local_bsz), min_local_bsz=profile.min_local_bsz)

    def _learned_goodput(self, jobs: Sequence[SiaJobState], epochs: Mapping[Hashable, int]) -> np.ndarray:
        """Goodput matrix from each job's own measurements (``learn_throughputs``), as Sia's policy sees it."""
        configs = self.configurations
        out = np.zeros((len(jobs), len(configs)))
        k = self.cluster.num_gpu_types
        for i, job in enumerate(jobs):
            known = [t for t in range(k) if self._model_key(job.job_id, t) in self._learned]
            if not known:
                out[i, configs.num_gpus == 1] = 1.0  # no model yet: one GPU of any type, all alike
                continue
            source = known[0]
            src_profile = self.profiles[job.application, self.cluster.gpu_types[source]]
            src_model = self._learned_model(job.job_id, source, epochs[job.job_id], policy=True)
            for t in range(k):
                cols = np.flatnonzero(configs.gpu_type == t)
                profile = self.profiles.get((job.application, self.cluster.gpu_types[t]))
                if profile is None or not cols.size:
                    continue
                gpus = configs.num_gpus[cols]
                if t in known:
                    model = self._learned_model(job.job_id, t, epochs[job.job_id], policy=True)
                    out[i, cols] = self._policy_goodput(model, configs.num_nodes[cols], gpus)
                else:
                    nodes = np.ceil(gpus / int(self.cluster.gpus_per_node[source]))
                    ratio = _one_gpu_throughput(profile) / _one_gpu_throughput(src_profile)
                    goodput = self._policy_goodput(src_model, np.minimum(nodes, gpus), gpus)
                    # Sia's simulator scales its float32 goodputs in float32
                    out[i, cols] = goodput * (np.float32(ratio) if self.sia_stepping else ratio)
        return np.where(np.isfinite(out) & (out > 0), out, 0.0)

    def _policy_goodput(self, model: GoodputModel, nodes: np.ndarray, gpus: np.ndarray) -> np.ndarray:
        """Goodputs of ``model`` at (nodes, GPUs) as the policy sees them: with ``sia_stepping`` in the
        arithmetic of Sia's policy (:func:`~allocopt.mechanism.sia_job_steps.sia_optimize` on float32 GPU
        counts, rounded to float32)."""
        if self.sia_stepping:
            return sia_optimize(model, nodes, gpus, float32=True)[0].astype(np.float32)
        return model.optimize(nodes, gpus)[0]

    def observe(self, plan: RoundPlan, results: Sequence[JobRoundResult]) -> None:
        """Nothing to learn: the job states were updated when the round was planned."""


def _initial_batch_split(profile: ApplicationProfile, replicas: int) -> tuple[float, float]:
    """Sia's batch split before a job has a model on the type: the initial batch size (at least
    ``min_local_bsz`` per GPU) in the fewest accumulation steps that fit (a single GPU above
    ``M0`` accumulates once). Returns (micro-batch, accumulation steps)."""
    batch = max(profile.init_batch_size, profile.min_local_bsz * replicas)
    local = math.ceil(batch / replicas - 1e-8)
    accum = math.ceil(local / profile.max_local_bsz - 1e-8) - 1
    if replicas == 1 and batch > profile.init_batch_size:
        accum = max(1, accum)
    micro = min(math.ceil(local / (accum + 1) - 1e-8), int(profile.max_batch_size / (replicas * (accum + 1))))
    return float(micro), float(accum)


def _one_gpu_throughput(profile: ApplicationProfile) -> float:
    """Samples/s of one GPU at its largest measured micro-batch over its slowest step (Sia's ratio)."""
    obs = profile.observations
    rows = (obs.num_replicas == 1) & (obs.placement != "")
    rows = rows if rows.any() else obs.num_replicas == 1
    return float(obs.local_bsz[rows].max() / obs.iter_time_s[rows].max())


def _positive_map(values: Mapping[str, float] | None, name: str) -> dict[str, float]:
    """``values`` (application -> number) as a dict of floats, each finite and > 0."""
    try:
        out = {str(k): float(v) for k, v in dict(values or {}).items()}
    except (TypeError, ValueError):
        raise InvalidOptionError(f"{name} must map application names to numbers, got {values!r}") from None
    bad = [k for k, v in out.items() if not (math.isfinite(v) and v > 0)]
    if bad:
        raise InvalidOptionError(f"{name}[{bad[0]!r}] is {out[bad[0]]}; each value must be a finite number > 0")
    return out


class SiaExecutor(Executor):
    """Runs a :class:`SiaPlanner`'s round plans in simulated time.

    A leased job trains for the plan's ``train_s`` (the round less its
    checkpoint-restore) at its ``samples_per_s``; a "step" is one progress
    sample. A job that completes holds its GPUs until then; rounds always last
    ``round_seconds`` (Sia's fixed scheduling interval).
    """

    def __init__(self) -> None:
        self._now = 0.0

    def now(self) -> float:
        return self._now

    def run_round(self, plan: RoundPlan) -> Sequence[JobRoundResult]:
        if not isinstance(plan, SiaRoundPlan):
            raise TypeError(f"SiaExecutor runs SiaRoundPlan, got {type(plan).__name__}")
        self._now = max(self._now, plan.start_s)
        results = []
        for lease in plan.leases:
            samples_per_s, train_s = plan.samples_per_s[lease.job_id], plan.train_s[lease.job_id]
            if not samples_per_s > 0:
                results.append(JobRoundResult(lease.job_id, RoundOutcome.FAILED, 0, 0.0, restarted=not lease.extended,
                                              message=f"no profiled throughput on {lease.gpu_type} x "
                                                      f"{len(lease.gpu_ids)}"))
                continue
            restore = lease.max_seconds - train_s
            steps = math.floor(samples_per_s * train_s)
            done = lease.max_steps is not None and steps >= lease.max_steps
            if done:
                steps = int(lease.max_steps)  # type: ignore[arg-type]
            seconds = restore + steps / samples_per_s if done else lease.max_seconds
            results.append(JobRoundResult(lease.job_id, RoundOutcome.COMPLETED if done else RoundOutcome.PREEMPTED,
                                          steps, seconds, measured_steps_per_s=samples_per_s,
                                          restarted=not lease.extended))
        self._now += plan.round_seconds
        return results


def total_progress(profile: ApplicationProfile) -> float:
    """Progress samples (``M0``-equivalent) a job of ``profile.application`` needs: Sia's
    ``get_progress(max_epochs)`` -- the smallest cumulative progress over the validation curves
    after :data:`MAX_EPOCHS` epochs, in iterations at the initial batch size ``M0`` -- times ``M0``."""
    return float(epoch_ends(profile)[-1])


def sia_workload(jobs: Sequence[SiaWorkloadJob], profiles: Mapping[tuple[str, str], ApplicationProfile],
                 source: str = "") -> Workload:
    """A simulator :class:`Workload` of Sia jobs: ``total_steps`` are the progress samples of
    :func:`total_progress`, ``scale_factors`` the requested GPUs, ``models`` the applications."""
    by_app = {app: prof for (app, _), prof in profiles.items()}
    missing = sorted({j.application for j in jobs} - set(by_app))
    if missing:
        raise InvalidOptionError(f"no profiles for application(s) {missing}; profiles cover {sorted(by_app)}")
    n = len(jobs)
    return Workload(tuple(j.application for j in jobs), np.array([j.num_replicas for j in jobs], dtype=np.int64),
                    np.array([math.ceil(total_progress(by_app[j.application])) for j in jobs], dtype=np.int64),
                    np.array([j.time_s for j in jobs], dtype=np.float64), np.ones(n), source,
                    np.array([j.line for j in jobs], dtype=np.int64))


def rigid_throughputs(workload: Workload, batch_sizes: Sequence[int],
                      profiles: Mapping[tuple[str, str], ApplicationProfile], cluster: Cluster) -> np.ndarray:
    """Progress samples/s of each job of :func:`sia_workload` on each GPU type with its requested GPUs and
    batch size fixed (Gavel-style rounds), as Sia's ``get_throughput_with_accum``.

    The job runs consolidated (whole nodes, then one partial node) at the profiled step time, with
    gradient accumulation where the batch does not fit in memory, times the statistical gain of
    that batch size averaged over the job's epochs (weighted so that the whole run takes the same
    time as with the per-epoch gains). 0 where the type lacks a profile or the GPUs, or the
    micro-batch is outside the profiled range.

    Returns
    -------
    ndarray of shape (n_jobs, n_gpu_types)
    """
    out = np.zeros((workload.num_jobs, cluster.num_gpu_types))
    for i, (app, replicas) in enumerate(workload.jobs()):
        batch = int(batch_sizes[i])
        for t, gpu_type in enumerate(cluster.gpu_types):
            profile = profiles.get((app, gpu_type))
            if profile is None or replicas > cluster.capacity[t]:
                continue
            per_node = int(cluster.gpus_per_node[t])
            placement = (per_node,) * (replicas // per_node) + ((replicas % per_node,) if replicas % per_node else ())
            local = math.ceil(batch / replicas - 1e-8)
            accum = math.ceil(local / profile.max_local_bsz - 1e-8) - 1
            if replicas == 1 and batch > profile.init_batch_size:
                accum = max(1, accum)
            micro = min(math.ceil(local / (accum + 1) - 1e-8), int(profile.max_batch_size / (replicas * (accum + 1))))
            step, sync = (float(a) for a in profile.true_times(placement, micro))
            gain = _mean_gain(profile, batch)
            rate = profile.init_batch_size * gain / (step + accum * (step - sync))
            out[i, t] = rate if np.isfinite(rate) and rate > 0 else 0.0
    return out


def _mean_gain(profile: ApplicationProfile, batch: int) -> float:
    """Sia's statistical gain of ``batch`` per epoch, averaged harmonically, weighted by each epoch's progress."""
    curves = profile.validation.values()
    epochs = min(MAX_EPOCHS.get(profile.application, 10**9), *(c.progress.size for c in curves))
    ends = np.array([min(c.progress[e] for c in curves) for e in range(epochs)])
    work = np.diff(ends, prepend=0.0)
    scale = batch / profile.init_batch_size
    gain = np.array([(g.var + g.sqr) / (g.var / scale + g.sqr)
                     for g in (profile.grad_params(batch, e) for e in range(epochs))])
    return float(work.sum() / (work / gain).sum())


__all__ = ["DEFAULT_RESTART_DELAY_S", "MAX_EPOCHS", "MIN_RESTART_FACTOR", "RESTART_DELAY_S", "SIA_SIMULATOR_MAX_NODES",
           "SIA_SIMULATOR_RESTORE_S", "SIA_SIMULATOR_SLOWDOWNS", "SiaExecutor",
           "SiaJobState", "SiaPlacement", "SiaPlanner", "SiaRoundPlan", "advance", "commit_plan",
           "place_configurations", "place_packed", "plan_round", "restart_delay_s", "rigid_throughputs", "sia_round", "sia_workload",
           "total_progress"]
