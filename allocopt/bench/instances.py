"""Seeded benchmark instances: random throughputs, jobs drawn from Gavel's measured
table (with pair throughputs for space sharing), hierarchical water-filling
instances with entities, and Sia goodput problems.

Every generator depends only on its arguments: the same (size, types, seed)
gives the same instance.
"""

from __future__ import annotations

import math
import random
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from allocopt.cluster import Cluster
from allocopt.configurations import Configurations, sia_configurations
from allocopt.errors import InvalidOptionError
from allocopt.goodput_problem import GoodputProblem, restart_factor
from allocopt.mechanism.sia_workloads import read_sia_workload
from allocopt.problem import Problem
from allocopt.throughput.profiles import read_seed_profile
from allocopt.throughput.table import ThroughputTable

#: GPU types of Gavel's measured table, fastest last.
GAVEL_GPU_TYPES = ("k80", "p100", "v100")


def _check_size(n_jobs: int, n_gpu_types: int, max_types: int | None = None, what: str = "") -> None:
    if n_jobs < 1:
        raise InvalidOptionError(f"n_jobs must be >= 1, got {n_jobs}; pass a positive number of jobs (--sizes)")
    if n_gpu_types < 1 or (max_types is not None and n_gpu_types > max_types):
        limit = f"1..{max_types}" if max_types is not None else ">= 1"
        raise InvalidOptionError(f"n_gpu_types must be {limit}{what}, got {n_gpu_types}; change --types")


