"""The scheduler loop: solve, plan a round, run it, measure, journal; until every job is done.

The unfinished jobs live in an :class:`allocopt.Engine` with their throughput
estimates (hints, then measurements): each round :meth:`~allocopt.Engine.next_round`
solves the policy when something changed and turns the time fractions into
leases with Gavel's priority mechanism and placement, an executor (local
processes or Ray) runs them, :meth:`~allocopt.Engine.record_round` credits the
run time and measured throughputs, and the outcome is journaled to SQLite
(:class:`StateStore`), so a killed scheduler restarted on the same state file
resumes every job from its last checkpoint.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from allocopt.cluster import Cluster
from allocopt.engine import Engine
from allocopt.documents import parse_json, parse_yaml, read_text
from allocopt.errors import DataFileError, InvalidProblemError
from allocopt.runtime.executor import Lease, RoundOutcome
from allocopt.runtime.local import JobSpec, LocalExecutor

#: Steps/s assumed for a job on a GPU type it may run on, until it gives a hint or is measured there.
DEFAULT_STEPS_PER_S = 1.0

#: The allocation is solved again (jobs finished, throughputs measured) at most once per this many
#: rounds, about Gavel's ratio (1920 s for 360-s rounds): in between, the time each job received
#: orders the priorities, so equal time fractions take turns.
RECOMPUTE_ROUNDS = 5


@dataclass(frozen=True)
class JobConfig:
    """One job of a JOBS file.

    ``throughputs``: optional hints, steps/s of the whole job per GPU type;
    ``gpu_types``: the types it may run on (default: all).
    """

    name: str
    command: list[str] | str
    total_steps: int
    scale_factor: int = 1
    priority_weight: float = 1.0
    throughputs: dict[str, float] | None = None
    gpu_types: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def spec(self) -> JobSpec:
        """The executor's view of the job (name, command, total steps, environment)."""
        return JobSpec(self.name, self.command, self.total_steps, self.env)


def load_jobs(path: str | Path) -> list[JobConfig]:
    """Jobs from a YAML (needs PyYAML: the ``runtime`` extra) or JSON file ``{"jobs": [{...}, ...]}``.

    Raises
    ------
    DataFileError
        For a file that cannot be read, is not UTF-8 text or not valid JSON/YAML (naming the line).
    InvalidProblemError
        For a malformed job (``field`` and ``job`` name it; the message names the file, the job's
        index and, for YAML, its line).
    """
    text = read_text(path, what="the job file")
    if str(path).lower().endswith(".json"):
        doc = parse_json(text, path)
    else:
        try:
            doc = parse_json(text, path)
        except DataFileError:
            doc = parse_yaml(text, path)
    if not isinstance(doc, Mapping) or not isinstance(doc.get("jobs"), list) or not doc["jobs"]:
        raise InvalidProblemError(f"{path} must hold 'jobs: [{{name, command, total_steps, ...}}, ...]'",
                                  field="jobs")
    known = set(JobConfig.__dataclass_fields__)
    jobs = []
    for k, entry in enumerate(doc["jobs"]):
        where = f"{path}, job {k}" + (f" (line {line})" if (line := _yaml_item_line(text, k)) else "")
        if not isinstance(entry, Mapping) or not {"name", "command", "total_steps"} <= set(entry):
            raise InvalidProblemError(f"{where}: a job needs name, command and total_steps", field="jobs")
        unknown = sorted(set(entry) - known, key=str)
        if unknown:
            raise InvalidProblemError(f"{where}: job {entry['name']!r} has unknown key(s) {unknown}; known: "
                                      f"{sorted(known)}", field="jobs", job=entry["name"])
        jobs.append(_job_config(entry, where))
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise InvalidProblemError(f"job names must be distinct in {path}", field="jobs")
    return jobs


