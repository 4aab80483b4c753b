"""How one job trains through a round in Sia's simulator (``Job.step`` and ``Job.update_local_bsz`` of
siasosp23/artifacts ``sia-simulator/job.py``), for :class:`allocopt.mechanism.sia_rounds.SiaPlanner`.

Sia's job re-chooses its batch size at every epoch boundary it crosses inside a
round, from a throughput model refitted to every step time it measured and the
gradient statistics of its last stretch of training; a short, many-epoch job
(CIFAR-10: 100 epochs in minutes) changes batch size tens of times a round.
Each stretch up to an epoch boundary takes a whole number of seconds (Sia
rounds it). The batch split respects the memory limit of the placement
(``get_max_local_bsz``) and of the replica count (the largest micro-batch
profiled at that many GPUs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from allocopt.throughput.goodput import GoodputModel, GradParams, PerfParams
from allocopt.throughput.profiles import ApplicationProfile, normalize_placement

_EPS = 1e-8  # Pollux's tolerance of ceil on batch sizes

#: Epochs a job trains in Sia's simulator (``applications.py``); other applications: every validated epoch.
MAX_EPOCHS: dict[str, int] = {"bert": 2, "cifar10": 100, "imagenet": 90}
#: Largest micro-batch Sia's policy assumes where it overrides the profile (``applications.py``:
#: deepspeech2 on rtx, 57 samples); the job itself runs up to its placement's profiled limit.
SIA_POLICY_MAX_LOCAL_BSZ: dict[tuple[str, str], int] = {("deepspeech2", "rtx"): 57}


def sia_epoch_ends(profile: ApplicationProfile) -> np.ndarray:
    """Sia's progress (the validation files' ``progress`` column) at the end of each epoch the job
    trains: ``get_progress(e + 1)``, the smallest over the validation curves."""
    curves = list(profile.validation.values())
    epochs = min(MAX_EPOCHS.get(profile.application, 10**9), *(c.progress.size for c in curves))
    return np.min([c.progress[:epochs] for c in curves], axis=0)


def epoch_ends(profile: ApplicationProfile) -> np.ndarray:
    """Progress samples (``M0``-equivalent) at the end of each epoch the job trains:
    :func:`sia_epoch_ends` times ``M0``."""
    return sia_epoch_ends(profile) * float(profile.init_batch_size)


def placement_max_local_bsz(profile: ApplicationProfile, placement: tuple[int, ...]) -> int:
    """Sia's ``get_max_local_bsz``: the largest micro-batch profiled for ``placement`` (any rotation);
    else of scalability rows with at least its nodes and GPUs; else the profile's largest."""
    key = normalize_placement(placement)
    rows = profile.placements.placement == key
    if rows.any():
        return int(profile.placements.local_bsz[rows].max())
    sc = profile.scalability
    if sc is not None:
        rows = (sc.num_nodes >= len(placement)) & (sc.num_replicas >= sum(placement))
        if rows.any():
            return int(sc.local_bsz[rows].max())
    return profile.max_local_bsz


