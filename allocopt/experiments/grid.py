"""A sweep's grid: every combination of policy, workload, cluster, seed and round length, as keyed points."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocopt.experiments.spec import SweepSpec, SweepSpecError, WorkloadSpec


@dataclass(frozen=True)
class Point:
    """One simulation of a sweep.

    Attributes
    ----------
    key : str
        Hex digest of ``params`` and allocopt's version: the point's identity in the results table.
    params : dict
        Plain (JSON) parameters: ``policy``, ``policy_label``, ``policy_options``, ``workload``
        (label), ``workload_kind``, ``workload_path``, ``workload_sha256``, ``profiles``,
        ``num_jobs``, ``jobs_per_hour``, ``scale_factor_probs``, ``cluster`` (``v100=36,...``),
        ``gpus_per_node``, ``seed``, ``round_seconds``, ``recompute_min_seconds``, ``mode``,
        ``window``, ``backend``, ``fidelity``, ``restart_overhead_s``, ``run_unallocated``,
        ``ftf``, ``throughputs``, ``allocopt_version``.
    """

    key: str
    params: dict[str, Any]


def cluster_label(cluster: Mapping[str, int]) -> str:
    """``v100=36,p100=36,k80=36``: a cluster as one table cell."""
    return ",".join(f"{k}={v}" for k, v in cluster.items())


def point_key(params: Mapping[str, Any]) -> str:
    """The hash identifying a point: SHA-256 of its parameters (which include allocopt's version), 16 hex digits."""
    text = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _workload_cases(entry: WorkloadSpec, index: int) -> list[dict[str, Any]]:
    """The concrete workloads of one entry: one per arrival rate, per file of a directory."""
    base = {"workload_set": entry.label, "workload_kind": entry.kind, "workload_path": None, "workload_sha256": None, "profiles": entry.profiles,
            "num_jobs": None, "jobs_per_hour": None, "scale_factor_probs": None}
    if entry.kind == "generate":
        probs = None if entry.scale_factor_probs is None else {str(k): v for k, v in
                                                               sorted(entry.scale_factor_probs.items())}
        return [{**base, "workload": entry.label, "num_jobs": entry.num_jobs, "jobs_per_hour": rate,
                 "scale_factor_probs": probs} for rate in entry.jobs_per_hour]
    paths = [entry.path] if entry.kind != "directory" else sorted(
        str(p) for p in Path(entry.path).iterdir() if p.is_file() and not p.name.startswith("."))
    cases = []
    for path in paths:
        kind = entry.kind if entry.kind != "directory" else ("sia" if path.lower().endswith(".csv") else "trace")
        label = entry.label if entry.kind != "directory" else f"{entry.label}/{Path(path).stem}"
        case = {**base, "workload": label, "workload_kind": kind, "workload_path": path,
                "workload_sha256": _sha256(path)}
        if entry.trace_format != "gavel":  # a public trace (keys of Gavel traces stay as they were)
            case["trace_format"] = entry.trace_format
            if entry.task_table is not None:
                case.update(task_table=entry.task_table, task_table_sha256=_sha256(entry.task_table))
        cases.append(case)
    if entry.kind == "directory" and not cases:
        raise SweepSpecError(f"{entry.path!r} holds no files", field=f"workloads[{index}].directory")
    return cases


def expand(spec: SweepSpec) -> list[Point]:
    """Every point of ``spec``'s grid, in a fixed order (workload, cluster, round length, policy, seed).

    File workloads are keyed by their content (``workload_sha256``), so an edited trace is a new point.
    """
    from allocopt import __version__

    gpus_per_node = spec.gpus_per_node if isinstance(spec.gpus_per_node, int) else dict(spec.gpus_per_node)
    common = {"gpus_per_node": gpus_per_node, "recompute_min_seconds": spec.recompute_min_seconds,
              "mode": spec.mode, "window": list(spec.window) if spec.window else None, "backend": spec.backend,
              "fidelity": spec.fidelity, "restart_overhead_s": spec.restart_overhead_s,
              "run_unallocated": spec.run_unallocated, "ftf": spec.ftf, "throughputs": spec.throughputs,
              "allocopt_version": __version__}
    for plugin in ("placement", "admission"):  # in a point's parameters (and key) only when set
        if getattr(spec, plugin) is not None:
            common[plugin] = getattr(spec, plugin)
    for name in ("tenants", "capacity_events"):  # files: keyed by their content too
        value = getattr(spec, name)
        if value is not None:
            common[name] = value
            if value != "equal":
                common[f"{name}_sha256"] = _sha256(value)
    for index, entry in enumerate(spec.workloads):
        if spec.window is not None and entry.kind == "generate" and entry.num_jobs < spec.window[1]:
            raise SweepSpecError(f"ends at job {spec.window[1]}, but workloads[{index}] generates {entry.num_jobs} "
                                 "jobs", field="window")
    points = []
    for index, entry in enumerate(spec.workloads):
        for case in _workload_cases(entry, index):
            for cluster in spec.clusters:
                for round_seconds in spec.round_seconds:
                    for policy in spec.policies:
                        for seed in spec.seeds:
                            params = {"policy": policy.name, "policy_label": policy.label,
                                      "policy_options": dict(policy.options), **case,
                                      "cluster": cluster_label(cluster), "seed": seed,
                                      "round_seconds": round_seconds, **common}
                            points.append(Point(point_key(params), params))
    keys = [p.key for p in points]
    if len(set(keys)) != len(keys):
        raise SweepSpecError("two points of the grid are the same simulation (a workload, policy or cluster listed "
                             "twice)", field="workloads")
    return points


__all__ = ["Point", "cluster_label", "expand", "point_key"]
