"""The answer of a policy: time fractions of each job on each GPU type."""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

from allocopt.errors import BackendNotInstalledError, InvalidProblemError
from allocopt.jsonio import JsonSource, document_or_write, read_json
from allocopt.problem import Problem
from allocopt.solution import Status
from allocopt.warm_start import WarmStart


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
        """The timings as a dict of seconds (and ``num_solves``)."""
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
    pair_matrix : ndarray of shape (n_pairs, n_gpu_types) or None
        Under space sharing, the time fraction each pair of ``problem.pairs``
        shares GPUs of each type.
    extras : dict
        Policy-specific results (e.g. ``deadline_met`` for max_throughput).
    warm_start : WarmStart or None
        The solver bases of this allocation's LPs (HiGHS, Gurobi), for
        ``allocopt.solve(..., warm_start=this_allocation)`` on a similar problem.
    """

    problem: Problem
    matrix: np.ndarray
    policy: str
    backend: str | None
    status: Status
    objective: float | None
    message: str
    timings: Timings = field(default_factory=Timings)
    pair_matrix: np.ndarray | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    warm_start: WarmStart | None = field(default=None, repr=False, compare=False)

    @property
    def job_ids(self) -> tuple[Hashable, ...]:
        """The problem's job ids, in order."""
        return self.problem.job_ids

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The problem's GPU type names, in order."""
        return self.problem.gpu_types

    @property
    def success(self) -> bool:
        """Whether the status is ``OPTIMAL``."""
        return self.status is Status.OPTIMAL

    @property
    def effective_throughput(self) -> np.ndarray:
        """Steps/s each job makes under this allocation (alone and in pairs), shape (n_jobs,)."""
        e = (self.problem.throughputs * self.matrix).sum(axis=1)
        if self.pair_matrix is not None:
            pair_steps = self.pair_matrix[:, :, None] * self.problem.pair_throughput_array
            for member in (0, 1):
                np.add.at(e, self.problem.pairs[:, member], pair_steps[:, :, member].sum(axis=1))
        return e

    @property
    def time_fraction(self) -> np.ndarray:
        """Total fraction of time each job runs (alone and in pairs), shape (n_jobs,)."""
        t = self.matrix.sum(axis=1)
        if self.pair_matrix is not None:
            for member in (0, 1):
                np.add.at(t, self.problem.pairs[:, member], self.pair_matrix.sum(axis=1))
        return t

    @property
    def normalized_throughput(self) -> np.ndarray:
        """Effective throughput over the cluster-proportional throughput ``e_i / p_i``, shape (n_jobs,)."""
        return self.effective_throughput / self.problem.proportional_throughputs

    @property
    def fair_share_ratio(self) -> np.ndarray:
        """``s_i e_i / (w_i p_i)``, the quantity whose minimum max_min_fairness maximizes, shape (n_jobs,).

        The scale factor makes a job on ``s_i`` GPUs comparable with single-GPU
        jobs; the weight divides its entitlement."""
        p = self.problem
        return self.normalized_throughput * p.scale_factors / p.priority_weights

    @property
    def gpus_used(self) -> np.ndarray:
        """Average GPUs of each type in use (a pair counts once), shape (n_gpu_types,)."""
        used = self.problem.scale_factors @ self.matrix
        if self.pair_matrix is not None:
            used = used + self.problem.scale_factors[self.problem.pairs[:, 0]] @ self.pair_matrix
        return used

    def to_dict(self) -> dict[Hashable, dict[str, float]]:
        """``{job_id: {gpu_type: fraction}}``, plus ``{(job_a, job_b): {...}}``
        for pairs under space sharing (Gavel's layout)."""
        types = self.gpu_types
        out = {job: dict(zip(types, row)) for job, row in zip(self.job_ids, self.matrix.tolist())}
        if self.pair_matrix is not None:
            ids = self.job_ids
            for (a, b), row in zip(self.problem.pairs.tolist(), self.pair_matrix.tolist()):
                out[(ids[a], ids[b])] = dict(zip(types, row))
        return out

    def to_frame(self):
        """A pandas DataFrame indexed by job id with one column per GPU type."""
        try:
            import pandas as pd
        except ImportError:
            raise BackendNotInstalledError("Allocation.to_frame needs pandas: pip install 'allocopt[pandas]'") from None
        return pd.DataFrame(self.matrix, index=list(self.job_ids), columns=list(self.gpu_types))

    @overload
    def to_json(self, path: None = None) -> dict[str, Any]: ...

    @overload
    def to_json(self, path: str | os.PathLike[str]) -> None: ...

    def to_json(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
        """A JSON summary (what ``allocopt solve`` writes); written to ``path`` when given."""
        ids = [j.item() if isinstance(j, np.generic) else j for j in self.job_ids]
        doc: dict[str, Any] = {
            "policy": self.policy, "backend": self.backend, "status": self.status.value,
            "message": self.message, "objective": self.objective, "gpu_types": list(self.gpu_types),
            "allocation": [{"id": j, "fractions": dict(zip(self.gpu_types, row)), "effective_throughput": float(e)}
                           for j, row, e in zip(ids, self.matrix.tolist(), self.effective_throughput)],
            "timings": self.timings.to_dict()}
        if self.pair_matrix is not None:
            doc["pairs"] = [{"jobs": [ids[a], ids[b]], "fractions": dict(zip(self.gpu_types, row))}
                            for (a, b), row in zip(self.problem.pairs.tolist(), self.pair_matrix.tolist())]
        return document_or_write(doc, path)

    @classmethod
    def from_json(cls, source: JsonSource, problem: Problem) -> Allocation:
        """An allocation of ``problem`` from :meth:`to_json`'s document, or the path of a JSON file holding one.

        The document holds the fractions, not the problem: pass the problem it
        was solved for (e.g. ``Problem.from_json("problem.json")``). Jobs, pairs
        and GPU types are matched by id and name; a GPU type a job lacks is 0.
        The solver bases are not saved, so the result cannot warm-start a solve.

        Raises
        ------
        InvalidProblemError
            Naming the entry, for a job missing from the document or not in
            ``problem``, an unknown GPU type or a fraction that is not a number
            in [0, 1].
        """
        data = read_json(source, what="allocation")
        if not isinstance(data, Mapping) or not isinstance(data.get("allocation"), list):
            raise InvalidProblemError("an allocation document needs an 'allocation' list (as Allocation.to_json "
                                      "writes it)", field="document")
        index = {job.item() if isinstance(job, np.generic) else job: i for i, job in enumerate(problem.job_ids)}
        column = {t: j for j, t in enumerate(problem.gpu_types)}

        def row_of(job: Any) -> int:
            return index.get(job, -1) if isinstance(job, (str, int, float)) else -1

        def fill(target: np.ndarray, row: int, fractions: Any, where: str) -> None:
            if not isinstance(fractions, Mapping):
                raise InvalidProblemError(f"{where}: 'fractions' must map GPU type to time fraction", field=where)
            for gpu_type, value in fractions.items():
                if gpu_type not in column:
                    raise InvalidProblemError(f"{where}: unknown GPU type {gpu_type!r}; the problem's types are "
                                              f"{list(problem.gpu_types)}", field=where)
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not -1e-9 <= value <= 1 + 1e-9:
                    raise InvalidProblemError(f"{where}: the fraction on {gpu_type!r} is {value!r}; give a number "
                                              "in [0, 1]", field=where)
                target[row, column[gpu_type]] = value

        matrix = np.zeros((problem.num_jobs, len(column)))
        seen: set[int] = set()
        for k, entry in enumerate(data["allocation"]):
            where = f"allocation[{k}]"
            job = entry.get("id") if isinstance(entry, Mapping) else None
            row = row_of(job)
            if row < 0 or row in seen:
                raise InvalidProblemError(f"{where}: job id {job!r} is not a job of the problem, or appears twice",
                                          field=where)
            seen.add(row)
            fill(matrix, row, entry.get("fractions"), where)
        if len(seen) != problem.num_jobs:
            missing = next(j for j, i in index.items() if i not in seen)
            raise InvalidProblemError(f"job {missing!r} of the problem is missing from 'allocation'",
                                      field="allocation", job=missing)
        pair_matrix = None
        if problem.pairs is not None:
            slot = {(int(a), int(b)): p for p, (a, b) in enumerate(problem.pairs.tolist())}
            pair_matrix = np.zeros((len(slot), len(column)))
            for k, entry in enumerate(data.get("pairs", [])):
                where = f"pairs[{k}]"
                ids = entry.get("jobs") if isinstance(entry, Mapping) else None
                rows = tuple(sorted(row_of(j) for j in ids)) if isinstance(ids, list) and len(ids) == 2 else ()
                if rows not in slot:
                    raise InvalidProblemError(f"{where}: {ids!r} is not a pair of the problem", field=where)
                fill(pair_matrix, slot[rows], entry.get("fractions"), where)
        elif data.get("pairs"):
            raise InvalidProblemError("the document has 'pairs' but the problem has no pair throughputs",
                                      field="pairs")
        try:
            status = Status(data.get("status", Status.OPTIMAL.value))
            timings = Timings(**data.get("timings", {}))
        except (TypeError, ValueError) as err:
            raise InvalidProblemError(f"malformed 'status' or 'timings': {err}", field="document") from None
        return cls(problem, matrix, str(data.get("policy", "")), data.get("backend"), status, data.get("objective"),
                   str(data.get("message", "")), timings, pair_matrix)

    def __repr__(self) -> str:
        obj = "None" if self.objective is None else f"{self.objective:.6g}"
        return (f"Allocation(policy={self.policy!r}, backend={self.backend!r}, status={self.status.value}, "
                f"objective={obj}, n_jobs={len(self.job_ids)}, gpu_types={self.gpu_types})")
