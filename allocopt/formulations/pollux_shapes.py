"""What a Pollux job may choose in a round: the shapes worth building (GPU type, one node or several,
replicas) with their objective coefficients, and keeping its previous allocation. Both exact models of
:mod:`allocopt.formulations.pollux` (per node) and :mod:`allocopt.formulations.pollux_groups` (per group of
identical nodes) are built over these choices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from allocopt.pollux_problem import PolluxProblem

#: Zero gap also in absolute terms (HiGHS stops at an absolute gap of 1e-6 by default; the objective
#: is a sum of values near ``eps ** p`` = 1000 per job, so that gap hid differences of 1e-8 in the fitness).
ZERO_GAP = {"highs": {"mip_abs_gap": 0.0}, "scipy": {}, "gurobi": {"MIPGapAbs": 0.0}}

def shape_entries(problem: PolluxProblem, p: float, scale: float, epsilon: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The shapes worth building: job, type, spread (0 one node, 1 several), replicas and
    coefficient ``U - eps ** p`` of each, sorted by job (see the module docstring)."""
    S = problem.speedup
    n, T, _, R1 = S.shape
    r = np.arange(R1)
    gpus, types = problem.node_gpus, problem.node_type
    if T == 1:
        largest = np.array([gpus.max(initial=0)])
        total = np.array([gpus.sum()])
        nodes = np.array([gpus.size])
    else:
        largest = np.array([gpus[types == t].max(initial=0) for t in range(T)])
        total = np.array([gpus[types == t].sum() for t in range(T)])
        nodes = np.bincount(types, minlength=T)
    fits = np.zeros((n, T, 2, R1), dtype=bool)
    fits[:, :, 0, :] = (r[None, :] <= largest[:, None])[None]
    spread_ok = (r[None, None, :] <= np.minimum(total[None, :, None], problem.max_nodes[:, None, None]
                                                * largest[None, :, None])) \
        & (nodes[None, :, None] >= 2) & (problem.max_nodes[:, None, None] >= 2) & (r >= 2)
    fits[:, :, 1, :] = spread_ok
    valid = (S > 0) & fits
    idle = epsilon ** p
    U = (scale * S * problem.restart_factor[:, None, None, None] + epsilon) ** p
    coef = np.where(valid, U - idle, np.inf)
    best_before = np.minimum.accumulate(np.concatenate([np.zeros((n, T, 2, 1)), coef[..., :-1]], axis=3), axis=3)
    keep = valid & (coef < best_before) & (coef < 0)
    job, t, s, rep = np.nonzero(keep)
    return job, t, s, rep, coef[job, t, s, rep]


@dataclass
class _Choices:
    """Everything a job may choose: shapes ``job, t, s, rep`` with coefficients ``coef``, and keeping
    the previous allocation (``keepers``, coefficients ``kcoef``)."""

    job: np.ndarray
    t: np.ndarray
    s: np.ndarray
    rep: np.ndarray
    coef: np.ndarray
    keepers: np.ndarray
    kcoef: np.ndarray
    ktype: np.ndarray  # group (type, or 0 unaware) of each keeper's previous nodes
    kspread: np.ndarray  # 1 where a keeper's previous allocation spans several nodes


def choices(problem: PolluxProblem, p: float, scale: float, epsilon: float) -> _Choices:
    """Shapes worth building (:func:`shape_entries`) and the jobs that may keep their allocation."""
    job, t, s, rep, coef = shape_entries(problem, p, scale, epsilon)
    prev = problem.previous
    prev_total, prev_nodes = prev.sum(axis=1), np.count_nonzero(prev, axis=1)
    keep_value = (scale * problem.speedup_of(prev) + epsilon) ** p - epsilon ** p
    keepers = np.flatnonzero((prev_total > 0) & (keep_value < 0) & (prev_nodes <= problem.max_nodes))
    first = np.argmax(prev[keepers] > 0, axis=1) if keepers.size else np.zeros(0, dtype=np.int64)
    ktype = problem.node_type[first] if problem.speedup.shape[1] > 1 else np.zeros(keepers.size, dtype=np.int64)
    return _Choices(job, t, s, rep, coef, keepers, keep_value[keepers], ktype,
                    (prev_nodes[keepers] > 1).astype(np.float64))


def _by_job(n: int, rows: np.ndarray, values: Any, width: int) -> sp.csr_matrix:
    values = np.broadcast_to(np.asarray(values, dtype=np.float64), rows.shape)
    return sp.csr_matrix((values, (rows, np.arange(rows.size))), shape=(n, width))