def _job_config(entry: Mapping[str, Any], where: str) -> JobConfig:
    """A JobConfig from one job object of a job file; InvalidProblemError naming the field otherwise."""
    name = entry["name"]

    def fail(field_name: str, expected: str) -> InvalidProblemError:
        return InvalidProblemError(f"{where}: {field_name} of job {name!r} is {entry[field_name]!r}; {expected}",
                                   field=field_name, job=name)

    if isinstance(name, bool) or not isinstance(name, (str, int)) or not str(name).strip():
        raise fail("name", "give a non-empty string")
    command = entry["command"]
    if not (isinstance(command, str) and command.strip()) and not (
            isinstance(command, list) and command and all(isinstance(c, (str, int, float)) for c in command)):
        raise fail("command", "give a shell string or a non-empty list of arguments")
    counts = {}
    for key, low in (("total_steps", 1), ("scale_factor", 1)):
        value = entry.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 2**53:
            raise fail(key, f"give an integer from {low} to {2**53}")
        counts[key] = value
    weight = entry.get("priority_weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < float("inf"):
        raise fail("priority_weight", "give a positive finite number")
    throughputs = entry.get("throughputs")
    if throughputs is not None and not (isinstance(throughputs, Mapping) and all(
            isinstance(t, str) and not isinstance(v, bool) and isinstance(v, (int, float)) and 0 <= v < float("inf")
            for t, v in throughputs.items())):
        raise fail("throughputs", "give a mapping of GPU type to steps/s >= 0")
    gpu_types = entry.get("gpu_types")
    if gpu_types is not None and not (isinstance(gpu_types, list) and all(isinstance(t, str) for t in gpu_types)):
        raise fail("gpu_types", "give a list of GPU type names")
    env = entry.get("env", {})
    if not (isinstance(env, Mapping) and all(isinstance(k, str) and isinstance(v, (str, int, float))
                                             and not isinstance(v, bool) for k, v in env.items())):
        raise fail("env", "give a mapping of variable names to strings")
    return JobConfig(**{**entry, "name": str(name), "command": command if isinstance(command, str)
                        else [str(c) for c in command], **counts, "priority_weight": float(weight),
                        "throughputs": None if throughputs is None else {t: float(v) for t, v in throughputs.items()},
                        "env": {k: str(v) for k, v in env.items()}})


def _yaml_item_line(text: str, k: int) -> int | None:
    """1-based line of ``jobs[k]`` in a YAML job file, or None (JSON, or no PyYAML)."""
    try:
        import yaml

        root = yaml.compose(text)
        jobs = next(v for key, v in root.value if key.value == "jobs")
        return jobs.value[k].start_mark.line + 1
    except Exception:  # noqa: BLE001 - only a nicer message: any failure leaves the line out
        return None


def parse_cluster(text: str) -> dict[str, int]:
    """``"cpu=2"`` or ``"a100=4,v100=2"`` -> ``{"a100": 4, "v100": 2}``."""
    out: dict[str, int] = {}
    for part in text.split(","):
        name, sep, count = part.partition("=")
        if not sep or not name.strip() or not count.strip().isdigit() or int(count) < 1:
            raise InvalidProblemError(f"--cluster expects TYPE=COUNT[,TYPE=COUNT...], got {text!r}", field="cluster")
        out[name.strip()] = int(count)
    return out


# ----- state ----------------------------------------------------------------------------
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (name TEXT PRIMARY KEY, config TEXT NOT NULL, status TEXT NOT NULL,
    steps_done INTEGER NOT NULL, received TEXT NOT NULL, submitted REAL NOT NULL,
    finished REAL, placement TEXT, measured TEXT NOT NULL, restarts INTEGER NOT NULL, message TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (idx INTEGER PRIMARY KEY, start REAL NOT NULL, end REAL NOT NULL,
    leases TEXT NOT NULL, results TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS engine (id INTEGER PRIMARY KEY CHECK (id = 0), document TEXT NOT NULL);
"""


@dataclass
class JobState:
    """What the scheduler knows of a job; times in epoch seconds, durations in seconds."""

    config: JobConfig
    status: str = "pending"  # pending | done | failed
    steps_done: int = 0  # steps of the newest checkpoint
    received: dict[str, float] = field(default_factory=dict)  # seconds run per GPU type
    submitted: float = field(default_factory=time.time)
    finished: float | None = None
    placement: tuple[str, tuple[int, ...]] | None = None  # GPU type and ids held at the end of the last round
    measured: dict[str, float] = field(default_factory=dict)  # latest estimate per measured type, steps/s
    restarts: int = 0
    message: str = ""


class StateStore:
    """The scheduler's journal in SQLite: jobs and rounds, each round committed in one transaction."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.db = sqlite3.connect(str(self.path), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)

    def load(self) -> dict[str, JobState]:
        """Every journaled job, in the order they were first written."""
        out = {}
        for row in self.db.execute("SELECT name, config, status, steps_done, received, submitted, finished, "
                                   "placement, measured, restarts, message FROM jobs ORDER BY rowid"):
            placement = json.loads(row[7]) if row[7] else None
            out[row[0]] = JobState(JobConfig(**json.loads(row[1])), row[2], row[3], json.loads(row[4]), row[5],
                                   row[6], (placement[0], tuple(placement[1])) if placement else None,
                                   json.loads(row[8]), row[9], row[10])
        return out

    def next_round(self) -> int:
        """Index of the next round (one past the last journaled one)."""
        return int(self.db.execute("SELECT COALESCE(MAX(idx) + 1, 0) FROM rounds").fetchone()[0])

    def load_engine(self) -> dict[str, Any] | None:
        """The engine state (:meth:`allocopt.Engine.to_json`) of the last committed round, if any."""
        row = self.db.execute("SELECT document FROM engine WHERE id = 0").fetchone()
        return json.loads(row[0]) if row else None

    def commit(self, jobs: Sequence[JobState], round_row: tuple[int, float, float, Any, Any] | None = None,
               engine: Mapping[str, Any] | None = None) -> None:
        """Write jobs (and a round, and the engine's state) atomically."""
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany(
                "INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(s.config.name, json.dumps(asdict(s.config)), s.status, s.steps_done, json.dumps(s.received),
                  s.submitted, s.finished, json.dumps(s.placement) if s.placement else None,
                  json.dumps(s.measured), s.restarts, s.message) for s in jobs])
            if round_row is not None:
                idx, start, end, leases, results = round_row
                self.db.execute("INSERT OR REPLACE INTO rounds VALUES (?, ?, ?, ?, ?)",
                                (idx, start, end, json.dumps(leases), json.dumps(results)))
            if engine is not None:
                self.db.execute("INSERT OR REPLACE INTO engine VALUES (0, ?)", (json.dumps(engine),))

    def close(self) -> None:
        self.db.close()


# ----- the loop -------------------------------------------------------------------------
class Scheduler:
    """Runs jobs to completion on a cluster, round by round, with an :class:`allocopt.Engine`.

    Parameters
    ----------
    jobs : sequence of JobConfig
        Merged with the jobs already in ``state`` (by name; the journal wins for known jobs).
    cluster : Cluster
    executor : LocalExecutor
        Or a subclass, such as :class:`allocopt.runtime.ray_executor.RayExecutor`.
    state : StateStore
    policy : str
        A policy over :class:`allocopt.Problem`.
    round_seconds : float
        Length of a round; the allocation is solved again at most once per
        :data:`RECOMPUTE_ROUNDS` rounds, when jobs finished or throughputs were measured.
    out : text stream for the status lines and the final report (None: silent).

    Raises
    ------
    InvalidProblemError
        For a job that can run on none of the cluster's GPU types.
    """

    def __init__(self, jobs: Sequence[JobConfig], cluster: Cluster, executor: LocalExecutor, state: StateStore, *,
                 policy: str = "max_min_fairness", round_seconds: float = 30.0, out: TextIO | None = None):
        self.cluster, self.executor, self.state = cluster, executor, state
        self.round_seconds, self.out = float(round_seconds), out
        self.jobs = state.load()
        for config in jobs:
            self.jobs.setdefault(config.name, JobState(config))
        self.engine = self._restored_engine(state.load_engine(), cluster, policy) or Engine(
            cluster, policy, round_seconds=self.round_seconds,
            recompute_min_seconds=RECOMPUTE_ROUNDS * self.round_seconds)
        for name, s in self.jobs.items():
            executor.add_job(name, s.config.spec())
            if s.status == "pending":  # reconcile with checkpoints written after the last journaled round
                s.steps_done = max(s.steps_done, executor.checkpointed_steps(name))
                if s.steps_done >= s.config.total_steps:
                    s.status, s.finished = "done", s.finished or time.time()
            s.placement = None  # a restarted scheduler holds no processes
            if s.status == "pending" and name not in self.engine:
                self.engine.add_job(name, self._throughputs(s.config), scale_factor=s.config.scale_factor,
                                    priority_weight=s.config.priority_weight)
                for gpu_type, value in s.measured.items():
                    if gpu_type in cluster.gpu_types:
                        self.engine.observe_throughput(name, gpu_type, value)
            elif s.status != "pending" and name in self.engine:
                self.engine.remove_job(name)
        self.state.commit(list(self.jobs.values()), engine=self.engine.to_json())
        self.round_index = state.next_round()
        self.gpu_seconds_used = 0.0
        self.wall_start = time.time()

    def _restored_engine(self, document: Mapping[str, Any] | None, cluster: Cluster, policy: str) -> Engine | None:
        """The journaled engine (its round counters: fairness carries over a restart), when it ran
        the same policy on the same cluster with the same rounds; its unrecorded leases are dropped
        (their rounds were not journaled, so they are run again)."""
        if document is None:
            return None
        engine = Engine.from_json(document)
        if (engine.cluster != cluster or engine.policy != policy
                or engine.mechanism_options.round_seconds != self.round_seconds):
            return None
        engine.record_round([])
        return engine

    def _throughputs(self, config: JobConfig) -> dict[str, float]:
        """Steps/s the engine starts from: hints, else :data:`DEFAULT_STEPS_PER_S`, on the types the job
        may use and fits on; 0 elsewhere."""
        out = {t: float((config.throughputs or {}).get(t, DEFAULT_STEPS_PER_S))
               if (config.gpu_types is None or t in config.gpu_types) and config.scale_factor <= n else 0.0
               for t, n in zip(self.cluster.gpu_types, self.cluster.capacity.tolist())}
        if not any(v > 0 for v in out.values()):
            raise InvalidProblemError(
                f"job {config.name!r} can run on none of the cluster's GPU types {list(self.cluster.gpu_types)} "
                f"(gpu_types {config.gpu_types}, scale_factor {config.scale_factor}, throughputs "
                f"{config.throughputs}); allow a type the cluster has enough GPUs of", field="gpu_types",
                job=config.name)
        return out

    def pending(self) -> list[str]:
        """Names of the jobs not yet done or failed."""
        return [n for n, s in self.jobs.items() if s.status == "pending"]

    def run(self, max_rounds: int | None = None) -> dict[str, Any]:
        """Run rounds until every job is done or failed (or ``max_rounds``); return :meth:`report`."""
        rounds = 0
        try:
            while self.pending() and (max_rounds is None or rounds < max_rounds):
                self.run_round()
                rounds += 1
        finally:
            self.executor.close()
        report = self.report()
        if self.out is not None:
            self._print_report(report)
        return report

    def run_round(self) -> None:
        """Plan (engine), run (executor), record and journal one round."""
        names = self.pending()
        for name in names:
            s = self.jobs[name]
            self.engine.update_job(name, num_steps_remaining=max(s.config.total_steps - s.steps_done, 1))
        plan = self.engine.next_round()
        t0 = time.time()
        results = self.executor.run_round(plan)
        t1 = time.time()
        self.engine.record_round(results)
        by_job = {r.job_id: r for r in results}
        for name in names:
            self.jobs[name].placement = None
        for lease in plan.leases:
            r, s = by_job[lease.job_id], self.jobs[lease.job_id]
            s.received[lease.gpu_type] = s.received.get(lease.gpu_type, 0.0) + r.run_seconds
            self.gpu_seconds_used += r.run_seconds * len(lease.gpu_ids)
            s.restarts += int(r.restarted)
            s.steps_done = max(s.steps_done, self.executor.checkpointed_steps(lease.job_id))
            s.message = r.message
            if r.measured_steps_per_s is not None:
                s.measured[lease.gpu_type] = self.engine.get_job(lease.job_id)["throughputs"][lease.gpu_type]
            if r.outcome is RoundOutcome.COMPLETED:
                s.status, s.finished, s.steps_done = "done", t1, max(s.steps_done, s.config.total_steps)
            elif r.outcome is RoundOutcome.FAILED and self.executor.failed(lease.job_id):
                s.status, s.finished = "failed", t1
            elif lease.job_id in self.executor.held_jobs:
                s.placement = (lease.gpu_type, tuple(lease.gpu_ids))
            if s.status != "pending":
                self.engine.remove_job(lease.job_id)
        self.state.commit(list(self.jobs.values()),
                          (self.round_index, t0, t1, [[l.job_id, l.gpu_type, list(l.gpu_ids), l.extended]
                                                      for l in plan.leases],
                           [[r.job_id, r.outcome.value, r.steps, r.run_seconds, r.measured_steps_per_s,
                             r.restarted, r.message] for r in results]), self.engine.to_json())
        if self.out is not None:
            self._print_status(plan.leases, by_job, t1 - t0)
        self.round_index += 1

    # ----- reporting ----------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Per job: status, steps, JCT (s, submission to completion, across restarts), restarts;
        utilization: GPU-seconds leased / (GPUs x wall seconds) of this scheduler run."""
        wall = max(time.time() - self.wall_start, 1e-9)
        return {"jobs": {n: {"status": s.status, "steps_done": s.steps_done, "total_steps": s.config.total_steps,
                             "jct_s": None if s.finished is None or s.status != "done" else s.finished - s.submitted,
                             "restarts": s.restarts, "received_s": s.received, "measured_steps_per_s": s.measured,
                             "message": s.message} for n, s in self.jobs.items()},
                "utilization": self.gpu_seconds_used / (wall * int(self.cluster.capacity.sum())),
                "rounds": self.round_index, "executor": asdict(self.executor.stats)
                | {"extension_fraction": self.executor.stats.extension_fraction}}

    def _print_status(self, leases: Sequence[Lease], results: Mapping[Hashable, Any], seconds: float) -> None:
        held = {l.job_id: l for l in leases}
        cells = []
        for n, s in self.jobs.items():
            lease, r = held.get(n), results.get(n)
            where = f"{lease.gpu_type}{list(lease.gpu_ids)}{'*' if lease.extended else ''}" if lease else "-"
            rate = f" {r.measured_steps_per_s:.1f}/s" if r is not None and r.measured_steps_per_s else ""
            cells.append(f"{n} {s.steps_done}/{s.config.total_steps} {s.status} {where}{rate}")
        print(f"round {self.round_index} ({seconds:.1f}s): " + " | ".join(cells), file=self.out, flush=True)

    def _print_report(self, report: Mapping[str, Any]) -> None:
        print("\njob                 status    steps         JCT (s)  restarts", file=self.out)
        for n, j in report["jobs"].items():
            jct = "-" if j["jct_s"] is None else f"{j['jct_s']:.1f}"
            print(f"{n:<19} {j['status']:<9} {j['steps_done']:>5}/{j['total_steps']:<6} {jct:>9}  {j['restarts']:>8}",
                  file=self.out)
        stats = self.executor.stats
        med = lambda xs: f"{float(np.median(xs)):.3f}" if xs else "-"  # noqa: E731
        print(f"utilization {report['utilization']:.1%} over {report['rounds']} rounds; leases extended "
              f"{stats.extension_fraction:.0%}; median launch-to-first-step {med(stats.launch_to_first_step_s)} s, "
              f"stop {med(stats.stop_s)} s", file=self.out, flush=True)
