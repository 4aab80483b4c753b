"""A Blox-style scheduling policy backed by an :class:`allocopt.Engine`.

Blox (msr-fiddle/blox) runs a round loop that holds the active jobs and the
cluster's GPUs as dictionaries, asks a scheduling policy for a decision each
round and then suspends and launches jobs. :class:`BloxPolicy.schedule` takes
those dictionaries and returns what Blox's placement step returns: the jobs to
suspend and the jobs to launch with their GPU ids. Allocation, Gavel's
priority mechanism and placement all happen in the engine
(:meth:`allocopt.Engine.next_round`).

Accepted shapes
---------------
``job_dict``: ``{job_id: job}``, ``job_id`` a str or int, ``job`` a dict with
    ``"throughputs"``: ``{gpu_type: steps_per_s}`` (required; types left out count as 0),
    ``"num_GPUs"`` or ``"scale_factor"``: GPUs the job uses at once (default 1),
    ``"priority"`` or ``"priority_weight"``: weight (default 1.0).
    Other keys (Blox's bookkeeping) are ignored.
``cluster``: ``{gpu_id: gpu}``, ``gpu_id`` any hashable the caller uses, ``gpu`` a dict with
    ``"gpu_type"`` (str), ``"node"`` (the server, any hashable) and
    ``"running_job"`` (the job id running on it, or None).

GPUs of each type are numbered by ``(node, gpu_id)``; the engine's servers of
a type have the largest per-node GPU count among that type's nodes.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, NamedTuple

from allocopt.cluster import Cluster
from allocopt.engine import Engine
from allocopt.errors import InvalidProblemError


class BloxDecision(NamedTuple):
    """A round's decision: jobs to suspend, and jobs to launch with the caller's GPU ids.

    A job that moves to other GPUs is in both.
    """

    to_suspend: list[Hashable]
    to_launch: dict[Hashable, list[Hashable]]


class BloxPolicy:
    """Blox-style scheduling policy: ``schedule(job_dict, cluster) -> BloxDecision``.

    Parameters
    ----------
    policy : str, default "max_min_fairness"
        Any allocopt policy over an :class:`allocopt.Problem` (as :class:`allocopt.Engine`).
    backend : str, default "highs"
    round_seconds : float, default 300
        Length of a Blox round, in seconds.
    **engine_options
        Other keyword arguments of :class:`allocopt.Engine` (``policy_options``,
        ``solve_options``, ``recompute_min_seconds``, ...).

    Attributes
    ----------
    engine : Engine or None
        The engine, created at the first :meth:`schedule`.
    """

    def __init__(self, policy: str = "max_min_fairness", backend: str = "highs", *,
                 round_seconds: float = 300.0, **engine_options: Any):
        self.policy, self.backend, self.round_seconds = policy, backend, round_seconds
        self.engine_options = engine_options
        self.engine: Engine | None = None

    def schedule(self, job_dict: Mapping[Hashable, Mapping[str, Any]],
                 cluster: Mapping[Hashable, Mapping[str, Any]]) -> BloxDecision:
        """The jobs to suspend and to launch this round (see the module docstring for the shapes).

        Jobs left out of ``job_dict`` are removed from the engine; GPU counts
        follow ``cluster``. Every job runs on GPUs of one type.

        Raises
        ------
        InvalidProblemError
            For a malformed job or GPU entry; ``field`` names it.
        """
        gpus = _gpus_by_type(cluster)
        counts = {t: len(ids) for t, ids in gpus.items()}
        per_node = {t: max(_node_sizes(cluster, ids)) for t, ids in gpus.items()}
        if self.engine is None:
            self.engine = Engine(Cluster(counts, per_node), self.policy, self.backend,
                                 round_seconds=self.round_seconds, **self.engine_options)
        engine = self.engine
        now = engine.cluster
        for t in set(now.gpu_types) | set(gpus):
            count, size = counts.get(t, 0), per_node.get(t)
            known = t in now.gpu_types
            if not known or count != now.capacity[now.gpu_types.index(t)] or (
                    size is not None and size != now.gpus_per_node[now.gpu_types.index(t)]):
                engine.set_capacity(t, count, gpus_per_node=size)
        for job_id in set(engine.job_ids) - set(job_dict):
            engine.remove_job(job_id)
        for job_id, job in job_dict.items():
            fields = _job_fields(job_id, job)
            if job_id not in engine:
                engine.add_job(job_id, **fields)
            else:
                current = engine.get_job(job_id)
                if any(current.get(k) != v for k, v in fields.items() if k != "throughputs") or any(
                        current["throughputs"].get(t, 0.0) != v for t, v in fields["throughputs"].items()):
                    engine.update_job(job_id, **fields)
        plan = engine.next_round(self.round_seconds)
        layout_ids = [gpu for t in engine.cluster.gpu_types for gpu in gpus.get(t, [])]
        assigned = {lease.job_id: sorted((layout_ids[g] for g in lease.gpu_ids), key=repr) for lease in plan.leases}
        running: dict[Hashable, list[Hashable]] = {}
        for gpu_id, gpu in cluster.items():
            if gpu.get("running_job") is not None:
                running.setdefault(gpu["running_job"], []).append(gpu_id)
        running = {job: sorted(ids, key=repr) for job, ids in running.items()}
        to_suspend = [job for job, ids in running.items() if assigned.get(job) != ids]
        to_launch = {job: ids for job, ids in assigned.items() if running.get(job) != ids}
        return BloxDecision(to_suspend, to_launch)


def _gpus_by_type(cluster: Mapping[Hashable, Mapping[str, Any]]) -> dict[str, list[Hashable]]:
    """GPU ids of each type, ordered by (node, gpu id)."""
    if not isinstance(cluster, Mapping) or not cluster:
        raise InvalidProblemError("cluster must be a non-empty mapping of GPU id to {'gpu_type', 'node', "
                                  "'running_job'}", field="cluster")
    by_type: dict[str, list[Hashable]] = {}
    for gpu_id, gpu in cluster.items():
        if not isinstance(gpu, Mapping) or not isinstance(gpu.get("gpu_type"), str) or "node" not in gpu:
            raise InvalidProblemError(f"cluster[{gpu_id!r}] must be a dict with a 'gpu_type' string and a 'node'",
                                      field=f"cluster[{gpu_id!r}]")
        by_type.setdefault(gpu["gpu_type"], []).append(gpu_id)
    return {t: sorted(ids, key=lambda g: (repr(cluster[g]["node"]), repr(g))) for t, ids in by_type.items()}


def _node_sizes(cluster: Mapping[Hashable, Mapping[str, Any]], ids: list[Hashable]) -> list[int]:
    sizes: dict[Hashable, int] = {}
    for gpu_id in ids:
        sizes[cluster[gpu_id]["node"]] = sizes.get(cluster[gpu_id]["node"], 0) + 1
    return list(sizes.values())


def _job_fields(job_id: Hashable, job: Mapping[str, Any]) -> dict[str, Any]:
    """Engine fields of a Blox job dict."""
    if not isinstance(job, Mapping) or not isinstance(job.get("throughputs"), Mapping):
        raise InvalidProblemError(f"job_dict[{job_id!r}] must be a dict with 'throughputs' "
                                  "({gpu_type: steps_per_s})", field="throughputs", job=job_id)
    return {"throughputs": dict(job["throughputs"]),
            "scale_factor": job.get("num_GPUs", job.get("scale_factor", 1)),
            "priority_weight": job.get("priority", job.get("priority_weight", 1.0))}


__all__ = ["BloxDecision", "BloxPolicy"]
