"""Optimus's speed model: a job's step time as a function of its worker count, fitted by NNLS.

Optimus (Peng et al., EuroSys 2018, section 3.2) models a data-parallel job's
training speed on ``w`` workers (for a fixed global batch) from the time of one
step: the batch's compute split over the workers, a constant, and
synchronization that grows with the workers::

    step_s(w) = theta0 / w + theta1 + theta2 * w,     theta >= 0
    speed(w) = 1 / step_s(w)                           (steps/s)

and fits ``theta`` to a few measured speeds by non-negative least squares
(Optimus's parameter-server form has a separate count of servers; with
all-reduce, as allocopt's executors run data-parallel jobs, it drops out).
``step_s`` is convex in ``w``, so the remaining time of a job is too, which
is what makes Optimus's greedy (:mod:`allocopt.formulations.optimus`) exact for
unit steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import nnls

from allocopt.errors import InvalidProblemError


@dataclass(frozen=True)
class OptimusSpeedModel:
    """``step_s(w) = theta0 / w + theta1 + theta2 * w`` (seconds per step on ``w`` workers), all ``theta >= 0``."""

    theta0: float
    theta1: float
    theta2: float

    def step_seconds(self, workers: Any) -> np.ndarray:
        """Seconds per step on ``workers`` (array-like of numbers >= 1)."""
        w = np.asarray(workers, dtype=np.float64)
        return self.theta0 / w + self.theta1 + self.theta2 * w

    def speed(self, workers: Any) -> np.ndarray:
        """Steps/s on ``workers``; inf where the step time is 0."""
        step = self.step_seconds(workers)
        return np.divide(1.0, step, out=np.full(step.shape, np.inf), where=step > 0)


def fit_optimus_speed(workers: Any, speed: Any) -> OptimusSpeedModel:
    """Fit Optimus's model to measured speeds (NNLS on ``1 / speed``, Optimus's fit).

    Parameters
    ----------
    workers : array-like of int of shape (m,)
        Worker (GPU) count of each measurement, >= 1.
    speed : array-like of float of shape (m,)
        Measured steps/s (or any rate of a fixed unit of work) at each count, > 0.

    Returns
    -------
    OptimusSpeedModel
        With fewer than three distinct counts the fit is not unique; NNLS returns one of them.

    Raises
    ------
    InvalidProblemError
        For mismatched shapes, no measurement, a count below 1 or a speed that is not finite and positive.
    """
    w = np.asarray(workers, dtype=np.float64).ravel()
    f = np.asarray(speed, dtype=np.float64).ravel()
    if w.shape != f.shape or not w.size:
        raise InvalidProblemError(f"fit_optimus_speed needs one speed per worker count and at least one, got "
                                  f"{w.size} counts and {f.size} speeds", field="speed")
    bad = np.flatnonzero(~(np.isfinite(w) & (w >= 1)))
    if bad.size:
        raise InvalidProblemError(f"worker count {w[bad[0]]} (measurement {bad[0]}) must be >= 1", field="workers")
    bad = np.flatnonzero(~(np.isfinite(f) & (f > 0)))
    if bad.size:
        raise InvalidProblemError(f"speed {f[bad[0]]} (measurement {bad[0]}) must be finite and > 0",
                                  field="speed")
    design = np.column_stack([1.0 / w, np.ones_like(w), w])
    theta, _ = nnls(design, 1.0 / f)
    return OptimusSpeedModel(*(float(t) for t in theta))


__all__ = ["OptimusSpeedModel", "fit_optimus_speed"]