def sia_optimize(model: GoodputModel, num_nodes: Any, num_replicas: Any, *, float32: bool = False
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:meth:`GoodputModel.optimize` in the arithmetic of Sia's simulator (Pollux's ``GoodputFunction.optimize``).

    Sia's search differs from allocopt's in details that move goodputs by up to
    1e-3: its 50 candidate batch sizes are ``numpy.geomspace`` values (in
    float32 when the policy passes float32 GPU counts, ``float32=True``; the
    job itself passes integers), the micro-batch is not capped so that the
    batch stays within ``max_batch_size``, a replica's network time is 1e-8 s
    and the retrogression factor ``max(K - 2, 1e-8)``, and the iteration time
    is ``exp(log(T_acc^g + T_net^g) / g)``. Returns (goodput, micro-batch,
    accumulation steps) of each (nodes, replicas), 0 where no candidate fits.
    """
    f = np.float32 if float32 else np.float64
    nodes, replicas = (np.asarray(a, dtype=f).ravel() for a in np.broadcast_arrays(num_nodes, num_replicas))
    perf, grad = model.perf_params, model.grad_params
    m0, lo, hi = model.init_batch_size, model.min_local_bsz, model.max_local_bsz
    smallest = np.maximum(f(m0), f(lo) * replicas)
    batch = np.geomspace(smallest, f(model.max_batch_size))  # (50, configurations), dtype f
    local = batch / replicas
    accum = np.ceil(local / f(hi) - f(_EPS)) - 1
    accum = np.where((replicas == 1) & (local > f(m0 + _EPS)), np.maximum(accum, 1), accum).astype(np.int64)
    micro = np.ceil(local.astype(np.float64) / (accum + 1) - _EPS).astype(np.int64)
    total = replicas.astype(np.float64) * micro * (accum + 1)
    t_acc = perf.alpha_c + perf.beta_c * micro
    inter, multi = nodes > 1, replicas > 1
    retro = np.maximum(replicas - 2, f(1e-8)).astype(np.float64)
    t_net = np.select([inter, multi], [perf.alpha_n, perf.alpha_r], 1e-8) + \
        np.select([inter, multi], [perf.beta_n, perf.beta_r], 1e-8) * retro
    t_iter = accum * t_acc + np.exp(np.log(t_acc ** perf.gamma + t_net ** perf.gamma) / perf.gamma)
    scale = total / m0
    denom = grad.var / scale + grad.sqr
    gain = np.where(denom > 0, (grad.var + grad.sqr) / np.where(denom > 0, denom, 1.0), 1.0)
    goodput = np.where((lo <= micro) & (micro <= hi), total / t_iter * (gain / scale), 0.0)
    best = np.argmax(goodput, axis=0)
    pick = np.arange(best.size)
    return goodput[best, pick], micro[best, pick], accum[best, pick]


def batch_split(profile: ApplicationProfile, placement: tuple[int, ...], perf: PerfParams | None,
                grad: GradParams | None) -> tuple[int, int]:
    """Sia's ``update_local_bsz``: (micro-batch, accumulation steps) of a job on ``placement``.

    Without a throughput model (``perf``) or gradient statistics the job runs its
    initial batch size (at least ``min_local_bsz`` per GPU) in the fewest
    accumulation steps that fit; with them, the goodput-optimal split of Sia's
    search (:func:`sia_optimize`). Then the micro-batch is cut to the largest
    profiled at this many GPUs and to ``max_batch_size / (GPUs x (steps + 1))``.
    """
    nodes, replicas = len(placement), int(sum(placement))
    max_local = placement_max_local_bsz(profile, placement)
    m0, lo = profile.init_batch_size, profile.min_local_bsz
    micro = accum = 0
    if perf is not None and grad is not None:
        model = GoodputModel(perf, grad, m0, profile.max_batch_size, max(max_local, lo), min_local_bsz=lo)
        _, m, s = sia_optimize(model, nodes, replicas)
        micro, accum = int(m[0]), int(s[0])
    if micro <= 0:
        batch = max(m0, lo * replicas)
        local = math.ceil(batch / replicas - 1e-8)
        accum = math.ceil(local / max_local - 1e-8) - 1
        if replicas == 1 and batch > m0:
            accum = max(1, accum)
        micro = math.ceil(local / (accum + 1) - 1e-8)
    same = profile.placements.num_replicas == replicas
    if same.any():
        micro = min(micro, int(profile.placements.local_bsz[same].max()))
    return min(micro, int(profile.max_batch_size / (replicas * (accum + 1)))), accum


@dataclass
class RoundSteps:
    """What a job did in one round of Sia's stepping.

    Attributes
    ----------
    progress : float
        Progress at the end in Sia's units (``M0``-equivalent samples / ``M0``).
    epoch : int
        Epochs completed.
    done_s : float or None
        Seconds of training after which it completed (None: it did not).
    batch_size : int
        Global batch size of its last stretch.
    grad : GradParams or None
        Gradient statistics of its last stretch (what it reports to the policy).
    """

    progress: float
    epoch: int
    done_s: float | None
    batch_size: int
    grad: GradParams | None


def step_round(profile: ApplicationProfile, placement: tuple[int, ...], progress: float, epoch: int,
               seconds: float, split: Callable[[], tuple[int, int]],
               measure: Callable[[tuple[int, int, int], float, float, GradParams], None], *,
               slowdown: float = 1.0, fallback_rate: Callable[[int, int], float] | None = None) -> RoundSteps:
    """Train one job for ``seconds`` on ``placement`` as Sia's ``Job.step``, in Sia's units and arithmetic.

    ``progress`` (and :attr:`RoundSteps.progress`) is Sia's: the validation
    files' ``progress`` column (samples of the initial batch size ``M0``,
    divided by ``M0``); times ``M0`` it is allocopt's. Each stretch runs the
    split ``split()`` returns at the step time Sia's simulator looks up for
    the placement (:meth:`ApplicationProfile.sia_times`), at the rate
    ``gain / (T_step + s (T_step - T_sync)) * (1 / slowdown)`` with ``gain``
    the statistical gain of the gradient statistics at that batch size and
    epoch; each stretch is reported to ``measure((nodes, replicas, micro),
    step_s, sync_s, grad)`` before it runs (the job's model learns from it),
    and the split is chosen again after it. A stretch that reaches the end
    of the epoch takes the rounded seconds to get there.
    ``fallback_rate(micro, accum)`` (samples/s before the gain) stands in
    where the profile has no step time.
    """
    ends = sia_epoch_ends(profile)
    m0 = float(profile.init_batch_size)
    calibration = 1.0 / slowdown
    nodes, replicas = len(placement), int(sum(placement))
    micro, accum = split()
    batch, grad, elapsed = replicas * micro * (accum + 1), None, 0.0
    while seconds > 0 and epoch < ends.size:
        batch = replicas * micro * (accum + 1)
        grad = profile.grad_params(batch, min(epoch, ends.size - 1))
        step, sync = profile.sia_times(placement, micro)
        if math.isfinite(step) and math.isfinite(sync):
            measure((nodes, replicas, micro), step, sync, grad)
            iteration_s = step + (step - sync) * accum
        elif fallback_rate is not None and fallback_rate(micro, accum) > 0:
            iteration_s = batch / fallback_rate(micro, accum)
        else:
            break
        scale = batch / m0
        denom = grad.var / scale + grad.sqr
        gain = (grad.var + grad.sqr) / denom if denom > 0 else 1.0
        rate = gain / iteration_s * 1.0 * calibration
        if not rate > 0:
            break
        if progress + rate * seconds < ends[epoch]:
            progress += rate * seconds
            elapsed += seconds
            seconds = 0.0
        else:
            delta = float(round(float((ends[epoch] - progress) / rate)))
            progress = float(ends[epoch])
            epoch += 1
            elapsed += delta
            seconds -= delta
            if epoch >= ends.size:
                return RoundSteps(progress, epoch, elapsed, batch, grad)
        micro, accum = split()
    return RoundSteps(progress, epoch, None, batch, grad)


__all__ = ["MAX_EPOCHS", "SIA_POLICY_MAX_LOCAL_BSZ", "RoundSteps", "batch_split", "epoch_ends", "sia_epoch_ends",
           "placement_max_local_bsz", "sia_optimize", "step_round"]
