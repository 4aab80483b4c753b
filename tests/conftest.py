"""Shared fixtures: backends parametrized with a skip reason where absent, and allocation checks."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import settings

from allocopt.backends import BACKENDS, get_backend

# CI runs the suite twice in one checkout (newest, then lowest versions): no example database, so
# the oldest Hypothesis never replays entries a newer one wrote (data_too_large health checks)
settings.register_profile("ci", database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

FEAS_TOL = 1e-6


def backend_param(name: str):
    reason = get_backend(name).unavailable_reason()
    return pytest.param(name, id=name, marks=pytest.mark.skipif(reason is not None, reason=reason or ""))


ALL_BACKENDS = [backend_param(name) for name in BACKENDS]


def assert_feasible(allocation, tol: float = FEAS_TOL) -> None:
    """Every allocation must satisfy the base constraints."""
    X = allocation.matrix
    problem = allocation.problem
    assert np.all(X >= -tol), "negative time fraction"
    time = allocation.time_fraction
    assert np.all(time <= 1 + tol), f"a job gets more than all of its time: {time.max()}"
    if allocation.pair_matrix is not None:
        assert np.all(allocation.pair_matrix >= -tol), "negative pair time fraction"
    used = allocation.gpus_used
    assert np.all(used <= problem.capacity + tol * max(1, problem.capacity.max())), \
        f"capacity exceeded: {used} > {problem.capacity}"
    assert np.all(X[~problem.runnable] <= tol), "time on a GPU type the job cannot run on"