def random_problem(n_jobs: int, n_gpu_types: int, seed: int = 0) -> Problem:
    """A random, contended instance of ``n_jobs`` distinct jobs on ``n_gpu_types`` types.

    * Throughputs (steps/s): job ``i`` has a base speed ``b_i`` log-uniform in
      [0.1, 10]; GPU type ``j`` a speedup ``f_j`` log-uniform in [1, 6] (types
      sorted slowest first); ``T_ij = b_i f_j e_ij`` with log-normal noise
      ``e_ij`` (sigma 0.3). About 10% of the entries are 0 (the job cannot run
      there), never all of a row.
    * Scale factors from {1, 2, 4, 8} GPUs with probabilities 0.7/0.1/0.15/0.05.
    * Priority weights 1 (80%) or 2 (20%).
    * Capacity: ``max(8 k, n / 4)`` GPUs in all, split over the types by a
      Dirichlet(4) draw, at least 8 per type: about 1.9 n GPUs demanded.
    * Steps remaining log-uniform in [1e3, 1e6]; time since start uniform in
      [0, 3600] s (for min_makespan and finish_time_fairness).
    """
    _check_size(n_jobs, n_gpu_types)
    rng = np.random.default_rng([seed, n_jobs, n_gpu_types])
    n, k = n_jobs, n_gpu_types
    base = np.exp(rng.uniform(np.log(0.1), np.log(10.0), n))
    speedup = np.sort(np.exp(rng.uniform(0.0, np.log(6.0), k)))
    noise = np.exp(rng.normal(0.0, 0.3, (n, k)))
    T = base[:, None] * speedup[None, :] * noise
    zero = rng.random((n, k)) < 0.10
    zero[np.arange(n), rng.integers(0, k, n)] = False  # every job can run somewhere
    T[zero] = 0.0
    scale = rng.choice([1, 2, 4, 8], size=n, p=[0.7, 0.1, 0.15, 0.05])
    weights = rng.choice([1.0, 2.0], size=n, p=[0.8, 0.2])
    total = max(8 * k, n // 4)
    share = rng.dirichlet(np.full(k, 4.0))
    capacity = np.maximum(8, np.round(share * total)).astype(int)
    steps = np.exp(rng.uniform(np.log(1e3), np.log(1e6), n))
    started = rng.uniform(0.0, 3600.0, n)
    cluster = Cluster({f"gpu{j}": int(capacity[j]) for j in range(k)})
    return Problem(T, cluster, scale_factors=scale, priority_weights=weights, num_steps_remaining=steps,
                   time_since_start=started)


def table_problem(n_jobs: int, n_gpu_types: int, seed: int = 0, *, space_sharing: bool = False,
                  table: ThroughputTable | None = None) -> Problem:
    """``n_jobs`` jobs drawn from Gavel's measured table (26 models, shipped with allocopt).

    GPU types: the ``n_gpu_types`` fastest of k80, p100, v100; ``max(8,
    n / (4 k))`` GPUs each. Jobs: :meth:`ThroughputTable.sample_problem` with
    Gavel's scale-factor distribution and priority weights 1 (80%) or 2, or,
    with ``space_sharing=True``, single-GPU jobs with the measured co-located
    throughputs of every pair (``n (n - 1) / 2`` pairs).
    """
    _check_size(n_jobs, n_gpu_types, len(GAVEL_GPU_TYPES), " (Gavel's table measures k80, p100 and v100)")
    per_type = max(8, n_jobs // (4 * n_gpu_types))
    cluster = Cluster({gpu: per_type for gpu in GAVEL_GPU_TYPES[-n_gpu_types:]})
    table = table or ThroughputTable.gavel()
    if space_sharing:
        return table.sample_problem(cluster, n_jobs, seed=seed, scale_factor_probs={1: 1.0}, space_sharing=True)
    return table.sample_problem(cluster, n_jobs, seed=seed, priority_weights={1.0: 0.8, 2.0: 0.2})


def water_filling_problem(n_jobs: int, n_gpu_types: int = 3, n_entities: int = 8,
                          seed: int = 0) -> tuple[Problem, dict[str, str]]:
    """A seeded hierarchical instance and its entity policies (``entity_policies`` of water_filling).

    Throughputs (steps/s): a base speed log-uniform in [0.2, 5] times a per-type
    speedup (1, 2.2, 3.5 for 3 types; interpolated between 1 and 3.5 otherwise)
    times log-normal noise (sigma 0.3); 10% of the entries of all but the
    fastest type are 0. Scale factors 1/2/4/8 with probabilities
    0.7/0.15/0.1/0.05; job weights 1 (80%) or 2; ``time_since_start`` uniform
    in [0, 1e5] s. Capacity: ``n / 8`` GPUs (at least 24) split 2:3:3:... over
    the types, at least 8 each. Entity ``u<e>`` has weight ``1 + e % 4`` and
    policy ``fifo`` for odd ``e``, ``fairness`` for even.
    """
    _check_size(n_jobs, n_gpu_types)
    if n_entities < 1:
        raise InvalidOptionError(f"n_entities must be >= 1, got {n_entities}")
    rng = np.random.default_rng([seed, n_jobs])
    n, k = n_jobs, n_gpu_types
    speedup = np.interp(np.linspace(0.0, 2.0, k), [0.0, 1.0, 2.0], [1.0, 2.2, 3.5]) if k > 1 else np.ones(1)
    base = np.exp(rng.uniform(np.log(0.2), np.log(5.0), n))
    T = base[:, None] * speedup * np.exp(rng.normal(0.0, 0.3, (n, k)))
    T[:, :k - 1][rng.random((n, k - 1)) < 0.10] = 0.0
    share = np.r_[2.0, np.full(k - 1, 3.0)]
    capacity = np.maximum(8, np.round(share / share.sum() * max(24, n // 8))).astype(int)
    names = GAVEL_GPU_TYPES if k == 3 else tuple(f"gpu{j}" for j in range(k))
    cluster = Cluster(dict(zip(names, capacity.tolist())))
    entities = [f"u{e}" for e in rng.integers(0, n_entities, n)]
    problem = Problem(
        T, cluster, scale_factors=rng.choice([1, 2, 4, 8], size=n, p=[0.7, 0.15, 0.1, 0.05]),
        priority_weights=rng.choice([1.0, 2.0], size=n, p=[0.8, 0.2]),
        time_since_start=rng.uniform(0.0, 1e5, n), entities=entities,
        entity_weights={f"u{e}": 1.0 + e % 4 for e in range(n_entities) if f"u{e}" in entities})
    policies = {e: ("fifo" if int(e[1:]) % 2 else "fairness") for e in problem.entity_ids}
    return problem, policies


# ----- instance families (every technique is measured on each) -------------------------------
def uniform_problem(n_jobs: int, n_gpu_types: int = 8, seed: int = 0, *, capacity: Any = None) -> Problem:
    """Distinct jobs with independent speeds per type, heavy priority weights and mixed scale factors.

    Throughputs (steps/s) uniform in [1, 10] per (job, type); priority weight 5
    on 20% of the jobs, else 1; scale factors 1/2/4/8 with probabilities
    0.7/0.1/0.15/0.05 (capped at the largest type's GPUs); ``capacity`` GPUs
    per type (an int for every type or one per type; default ``n / 4`` per
    type, at least 1). With 8 types and
    ``n / 4`` each the jobs' best types are rarely contended, so the per-job
    time limit, not capacity, decides max-min fairness.
    """
    _check_size(n_jobs, n_gpu_types)
    rng = np.random.default_rng([seed, n_jobs, n_gpu_types, 1])
    n, k = n_jobs, n_gpu_types
    T = rng.uniform(1.0, 10.0, (n, k))
    weights = np.where(rng.random(n) < 0.2, 5.0, 1.0)
    scale = rng.choice([1, 2, 4, 8], size=n, p=[0.7, 0.1, 0.15, 0.05])
    cap = np.broadcast_to(np.asarray(max(1, n // 4) if capacity is None else capacity), (k,)).astype(int)
    scale = np.minimum(scale, cap.max())  # a job fits on the largest type
    cluster = Cluster({f"gpu{j}": int(cap[j]) for j in range(k)})
    return Problem(T, cluster, scale_factors=scale, priority_weights=weights,
                   num_steps_remaining=np.exp(rng.uniform(np.log(1e3), np.log(1e6), n)),
                   time_since_start=rng.uniform(0.0, 3600.0, n))


#: Gavel's ``JobTable`` (scheduler/job_table.py), in its order: Gavel's generator draws a job's model
#: as ``rng.choice(JobTable)``, so the order decides which model a seed gives.
GAVEL_JOB_TABLE: tuple[str, ...] = (
    *(f"ResNet-18 (batch size {b})" for b in (16, 32, 64, 128, 256)),
    *(f"ResNet-50 (batch size {b})" for b in (16, 32, 64, 128)),
    *(f"Transformer (batch size {b})" for b in (16, 32, 64, 128, 256)),
    *(f"LM (batch size {b})" for b in (5, 10, 20, 40, 80)),
    *(f"Recommendation (batch size {b})" for b in (512, 1024, 2048, 4096, 8192)),
    "A3C", "CycleGAN")


def gavel_generated_jobs(n_jobs: int, seed: int, *, multi_gpu: bool,
                         table: ThroughputTable | None = None) -> list[tuple[str, int]]:
    """``(model, scale_factor)`` of the first ``n_jobs`` jobs Gavel's generator draws from ``random.Random(seed)``.

    The same jobs, in the same order, as ``utils.generate_job(throughputs, rng=rng,
    generate_multi_gpu_jobs=multi_gpu)`` called ``n_jobs`` times on one
    ``rng = random.Random(seed)`` (Gavel's scheduler/utils.py, copied unchanged
    into POP's cluster_scheduling/scheduler/utils.py; Soroush imports Gavel's),
    which every job consumes as: a scale factor from ``r = uniform(0, 1)`` (1
    below 0.7, 2 up to 0.8, 4 up to 0.95, else 8; forced to 1 unless
    ``multi_gpu``), a duration (``random()`` then one ``uniform``; drawn to keep
    the stream, not used), then ``choice`` over :data:`GAVEL_JOB_TABLE` until the
    model is distributed (measured at scale factors above 1) or the scale factor
    is 1. Python's ``random`` is specified to repeat these draws on every platform.
    """
    table = table or ThroughputTable.gavel()
    distributed = {m for m in GAVEL_JOB_TABLE if len(table.scale_factors(m)) > 1}
    rng = random.Random(seed)
    jobs = []
    for _ in range(n_jobs):  # one sequential random stream: the order of the draws is the instance
        r = rng.uniform(0, 1)
        scale = 1 if r < 0.7 else 2 if r <= 0.8 else 4 if r <= 0.95 else 8
        rng.uniform(3, 4) if rng.random() >= 0.8 else rng.uniform(1.5, 3)
        scale = scale if multi_gpu else 1
        model = rng.choice(GAVEL_JOB_TABLE)
        while scale > 1 and model not in distributed:
            model = rng.choice(GAVEL_JOB_TABLE)
        jobs.append((model, scale))
    return jobs


def pop_figure2_problem(n_jobs: int = 2048, seed: int = 0, *, gpus_per_type: int | None = None) -> Problem:
    """POP's figure-2 instance (Narayanan et al., SOSP 2021): max-min fairness with space sharing.

    Follows POP's cluster_scheduling/figure2.py (``create_problem_instance``
    with its ``__main__`` arguments; ``seed`` is its trial seed ``i``): the jobs
    are :func:`gavel_generated_jobs` ``(n_jobs, seed, multi_gpu=False)``, so every
    job is single-GPU and the job list is the one POP's script builds for this
    seed; priority weight 1 (``introduce_skew=False``); ``max(n / 4, 1)`` GPUs of
    each of v100, p100, k80 (``gpus_per_type`` overrides: 512 at 2,048 jobs);
    every pair ``i < j`` with its measured co-located throughputs (Gavel's
    ``simulation_throughputs.json``, shipped as the Gavel table). Job ids are
    0 .. n - 1 (POP's ``JobIdPair(i, None)``). Not reproduced: POP's
    sub-problem split (``partitions`` does that) and MOSEK.
    """
    _check_size(n_jobs, 3)
    table = ThroughputTable.gavel()
    per_type = gpus_per_type or max(n_jobs // 4, 1)
    cluster = Cluster({gpu: per_type for gpu in GAVEL_GPU_TYPES})
    return table.problem(gavel_generated_jobs(n_jobs, seed, multi_gpu=False, table=table), cluster,
                         space_sharing=True)


#: Soroush's priority weights, job ``i`` gets ``SOROUSH_PRIORITIES[i % 4]`` (``introduce_skew=True``).
SOROUSH_PRIORITIES = (1.0, 2.0, 4.0, 8.0)


def soroush_problem(n_jobs: int = 8192, seed: int = 0, *, gpus_per_type: int | None = None) -> Problem:
    """Soroush's cluster-scheduling instance (Namyar et al., NSDI 2024).

    Follows Soroush's cluster_scheduling/scripts/benchmark.py
    (``create_problem_instance`` with its ``__main__`` arguments: 8,192 jobs,
    ``ss_share=False``, ``introduce_skew=True``; ``seed`` is its trial seed
    ``i``): the jobs are :func:`gavel_generated_jobs` ``(n_jobs, seed,
    multi_gpu=True)``, the job list Soroush's script builds for this seed, with
    each job's isolated throughput at its scale factor; priority weight
    ``(1, 2, 4, 8)[i % 4]`` for job ``i``; ``n / 4`` GPUs of each of v100,
    p100, k80 (``gpus_per_type`` overrides: 2,048 at 8,192 jobs). Job ids are
    0 .. n - 1. Differs from Soroush's ``max(n / 4, 1)`` GPUs below 32 jobs
    only: at least 8 per type, so that an 8-GPU job fits. Not reproduced: its
    Gurobi solves.
    """
    _check_size(n_jobs, 3)
    table = ThroughputTable.gavel()
    per_type = gpus_per_type or max(n_jobs // 4, 8)
    cluster = Cluster({gpu: per_type for gpu in GAVEL_GPU_TYPES})
    weights = np.resize(np.asarray(SOROUSH_PRIORITIES), n_jobs)
    return table.problem(gavel_generated_jobs(n_jobs, seed, multi_gpu=True, table=table), cluster,
                         priority_weights=weights)


#: Instance families of the bench (``allocopt bench --families``): name -> (description, generator of
#: ``(n_jobs, seed) -> Problem``). Every technique is measured on every family.
FAMILIES: dict[str, tuple[str, Any]] = {
    "uniform": ("U[1,10] speeds, weight 5 on 20%, scale factors 1-8, n/4 GPUs per type, 8 types",
                lambda n, seed: uniform_problem(n, 8, seed)),
    "gavel_table": ("Gavel's 26-model table, 3 types, n/12 GPUs per type",
                    lambda n, seed: table_problem(n, 3, seed)),
    "oversubscribed": ("as uniform with n/32 GPUs per type", lambda n, seed: uniform_problem(n, 8, seed,
                                                                                           capacity=n // 32)),
    "undersubscribed": ("as uniform with n GPUs per type", lambda n, seed: uniform_problem(n, 8, seed, capacity=n)),
    "unequal": ("as uniform on 3 types of 2, 64 and 512 GPUs",
                lambda n, seed: uniform_problem(n, 3, seed, capacity=[2, 64, 512])),
    "random": ("the bench's random generator (log-uniform speeds, 10% unrunnable), 8 types",
               lambda n, seed: random_problem(n, 8, seed)),
    "soroush": ("Soroush's cluster-scheduling generator: Gavel's generator, weights 1/2/4/8, n/4 GPUs per type",
                lambda n, seed: soroush_problem(n, seed)),
}


# ----- Sia ---------------------------------------------------------------------------------
#: Sia's heterogeneous 64-GPU "saturn" cluster: nodes per GPU type and GPUs per node.
SATURN_NODES = {"aws": 6, "rtx": 3, "dgx-ext": 2}
GPUS_PER_NODE = {"aws": 4, "rtx": 8, "dgx-ext": 8}
SEED_PROFILE_TYPE = {"aws": "t4", "rtx": "rtx", "dgx-ext": "dgx"}  # names in seed_profiles/*.csv
MAX_PHYSICAL_NODES = {"aws": 16, "rtx": 3, "dgx-ext": 2}  # Sia's cluster_max_physical_nnodes
SIA_JOBS_PER_SCALE = 160  # jobs of Sia's scale_<N>x traces per 64 GPUs
MAX_GPUS = 64  # largest configuration Sia profiles
#: Throughput scaling exponent per application (throughput ~ gpus ** alpha on one node).
SCALING = {"cifar10": 0.65, "imagenet": 0.9, "bert": 0.85, "deepspeech2": 0.75, "yolov3": 0.8, "ncf": 0.6}
#: Seconds one restart costs (Sia's published get_restart_penalty).
RESTART_DELAY_S = {"cifar10": 30, "imagenet": 250, "bert": 120, "deepspeech2": 25, "yolov3": 45, "ncf": 30}
#: Per-GPU samples/s on aws, rtx, dgx-ext (from Sia's seed profiles) for applications whose profile is absent.
FALLBACK_TPUT = {"bert": (13.0, 26.9, 140.4), "cifar10": (1461.4, 3306.3, 10062.6),
                 "deepspeech2": (35.7, 60.4, 77.5), "imagenet": (216.6, 431.8, 1034.0),
                 "yolov3": (27.9, 13.5, 81.4), "ncf": (1537282.7, 1617380.8, 3057698.3)}
_SIA_APPS = ("cifar10", "deepspeech2", "yolov3", "bert", "imagenet")
_SIA_APP_PROBS = (0.8375, 0.0625, 0.04375, 0.0375, 0.01875)


_data_dir: Path | None = None


def set_data_dir(path: str | Path | None) -> None:
    """Read Sia's scale workloads and seed profiles from ``path`` (``allocopt bench --sia-data``):
    a folder holding ``sia/workloads/scale`` and ``sia/seed_profiles``; None: shipped data only."""
    global _data_dir
    _data_dir = None if path is None else Path(path)


def data_dir() -> Path | None:
    """The folder :func:`set_data_dir` chose, or None."""
    return _data_dir


def saturn_cluster(scale: int) -> Cluster:
    """Sia's saturn cluster scaled ``scale`` times (64 ``scale`` GPUs)."""
    return Cluster({t: n * GPUS_PER_NODE[t] * scale for t, n in SATURN_NODES.items()}, gpus_per_node=GPUS_PER_NODE)


def sia_jobs(n_jobs: int, seed: int, data_dir: Path | None = None, workload: int = 1
             ) -> tuple[list[str], np.ndarray, str]:
    """Applications and requested replicas of ``n_jobs`` jobs, and where they came from.

    From Sia's ``workloads/scale/scale_<N>x/workload-<workload>.csv`` under
    ``data_dir`` when ``n_jobs`` is a multiple of 160 and the file exists; else
    drawn with the application mix of those traces and 4-16 replicas.
    """
    scale, rest = divmod(n_jobs, SIA_JOBS_PER_SCALE)
    path = (data_dir / "sia" / "workloads" / "scale" / f"scale_{scale}x" / f"workload-{workload}.csv"
            if data_dir is not None and rest == 0 else None)
    if path is not None and path.exists():
        jobs = read_sia_workload(path)
        return [job.application for job in jobs], np.array([job.num_replicas for job in jobs]), str(path)
    rng = np.random.default_rng(seed)
    apps = rng.choice(_SIA_APPS, size=n_jobs, p=_SIA_APP_PROBS)
    return list(apps), rng.choice([4, 6, 8, 10, 12, 16], size=apps.size), "synthetic (seeded application mix)"


def per_gpu_throughput(apps: set[str], data_dir: Path | None = None) -> dict[str, np.ndarray]:
    """Best 1-GPU samples/s of each application on aws, rtx, dgx-ext (Sia's seed profiles:
    ``data_dir/sia/seed_profiles`` if given, else the subset shipped with allocopt, else
    :data:`FALLBACK_TPUT`)."""
    shipped = resources.files("allocopt") / "data" / "sia_profiles" / "seed_profiles"
    out = {}
    for app in apps:
        path = data_dir / "sia" / "seed_profiles" / f"{app}.csv" if data_dir is not None else None
        source = path if path is not None and path.exists() else shipped / f"{app}.csv"
        if not source.is_file():
            out[app] = np.array(FALLBACK_TPUT[app])
            continue
        with resources.as_file(source) as local:
            profile = read_seed_profile(local)
        out[app] = np.array([(profile[SEED_PROFILE_TYPE[t]].local_bsz / profile[SEED_PROFILE_TYPE[t]].iter_time_s).max()
                             for t in SATURN_NODES])
    return out


def synthetic_goodput(apps: list[str], replicas: np.ndarray, configs: Configurations,
                      tput: dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """Goodput (samples/s x statistical efficiency) of each job in each configuration.

    ``tput1[app, type] * gpus ** alpha_i * network(nodes, type) * efficiency(gpus)``
    with ``tput1`` the application's 1-GPU throughput, ``alpha_i`` the
    application's scaling exponent (:data:`SCALING`) +- 0.05, ``network`` 0.97
    per extra node (0.92 on aws's slower network), and ``efficiency = 1 / (1 +
    gpus / b_i)`` with a per-job gradient noise scale ``b_i`` log-uniform in
    [8, 256] GPUs; times a per-(job, type) log-normal factor (sigma 0.15). NaN
    (cannot use) above ``min(2 x requested replicas, 64)`` GPUs.
    """
    n = len(apps)
    base = np.stack([tput[a] for a in apps])  # (n, types)
    alpha = np.array([SCALING[a] for a in apps]) + rng.uniform(-0.05, 0.05, n)
    noise_scale = np.exp(rng.uniform(np.log(8), np.log(256), n))
    jitter = np.exp(rng.normal(0.0, 0.15, (n, base.shape[1])))
    t, g, nodes = configs.gpu_type, configs.num_gpus.astype(np.float64), configs.num_nodes
    hop = np.where(np.array(configs.gpu_type_names) == "aws", 0.92, 0.97)
    G = ((base * jitter)[:, t] * g[None, :] ** alpha[:, None] * (hop ** (nodes - 1))[None, :]
         / (1.0 + g[None, :] / noise_scale[:, None]))
    G[g[None, :] > np.minimum(2 * replicas, MAX_GPUS)[:, None]] = np.nan
    return G


def sia_rounds(n_jobs: int, seed: int = 0, *, data_dir: Path | None = None, workload: int = 1,
               capped: bool = True, steady: bool = True) -> tuple[dict[str, GoodputProblem], str]:
    """Sia scheduling rounds of ``n_jobs`` jobs on saturn scaled to ``ceil(n_jobs / 160)`` x 64 GPUs
    (5,120 jobs: 2,048 GPUs, the shape of Sia's ``scale_32x``), and the jobs' source.

    ``first``: no job has a previous configuration. ``steady`` (when asked; it
    solves ``first`` with HiGHS): every job has the configuration the first
    round gave it, goodput moved by a log-normal factor (sigma 0.1), restart
    factors from synthetic ages and restart counts, and 2% of the running jobs
    pinned. ``capped``: configurations limited to Sia's profiled node counts.
    """
    from allocopt.api import solve

    _check_size(n_jobs, 1)
    cluster = saturn_cluster(max(1, math.ceil(n_jobs / SIA_JOBS_PER_SCALE)))
    configs = sia_configurations(cluster, max_nodes=MAX_PHYSICAL_NODES if capped else None)
    apps, replicas, source = sia_jobs(n_jobs, seed, data_dir, workload)
    rng = np.random.default_rng(seed)
    G = synthetic_goodput(apps, replicas, configs, per_gpu_throughput(set(apps), data_dir), rng)
    ids = [f"{a}-{i}" for i, a in enumerate(apps)]
    rounds = {"first": GoodputProblem(G, configs, cluster, job_ids=ids)}
    if steady:
        previous = solve(rounds["first"], "sia").configuration
        age_s = rng.uniform(0, 4 * 3600, len(apps))
        restarts = rng.poisson(age_s / 1800)
        delay_s = np.array([RESTART_DELAY_S[a] for a in apps])
        r = np.clip(restart_factor(age_s, restarts, delay_s), 0.05, 1.0)
        pinned = (previous >= 0) & (rng.random(len(apps)) < 0.02)
        G_next = G * np.exp(rng.normal(0.0, 0.1, G.shape))
        rounds["steady"] = GoodputProblem(G_next, configs, cluster, job_ids=ids, previous=previous,
                                          restart_factor=r, pinned=pinned)
    return rounds, source
