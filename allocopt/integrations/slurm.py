"""``allocopt slurm``: allocopt's rounds enacted on a Slurm cluster through Slurm's own commands.

A controller runs beside ``slurmctld`` (no change to Slurm). Users opt in per
job with a comment marker::

    sbatch --hold --gres=gpu:1 --comment="allocopt:model=resnet50,steps=5000" train.sh

and run their program under ``python -m allocopt.integrations.slurm_exec``
(or ``allocopt slurm exec``), which gives it the :mod:`allocopt.runtime.client`
environment: checkpoint directory, progress file, GPU type, total steps. Every
round (``--round-seconds``) the controller

1. reads the managed partitions' jobs and nodes (one ``squeue``, one ``sinfo``);
   GPU types and counts come from the nodes' typed GRES, less the GPUs that
   running jobs which did not opt in hold;
2. credits each lease of the last round with the seconds its job really ran
   (Slurm's start/end times) and the throughput the job measured (its progress
   file), through :meth:`allocopt.Engine.record_round`;
3. asks :meth:`allocopt.Engine.next_round` for the round's leases, journals them
   (SQLite), and enacts them with batched ``scontrol`` calls: jobs that keep
   their lease keep running; jobs that lose it are requeued held
   (``scontrol requeuehold``: SIGTERM, ``KillWait`` seconds to checkpoint, back
   to pending held, same job id); jobs that get one are pinned to the lease's GPU
   type (``ExcNodeList``: the nodes of the other types) and released.

Opted-in jobs are kept held while they have no lease. Jobs without the marker
are never touched. When the controller stops, Slurm keeps running what runs and
held jobs stay held; a restarted controller (same ``--state``) continues from
its journal and credits the time jobs ran while it was down.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sqlite3
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from allocopt.cluster import Cluster
from allocopt.engine import Engine
from allocopt.errors import AllocoptError, InvalidOptionError, InvalidProblemError
from allocopt.integrations.slurm_commands import FINAL_STATES, Slurm, SlurmError, SlurmJob, SlurmNode
from allocopt.integrations.slurm_exec import add_exec_arguments, exec_job, job_dir
from allocopt.mechanism.admission import AcceptAll, admission_policy, admit_jobs
from allocopt.mechanism.placement_policies import placement_policy
from allocopt.runtime.executor import Lease
from allocopt.runtime.elastic import (ELASTIC_KEYS, ElasticSpec, GoodputEngine, is_goodput_policy, load_job_profiles,
                                      parse_elastic)
from allocopt.runtime.executor import JobRoundResult, RoundOutcome
from allocopt.runtime.fence import issue_epoch
from allocopt.throughput.table import ThroughputTable

log = logging.getLogger(__name__)

#: Comment prefix that opts a job in.
DEFAULT_MARKER = "allocopt"
#: Steps/s assumed on a GPU type the job may use, until a table entry or a measurement gives one.
DEFAULT_STEPS_PER_S = 1.0
#: The allocation is solved again at most once per this many rounds (as ``allocopt run``).
RECOMPUTE_ROUNDS = 5
#: Keys a job may set after the marker: ``allocopt:model=NAME,steps=N,weight=W,types=a100+v100``.
JOB_KEYS = ("model", "steps", "weight", "types")
#: Keys that make a job elastic (run by a goodput policy, ``--policy sia``): the job file's elastic fields of
#: ``allocopt run`` (:class:`allocopt.runtime.elastic.ElasticSpec`), e.g. ``allocopt:batch_size=64,max_replicas=4``.
ELASTIC_JOB_KEYS = tuple(sorted(ELASTIC_KEYS))
#: Seconds of steps a throughput measurement needs (shorter ones are mostly start-up noise).
_MIN_MEASURED_S = 1.0
#: Seconds before an elastic job requeued in a round starts again (Slurm: see Slurm.update_release).
RESTART_DELAY_S = 2
_RUNNING = ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT")


def _delayed_by_slurm(sj: SlurmJob) -> bool:
    """Whether a pending, unheld job waits for a begin time Slurm set beyond allocopt's restart delay (Slurm
    requeues a job whose node went down to begin about two minutes later)."""
    return (sj.reason == "BeginTime" and sj.start_s is not None
            and sj.start_s > time.time() + 2 * RESTART_DELAY_S + 5)


# ----- per-job attributes -------------------------------------------------------------------
@dataclass
class JobRecord:
    """What the controller knows of an opted-in Slurm job; times in epoch seconds, durations in seconds.

    ``status``: ``active`` (in the engine), ``done``, ``failed``, ``cancelled``, ``gone`` (left
    Slurm's records unseen) or ``rejected`` (bad opt-in attributes: held, ``message`` says why).
    ``lease_type``: the GPU type the job is released on (None: kept held).
    ``lease``: an elastic job's configuration, or a rigid job's nodes (``--placement``), it was last
    released with.
    """

    job_id: str
    name: str
    model: str
    scale_factor: int
    total_steps: int | None = None
    weight: float = 1.0
    gpu_types: list[str] | None = None
    user_excluded: str = ""
    status: str = "active"
    lease_type: str | None = None
    received: dict[str, float] = field(default_factory=dict)
    measured: dict[str, float] = field(default_factory=dict)
    releases: int = 0
    preemptions: int = 0
    steps_done: int = 0
    first_seen: float = field(default_factory=time.time)
    finished: float | None = None
    message: str = ""
    elastic: dict[str, Any] | None = None  # an elastic job's ElasticSpec (as a dict)
    lease: dict[str, Any] | None = None  # released with: an elastic job's configuration, a placed rigid job's nodes
    tasks_per_gpu: bool = False  # an elastic job submitted with several tasks: one task per GPU


def parse_comment(comment: str, marker: str = DEFAULT_MARKER) -> dict[str, str] | None:
    """The attributes of an opt-in comment (``allocopt`` or ``allocopt:k=v,k=v``); None without the marker.

    Raises
    ------
    InvalidProblemError
        For an unknown key or a malformed pair; ``field`` names it.
    """
    text = comment.strip()
    if text != marker and not text.startswith(marker + ":"):
        return None
    attrs: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in text[len(marker) + 1:].split(","))):
        key, sep, value = pair.partition("=")
        if not sep or key.strip() not in JOB_KEYS + ELASTIC_JOB_KEYS or not value.strip():
            raise InvalidProblemError(f"comment {comment!r}: {pair!r} is not KEY=VALUE with KEY one of "
                                      f"{', '.join(JOB_KEYS + ELASTIC_JOB_KEYS)}", field=key.strip() or "comment")
        attrs[key.strip()] = value.strip()
    return attrs


def new_record(job: SlurmJob, attrs: Mapping[str, str], gpu_types: Sequence[str]) -> JobRecord:
    """A :class:`JobRecord` of a newly seen job (its GPU count from its GRES, 1 when none).

    Raises
    ------
    InvalidProblemError
        For a malformed ``steps``/``weight``/``types`` or a GPU type the cluster does not have.
    """
    requested_type, count = job.gpus
    try:
        steps = int(attrs["steps"]) if "steps" in attrs else None
        weight = float(attrs.get("weight", 1.0))
    except ValueError as err:
        raise InvalidProblemError(f"job {job.job_id}: {err}; steps must be an integer, weight a number",
                                  field="steps", job=job.job_id) from None
    if (steps is not None and steps < 1) or not (math.isfinite(weight) and weight > 0):
        raise InvalidProblemError(f"job {job.job_id}: steps must be >= 1 and weight > 0", field="steps",
                                  job=job.job_id)
    types = attrs["types"].split("+") if "types" in attrs else ([requested_type] if requested_type else None)
    unknown = sorted(set(types or ()) - set(gpu_types))
    if unknown:
        raise InvalidProblemError(f"job {job.job_id}: GPU type(s) {unknown} are not in the managed partitions "
                                  f"(types: {', '.join(gpu_types)})", field="types", job=job.job_id)
    spec = elastic_spec(attrs, job.job_id)
    if spec is not None and (requested_type is not None or job.tres_per_job or job.tres_per_task):
        raise InvalidProblemError(f"job {job.job_id}: allocopt sets an elastic job's GPU count and type; submit it "
                                  "with --gres=gpu:1 (no type, no --gpus or --gpus-per-task) and name the types it "
                                  "may use in types=", field="gres", job=job.job_id)
    return JobRecord(job.job_id, job.name, attrs.get("model", job.name), max(count, 1), steps, weight, types,
                     job.excluded, elastic=None if spec is None else asdict(spec), tasks_per_gpu=job.num_tasks > 1)


def elastic_spec(attrs: Mapping[str, str], job_id: str) -> ElasticSpec | None:
    """The :class:`ElasticSpec` of a comment's elastic keys (:data:`ELASTIC_JOB_KEYS`); None without any.

    Raises
    ------
    InvalidProblemError
        As :func:`allocopt.runtime.elastic.parse_elastic` (``seed_profile`` must be an absolute path).
    """
    entry: dict[str, Any] = {}
    for key in ELASTIC_JOB_KEYS:
        if key not in attrs:
            continue
        value = attrs[key]
        if key not in ("application", "lr_scaling", "seed_profile"):
            try:
                number = float(value)
                value = int(number) if number.is_integer() and key != "restart_delay_s" else number
            except ValueError:
                pass  # parse_elastic names the key
        entry[key] = value
    return parse_elastic(entry, "comment", job_id) if entry else None


def load_throughputs(path: str | os.PathLike | None) -> dict[tuple[str, int], dict[str, float]]:
    """``(model, scale_factor) -> {gpu_type: steps/s}`` from a :class:`ThroughputTable` CSV or JSON file."""
    if path is None:
        return {}
    table = ThroughputTable.from_csv(path) if str(path).endswith(".csv") else ThroughputTable.from_json(path)
    return {entry: dict(zip(table.gpu_types, row.tolist()))
            for entry, row in zip(table.entries, table.throughputs_steps_per_s)}


# ----- the jobs' progress files ------------------------------------------------------------
class _Progress:
    """Incremental reader of a job's progress file (JSON lines of :mod:`allocopt.runtime.client`)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.records = path, 0, []

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return self.records
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            try:
                self.records.append(json.loads(line))
            except ValueError:
                continue
        del self.records[:-5000]
        return self.records

    def rate(self, start_s: float, end_s: float) -> float | None:
        """Steps/s over ``[start_s, end_s]`` from the step records of each run (a ``start`` record begins
        a run); None with less than ``_MIN_MEASURED_S`` seconds of steps in the window."""
        steps = seconds = 0.0
        last: tuple[float, int] | None = None
        for r in self.read():
            t, event = r.get("t"), r.get("event")
            if t is None or event not in ("start", "step", "exit") or not start_s <= t <= end_s:
                continue
            if last is not None and event != "start":
                steps += r["step"] - last[1]
                seconds += t - last[0]
            last = (t, r["step"])
        return steps / seconds if seconds >= _MIN_MEASURED_S and steps > 0 else None

    def steps_between(self, start_s: float, end_s: float) -> int:
        """Steps the job's runs completed within ``[start_s, end_s]`` (from each run's records in the window)."""
        steps, last = 0, None
        for r in self.read():
            t, event = r.get("t"), r.get("event")
            if t is None or event not in ("start", "step", "exit") or not start_s <= t <= end_s:
                continue
            if last is not None and event != "start":
                steps += max(int(r["step"]) - last, 0)
            last = int(r["step"])
        return steps

    def metrics(self) -> dict[str, float]:
        """The latest value of each numeric metric the job reported (``grad_sqr``, ``grad_var``, ``sync_time``)."""
        out: dict[str, float] = {}
        for r in self.read():
            if r.get("event") == "metrics":
                out.update({k: float(v) for k, v in r.items() if k not in ("event", "t")
                            and isinstance(v, (int, float)) and not isinstance(v, bool)})
        return out

    def steps_done(self) -> int:
        records = self.read()
        return int(records[-1].get("ckpt") or records[-1].get("step", 0)) if records else 0


# ----- journal -----------------------------------------------------------------------------
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (idx INTEGER PRIMARY KEY, start REAL NOT NULL, seconds REAL NOT NULL,
    leases TEXT NOT NULL, allocation TEXT NOT NULL, results TEXT NOT NULL, actions TEXT NOT NULL,
    timings TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS engine (id INTEGER PRIMARY KEY CHECK (id = 0), document TEXT NOT NULL);
"""


def lease_nodes(cluster: Cluster, leases: Sequence[Lease], slots: Mapping[str, Sequence[str]]
                ) -> dict[str, dict[str, Any]]:
    """The nodes each lease's GPU ids are on: per job, ``nodes`` (sorted), ``gpus`` per node and
    ``gpus_per_node`` (the most on one node).

    ``cluster`` is the engine's (its GPU ids are numbered type by type, :class:`GpuLayout`), ``slots``
    the node of each of a type's GPUs in that order (:meth:`SlurmController._gpu_slots`).

    Raises
    ------
    InvalidProblemError
        When a lease names a GPU that ``slots`` does not have.
    """
    starts = dict(zip(cluster.gpu_types, [0, *np.cumsum(cluster.capacity).tolist()]))
    out: dict[str, dict[str, Any]] = {}
    for lease in leases:
        have = slots.get(lease.gpu_type, ())
        local = [g - starts[lease.gpu_type] for g in lease.gpu_ids]
        if any(not 0 <= k < len(have) for k in local):
            raise InvalidProblemError(f"job {lease.job_id}: GPU ids {list(lease.gpu_ids)} of type {lease.gpu_type} "
                                      f"beyond the {len(have)} free GPUs of the type's nodes", field="gpu_ids")
        on = [have[k] for k in local]
        counts = {n: on.count(n) for n in sorted(set(on))}
        out[str(lease.job_id)] = {"nodes": sorted(counts), "gpus": [counts[n] for n in sorted(counts)],
                                  "gpus_per_node": max(counts.values(), default=0)}
    return out


class Journal:
    """The controller's state in SQLite (WAL, synchronous commits): jobs, rounds, the engine."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.db = sqlite3.connect(str(self.path), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)
        self._written: dict[str, str] = {}  # job id -> the record as last written (only changes are written)

    def jobs(self) -> dict[str, JobRecord]:
        return {row[0]: JobRecord(**json.loads(row[1]))
                for row in self.db.execute("SELECT job_id, record FROM jobs ORDER BY rowid")}

    def engine(self) -> dict[str, Any] | None:
        row = self.db.execute("SELECT document FROM engine WHERE id = 0").fetchone()
        return json.loads(row[0]) if row else None

    def last_round(self) -> tuple[int, float, dict[str, str]] | None:
        """Index, start (epoch s) and leases ``{job: gpu_type}`` of the last journaled round."""
        row = self.db.execute("SELECT idx, start, leases FROM rounds ORDER BY idx DESC LIMIT 1").fetchone()
        return None if row is None else (row[0], row[1], json.loads(row[2]))

    def rounds(self) -> list[dict[str, Any]]:
        """Every journaled round as a dict (for reports and tests)."""
        keys = ("idx", "start", "seconds", "leases", "allocation", "results", "actions", "timings")
        return [dict(zip(keys, row[:3] + tuple(json.loads(x) for x in row[3:])))
                for row in self.db.execute(f"SELECT {', '.join(keys)} FROM rounds ORDER BY idx")]

    def commit(self, jobs: Sequence[JobRecord], engine: Mapping[str, Any],
               round_row: tuple[int, float, float, Any, Any, Any, Any, Any] | None = None) -> None:
        """Write jobs, the engine's state and a round in one transaction."""
        with self.db:
            self.db.execute("BEGIN")
            rows = self._write_jobs(jobs)
            self.db.execute("INSERT OR REPLACE INTO engine VALUES (0, ?)", (json.dumps(engine),))
            if round_row is not None:
                idx, start, seconds, *docs = round_row
                self.db.execute("INSERT OR REPLACE INTO rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                (idx, start, seconds, *(json.dumps(d) for d in docs)))
        self._written.update(rows)

    def save_jobs(self, jobs: Sequence[JobRecord]) -> None:
        """Write the records of ``jobs`` that changed since last written (one transaction)."""
        with self.db:
            self.db.execute("BEGIN")
            rows = self._write_jobs(jobs)
        self._written.update(rows)

    def _write_jobs(self, jobs: Sequence[JobRecord]) -> list[tuple[str, str]]:
        rows = [(r.job_id, json.dumps(vars(r))) for r in jobs]
        self.db.executemany("INSERT OR REPLACE INTO jobs VALUES (?, ?)",
                            [row for row in rows if self._written.get(row[0]) != row[1]])
        return rows

    def set_timings(self, idx: int, timings: Mapping[str, float]) -> None:
        """Replace the timings of round ``idx`` (its enactment is timed after it was journaled)."""
        self.db.execute("UPDATE rounds SET timings = ? WHERE idx = ?", (json.dumps(timings), idx))

    def close(self) -> None:
        self.db.close()


# ----- the controller ------------------------------------------------------------------------
class SlurmController:
    """Enacts an :class:`allocopt.Engine`'s rounds on the opted-in jobs of Slurm partitions.

    Parameters
    ----------
    slurm : Slurm
        The commands, scoped to the managed partitions.
    journal : Journal
    spool : path
        Directory shared with the compute nodes: per job, the lease file, progress and checkpoints.
    policy : str
    round_seconds : float
        Length of a round, seconds.
    throughputs : mapping, optional
        ``(model, scale_factor) -> {gpu_type: steps/s}`` (see :func:`load_throughputs`).
    marker : str
        Comment prefix that opts a job in.
    out : text stream or None
        Where a line per round goes.
    profiles : path, optional
        With a goodput policy (``sia``): the application profiles elastic jobs name (default: Sia's
        shipped profiles).
    placement : str, optional
        Rigid jobs: a placement policy's name (``PLACEMENT_POLICIES``). With it, each lease is pinned to
        the nodes the policy chose (:func:`lease_nodes`): ``ExcNodeList`` leaves only those, and a lease
        spread evenly over several nodes sets ``NumNodes`` and ``Gres=gpu:N`` per node. A lease split
        unevenly (3 GPUs over two nodes), which Slurm's per-node GRES cannot express, pins its GPU type
        only. Without it, every lease pins the GPU type only and Slurm picks the nodes.
    admission : str, default "accept_all"
        Rigid jobs: an admission policy's name (``ADMISSION_POLICIES``), asked each round which of the
        opted-in jobs not yet admitted (first seen first) join the engine; the others stay held, their
        journal message saying they wait for admission.

    With a goodput policy the controller runs elastic jobs (comments with ``batch_size``...) with a
    :class:`~allocopt.runtime.elastic.GoodputEngine`; any other policy runs rigid jobs. Jobs of the other
    kind are rejected (kept held, with the reason).
    """

    def __init__(self, slurm: Slurm, journal: Journal, spool: str | os.PathLike, *,
                 policy: str = "max_min_fairness", round_seconds: float = 60.0,
                 throughputs: Mapping[tuple[str, int], Mapping[str, float]] | None = None,
                 marker: str = DEFAULT_MARKER, out: TextIO | None = None,
                 profiles: str | os.PathLike | None = None, placement: str | None = None,
                 admission: str = "accept_all"):
        if not (isinstance(round_seconds, (int, float)) and 0 < round_seconds < math.inf):
            raise InvalidOptionError(f"round_seconds must be a positive number of seconds, got {round_seconds!r}")
        self.slurm, self.journal, self.spool = slurm, journal, Path(spool)
        self.policy, self.round_seconds, self.marker, self.out = policy, float(round_seconds), marker, out
        self.throughputs = dict(throughputs or {})
        self.records = journal.jobs()
        self.elastic = is_goodput_policy(policy)
        if placement is not None:
            placement_policy(placement)  # an unknown name fails here
        self.placement, self.admission = placement, admission_policy(admission)
        if self.elastic and (placement is not None or admission != "accept_all"):
            raise InvalidOptionError(f"placement and admission policies apply to rigid jobs; policy {policy} places "
                                     "elastic jobs itself (leave --placement and --admission out)")
        self.profiles_dir = profiles
        self.profiles: dict[tuple[str, str], Any] = {}
        self.engine: Engine | GoodputEngine | None = None
        document = journal.engine()
        if document is not None:
            if document.get("format") == "allocopt-goodput-engine":
                if self.elastic:
                    for rec in self.records.values():
                        self._load_profiles(rec)
                self.engine = GoodputEngine.from_json(document, self.profiles)
                journaled_s = self.engine.round_seconds
            else:
                self.engine = Engine.from_json(document)
                journaled_s = self.engine.mechanism_options.round_seconds
            if self.engine.policy != policy or journaled_s != self.round_seconds:
                raise InvalidOptionError(f"the journal {journal.path} was written with policy "
                                         f"{self.engine.policy!r} and {journaled_s:g}-s rounds; restart with "
                                         "those, or give a new --state file")
            if isinstance(self.engine, Engine):
                if self.engine.placement.name != (placement or "best_fit"):
                    raise InvalidOptionError(f"the journal {journal.path} was written with placement "
                                             f"{self.engine.placement.name!r}; restart with it, or give a new --state "
                                             "file")
                self.engine.placement_models.update({j: r.model for j, r in self.records.items()})
        last = journal.last_round()
        self.round_index = 0 if last is None else last[0] + 1
        self.round_start = None if last is None else last[1]
        self.leases: dict[str, Any] = {} if last is None else last[2]  # rigid: job -> type; elastic: -> config
        self._progress: dict[str, _Progress] = {}
        self._warned_models: set[tuple[str, int]] = set()
        self._node_types: dict[str, str] = {}
        (self.spool / "jobs").mkdir(parents=True, exist_ok=True)

    # ----- state ------------------------------------------------------------------------
    def active(self) -> list[str]:
        """Ids of the opted-in jobs still to run."""
        return [j for j, r in self.records.items() if r.status == "active"]

    def _progress_of(self, job_id: str) -> _Progress:
        if job_id not in self._progress:
            self._progress[job_id] = _Progress(job_dir(self.spool, job_id) / "progress.jsonl")
        return self._progress[job_id]

    def _cluster(self, nodes: Sequence[SlurmNode], jobs: Sequence[SlurmJob]) -> tuple[dict[str, int], dict[str, int],
                                                                                      dict[str, str]]:
        """GPUs per type free for allocopt (up, single-type nodes, less the GPUs of running jobs that did not
        opt in), GPUs per node per type, and each node's type."""
        node_type = {n.name: n.gpu_type for n in nodes if n.gpu_type is not None}
        total: dict[str, int] = {}
        per_node: dict[str, int] = {}
        for n in nodes:
            if n.mixed:
                log.warning("node %s has several GPU types; allocopt leaves it out (one GPU type per node)", n.name)
            if n.gpu_type is not None and n.up:
                total[n.gpu_type] = total.get(n.gpu_type, 0) + n.gpus
                per_node[n.gpu_type] = max(per_node.get(n.gpu_type, 0), n.gpus)
        for j in jobs:
            if j.state in _RUNNING and j.job_id not in self.records:
                for k, node in enumerate(j.nodes):
                    if node_type.get(node) in total:
                        total[node_type[node]] = max(0, total[node_type[node]] - j.gpus_on(k))
        return total, per_node, node_type

    def _engine_throughputs(self, rec: JobRecord, types: Sequence[str]) -> dict[str, float]:
        key = (rec.model, rec.scale_factor)
        table = self.throughputs.get(key)
        if table is None and self.throughputs and key not in self._warned_models:
            self._warned_models.add(key)
            log.warning("job %s: model %r at %d GPU(s) is not in the throughput table; assuming %g steps/s on "
                        "every type until measured", rec.job_id, rec.model, rec.scale_factor, DEFAULT_STEPS_PER_S)
        out = {t: float((table or {}).get(t, 0.0 if table else DEFAULT_STEPS_PER_S)) for t in types}
        out.update({t: v for t, v in rec.measured.items() if t in out})
        if rec.gpu_types is not None:
            out = {t: (v if t in rec.gpu_types else 0.0) for t, v in out.items()}
        return out

    # ----- one round ----------------------------------------------------------------------
    def run_round(self) -> dict[str, Any]:
        """Observe Slurm, credit the last round, plan this one, journal it and enact it; returns its record."""
        t0 = time.time()
        jobs, nodes = self.slurm.jobs(), self.slurm.nodes()
        live = {j.job_id for j in jobs}
        jobs += self.slurm.jobs([j for j, r in self.records.items()  # how the tracked jobs that left ended
                                 if r.status in ("active", "rejected") and j not in live])
        now = time.time()
        by_id = {j.job_id: j for j in jobs}
        capacity, per_node, node_type = self._cluster(nodes, jobs)
        if node_type != self._node_types:  # for allocopt slurm exec: the GPU type of the job's node
            tmp = self.spool / ".nodes.json.tmp"
            tmp.write_text(json.dumps(node_type), encoding="utf-8")
            os.replace(tmp, self.spool / "nodes.json")
            self._node_types = node_type
        if self.elastic:
            return self._elastic_round(t0, jobs, nodes, by_id, now, node_type)
        if self.engine is None:
            if not capacity:
                raise InvalidProblemError(f"no typed GPU GRES (gpu:TYPE:N) on the up nodes of partition(s) "
                                          f"{', '.join(self.slurm.partitions) or '(all)'}; configure gres.conf "
                                          "with Type= on each node", field="partition")
            self.engine = Engine(Cluster(capacity, per_node), self.policy, round_seconds=self.round_seconds,
                                 recompute_min_seconds=RECOMPUTE_ROUNDS * self.round_seconds,
                                 placement=self.placement or "best_fit")
        engine = self.engine
        current = dict(zip(engine.cluster.gpu_types, engine.cluster.capacity.tolist()))
        for gpu_type in sorted(set(current) | set(capacity)):
            if current.get(gpu_type) != capacity.get(gpu_type, 0):
                engine.set_capacity(gpu_type, capacity.get(gpu_type, 0), gpus_per_node=per_node.get(gpu_type))
        types = list(engine.cluster.gpu_types)

        results = self._credit_last_round(by_id, node_type, now)
        self._track(jobs, by_id, types, now)
        self._admit(types)

        t1 = time.time()
        leased: dict[str, str] = {}
        pinned: dict[str, dict[str, Any]] = {}
        if len(engine):  # (an engine without jobs has no round to plan)
            plan = engine.next_round(self.round_seconds)
            leased = {lease.job_id: lease.gpu_type for lease in plan.leases}
            if self.placement is not None:
                pinned = lease_nodes(engine.cluster, plan.leases, self._gpu_slots(nodes, jobs)[0])
        t2 = time.time()
        document = engine.to_json()
        # the allocation the priority mechanism follows (installed at its last recompute)
        installed = {str(job): state["allocation"] for job, state in document["rounds"]["jobs"]}
        hold, preempt, release, settling = self._decide(leased, by_id, node_type, nodes, pinned)

        # journal, then enact (a crash in between is repaired by the next round's comparison with Slurm)
        self.leases = {j: t for j, t in leased.items()}
        actions = {"hold": hold, "requeuehold": preempt, "release": sorted(release)}
        if pinned:
            actions["nodes"] = {j: pinned[j]["nodes"] for j in sorted(release) if not isinstance(release[j], str)}
        self.journal.commit(list(self.records.values()), document,
                            (self.round_index, now, self.round_seconds, self.leases, installed,
                             [[r.job_id, r.run_seconds, r.measured_steps_per_s] for r in results], actions,
                             {"observe_s": t1 - t0, "solve_s": t2 - t1}))
        t3 = time.time()
        later = [j for j in settling if j in release]
        failed = self.slurm.enact(hold, preempt, {j: x for j, x in release.items() if j not in later})
        t4 = time.time()
        if later:  # the rest are released by a later round (they are held and leased)
            stopped = self.slurm.wait_requeued(later, timeout_s=min(self.round_seconds / 2, 60.0))
            failed |= self.slurm.release({j: release[j] for j in stopped})
        t5 = time.time()
        timings = {"observe_s": t1 - t0, "solve_s": t2 - t1, "journal_s": t3 - t2, "enact_s": t4 - t3,
                   "round_s": t4 - t0, "requeued_release_s": t5 - t4}
        self.journal.set_timings(self.round_index, timings)
        record = {"idx": self.round_index, "start": now, "leases": self.leases, "actions": actions,
                  "failed": failed, "timings": timings}
        if self.out is not None:
            self._print_round(record)
        self.round_index += 1
        self.round_start = now
        return record

    # ----- elastic jobs (a goodput policy) -----------------------------------------------
    def _gpu_slots(self, nodes: Sequence[SlurmNode], jobs: Sequence[SlurmJob]) -> tuple[dict[str, list[str]],
                                                                                          dict[str, int]]:
        """Per GPU type, the node of each GPU free for allocopt (up single-type nodes in name order, less the
        GPUs of running jobs that did not opt in): the goodput engine's GPU ids of the type, in order; and the
        most GPUs of a node per type."""
        foreign: dict[str, int] = {}
        for j in jobs:
            if j.state in _RUNNING and j.job_id not in self.records:
                for k, node in enumerate(j.nodes):
                    foreign[node] = foreign.get(node, 0) + j.gpus_on(k)
        slots: dict[str, list[str]] = {}
        per_node: dict[str, int] = {}
        for n in sorted(nodes, key=lambda n: n.name):
            if n.gpu_type is not None and n.up:
                slots.setdefault(n.gpu_type, []).extend([n.name] * max(n.gpus - foreign.get(n.name, 0), 0))
                per_node[n.gpu_type] = max(per_node.get(n.gpu_type, 0), n.gpus)
        return slots, per_node

    def _elastic_engine(self, slots: Mapping[str, list[str]], per_node: Mapping[str, int]) -> GoodputEngine:
        """The goodput engine on the cluster of ``slots``: created on the first round, rebuilt (keeping every
        job's measurements and models) when the capacity changed (nodes down or back, foreign jobs)."""
        types = sorted(set(slots) | (set(self.engine.cluster.gpu_types) if self.engine is not None else set()))
        capacity = {t: len(slots.get(t, ())) for t in types}
        gpus_per_node = {t: max(per_node.get(t, 1), 1) for t in types}
        if not any(capacity.values()) and self.engine is None:
            raise InvalidProblemError(f"no typed GPU GRES (gpu:TYPE:N) on the up nodes of partition(s) "
                                      f"{', '.join(self.slurm.partitions) or '(all)'}; configure gres.conf "
                                      "with Type= on each node", field="partition")
        if self.engine is None:
            self.engine = GoodputEngine(Cluster(capacity, gpus_per_node), self.policy,
                                        round_seconds=self.round_seconds, profiles=self.profiles)
        engine = self.engine
        assert isinstance(engine, GoodputEngine)
        current = dict(zip(engine.cluster.gpu_types, engine.cluster.capacity.tolist()))
        if current != capacity or dict(zip(engine.cluster.gpu_types, engine.cluster.gpus_per_node.tolist())) \
                != gpus_per_node:
            log.info("capacity changed from %s to %s: goodput engine rebuilt", current, capacity)
            document = engine.to_json()
            document["cluster"] = {"gpus": capacity, "gpus_per_node": gpus_per_node}
            self.engine = engine = GoodputEngine.from_json(document, self.profiles)
        return engine

    @staticmethod
    def _config_of(sj: SlurmJob, node_type: Mapping[str, str]) -> tuple[str | None, tuple[str, ...], int]:
        """(GPU type, nodes, GPUs) a job runs (or ran) on, as Slurm shows it."""
        return (node_type.get(sj.nodes[0]) if sj.nodes else None), tuple(sorted(sj.nodes)), sj.gpus[1]

    @staticmethod
    def _runs(config: tuple[str | None, tuple[str, ...], int], lease: Mapping[str, Any] | None) -> bool:
        """Whether Slurm's ``config`` of a job is ``lease``'s allocation."""
        return lease is not None and config == (lease["gpu_type"], tuple(lease["nodes"]), lease["replicas"])

    def _credit_elastic(self, by_id: Mapping[str, SlurmJob], node_type: Mapping[str, str],
                        now: float) -> list[JobRoundResult]:
        """Credit the last round's leases with the seconds and steps their jobs ran at the lease's configuration
        (Slurm's start and end times), the steps/s measured from their progress records and the metrics they
        reported: the goodput engine refits their models from them."""
        results: list[JobRoundResult] = []
        if self.round_start is None or not isinstance(self.engine, GoodputEngine):
            return results
        for job_id, lease in self.leases.items():
            rec, sj = self.records.get(job_id), by_id.get(job_id)
            ran, begin, restarted = 0.0, now, False
            if sj is not None and sj.start_s is not None and self._runs(self._config_of(sj, node_type), lease):
                begin = max(sj.start_s, self.round_start)
                restarted = sj.start_s >= self.round_start
                if sj.state in _RUNNING and not sj.requeueing:
                    ran = max(0.0, now - begin)
                elif sj.end_s is not None:
                    ran = max(0.0, min(sj.end_s, now) - begin)
            progress = self._progress_of(job_id)
            rate = progress.rate(begin, now) if ran > 0 else None
            steps = progress.steps_between(begin, now) if ran > 0 else 0
            if rec is not None:
                rec.received[lease["gpu_type"]] = rec.received.get(lease["gpu_type"], 0.0) + ran * lease["replicas"]
            if job_id in self.engine:
                results.append(JobRoundResult(job_id, RoundOutcome.PREEMPTED, steps, ran, rate, restarted, "",
                                              progress.metrics()))
        self.engine.record_round(results)
        for r in results:
            if r.measured_steps_per_s is not None:
                t = self.leases[r.job_id]["gpu_type"]
                self.records[r.job_id].measured[t] = self.engine.get_job(r.job_id)["throughputs"][t]
        return results

    def _elastic_round(self, t0: float, jobs: Sequence[SlurmJob], nodes: Sequence[SlurmNode],
                       by_id: Mapping[str, SlurmJob], now: float, node_type: Mapping[str, str]) -> dict[str, Any]:
        """A round of elastic jobs: plan with the goodput engine, then requeue-hold the jobs whose configuration
        (GPU type, nodes, GPU count, batch) changes, update them (``ExcNodeList``, ``NumNodes``, ``Gres``,
        ``NumTasks``) and release them with their new lease; jobs whose configuration stays keep running."""
        slots, per_node = self._gpu_slots(nodes, jobs)
        engine = self._elastic_engine(slots, per_node)
        types = list(engine.cluster.gpu_types)
        results = self._credit_elastic(by_id, node_type, now)
        self._track(jobs, by_id, types, now)
        for job_id in self.active():
            if job_id in engine:
                rec = self.records[job_id]
                done = max(rec.steps_done, self._progress_of(job_id).steps_done())
                engine.sync_progress(job_id, done)
                if rec.total_steps is not None:
                    engine.update_job(job_id, num_steps_remaining=max(rec.total_steps - done, 1))

        t1 = time.time()
        wanted: dict[str, dict[str, Any]] = {}
        if len(engine):
            plan = engine.next_round()
            starts = dict(zip(engine.cluster.gpu_types, [0, *np.cumsum(engine.cluster.capacity).tolist()]))
            for lease in plan.leases:
                on = [slots[lease.gpu_type][g - starts[lease.gpu_type]] for g in lease.gpu_ids]
                counts = {n: on.count(n) for n in on}
                batch = asdict(lease.batch) if lease.batch is not None else {}
                total = engine.launch_total_steps(lease.job_id, batch["batch_size"]) if batch else None
                wanted[str(lease.job_id)] = {"gpu_type": lease.gpu_type, "nodes": sorted(counts),
                                             "gpus_per_node": max(counts.values()), "replicas": len(on),
                                             "batch": batch, "round": self.round_index,
                                             "total_steps": total or self.records[str(lease.job_id)].total_steps}
        t2 = time.time()
        hold, preempt, release, settling = self._decide_elastic(wanted, by_id, node_type)
        decisions = {str(j): {"gpu_type": d.gpu_type, "replicas": d.replicas, **d.to_json()}
                     for j, d in engine.decisions.items() if str(j) in wanted}
        self.leases = wanted
        actions = {"hold": hold, "requeuehold": preempt, "release": sorted(release) + sorted(settling)}
        self.journal.commit(list(self.records.values()), engine.to_json(),
                            (self.round_index, now, self.round_seconds, self.leases, decisions,
                             [[r.job_id, r.run_seconds, r.measured_steps_per_s] for r in results], actions,
                             {"observe_s": t1 - t0, "solve_s": t2 - t1}))
        t3 = time.time()
        failed = self.slurm.hold(hold) if hold else {}
        # a job held here may have been requeued by Slurm moments ago (its node went down): it starts after the
        # delay that keeps slurmd from refusing its new credential
        held_here = set(hold)
        failed |= self._release_elastic([j for j in release if j not in failed and j not in held_here], wanted, by_id)
        failed |= self._release_elastic([j for j in release if j not in failed and j in held_here], wanted, by_id,
                                        start=f"now+{RESTART_DELAY_S}")
        if preempt:
            failed |= self.slurm.requeue_hold(preempt)
        t4 = time.time()
        if settling:  # requeued jobs are released once they stopped (the rest by a later round: held, leased)
            stopped = self.slurm.wait_requeued(settling, timeout_s=min(self.round_seconds / 2, 60.0))
            failed |= self._release_elastic(stopped, wanted, by_id, start=f"now+{RESTART_DELAY_S}")
        t5 = time.time()
        timings = {"observe_s": t1 - t0, "solve_s": t2 - t1, "journal_s": t3 - t2, "enact_s": t4 - t3,
                   "round_s": t4 - t0, "requeued_release_s": t5 - t4}
        self.journal.set_timings(self.round_index, timings)
        record = {"idx": self.round_index, "start": now, "leases": self.leases, "actions": actions,
                  "failed": failed, "timings": timings}
        if self.out is not None:
            self._print_round(record)
        self.round_index += 1
        self.round_start = now
        return record

    def _decide_elastic(self, wanted: Mapping[str, Mapping[str, Any]], by_id: Mapping[str, SlurmJob],
                        node_type: Mapping[str, str]) -> tuple[list[str], list[str], list[str], list[str]]:
        """The jobs to hold, to requeue held, to release now (held, or held first), and to release once their
        requeue completed. A running job keeps running exactly when Slurm runs it on its lease's nodes and
        GPU count and it was released with the lease's batch."""
        hold: list[str] = []
        preempt: list[str] = []
        release: list[str] = []
        settling: list[str] = []
        for job_id, rec in self.records.items():
            sj = by_id.get(job_id)
            if sj is None or sj.state in FINAL_STATES:
                continue
            want = wanted.get(job_id) if rec.status == "active" else None
            same = want is not None and rec.lease is not None and all(
                rec.lease.get(k) == want[k] for k in ("gpu_type", "nodes", "replicas", "batch"))
            if sj.state in _RUNNING and not sj.requeueing:
                if not (same and self._runs(self._config_of(sj, node_type), want)):
                    preempt.append(job_id)
                    rec.preemptions += 1
                    if want is not None:
                        settling.append(job_id)
            elif sj.requeueing:
                if want is not None:
                    settling.append(job_id)
            elif sj.state == "PENDING":
                if want is None:
                    if not sj.held:
                        hold.append(job_id)
                elif sj.held:
                    release.append(job_id)
                elif not same or _delayed_by_slurm(sj):
                    # released for another configuration (or never by allocopt), or requeued by Slurm itself
                    # (its node went down) to begin minutes later: held first, released to start now
                    hold.append(job_id)
                    release.append(job_id)
            rec.lease_type = None if want is None else want["gpu_type"]
        return hold, preempt, release, settling

    def _release_elastic(self, job_ids: Sequence[str], wanted: Mapping[str, Mapping[str, Any]],
                         by_id: Mapping[str, SlurmJob], start: str = "now") -> dict[str, str]:
        """Write each held job's lease, set its configuration (``ExcNodeList``: every node but its lease's;
        ``NumNodes`` where Slurm's node count differs (scontrol takes it for one job per call); ``Gres=gpu:N``
        per node; for jobs of one task per GPU ``NumTasks``, ``NumCPUs`` and ``MinCPUsNode``, so that each node
        has a CPU per task) and release it."""
        if not job_ids:
            return {}
        all_nodes = sorted(self._node_types)
        updates: dict[str, tuple[str, ...]] = {}
        for job_id in job_ids:
            rec, want = self.records[job_id], wanted[job_id]
            excluded = [n for n in all_nodes if n not in want["nodes"]]
            if rec.user_excluded:
                excluded.append(rec.user_excluded)
            sj = by_id.get(job_id)
            same_count = sj is not None and sj.num_nodes == len(want["nodes"])
            count = len(want["nodes"])  # N-N: Slurm refuses a bare NumNodes=N above a job's submitted -N
            nodes = () if same_count else (f"NumNodes={count}-{count}",)
            updates[job_id] = (f"ExcNodeList={','.join(excluded)}", *nodes, f"Gres=gpu:{want['gpus_per_node']}",
                               *([f"NumTasks={want['replicas']}", f"NumCPUs={want['replicas']}",
                                  f"MinCPUsNode={want['gpus_per_node']}"] if rec.tasks_per_gpu else []))
            self._write_elastic_lease(rec, want)
            rec.lease = dict(want)
            rec.releases += 1
        # journaled before Slurm sees it: a controller killed from here on and restarted finds each of these jobs
        # either held (it releases it again) or running its lease (it leaves it running)
        self.journal.save_jobs([self.records[j] for j in job_ids])
        return self.slurm.update_release(updates, start)

    def _write_elastic_lease(self, rec: JobRecord, want: Mapping[str, Any]) -> None:
        jdir = job_dir(self.spool, rec.job_id)
        jdir.mkdir(parents=True, exist_ok=True)
        tmp = jdir / ".lease.json.tmp"
        epoch = issue_epoch(str(jdir))  # every earlier launch of the job is fenced off (client.fenced)
        tmp.write_text(json.dumps({"gpu_type": want["gpu_type"], "round": want["round"],
                                   "total_steps": want["total_steps"], "replicas": want["replicas"],
                                   "nodes": want["nodes"], "gpus_per_node": want["gpus_per_node"], "epoch": epoch,
                                   **want["batch"]}),
                       encoding="utf-8")
        os.replace(tmp, jdir / "lease.json")

    def _credit_last_round(self, by_id: Mapping[str, SlurmJob], node_type: Mapping[str, str],
                           now: float) -> list[JobRoundResult]:
        """Credit the last round's leases with the seconds their jobs ran on the lease's type (Slurm's start
        and end times, so a controller's downtime counts) and the steps/s they measured."""
        results: list[JobRoundResult] = []
        if self.round_start is None or self.engine is None:
            return results
        for job_id, gpu_type in self.leases.items():
            rec, sj = self.records.get(job_id), by_id.get(job_id)
            ran = 0.0
            if sj is not None and sj.start_s is not None:
                begin = max(sj.start_s, self.round_start)
                if sj.state in _RUNNING and sj.nodes and node_type.get(sj.nodes[0]) == gpu_type:
                    ran = max(0.0, now - begin)
                elif sj.state in FINAL_STATES and sj.end_s is not None:
                    ran = max(0.0, min(sj.end_s, now) - begin)
            # (from this run's start only: an earlier run on another type may have logged steps in the round)
            rate = self._progress_of(job_id).rate(begin, now) if ran > 0 else None
            if rec is not None:
                rec.received[gpu_type] = rec.received.get(gpu_type, 0.0) + ran
            if job_id in self.engine:
                results.append(JobRoundResult(job_id, RoundOutcome.PREEMPTED, 0, ran, rate))
        self.engine.record_round(results)  # the journaled leases are the engine's unrecorded ones
        for r in results:
            if r.measured_steps_per_s is not None:
                self.records[r.job_id].measured[self.leases[r.job_id]] = \
                    self.engine.get_job(r.job_id)["throughputs"][self.leases[r.job_id]]
        return results

    def _track(self, jobs: Sequence[SlurmJob], by_id: Mapping[str, SlurmJob], types: Sequence[str],
               now: float) -> None:
        """Records for newly seen opted-in jobs (added to the engine, or rejected); finished and vanished
        jobs leave the engine."""
        excluded = self.slurm.excluded_nodes([sj.job_id for sj in jobs if sj.job_id not in self.records
                                               and sj.state not in FINAL_STATES and self.marker in sj.comment])
        for sj in jobs:
            rec = self.records.get(sj.job_id)
            if rec is None:
                sj = replace(sj, excluded=excluded.get(sj.job_id, ""))
                if sj.state in FINAL_STATES:
                    continue  # finished before the controller saw it
                try:
                    attrs = parse_comment(sj.comment, self.marker)
                except InvalidProblemError as err:
                    attrs, problem = {}, str(err)
                else:
                    problem = ""
                if attrs is None:
                    continue  # not opted in: never touched
                try:
                    rec = new_record(sj, attrs, types) if not problem else None
                except InvalidProblemError as err:
                    problem = str(err)
                if rec is not None:
                    problem = self._add_to_engine(rec, types)
                if problem:
                    rec = JobRecord(sj.job_id, sj.name, sj.name, max(sj.gpus[1], 1), status="rejected",
                                    message=problem)
                    log.error("job %s rejected (kept held): %s", sj.job_id, problem)
                self.records[sj.job_id] = rec
            elif rec.status in ("active", "rejected") and sj.state in FINAL_STATES:
                rec.status = {"COMPLETED": "done", "CANCELLED": "cancelled"}.get(sj.state, "failed")
                rec.finished, rec.lease_type = sj.end_s or now, None
                rec.message = f"Slurm state {sj.state}" if rec.status != "done" else ""
                rec.steps_done = max(rec.steps_done, self._progress_of(sj.job_id).steps_done())
                if sj.job_id in self.engine:
                    self.engine.remove_job(sj.job_id)
        for job_id, rec in self.records.items():
            if rec.status == "active" and job_id not in by_id:
                rec.status, rec.finished, rec.lease_type = "gone", now, None
                rec.message = "left Slurm's records (MinJobAge) before the controller saw it finish"
                if job_id in self.engine:
                    self.engine.remove_job(job_id)
            if rec.status == "active" and (job_id in self.leases or rec.lease_type is not None):
                rec.steps_done = max(rec.steps_done, self._progress_of(job_id).steps_done())

    def _add_to_engine(self, rec: JobRecord, types: Sequence[str]) -> str:
        """Add a new job to the engine; the reason it cannot be ("" when added)."""
        if self.elastic != (rec.elastic is not None):
            return (f"job {rec.job_id} is elastic (batch_size...), which policy {self.policy} does not run; run "
                    "allocopt slurm with a goodput policy (--policy sia)" if rec.elastic is not None else
                    f"job {rec.job_id} is rigid (no batch_size in its comment), and policy {self.policy} runs elastic "
                    "jobs only; give it batch_size (and min_replicas, max_replicas...), or use another policy")
        if isinstance(self.engine, GoodputEngine):
            try:
                self._load_profiles(rec)
                self.engine.add_job(rec.job_id, ElasticSpec(**rec.elastic), gpu_types=rec.gpu_types,  # type: ignore[arg-type]
                                    submitted=rec.first_seen)
            except AllocoptError as err:
                return str(err)
        elif isinstance(self.admission, AcceptAll):
            self.engine.add_job(rec.job_id, self._engine_throughputs(rec, types),  # type: ignore[union-attr]
                                scale_factor=rec.scale_factor, priority_weight=rec.weight)
            self.engine.placement_models[rec.job_id] = rec.model  # type: ignore[union-attr]
        return ""  # (with an admission policy, _admit adds it)

    def _admit(self, types: Sequence[str]) -> None:
        """Rigid jobs: ask the admission policy which active jobs not in the engine (first seen first) join
        it; the others stay held with a message."""
        engine = self.engine
        if self.elastic or engine is None:
            return
        queued = sorted((j for j, r in self.records.items() if r.status == "active" and j not in engine),
                        key=lambda j: self.records[j].first_seen)
        if not queued:
            return
        names = [j for j, r in self.records.items() if r.status == "active" and j in engine] + queued
        recs = [self.records[j] for j in names]
        scale = np.array([r.scale_factor for r in recs], dtype=np.int64)
        active = np.arange(len(names)) < len(names) - len(queued)
        waiting = np.flatnonzero(~active)
        mask = admit_jobs(self.admission, engine.cluster, scale, np.array([r.first_seen for r in recs]), active,
                          waiting, time.time())
        demand = int(scale[active].sum() + scale[waiting[mask]].sum())
        for job_id, admitted in zip(queued, mask.tolist()):
            rec = self.records[job_id]
            if admitted:
                rec.message = ""
                engine.add_job(job_id, self._engine_throughputs(rec, types), scale_factor=rec.scale_factor,
                               priority_weight=rec.weight)
                engine.placement_models[job_id] = rec.model
            else:
                rec.message = (f"waiting for admission ({self.admission.name}): the admitted jobs ask for {demand} "
                               f"of the cluster's {int(engine.cluster.capacity.sum())} GPUs")

    def _load_profiles(self, rec: JobRecord) -> None:
        """Load the application profile an elastic job names (once per application)."""
        app = (rec.elastic or {}).get("application")
        if app and not any(a == app for a, _ in self.profiles):
            self.profiles.update(load_job_profiles(self.profiles_dir, [app]))
            if isinstance(self.engine, GoodputEngine):
                self.engine.profiles.update(self.profiles)

    def _decide(self, leased: Mapping[str, str], by_id: Mapping[str, SlurmJob], node_type: Mapping[str, str],
                nodes: Sequence[SlurmNode], pinned: Mapping[str, Mapping[str, Any]] | None = None
                ) -> tuple[list[str], list[str], dict[str, str | tuple[str, ...]], list[str]]:
        """Compare Slurm's state with the round's leases: the jobs to hold, to requeue held, to release
        (with their exclusion lists, or the fields to set when ``pinned`` gives a lease's nodes,
        :func:`lease_nodes`), and the requeued ones whose release waits until they stopped."""
        pinned = pinned or {}
        hold: list[str] = []
        preempt: list[str] = []
        release: dict[str, str | tuple[str, ...]] = {}
        settling: list[str] = []  # requeued jobs to release once they stopped
        all_nodes = sorted(node_type) + sorted(n.name for n in nodes if n.mixed)
        for job_id, rec in self.records.items():
            sj = by_id.get(job_id)
            if sj is None or sj.state in FINAL_STATES:
                continue
            want = leased.get(job_id) if rec.status == "active" else None
            running = sj.state in _RUNNING and not sj.requeueing
            on = node_type.get(sj.nodes[0]) if running and sj.nodes else None
            pin = pinned.get(job_id) if want is not None else None
            if pin is not None and len(set(pin["gpus"])) != 1:
                pin = None  # Slurm's GRES is per node: an uneven split is not expressible; the type is pinned only
            if pin is not None and on == want and sorted(sj.nodes) != pin["nodes"]:
                on = None  # running on other nodes than the placement chose: requeued and released there
            if want is not None and (sj.requeueing or (running and on != want)):
                settling.append(job_id)
            if running and on != want:
                preempt.append(job_id)
                rec.preemptions += 1
            if want is None:
                if sj.state == "PENDING" and not sj.held:
                    hold.append(job_id)
            elif not (running and on == want) and (sj.held or running or rec.lease_type != want or (
                    pin is not None and (rec.lease or {}).get("nodes") != pin["nodes"])):
                excluded = [n for n in all_nodes if node_type.get(n) != want or (pin is not None
                                                                                  and n not in pin["nodes"])]
                if rec.user_excluded:
                    excluded.append(rec.user_excluded)
                release[job_id] = ",".join(excluded)
                if pin is not None:
                    release[job_id] = self._pinned_fields(release[job_id], pin, sj)
                    rec.lease = {"nodes": pin["nodes"]}
                rec.releases += 1
                self._write_lease(rec, want)
            rec.lease_type = want
        return hold, preempt, release, settling

    @staticmethod
    def _pinned_fields(excluded: str, pin: Mapping[str, Any], sj: SlurmJob) -> tuple[str, ...]:
        """``scontrol update`` fields of a rigid job released on a placement's nodes (its GPUs split evenly over
        them): ``ExcNodeList``, and ``NumNodes=N-N`` with ``Gres=gpu:K`` per node when the job's node count
        differs (``N-N``: Slurm refuses a plain count above the maximum of a job submitted with ``-N``)."""
        fields: tuple[str, ...] = (f"ExcNodeList={excluded}",)
        if sj.num_nodes != len(pin["nodes"]):
            count = len(pin["nodes"])
            fields += (f"NumNodes={count}-{count}", f"Gres=gpu:{pin['gpus_per_node']}")
        return fields

    def _write_lease(self, rec: JobRecord, gpu_type: str) -> None:
        jdir = job_dir(self.spool, rec.job_id)
        jdir.mkdir(parents=True, exist_ok=True)
        tmp = jdir / ".lease.json.tmp"
        tmp.write_text(json.dumps({"gpu_type": gpu_type, "round": self.round_index, "total_steps": rec.total_steps}),
                       encoding="utf-8")
        os.replace(tmp, jdir / "lease.json")

    def run(self, *, max_rounds: int | None = None, exit_when_done: bool = False) -> dict[str, Any]:
        """Run rounds every ``round_seconds`` until interrupted, ``max_rounds``, or (``exit_when_done``)
        no opted-in job is left to run after one was seen; return :meth:`report`."""
        rounds = 0
        while max_rounds is None or rounds < max_rounds:
            started = time.monotonic()
            try:
                self.run_round()
            except SlurmError as err:  # slurmctld restarting or overloaded: nothing changed, try next round
                log.warning("round skipped: %s", err)
            rounds += 1
            if exit_when_done and self.records and not self.active():
                break
            time.sleep(max(0.0, self.round_seconds - (time.monotonic() - started)))
        return self.report()

    def report(self) -> dict[str, Any]:
        """Per job: status, steps, GPU seconds received per type, measured steps/s, releases, preemptions."""
        return {"rounds": self.round_index,
                "jobs": {j: {k: v for k, v in asdict(r).items() if k not in ("user_excluded",)}
                         for j, r in self.records.items()}}

    def _print_round(self, record: Mapping[str, Any]) -> None:
        cells = [f"{j}:{t}" if isinstance(t, str) else f"{j}:{t['gpu_type']}x{t['replicas']}"
                 + (f"/b{t['batch']['batch_size']}" if t.get("batch") else "")
                 for j, t in list(record["leases"].items())[:8]]
        cells += ["..."] if len(record["leases"]) > 8 else []
        a, tm = record["actions"], record["timings"]
        self.out.write(f"round {record['idx']}: {len(self.active())} active, run {' '.join(cells) or '-'}; "
                       f"released {len(a['release'])}, requeued {len(a['requeuehold'])}, held {len(a['hold'])}; "
                       f"solve {tm['solve_s']:.3f}s, round {tm['round_s']:.3f}s\n")
        self.out.flush()


# ----- command line -------------------------------------------------------------------------
def add_parser(commands: Any) -> None:
    """Register ``allocopt slurm {run,exec,status}`` on the ``allocopt`` command line's subparsers."""
    p = commands.add_parser("slurm", help="enact allocopt's rounds on a Slurm cluster (controller, job wrapper)",
                            description="Run allocopt beside slurmctld: opted-in jobs (--comment=allocopt...) are "
                                        "held, released on a GPU type and requeued held, round by round.")
    sub = p.add_subparsers(dest="slurm_command", required=True, metavar="ACTION")
    r = sub.add_parser("run", help="run the controller until interrupted")
    r.add_argument("--partition", action="append", default=[], metavar="NAME",
                   help="a partition to manage (repeatable; default: all)")
    r.add_argument("--spool", required=True, metavar="DIR",
                   help="directory shared with the compute nodes (lease, progress and checkpoint files)")
    r.add_argument("--state", metavar="FILE", help="SQLite journal (default: SPOOL/controller.sqlite)")
    r.add_argument("--policy", default="max_min_fairness",
                   help="allocation policy (default: %(default)s); sia runs elastic jobs (comment keys batch_size, "
                        "min_replicas, max_replicas...) with goodput rounds")
    r.add_argument("--profiles", metavar="DIR",
                   help="application profiles the elastic jobs name (default: Sia's profiles shipped with allocopt)")
    r.add_argument("--round-seconds", type=float, default=60.0, help="round length in s (default: %(default)s)")
    r.add_argument("--throughputs", metavar="FILE",
                   help="throughput table (CSV or JSON of model, scale_factor, gpu_type, throughput), keyed by "
                        "the job's model= attribute (default: its job name)")
    r.add_argument("--marker", default=DEFAULT_MARKER, help="comment prefix that opts a job in (default: %(default)s)")
    r.add_argument("--max-rounds", type=int, help="stop after this many rounds")
    r.add_argument("--exit-when-done", action="store_true",
                   help="stop once every opted-in job seen has finished")
    r.add_argument("--placement", metavar="NAME",
                   help="rigid jobs: pin each lease to the nodes a placement policy chose: best_fit, packing, "
                        "scattered or consolidated (by the job's model=); default: pin the GPU type only, Slurm "
                        "picks the nodes")
    r.add_argument("--admission", default="accept_all", metavar="NAME",
                   help="rigid jobs: admission control, accept_all (the default) or load_based (Blox's: admitted "
                        "while the admitted jobs ask for at most 1.2 x the GPUs; the others stay held, with a "
                        "message in the journal)")
    r.set_defaults(run=_run_controller)
    e = sub.add_parser("exec", help="(in a job script) run COMMAND with the allocopt job client's environment "
                                    "(python -m allocopt.integrations.slurm_exec starts faster)")
    add_exec_arguments(e)
    e.set_defaults(run=_run_exec)
    s = sub.add_parser("status", help="print the journaled jobs as JSON")
    s.add_argument("--state", required=True, metavar="FILE", help="the controller's journal")
    s.set_defaults(run=_run_status)


def _run_controller(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    spool = Path(args.spool)
    spool.mkdir(parents=True, exist_ok=True)
    controller = SlurmController(Slurm(args.partition), Journal(args.state or spool / "controller.sqlite"), spool,
                                 policy=args.policy, round_seconds=args.round_seconds,
                                 throughputs=load_throughputs(args.throughputs), marker=args.marker,
                                 out=sys.stdout, profiles=args.profiles, placement=args.placement,
                                 admission=args.admission)
    try:
        controller.run(max_rounds=args.max_rounds, exit_when_done=args.exit_when_done)
    except KeyboardInterrupt:
        log.info("interrupted: Slurm keeps running the released jobs; held jobs stay held")
    return 0


def _run_exec(args: argparse.Namespace) -> int:
    exec_job(args.spool, args.job_command)
    return 0  # not reached


def _run_status(args: argparse.Namespace) -> int:
    if not Path(args.state).exists():
        raise InvalidOptionError(f"no journal at {args.state}")
    journal = Journal(args.state)
    json.dump({j: asdict(r) for j, r in journal.jobs().items()}, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0
