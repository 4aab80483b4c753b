"""The answer of a policy: time fractions of each job on each GPU type."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from allocopt.errors import BackendNotInstalledError
from allocopt.problem import Problem
from allocopt.solution import Status


@dataclass(frozen=True)
class Timings:
    """Wall-clock seconds spent on one allocation.

    ``model_build_s``: formulating and compiling models; ``solver_build_s``:
    handing them to the solver; ``solve_s``: inside the solver; ``total_s``:
    everything, validation of options included. ``num_solves`` counts solver
    calls (iterative policies make several).
    """

    model_build_s: float = 0.0
    solver_build_s: float = 0.0
    solve_s: float = 0.0
    total_s: float = 0.0
    num_solves: int = 0

    def to_dict(self) -> dict[str, float]:
        return {"model_build_s": self.model_build_s, "solver_build_s": self.solver_build_s,
                "solve_s": self.solve_s, "total_s": self.total_s, "num_solves": self.num_solves}


@dataclass(frozen=True)
class Allocation:
    """Time fractions ``matrix[i, j]`` of job ``i`` on GPU type ``j``.

    Attributes
    ----------
    problem : Problem
    matrix : ndarray of shape (n_jobs, n_gpu_types)
        Fraction of wall-clock time each job runs on ``scale_factor`` GPUs of each type.
    policy : str
    backend : str or None
        None for closed-form policies.
    status : Status
        ``OPTIMAL`` unless ``best_effort=True`` returned something else.
    objective : float or None
        The policy's objective (e.g. the minimum normalized throughput for
        max-min fairness); None for closed-form shares.
    message : str
    timings : Timings
    extras : dict
        Policy-specific results (e.g. ``deadline_met`` for max_throughput).
    """

    problem: Problem
    matrix: np.ndarray
    policy: str
    backend: str | None
    status: Status
    objective: float | None
    message: str
    timings: Timings = field(default_factory=Timings)
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def job_ids(self) -> tuple[Hashable, ...]:
        return self.problem.job_ids

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return self.problem.gpu_types

    @property
    def success(self) -> bool:
        return self.status is Status.OPTIMAL

    @property
    def effective_throughput(self) -> np.ndarray:
        """Steps/s each job makes under this allocation, shape (n_jobs,)."""
        return (self.problem.throughputs * self.matrix).sum(axis=1)

    @property
    def normalized_throughput(self) -> np.ndarray:
        """Effective throughput over the cluster-proportional throughput, shape (n_jobs,)."""
        return self.effective_throughput / self.problem.proportional_throughputs

    @property
    def gpus_used(self) -> np.ndarray:
        """Average GPUs of each type in use, ``sum_i s_i X[i, j]``, shape (n_gpu_types,)."""
        return self.problem.scale_factors @ self.matrix

    def to_dict(self) -> dict[Hashable, dict[str, float]]:
        """``{job_id: {gpu_type: fraction}}``."""
        types = self.gpu_types
        return {job: dict(zip(types, row)) for job, row in zip(self.job_ids, self.matrix.tolist())}

    def to_frame(self):
        """A pandas DataFrame indexed by job id with one column per GPU type."""
        try:
            import pandas as pd
        except ImportError:
            raise BackendNotInstalledError("Allocation.to_frame needs pandas: pip install 'allocopt[pandas]'") from None
        return pd.DataFrame(self.matrix, index=list(self.job_ids), columns=list(self.gpu_types))

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable summary (what ``allocopt solve`` writes)."""
        ids = [j.item() if isinstance(j, np.generic) else j for j in self.job_ids]
        return {"policy": self.policy, "backend": self.backend, "status": self.status.value,
                "message": self.message, "objective": self.objective,
                "gpu_types": list(self.gpu_types),
                "allocation": [{"id": j, "fractions": dict(zip(self.gpu_types, row)),
                                "effective_throughput": float(e)}
                               for j, row, e in zip(ids, self.matrix.tolist(), self.effective_throughput)],
                "timings": self.timings.to_dict()}

    def __repr__(self) -> str:
        obj = "None" if self.objective is None else f"{self.objective:.6g}"
        return (f"Allocation(policy={self.policy!r}, backend={self.backend!r}, status={self.status.value}, "
                f"objective={obj}, n_jobs={len(self.job_ids)}, gpu_types={self.gpu_types})")
