"""Warm starts across similar problems: a solve's final simplex bases, mapped
onto the models of the next problem by job id.

Consecutive allocations (rounds of a simulation, an embedded engine) differ by
a few jobs. :class:`WarmStart` keeps, for each model a policy solved, the
block layout and the solution whose basis a later solve of the same model
(:func:`model_key`) starts from. Blocks whose leading axis is the job axis (``X`` rows,
per-job constraints) are matched by job id: new jobs start nonbasic at zero
with their rows basic (slack), departed jobs are dropped; blocks of the same
shape otherwise (capacity rows, scalars) are copied; anything else starts from
the default. The backend then repairs the basis count
(:func:`allocopt.backends.base.repair_basis`), so the result is always a valid
start, only a better or worse one.

Besides bases, a warm start carries the allocation it came from (``previous``:
min makespan and finish-time fairness keep it, with no LP, when it still
attains their lower bound) and per-policy ``hints`` (finish-time fairness'
``rho``; max-min fairness' GPU ``prices``, where price decomposition starts).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from allocopt.model import CompiledModel
from allocopt.solution import Basis, BasisStatus, Solution

Layout = dict[str, tuple[slice, tuple[int, ...]]]

#: A warm start is used only when at least this fraction of the new problem's jobs were in the old one.
MIN_KNOWN_FRACTION = 0.5


@dataclass(frozen=True)
class WarmStart:
    """The final solve of each model of an allocation, to start later solves from.

    Attributes
    ----------
    job_ids : tuple
        The jobs, in order, that the job axis of the blocks refers to.
    solves : mapping of :func:`model_key` to (variable layout, constraint layout, Solution)
    previous : (job ids, ndarray) or None
        The allocation this warm start came from: its jobs and time fractions (n_jobs, n_gpu_types),
        for a policy that can certify it is still optimal (finish-time fairness).
    hints : mapping of str to float or tuple of floats
        Values a policy keeps for its next solve (finish-time fairness: the optimal ``rho``,
        where its search starts; max-min fairness: the GPU types' ``prices``, where price
        decomposition starts).
    """

    job_ids: tuple[Hashable, ...]
    solves: Mapping[str, tuple[Layout, Layout, Solution]]
    hints: Mapping[str, float | tuple[float, ...]] = field(default_factory=dict)
    previous: tuple[tuple[Hashable, ...], np.ndarray] | None = None

    def previous_matrix(self, job_ids: Sequence[Hashable]) -> np.ndarray | None:
        """The previous allocation's time fractions in the order of ``job_ids`` (zeros for new jobs),
        or None when there is none."""
        if self.previous is None:
            return None
        ids, matrix = self.previous
        index = old_positions(tuple(ids), tuple(job_ids))
        out = np.zeros((len(job_ids), matrix.shape[1]))
        out[index >= 0] = matrix[index[index >= 0]]
        return out

    def basis_for(self, model: CompiledModel, job_ids: Sequence[Hashable]) -> Basis | None:
        """A start for ``model``, whose job axis holds ``job_ids``; None when no
        model of that name was solved to an optimal basis, or when fewer than
        :data:`MIN_KNOWN_FRACTION` of the jobs were in it (a cold solve, which
        may use an interior-point method, is then the better start)."""
        entry = self.solves.get(model_key(model))
        if entry is None:
            return None
        old_index = old_positions(self.job_ids, tuple(job_ids))
        if np.count_nonzero(old_index >= 0) < MIN_KNOWN_FRACTION * len(job_ids):
            return None
        variables, constraints, solution = entry
        basis = solution.basis
        if basis is None:
            return None
        jobs = (len(self.job_ids), len(job_ids))
        return Basis(_map_blocks(basis.col_status, variables, model.variables, BasisStatus.LOWER, old_index, jobs),
                     _map_blocks(basis.row_status, constraints, model.constraints, BasisStatus.BASIC, old_index, jobs))


def old_positions(old: tuple[Hashable, ...], new: tuple[Hashable, ...]) -> np.ndarray:
    """Index in ``old`` of each job of ``new`` (-1 for a new job): by sorted search when both are
    integer ids, else through a dict."""
    if new == old:  # the same jobs (new throughputs or capacity)
        return np.arange(len(new))
    old_ids, new_ids = np.asarray(old), np.asarray(new)
    if old_ids.ndim == new_ids.ndim == 1 and old_ids.size and old_ids.dtype.kind in "iu" \
            and new_ids.dtype.kind in "iu":
        order = np.argsort(old_ids, kind="stable")
        at = order[np.minimum(np.searchsorted(old_ids, new_ids, sorter=order), old_ids.size - 1)]
        return np.where(old_ids[at] == new_ids, at, -1).astype(np.int64)
    position = {job: i for i, job in enumerate(old)}
    return np.fromiter((position.get(job, -1) for job in new), dtype=np.int64, count=len(new))


def model_key(model: CompiledModel) -> str:
    """What identifies "the same model" across solves: its name and block names
    (an iterative policy's different LPs share a name but not their blocks)."""
    return f"{model.name}|{','.join(model.variables)}|{','.join(model.constraints)}"


def _map_blocks(status: np.ndarray, old: Layout, new: Layout, default: BasisStatus,
                old_index: np.ndarray, jobs: tuple[int, int]) -> np.ndarray:
    size = sum(int(np.prod(shape, dtype=np.int64)) for _, shape in new.values())
    out = np.full(size, default, dtype=np.int8)
    for name, (index, shape) in new.items():
        if name not in old:
            continue
        old_slice, old_shape = old[name]
        block = status[old_slice].reshape(old_shape)
        if len(shape) and len(old_shape) and (old_shape[0], shape[0]) == jobs and old_shape[1:] == shape[1:]:
            # the job axis (when the number of jobs equals another axis' length, e.g. GPU
            # types, that axis is mapped the same way: a worse start, never a wrong answer)
            mapped = np.full(shape, default, dtype=np.int8)
            known = old_index >= 0
            mapped[known] = block[old_index[known]]
            out[index] = mapped.ravel()
        elif old_shape == shape:
            out[index] = block.ravel()
    return out
