"""Goodput over configurations: the input of Sia-style policies and their answer.

A :class:`GoodputProblem` holds, for every job and every configuration of a
:class:`~allocopt.configurations.Configurations` set, the job's goodput there
(statistically useful training progress per second, any unit shared within a
row), plus what a round-based scheduler knows about each job: its previous
configuration, its restart factor, whether it must keep its configuration
(pinned) and, for rigid jobs, the GPU count it needs. A policy answers with a
:class:`ConfigurationAllocation`: at most one configuration per job.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

from allocopt.allocation import Timings
from allocopt.cluster import Cluster
from allocopt.configurations import Configurations
from allocopt.errors import InvalidProblemError
from allocopt.jsonio import JsonSource, document_or_write, read_json
from allocopt.solution import Status


def restart_factor(age_s: Any, restarts: Any, delay_s: Any) -> np.ndarray:
    """Pollux's re-allocation factor: the share of a job's time not lost to restarts.

    ``r = max(age_s - restarts * delay_s, 0) / (age_s + delay_s)``, and ``r = 1``
    while ``age_s < delay_s`` (a young job is not penalized). Arrays broadcast.

    Parameters
    ----------
    age_s : array-like of float
        Seconds since each job started (>= 0).
    restarts : array-like of int
        Times each job has been restarted so far (>= 0).
    delay_s : array-like of float
        Seconds one restart costs each job (checkpoint, restore, warm-up; > 0).

    Returns
    -------
    ndarray of float in [0, 1]
        0 when the restarts have cost the job's whole age; clip it to a small
        positive value (or pin the job) before passing it to :class:`GoodputProblem`.
    """
    age, count, delay = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (age_s, restarts, delay_s)))
    for name, a, ok in (("age_s", age, age >= 0), ("restarts", count, (count >= 0) & (count == np.round(count))),
                        ("delay_s", delay, delay > 0)):
        if not np.all(ok & np.isfinite(a)):
            need = {"age_s": "finite and >= 0", "restarts": "whole numbers >= 0", "delay_s": "finite and > 0"}[name]
            raise InvalidProblemError(f"restart_factor: {name} must be {need}, got {a[~(ok & np.isfinite(a))][0]}",
                                      field=name)
    r = np.maximum(age - count * delay, 0.0) / (age + delay)
    return np.where(age < delay, 1.0, r)


class GoodputProblem:
    """Jobs, a configuration set and each job's goodput in each configuration.

    Parameters
    ----------
    goodput : array-like of shape (n_jobs, n_configurations)
        Goodput of each job in each configuration of ``configurations`` (any
        positive unit, e.g. samples/s scaled by statistical efficiency; only
        ratios within a row matter to Sia). 0 or NaN where the job cannot use
        the configuration.
    configurations : Configurations
        Built for ``cluster`` (e.g. by :func:`~allocopt.configurations.sia_configurations`).
    cluster : Cluster
    job_ids : sequence of hashable, optional
        Distinct job ids; default ``0 .. n_jobs - 1``.
    previous : array-like of int of shape (n_jobs,), optional
        Configuration each job ran in last round, -1 (or None) for none; default all -1.
    restart_factor : array-like of float in (0, 1] of shape (n_jobs,), optional
        Factor on a job's goodput in every configuration other than its
        previous one (the cost of restarting; see :func:`restart_factor`); default 1.
    pinned : array-like of bool of shape (n_jobs,), optional
        Jobs that must keep their previous configuration (e.g. mid checkpoint-restore).
    rigid_gpus : array-like of shape (n_jobs,), optional
        GPUs a rigid job needs, 0 (or None) for adaptive jobs: a rigid job may
        only take configurations with exactly that many GPUs, so only its GPU type is chosen.

    Attributes
    ----------
    goodput : read-only ndarray of float, shape (n_jobs, n_configurations)
    valid : read-only ndarray of bool, shape (n_jobs, n_configurations)
        Positive goodput and, for rigid jobs, the required GPU count.
    previous, restart_factor, pinned, rigid_gpus : read-only ndarray, shape (n_jobs,)
    job_ids : tuple

    Raises
    ------
    InvalidProblemError
        With ``field`` (and ``job``) set, for any malformed input: negative or
        infinite goodput, an out-of-range previous configuration or restart
        factor, a pinned job without a valid previous configuration, pinned
        jobs that overfill a GPU type, or a job with no valid configuration.
    """

    def __init__(self, goodput: Any, configurations: Configurations, cluster: Cluster, *,
                 job_ids: Sequence[Hashable] | None = None, previous: Any = None, restart_factor: Any = None,
                 pinned: Any = None, rigid_gpus: Any = None):
        if not isinstance(cluster, Cluster):
            raise InvalidProblemError(f"cluster must be an allocopt.Cluster, got {type(cluster).__name__}",
                                      field="cluster")
        if not isinstance(configurations, Configurations):
            raise InvalidProblemError(f"configurations must be an allocopt.Configurations, got "
                                      f"{type(configurations).__name__}; build one with "
                                      "allocopt.sia_configurations(cluster)", field="configurations")
        if configurations.cluster != cluster:
            raise InvalidProblemError(f"configurations were built for {configurations.cluster!r}, not for "
                                      f"{cluster!r}; build them with sia_configurations(cluster)",
                                      field="configurations")
        self.cluster = cluster
        self.configurations = configurations
        try:
            G = np.array(goodput, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise InvalidProblemError(f"goodput must be a numeric array of shape (n_jobs, n_configurations): {err}",
                                      field="goodput") from err
        if G.ndim != 2 or G.shape[1] != len(configurations):
            raise InvalidProblemError(f"goodput has shape {G.shape}, expected (n_jobs, n_configurations) with "
                                      f"n_configurations = {len(configurations)}", field="goodput")
        self.goodput = G
        self.job_ids = self._job_ids(job_ids)
        bad = np.isinf(G) | (G < 0)
        if bad.any():
            i, c = (int(v) for v in np.argwhere(bad)[0])
            raise InvalidProblemError(
                f"goodput of job {self.job_ids[i]!r} in configuration {configurations.label(c)} is {G[i, c]}; "
                f"give a finite positive value, or 0 / NaN where the job cannot use it "
                f"({int(bad.sum())} such entries)", field="goodput", job=self.job_ids[i])
        self.previous = self._integers("previous", previous, -1)
        self.rigid_gpus = self._integers("rigid_gpus", rigid_gpus, 0)
        self.restart_factor = self._restart_factors(restart_factor)
        self.pinned = self._pinned(pinned)
        self.valid = self._valid()
        self._check_pinned()
        for name in ("goodput", "previous", "rigid_gpus", "restart_factor", "pinned", "valid"):
            getattr(self, name).setflags(write=False)

    @property
    def num_jobs(self) -> int:
        """Number of jobs."""
        return self.goodput.shape[0]

    @property
    def num_configurations(self) -> int:
        """Number of configurations."""
        return self.goodput.shape[1]

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The cluster's GPU type names, in order."""
        return self.cluster.gpu_types

    def __repr__(self) -> str:
        return (f"GoodputProblem(n_jobs={self.num_jobs}, n_configurations={self.num_configurations}, "
                f"cluster={self.cluster!r})")

    # ----- JSON ----------------------------------------------------------------------
    @overload
    def to_json(self, path: None = None) -> dict[str, Any]: ...

    @overload
    def to_json(self, path: str | os.PathLike[str]) -> None: ...

    def to_json(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
        """The problem as a JSON document that :meth:`from_json` reads back; written to ``path`` when given.

        ``{"cluster": {...}, "configurations": [{"gpu_type", "num_nodes", "num_gpus"}, ...],
        "jobs": [{"id", "goodput": [per configuration, null where unusable], "previous",
        "restart_factor", "pinned", "rigid_gpus"}, ...]}``; ``previous`` indexes ``configurations`` (-1: none).
        """
        configs = self.configurations
        types = self.cluster.gpu_types
        goodput = np.where(np.isnan(self.goodput), None, self.goodput).tolist()
        doc = {"cluster": self.cluster.to_dict(),
               "configurations": [{"gpu_type": types[t], "num_nodes": n, "num_gpus": g} for t, n, g in
                                  zip(configs.gpu_type.tolist(), configs.num_nodes.tolist(),
                                      configs.num_gpus.tolist())],
               "jobs": [{"id": job.item() if isinstance(job, np.generic) else job, "goodput": row,
                         "previous": prev, "restart_factor": factor, "pinned": pin, "rigid_gpus": rigid}
                        for job, row, prev, factor, pin, rigid in
                        zip(self.job_ids, goodput, self.previous.tolist(), self.restart_factor.tolist(),
                            self.pinned.tolist(), self.rigid_gpus.tolist())]}
        return document_or_write(doc, path)

    @classmethod
    def from_json(cls, source: JsonSource) -> GoodputProblem:
        """A goodput problem from :meth:`to_json`'s document, or the path of a JSON file holding one."""
        data = read_json(source, what="goodput problem")
        if not isinstance(data, Mapping) or not {"cluster", "configurations", "jobs"} <= set(data):
            raise InvalidProblemError("a goodput problem document needs 'cluster', 'configurations' and 'jobs' "
                                      "fields", field="document")
        cluster = Cluster.from_dict(data["cluster"])
        configs, jobs = data["configurations"], data["jobs"]
        for name, items, keys in (("configurations", configs, ("gpu_type", "num_nodes", "num_gpus")),
                                  ("jobs", jobs, ("id", "goodput"))):
            if not isinstance(items, list):
                raise InvalidProblemError(f"'{name}' must be a list of objects", field=name)
            for k, item in enumerate(items):
                if not isinstance(item, Mapping) or not set(keys) <= set(item):
                    raise InvalidProblemError(f"{name}[{k}] must be an object with {', '.join(keys)}",
                                              field=f"{name}[{k}]")
        configurations = Configurations(cluster, *([c[key] for c in configs] for key in
                                                   ("gpu_type", "num_nodes", "num_gpus")))
        goodput = [[np.nan if g is None else g for g in job["goodput"]] for job in jobs]
        if any(len(row) != len(configs) for row in goodput):
            k = next(k for k, row in enumerate(goodput) if len(row) != len(configs))
            raise InvalidProblemError(f"jobs[{k}] (id {jobs[k]['id']!r}) has {len(goodput[k])} goodput values; "
                                      f"give one per configuration ({len(configs)})", field=f"jobs[{k}].goodput",
                                      job=jobs[k]["id"])

        def column(key: str, default: Any) -> list:
            return [job.get(key, default) for job in jobs]

        return cls(np.array(goodput, dtype=np.float64).reshape(len(jobs), len(configs)), configurations, cluster,
                   job_ids=[job["id"] for job in jobs], previous=column("previous", -1),
                   restart_factor=column("restart_factor", 1.0), pinned=column("pinned", False),
                   rigid_gpus=column("rigid_gpus", 0))

    # ----- validation ----------------------------------------------------------------
    def _job_ids(self, job_ids: Sequence[Hashable] | None) -> tuple:
        n = self.goodput.shape[0]
        if job_ids is None:
            return tuple(range(n))
        ids = tuple(job_ids)
        if len(ids) != n:
            raise InvalidProblemError(f"job_ids has {len(ids)} entries but goodput has {n} rows", field="job_ids")
        try:
            distinct = len(set(ids))
        except TypeError:
            raise InvalidProblemError("job ids must be hashable", field="job_ids") from None
        if distinct != n:
            seen: set = set()
            dup = next(j for j in ids if j in seen or seen.add(j))
            raise InvalidProblemError(f"job id {dup!r} appears more than once; job ids must be distinct",
                                      field="job_ids", job=dup)
        return ids

    def _per_job(self, name: str, value: Any) -> np.ndarray:
        """``value`` as float per job (None read as NaN)."""
        try:
            arr = np.array(value, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise InvalidProblemError(f"{name} must be numeric, one entry per job: {err}", field=name) from err
        if arr.shape != (self.num_jobs,):
            raise InvalidProblemError(f"{name} has shape {arr.shape}, expected (n_jobs,) = ({self.num_jobs},)",
                                      field=name)
        return arr

    def _first_bad(self, name: str, bad: np.ndarray, value: np.ndarray, need: str) -> None:
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InvalidProblemError(f"{name} of job {self.job_ids[i]!r} is {value[i]:g}; {need}",
                                      field=name, job=self.job_ids[i])

    def _integers(self, name: str, value: Any, none: int) -> np.ndarray:
        """Per-job integers, None entries read as ``none``."""
        if value is None:
            return np.full(self.num_jobs, none, dtype=np.int64)
        arr = self._per_job(name, value)
        arr = np.where(np.isnan(arr), none, arr)
        if name == "previous":
            need = f"give a configuration index in 0..{self.num_configurations - 1}, or -1 for none"
            bad = (arr < -1) | (arr >= self.num_configurations)
        else:
            need = "give a number of GPUs >= 1 for a rigid job, or 0 / None for an adaptive one"
            bad = arr < 0
        self._first_bad(name, bad | np.isinf(arr) | (arr != np.round(arr)), arr, need)
        return arr.astype(np.int64)

    def _restart_factors(self, value: Any) -> np.ndarray:
        if value is None:
            return np.ones(self.num_jobs)
        r = self._per_job("restart_factor", value)
        self._first_bad("restart_factor", ~((r > 0) & (r <= 1)), r,
                        "it must be in (0, 1] (1: restarting costs nothing). A factor of 0 would make every "
                        "other configuration worthless: pin the job (pinned=...) to keep it where it is, or "
                        "clip the factor, e.g. np.clip(r, 1e-3, 1)")
        return r

    def _pinned(self, value: Any) -> np.ndarray:
        if value is None:
            return np.zeros(self.num_jobs, dtype=bool)
        arr = self._per_job("pinned", value)
        self._first_bad("pinned", (arr != 0) & (arr != 1), arr, "give True or False")
        return arr.astype(bool)

    def _valid(self) -> np.ndarray:
        gpus = self.configurations.num_gpus
        valid = self.goodput > 0  # False for NaN
        rigid = self.rigid_gpus > 0
        valid[rigid] &= gpus[None, :] == self.rigid_gpus[rigid, None]
        none = np.flatnonzero(~valid.any(axis=1))
        if none.size:
            i = int(none[0])
            job = self.job_ids[i]
            more = f" ({none.size} jobs in all)" if none.size > 1 else ""
            if self.rigid_gpus[i] and not np.any(gpus == self.rigid_gpus[i]):
                why = (f"rigid job {job!r} needs {self.rigid_gpus[i]} GPUs but no configuration has exactly "
                       f"{self.rigid_gpus[i]} (counts: {sorted(set(gpus.tolist()))}); build the set with "
                       "sia_configurations(cluster, all_gpu_counts=True) or change its rigid_gpus")
            elif self.rigid_gpus[i]:
                why = (f"rigid job {job!r} has no positive goodput in any configuration with "
                       f"{self.rigid_gpus[i]} GPUs")
            else:
                why = f"job {job!r} has no positive goodput in any configuration"
            raise InvalidProblemError(f"{why}{more}; give it a goodput on at least one configuration it can use, "
                                      "or leave it out of the problem", field="goodput", job=job)
        return valid

    def _check_pinned(self) -> None:
        jobs = np.flatnonzero(self.pinned)
        if not jobs.size:
            return
        prev = self.previous[jobs]
        ok = prev >= 0
        ok[ok] = self.valid[jobs[ok], prev[ok]]
        if not ok.all():
            i = int(jobs[~ok][0])
            p = self.previous[i]
            where = ("has no previous configuration" if p < 0 else
                     f"cannot use its previous configuration {self.configurations.label(p)}")
            raise InvalidProblemError(f"pinned job {self.job_ids[i]!r} {where}; a pinned job keeps its previous "
                                      "configuration, so give it one with positive goodput (and, if rigid, its "
                                      "GPU count) or unpin it", field="pinned", job=self.job_ids[i])
        configs = self.configurations
        used = np.bincount(configs.gpu_type[prev], weights=configs.num_gpus[prev],
                           minlength=self.cluster.num_gpu_types)
        over = np.flatnonzero(used > self.cluster.capacity)
        if over.size:
            j = int(over[0])
            raise InvalidProblemError(f"pinned jobs hold {int(used[j])} {self.cluster.gpu_types[j]} GPUs but the "
                                      f"cluster has {self.cluster.capacity[j]}; unpin some of them",
                                      field="pinned")


@dataclass(frozen=True)
class ConfigurationAllocation:
    """At most one configuration per job: the answer of a configuration policy (``sia``).

    Attributes
    ----------
    problem : GoodputProblem
    configuration : read-only ndarray of int, shape (n_jobs,)
        Index into ``problem.configurations`` of each job's configuration, -1 for none.
    policy : str
    backend : str or None
        None when there was nothing to solve (no jobs).
    status : Status
        ``OPTIMAL`` unless ``best_effort=True`` returned something else.
    objective : float or None
        The policy's objective value at this allocation.
    message : str
    timings : Timings
    extras : dict
        Policy-specific results (``sia``: how its MILP was solved).
    """

    problem: GoodputProblem
    configuration: np.ndarray
    policy: str
    backend: str | None
    status: Status
    objective: float | None
    message: str
    timings: Timings = field(default_factory=Timings)
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def job_ids(self) -> tuple[Hashable, ...]:
        """The problem's job ids, in order."""
        return self.problem.job_ids

    @property
    def success(self) -> bool:
        """Whether the status is ``OPTIMAL``."""
        return self.status is Status.OPTIMAL

    @property
    def allocated(self) -> np.ndarray:
        """Bool per job: has a configuration."""
        return self.configuration >= 0

    @property
    def gpu_type(self) -> tuple[str | None, ...]:
        """GPU type name of each job's configuration, None for none."""
        names = self.problem.configurations.gpu_type_names
        return tuple(names[c] if c >= 0 else None for c in self.configuration.tolist())

    @property
    def num_nodes(self) -> np.ndarray:
        """Nodes each job spans, 0 for none, shape (n_jobs,)."""
        return np.where(self.allocated, self.problem.configurations.num_nodes[self.configuration], 0)

    @property
    def num_gpus(self) -> np.ndarray:
        """GPUs each job holds, 0 for none, shape (n_jobs,)."""
        return np.where(self.allocated, self.problem.configurations.num_gpus[self.configuration], 0)

    @property
    def gpus_used(self) -> np.ndarray:
        """GPUs of each type in use, shape (n_gpu_types,)."""
        types = self.problem.configurations.gpu_type[self.configuration[self.allocated]]
        return np.bincount(types, weights=self.num_gpus[self.allocated],
                           minlength=self.problem.cluster.num_gpu_types).astype(np.int64)

    def to_dict(self) -> dict[Hashable, dict[str, Any] | None]:
        """``{job_id: {"gpu_type": str, "num_nodes": int, "num_gpus": int}}``, None for jobs left idle."""
        return {job: ({"gpu_type": t, "num_nodes": nodes, "num_gpus": gpus} if t is not None else None)
                for job, t, nodes, gpus in zip(self.job_ids, self.gpu_type, self.num_nodes.tolist(),
                                               self.num_gpus.tolist())}

    @overload
    def to_json(self, path: None = None) -> dict[str, Any]: ...

    @overload
    def to_json(self, path: str | os.PathLike[str]) -> None: ...

    def to_json(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
        """A JSON summary (as :meth:`allocopt.Allocation.to_json`); written to ``path`` when given.

        ``allocation`` lists per job its ``configuration`` (index, -1: idle),
        ``gpu_type`` (null when idle), ``num_nodes`` and ``num_gpus``.
        """
        ids = [j.item() if isinstance(j, np.generic) else j for j in self.job_ids]
        doc = {"policy": self.policy, "backend": self.backend, "status": self.status.value,
               "message": self.message, "objective": self.objective,
               "allocation": [{"id": j, "configuration": c, "gpu_type": t, "num_nodes": n, "num_gpus": g}
                              for j, c, t, n, g in zip(ids, self.configuration.tolist(), self.gpu_type,
                                                       self.num_nodes.tolist(), self.num_gpus.tolist())],
               "timings": self.timings.to_dict()}
        return document_or_write(doc, path)

    @classmethod
    def from_json(cls, source: JsonSource, problem: GoodputProblem) -> ConfigurationAllocation:
        """An allocation of ``problem`` from :meth:`to_json`'s document, or the path of a JSON file holding one.

        The document holds each job's configuration index, not the problem: pass
        the problem it was solved for (e.g. ``GoodputProblem.from_json(path)``).
        Jobs are matched by id.

        Raises
        ------
        InvalidProblemError
            Naming the entry, for a job missing from the document or not in
            ``problem``, or a configuration that is not an index of
            ``problem.configurations`` (-1: idle).
        """
        data = read_json(source, what="configuration allocation")
        if not isinstance(data, Mapping) or not isinstance(data.get("allocation"), list):
            raise InvalidProblemError("a configuration allocation document needs an 'allocation' list (as "
                                      "ConfigurationAllocation.to_json writes it)", field="document")
        index = {job.item() if isinstance(job, np.generic) else job: i for i, job in enumerate(problem.job_ids)}
        configuration = np.full(problem.num_jobs, -2, dtype=np.int64)
        for k, entry in enumerate(data["allocation"]):
            where = f"allocation[{k}]"
            job = entry.get("id") if isinstance(entry, Mapping) else None
            row = index.get(job, -1) if isinstance(job, (str, int, float)) else -1
            if row < 0 or configuration[row] != -2:
                raise InvalidProblemError(f"{where}: job id {job!r} is not a job of the problem, or appears twice",
                                          field=where)
            value = entry.get("configuration")
            if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value < problem.num_configurations:
                raise InvalidProblemError(f"{where}: configuration is {value!r}; give an index from 0 to "
                                          f"{problem.num_configurations - 1}, or -1 for none", field=where)
            configuration[row] = value
        if (configuration == -2).any():
            missing = problem.job_ids[int(np.flatnonzero(configuration == -2)[0])]
            raise InvalidProblemError(f"job {missing!r} of the problem is missing from 'allocation'",
                                      field="allocation", job=missing)
        try:
            status = Status(data.get("status", Status.OPTIMAL.value))
            timings = Timings(**data.get("timings", {}))
        except (TypeError, ValueError) as err:
            raise InvalidProblemError(f"malformed 'status' or 'timings': {err}", field="document") from None
        configuration.setflags(write=False)
        return cls(problem, configuration, str(data.get("policy", "")), data.get("backend"), status,
                   data.get("objective"), str(data.get("message", "")), timings)

    def __repr__(self) -> str:
        obj = "None" if self.objective is None else f"{self.objective:.6g}"
        return (f"ConfigurationAllocation(policy={self.policy!r}, backend={self.backend!r}, "
                f"status={self.status.value}, objective={obj}, n_jobs={len(self.job_ids)}, "
                f"allocated={int(self.allocated.sum())})")
