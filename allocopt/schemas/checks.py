"""Checks of documents against the types and keys of allocopt's JSON Schemas, without jsonschema
(not a core dependency): the first violation raises an :class:`~allocopt.errors.InvalidProblemError`
whose ``field`` is its path in the document (``jobs[3].scale_factor``). Value ranges that depend on
the whole problem (GPU types known, jobs that fit) are checked where the objects are built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from allocopt.cluster import MAX_COUNT
from allocopt.errors import InvalidProblemError

#: Largest integer accepted for a count or an integer id in a document (above it, arrays overflow).
MAX_DOCUMENT_INT = 2**53

_JOB_NUMBERS = {"priority_weight": "> 0", "num_steps_remaining": ">= 0", "time_since_start_s": ">= 0",
                "slo_s": "> 0", "time_isolated_s": ">= 0"}


def _schema_error(path: str, message: str, job: Any = None) -> InvalidProblemError:
    return InvalidProblemError(f"{path}{'' if job is None else f' (id {job!r})'} {message}", field=path, job=job)


def _is_number(value: Any) -> bool:
    """A JSON number that fits a float64 (bools, strings, huge integers are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return False
    try:
        return bool(np.isfinite(float(value)))
    except OverflowError:
        return False


def _is_integer(value: Any, low: int) -> bool:
    return _is_number(value) and float(value).is_integer() and low <= value <= MAX_DOCUMENT_INT


def _check_number(value: Any, path: str, bound: str, job: Any = None) -> None:
    ok = _is_number(value) and (value > 0 if bound == "> 0" else value >= 0)
    if not ok:
        raise _schema_error(path, f"is {value!r}; give a finite number {bound}", job)


def _check_object(value: Any, path: str, allowed: set[str] | None = None, required: tuple[str, ...] = (),
                  job: Any = None) -> None:
    if not isinstance(value, Mapping):
        raise _schema_error(path, f"must be an object, got {type(value).__name__}", job)
    bad_keys = [k for k in value if not isinstance(k, str)]
    if bad_keys:
        raise _schema_error(path, f"has non-string key(s) {bad_keys[:3]}", job)
    missing = [k for k in required if k not in value]
    if missing:
        raise _schema_error(path, f"needs the field(s) {missing}", job)
    if allowed is not None:
        extra = sorted(set(value) - allowed)
        if extra:
            raise _schema_error(path, f"has unknown field(s) {extra}; allowed: {', '.join(sorted(allowed))}", job)


def _check_job_id(value: Any, path: str) -> None:
    if isinstance(value, bool) or not (isinstance(value, str) or _is_integer(value, -MAX_DOCUMENT_INT)):
        raise _schema_error(path, f"is {value!r}; job ids must be strings or integers")


def check_cluster_document(cluster: Any, path: str = "cluster") -> None:
    """InvalidProblemError naming the path unless ``cluster`` follows the schema's cluster object."""
    _check_object(cluster, path, {"gpus", "gpus_per_node"}, ("gpus",))
    gpus = cluster["gpus"]
    _check_object(gpus, f"{path}.gpus")
    if not gpus:
        raise _schema_error(f"{path}.gpus", "must name at least one GPU type")
    for gpu_type, count in gpus.items():
        if not (_is_integer(count, 0) and count <= MAX_COUNT):
            raise _schema_error(f"{path}.gpus.{gpu_type}", f"is {count!r}; give an integer count 0..{MAX_COUNT}")
    per_node = cluster.get("gpus_per_node", 1)
    counts = per_node.items() if isinstance(per_node, Mapping) else [(None, per_node)]
    for gpu_type, count in counts:
        if not (_is_integer(count, 1) and count <= MAX_COUNT):
            where = f"{path}.gpus_per_node" + ("" if gpu_type is None else f".{gpu_type}")
            raise _schema_error(where, f"is {count!r}; give an integer 1..{MAX_COUNT}")


def check_problem_document(data: Mapping) -> None:
    """InvalidProblemError naming the path (``jobs[3].scale_factor``) of the first value whose type or
    key the problem schema (``allocopt/schemas/problem.schema.json``) does not allow."""
    check_cluster_document(data["cluster"])
    jobs = data["jobs"]
    if not isinstance(jobs, list):
        raise _schema_error("jobs", "must be a list of job objects")
    for k, job in enumerate(jobs):
        path = f"jobs[{k}]"
        job_id = job.get("id") if isinstance(job, Mapping) else None
        _check_object(job, path, {"id", "throughputs", "scale_factor", "entity", *_JOB_NUMBERS}, ("id", "throughputs"),
                      job=job_id if isinstance(job_id, (str, int)) else None)
        _check_job_id(job_id, f"{path}.id")
        _check_object(job["throughputs"], f"{path}.throughputs", job=job_id)
        for gpu_type, value in job["throughputs"].items():
            _check_number(value, f"{path}.throughputs.{gpu_type}", ">= 0", job_id)
        if "scale_factor" in job and not _is_integer(job["scale_factor"], 1):
            raise _schema_error(f"{path}.scale_factor", f"is {job['scale_factor']!r}; give an integer number of "
                                "GPUs >= 1", job_id)
        for name, bound in _JOB_NUMBERS.items():
            if name in job:
                _check_number(job[name], f"{path}.{name}", bound, job_id)
        entity = job.get("entity")
        if entity is not None and (isinstance(entity, bool) or not isinstance(entity, (str, int))):
            raise _schema_error(f"{path}.entity", f"is {entity!r}; give a string or an integer", job_id)
    for name in ("costs", "entity_weights"):
        if name in data:
            _check_object(data[name], name)
            for key, value in data[name].items():
                _check_number(value, f"{name}.{key}", "> 0")
    if "pairs" in data:
        if not isinstance(data["pairs"], list):
            raise _schema_error("pairs", "must be a list of {\"jobs\": [a, b], \"throughputs\": {...}}")
        for k, pair in enumerate(data["pairs"]):
            path = f"pairs[{k}]"
            _check_object(pair, path, {"jobs", "throughputs"}, ("jobs", "throughputs"))
            if not isinstance(pair["jobs"], list) or len(pair["jobs"]) != 2:
                raise _schema_error(f"{path}.jobs", "must be a list of two job ids")
            for m, job_id in enumerate(pair["jobs"]):
                _check_job_id(job_id, f"{path}.jobs[{m}]")
            _check_object(pair["throughputs"], f"{path}.throughputs")
            for gpu_type, values in pair["throughputs"].items():
                if not isinstance(values, list) or len(values) != 2:
                    raise _schema_error(f"{path}.throughputs.{gpu_type}", "must be two steps/s [tput_a, tput_b]")
                for m, value in enumerate(values):
                    _check_number(value, f"{path}.throughputs.{gpu_type}[{m}]", ">= 0")
