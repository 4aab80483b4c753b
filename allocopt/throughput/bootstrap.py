"""Bootstrapping goodput models across GPU types from 1-GPU profiles (as Sia does).

A new job is profiled on one GPU of every type (cheap), but multi-GPU
measurements exist only where it has run. Sia estimates the job's multi-GPU
goodput on a type it has not run on with several GPUs by scaling the goodput
model of a type where it has, by the ratio of their 1-GPU throughputs; once
the job has multi-GPU observations on a type, that type's own fit is used.
:func:`throughput_ratio` and :func:`project` do one projection;
:class:`BootstrappedJob` keeps a job's observations per type and hands out a
:class:`~allocopt.throughput.goodput.GoodputModel` per type, refitting (warm
started) only the types whose observations changed.

Scaling every time parameter by ``1 / ratio`` multiplies throughput by
``ratio`` at every configuration (the model is homogeneous of degree 1 in its
times), which is Sia's "goodput x throughput ratio". Unlike Sia, the
projected model keeps the target configuration's own node count and uses the
target type's memory limit (largest 1-GPU micro-batch measured there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from allocopt.errors import InvalidProblemError
from allocopt.throughput.goodput import GoodputModel, GradParams, PerfParams
from allocopt.throughput.profiles import Observations


def throughput_ratio(target: Observations, reference: Observations) -> float:
    """How many times faster one GPU of the target type runs the job than one of the reference type.

    The geometric mean of ``T_ref(m) / T_target(m)`` (1-GPU iteration times,
    linearly interpolated in ``m``, repeated sizes averaged) over the
    micro-batch sizes measured on either type within the range measured on
    both; ``throughput_ratio(a, b) == 1 / throughput_ratio(b, a)``.

    Parameters
    ----------
    target, reference : Observations
        Rows with ``num_replicas == 1`` are used (e.g. seed profiles).

    Raises
    ------
    InvalidProblemError
        If either has no 1-GPU row or their micro-batch ranges do not overlap.
    """
    curves = []
    for name, obs in (("target", target), ("reference", reference)):
        one = obs.num_replicas == 1
        if not one.any():
            raise InvalidProblemError(f"the {name} observations have no 1-GPU row", field=name)
        sizes, inverse = np.unique(obs.local_bsz[one], return_inverse=True)
        curves.append((sizes.astype(np.float64), np.bincount(inverse, weights=obs.iter_time_s[one])
                       / np.bincount(inverse)))
    (m_t, t_t), (m_r, t_r) = curves
    lo, hi = max(m_t[0], m_r[0]), min(m_t[-1], m_r[-1])
    if lo > hi:
        raise InvalidProblemError(f"1-GPU micro-batch sizes do not overlap: target {m_t[0]:g}..{m_t[-1]:g}, "
                                  f"reference {m_r[0]:g}..{m_r[-1]:g}", field="local_bsz")
    sizes = np.union1d(m_t, m_r)
    sizes = sizes[(sizes >= lo) & (sizes <= hi)]
    return float(np.exp(np.mean(np.log(np.interp(sizes, m_r, t_r) / np.interp(sizes, m_t, t_t)))))


def project(model: GoodputModel, ratio: float, *, max_local_bsz: int | None = None) -> GoodputModel:
    """``model`` (fitted on a reference type) for a type ``ratio`` times as fast.

    Every time parameter is divided by ``ratio``, so throughput and goodput
    are ``ratio`` times the reference's in every configuration; gradient
    statistics and batch limits are kept, except the memory limit
    ``max_local_bsz`` where given (the target type's).
    """
    if not (np.isfinite(ratio) and ratio > 0):
        raise InvalidProblemError(f"throughput ratio must be finite and > 0, got {ratio}", field="ratio")
    return replace(model, perf_params=model.perf_params.scaled(1.0 / ratio),
                   max_local_bsz=model.max_local_bsz if max_local_bsz is None else int(max_local_bsz))


class BootstrappedJob:
    """One job's goodput models on every GPU type, projected where it has no multi-GPU observations.

    Parameters
    ----------
    seed : mapping of str to Observations
        1-GPU observations of the job on every GPU type it may run on (e.g.
        from :func:`~allocopt.throughput.profiles.read_seed_profile`).
    grad_params : GradParams
    init_batch_size, max_batch_size : int
        The job's global batch size range (samples).
    max_local_bsz : mapping of str to int, optional
        Largest micro-batch per GPU of each type; default the largest 1-GPU micro-batch in ``seed``.
    min_local_bsz : int, default 1

    Notes
    -----
    The model of a type is

    * its own fit (seed plus observations there) once the job has a
      multi-GPU observation on it;
    * else, if some type has multi-GPU observations, the fit of the type with
      the most of them, projected by :func:`project` with the 1-GPU
      :func:`throughput_ratio` of the two types' seeds;
    * else its own fit of the 1-GPU seed (Pollux's priors: synchronization
      costs pinned near 0 until observed).

    Examples
    --------
    >>> from allocopt.throughput.profiles import read_seed_profile, shipped_profiles_dir
    >>> seed = read_seed_profile(shipped_profiles_dir() / "seed_profiles" / "cifar10.csv")
    >>> job = BootstrappedJob(seed, GradParams(1.0, 10.0), init_batch_size=128, max_batch_size=4096)
    >>> job.projected_from("rtx") is None  # no multi-GPU data anywhere: each type fits its own seed
    True
    """

    def __init__(self, seed: Mapping[str, Observations], grad_params: GradParams, *, init_batch_size: int,
                 max_batch_size: int, max_local_bsz: Mapping[str, int] | None = None, min_local_bsz: int = 1):
        if not seed:
            raise InvalidProblemError("seed must give 1-GPU observations on at least one GPU type", field="seed")
        self._observations = {str(t): obs for t, obs in seed.items()}
        self._seed = dict(self._observations)
        limits = dict(max_local_bsz or {})
        unknown = sorted(set(limits) - set(self._seed))
        if unknown:
            raise InvalidProblemError(f"max_local_bsz names GPU type(s) {unknown} without a seed profile",
                                      field="max_local_bsz")
        self._max_local = {t: int(limits.get(t, obs.local_bsz.max())) for t, obs in self._seed.items()}
        self.grad_params = grad_params
        self.init_batch_size = int(init_batch_size)
        self.max_batch_size = int(max_batch_size)
        self.min_local_bsz = int(min_local_bsz)
        self._fits: dict[str, PerfParams] = {}
        self._stale = set(self._seed)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The GPU types the job has a model for."""
        return tuple(self._seed)

    def observe(self, gpu_type: str, observations: Observations) -> None:
        """Add measured iterations of the job on ``gpu_type``; its model is refitted on next use."""
        self._check_type(gpu_type)
        self._observations[gpu_type] = Observations.concat([self._observations[gpu_type], observations])
        self._stale.add(gpu_type)

    def observations(self, gpu_type: str) -> Observations:
        """Seed plus observed rows of ``gpu_type``."""
        self._check_type(gpu_type)
        return self._observations[gpu_type]

    def projected_from(self, gpu_type: str) -> str | None:
        """The type whose model is projected onto ``gpu_type``, or None where it uses its own fit."""
        self._check_type(gpu_type)
        multi = {t: int(np.count_nonzero(obs.num_replicas > 1)) for t, obs in self._observations.items()}
        if multi[gpu_type] or not any(multi.values()):
            return None
        return max(multi, key=lambda t: multi[t])  # first of the types with the most, in seed order

    def model(self, gpu_type: str) -> GoodputModel:
        """The job's :class:`GoodputModel` on ``gpu_type``."""
        source = self.projected_from(gpu_type)
        own = source is None
        fitted = GoodputModel(self._fit(gpu_type if own else source), self.grad_params, self.init_batch_size,
                              self.max_batch_size, self._max_local[gpu_type if own else source],
                              min_local_bsz=self.min_local_bsz)
        if own:
            return fitted
        ratio = throughput_ratio(self._seed[gpu_type], self._seed[source])
        return project(fitted, ratio, max_local_bsz=self._max_local[gpu_type])

    def models(self) -> dict[str, GoodputModel]:
        """:meth:`model` of every GPU type, e.g. one entry of :func:`~allocopt.throughput.goodput.goodput_matrix`."""
        return {t: self.model(t) for t in self._seed}

    def _fit(self, gpu_type: str) -> PerfParams:
        if gpu_type in self._stale:
            self._fits[gpu_type] = self._observations[gpu_type].fit(initial=self._fits.get(gpu_type))
            self._stale.discard(gpu_type)
        return self._fits[gpu_type]

    def _check_type(self, gpu_type: str) -> None:
        if gpu_type not in self._seed:
            raise InvalidProblemError(f"unknown GPU type {gpu_type!r}; the job has seed profiles on "
                                      f"{list(self._seed)}", field="gpu_type")


__all__ = ["BootstrappedJob", "project", "throughput_ratio"]
