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

import contextlib
import hashlib
import json
import logging
import math
import os
import signal
import sqlite3
import threading
import time
import uuid
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from allocopt.cluster import Cluster
from allocopt.engine import Engine
from allocopt.documents import parse_json, parse_yaml, read_text
from allocopt.errors import DataFileError, InvalidOptionError, InvalidProblemError, StateError
from allocopt.mechanism.admission import admission_policy, admit_jobs
from allocopt.runtime.elastic import (ELASTIC_KEYS, ElasticSpec, GoodputEngine, GoodputOptions, is_goodput_policy,
                                      load_job_profiles, parse_elastic)
from allocopt.runtime.executor import Lease, RoundOutcome
from allocopt.runtime.local import (JobSpec, LocalExecutor, exclusive_lock, job_directory_name,
                                    sanitized_job_name)

log = logging.getLogger(__name__)

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
    ``gpu_types``: the types it may run on (default: all); ``elastic``: an elastic job's
    batch and replica limits (:class:`~allocopt.runtime.elastic.ElasticSpec`, from its keys
    beside these in the job file), run by a goodput policy (``--policy sia``).
    """

    name: str
    command: list[str] | str
    total_steps: int
    scale_factor: int = 1
    priority_weight: float = 1.0
    throughputs: dict[str, float] | None = None
    gpu_types: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    elastic: ElasticSpec | None = None

    def __post_init__(self) -> None:
        if isinstance(self.elastic, Mapping):  # as journaled
            object.__setattr__(self, "elastic", ElasticSpec(**self.elastic))

    def spec(self) -> JobSpec:
        """The executor's view of the job (name, command, total steps, environment)."""
        return JobSpec(self.name, self.command, self.total_steps, self.env)


def load_jobs(path: str | Path, *, invalid: dict[str, str] | None = None) -> list[JobConfig]:
    """Jobs from a YAML (needs PyYAML: the ``runtime`` extra) or JSON file ``{"jobs": [{...}, ...]}``.

    A job with a bad field raises InvalidProblemError naming the file, the job and the field; with
    ``invalid`` (a dict) it is left out and ``invalid[name]`` says why instead, so the other jobs
    can run. A file that is unreadable as a whole, duplicate names and names that would share a
    job directory always raise.
    """
    text = read_text(path, what="the job file")
    try:
        doc = parse_json(text, path)
    except DataFileError:
        doc = parse_yaml(text, path)  # YAML is a superset of JSON: its errors name the line either way
    if not isinstance(doc, Mapping) or not isinstance(doc.get("jobs"), list) or not doc["jobs"]:
        raise InvalidProblemError(f"{path} must hold 'jobs: [{{name, command, total_steps, ...}}, ...]'",
                                  field="jobs")
    jobs, dirs = [], {}
    for k, entry in enumerate(doc["jobs"]):
        name = str(entry["name"]) if isinstance(entry, Mapping) and "name" in entry else f"#{k}"
        other = dirs.get(sanitized_job_name(name))
        if other is not None:
            what = "have the same name" if other == name else \
                f"would share the job directory {sanitized_job_name(name)!r}"
            raise InvalidProblemError(f"{path}: jobs {other!r} and {name!r} {what}; rename one of them",
                                      field="name", job=name)
        dirs[sanitized_job_name(name)] = name
        try:
            job_directory_name(name)
            jobs.append(_job_config(entry, k, path))
        except InvalidProblemError as err:
            if invalid is None:
                raise
            invalid[name] = str(err)
    return jobs


def _job_config(entry: Any, k: int, path: str | Path) -> JobConfig:
    """One validated job entry; InvalidProblemError naming the file, job and field otherwise."""
    if not isinstance(entry, Mapping) or not {"name", "command"} <= set(entry) or not (
            "total_steps" in entry or "total_samples" in entry):
        raise InvalidProblemError(f"{path}: job {k} needs name, command and total_steps (or an elastic job's "
                                  "total_samples)", field="jobs")
    name = str(entry["name"])

    def bad(field_name: str, what: str) -> InvalidProblemError:
        return InvalidProblemError(f"{path}: job {name!r}: {field_name} {what}, got {entry.get(field_name)!r}",
                                   field=field_name, job=name)

    known = (set(JobConfig.__dataclass_fields__) - {"elastic"}) | ELASTIC_KEYS
    unknown = sorted(set(entry) - known)
    if unknown:
        raise InvalidProblemError(f"{path}: job {name!r} has unknown key(s) {unknown}; known: {sorted(known)}",
                                  field="jobs", job=name)
    if not name.strip():
        raise bad("name", "must not be empty")
    command = entry["command"]
    if isinstance(command, list) and command and all(_scalar(c) for c in command):
        command = [str(c) for c in command]
    elif not (isinstance(command, str) and command.strip()):
        raise bad("command", "must be a command line or a non-empty list of arguments")
    elastic = parse_elastic(entry, path, name)
    if "total_steps" in entry:
        total = _integer(entry["total_steps"])
        if total is None or not 1 <= total <= 2 ** 53:
            raise bad("total_steps", "must be an integer from 1 to 2**53")
    elif elastic is None:
        raise bad("total_samples", "applies to elastic jobs only (give batch_size), or give total_steps")
    else:  # the most steps its samples can take: its batch never falls below the initial one
        total = -(-elastic.total_samples // elastic.batch_size)  # type: ignore[operator]
    scale = _integer(entry.get("scale_factor", 1))
    if scale is None or not 1 <= scale <= 2 ** 20:
        raise bad("scale_factor", "must be an integer from 1 to 2**20")
    weight = entry.get("priority_weight", 1.0)
    if not _number(weight) or not 0 < float(weight) < math.inf:
        raise bad("priority_weight", "must be a positive number")
    throughputs = entry.get("throughputs")
    if throughputs is not None and not (isinstance(throughputs, Mapping) and all(
            isinstance(t, str) and _number(v) and 0 <= float(v) < math.inf for t, v in throughputs.items())):
        raise bad("throughputs", "must map GPU types to steps/s >= 0")
    gpu_types = entry.get("gpu_types")
    if gpu_types is not None and not (isinstance(gpu_types, list) and gpu_types
                                      and all(isinstance(t, str) for t in gpu_types)):
        raise bad("gpu_types", "must be a non-empty list of GPU type names")
    env = entry.get("env") or {}
    if not (isinstance(env, Mapping) and all(isinstance(key, str) and key and "=" not in key and _scalar(v)
                                             for key, v in env.items())):
        raise bad("env", "must map variable names to strings or numbers")
    if elastic is not None and "scale_factor" in entry:
        raise bad("scale_factor", "does not apply to an elastic job (it has min_replicas and max_replicas)")
    return JobConfig(name, command, total, scale, float(weight),
                     None if throughputs is None else {t: float(v) for t, v in throughputs.items()},
                     None if gpu_types is None else list(gpu_types),
                     {key: str(v).lower() if isinstance(v, bool) else str(v) for key, v in env.items()}, elastic)


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not (isinstance(value, float) and not math.isfinite(value))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any) -> int | None:
    """``value`` as an int when it is one (also ``5.0``), else None (strings, booleans, fractions, nan)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
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
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
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
    """The scheduler's journal in SQLite: jobs and rounds, each round committed in one transaction.

    Held exclusively (``flock`` on ``PATH.lock``, which names the holder's PID) while open; the
    files are created 0600; the journal is checked at open (``quick_check``) and before every
    commit (still the same file on disk, its write-ahead log too). Jobs' ``env`` values are
    journaled only with ``store_env`` (else their names, the values come from the job file).

    Raises
    ------
    StateError
        Another scheduler holds the journal; it was deleted or replaced while open.
    DataFileError
        The file is not a readable allocopt journal.
    """

    def __init__(self, path: str | Path, *, store_env: bool = False):
        self.path, self.store_env = Path(path), store_env
        self._lock_fd = exclusive_lock(Path(f"{self.path}.lock"), f"the journal {self.path}",
                                       "pass another --state")
        try:
            self.created = not self.path.exists()
            left = [f"{self.path}{x}" for x in ("-wal", "-shm") if self.created and os.path.exists(f"{self.path}{x}")]
            if left:
                raise StateError(f"the journal {self.path} is missing but {' and '.join(left)} remain: restore the "
                                 "journal, or move these files and the work directory away to start afresh")
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            os.chmod(self.path, 0o600)
            self.db = sqlite3.connect(str(self.path), isolation_level=None)
            try:
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=FULL")
                check = self.db.execute("PRAGMA quick_check").fetchone()[0]
                if check != "ok":
                    raise sqlite3.DatabaseError(check)
                self.db.executescript(_SCHEMA)
                row = self.db.execute("SELECT value FROM meta WHERE key = 'id'").fetchone()
                if row is None:
                    self.db.execute("INSERT INTO meta VALUES ('id', ?)", (uuid.uuid4().hex,))
                    row = self.db.execute("SELECT value FROM meta WHERE key = 'id'").fetchone()
                self.journal_id: str = row[0]
            except sqlite3.DatabaseError as err:
                self.db.close()
                raise DataFileError(f"not a readable allocopt journal ({err}); move it away to start afresh, "
                                    "or pass another --state", path=self.path) from None
            for suffix in ("-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(f"{self.path}{suffix}", 0o600)
            self._files = self._identity()
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _identity(self) -> dict[str, tuple[int, int] | None]:
        out: dict[str, tuple[int, int] | None] = {}
        for suffix in ("", "-wal", "-shm"):
            try:
                st = os.stat(f"{self.path}{suffix}")
                out[suffix] = (st.st_dev, st.st_ino)
            except FileNotFoundError:
                out[suffix] = None
        return out

    def verify(self) -> None:
        """Raise StateError when the journal (or its write-ahead log) was deleted or replaced since
        the last commit: what is written now would be lost."""
        now = self._identity()
        for suffix, before in self._files.items():
            if before is not None and now[suffix] != before:
                raise StateError(f"the journal {self.path}{suffix} was deleted or replaced while allocopt run was "
                                 "using it; its jobs were stopped (their progress is in their checkpoints). Restore "
                                 "the file, or move the work directory away to start afresh, and rerun")

    def load(self) -> dict[str, JobState]:
        """Every journaled job, in the order they were first written."""
        out = {}
        try:
            for row in self.db.execute("SELECT name, config, status, steps_done, received, submitted, finished, "
                                       "placement, measured, restarts, message FROM jobs ORDER BY rowid"):
                placement = json.loads(row[7]) if row[7] else None
                out[row[0]] = JobState(JobConfig(**json.loads(row[1])), row[2], row[3], json.loads(row[4]), row[5],
                                       row[6], (placement[0], tuple(placement[1])) if placement else None,
                                       json.loads(row[8]), row[9], row[10])
        except (sqlite3.DatabaseError, ValueError, TypeError, IndexError) as err:
            raise DataFileError(f"a journaled job is unreadable ({err}); move the journal away to start afresh",
                                path=self.path) from None
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
        self.verify()
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany(
                "INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(s.config.name, json.dumps(self._config(s.config)), s.status, s.steps_done, json.dumps(s.received),
                  s.submitted, s.finished, json.dumps(s.placement) if s.placement else None,
                  json.dumps(s.measured), s.restarts, s.message) for s in jobs])
            if round_row is not None:
                idx, start, end, leases, results = round_row
                self.db.execute("INSERT OR REPLACE INTO rounds VALUES (?, ?, ?, ?, ?)",
                                (idx, start, end, json.dumps(leases), json.dumps(results)))
            if engine is not None:
                self.db.execute("INSERT OR REPLACE INTO engine VALUES (0, ?)", (json.dumps(engine),))
        self._files = {suffix: now or self._files.get(suffix) for suffix, now in self._identity().items()}

    def _config(self, config: JobConfig) -> dict[str, Any]:
        doc = asdict(config)
        if not self.store_env:
            doc["env"] = {key: None for key in config.env}  # names only: values may be secrets
        return doc

    def close(self) -> None:
        """Close the journal and release its lock."""
        self.db.close()
        os.close(self._lock_fd)


def default_state_path(jobs_file: str | Path) -> Path:
    """Where ``allocopt run JOBS`` journals without ``--state``: one file per job file, under
    ``$XDG_STATE_HOME/allocopt`` (default ``~/.local/state/allocopt``), outside any source tree."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "allocopt"
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    resolved = Path(jobs_file).resolve()
    return base / f"{resolved.stem}-{hashlib.sha256(str(resolved).encode()).hexdigest()[:10]}.db"


def _with_env(journaled: JobConfig, from_file: JobConfig | None) -> JobConfig:
    """A journaled job's config with its ``env`` values (journaled as names only) from the job file."""
    if all(v is not None for v in journaled.env.values()):
        return journaled
    values = from_file.env if from_file is not None else {}
    missing = sorted(k for k, v in journaled.env.items() if v is None and k not in values)
    if missing:
        log.warning("job %s: the values of env %s are not journaled and not in the job file; it runs without them",
                    journaled.name, missing)
    env = {k: v if v is not None else values[k] for k, v in journaled.env.items() if v is not None or k in values}
    return replace(journaled, env=env)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Ignore SIGINT and SIGTERM in the block (main thread only), so cleanup runs to its end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _goodput_names() -> list[str]:
    from allocopt.runtime.elastic import goodput_policies

    return list(goodput_policies())


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
    out : text stream, optional
        Where the status lines and the final report go (default None: silent).
    rejected : mapping of job name to message
        Jobs of the job file that were left out (see :func:`load_jobs`): reported as failed.
    retry_failed : bool
        Run again the jobs the journal says failed, with their entry of the job file when it has one
        (else they stay failed, and a line says how to retry).
    profiles : path, optional
        With a goodput policy (``sia``, see :func:`allocopt.runtime.elastic.goodput_policies`): the
        application profiles elastic jobs name (default: Sia's shipped profiles).
    goodput_options : GoodputOptions, optional
        With a goodput policy: the :class:`~allocopt.runtime.elastic.GoodputEngine`'s options.
    placement : str, default "best_fit"
        Placement policy of the rounds (:data:`~allocopt.mechanism.placement_policies.PLACEMENT_POLICIES`):
        which devices each job's GPUs are; rigid jobs (the engine's ``placement``).
    admission : str, default "accept_all"
        Admission policy (:data:`~allocopt.mechanism.admission.ADMISSION_POLICIES`), asked at the start
        of every round which of the submitted jobs not yet admitted join the scheduled ones (submission
        order); a job it holds back stays ``pending`` with a message saying it waits for admission.
        Rigid jobs only.

    Notes
    -----
    A job that can run on none of the cluster's GPU types fails with a message; the others run.
    A goodput policy runs elastic jobs only, any other policy rigid jobs only: the others fail
    with a message saying so.

    Raises
    ------
    StateError
        When ``executor.work_dir`` belongs to another journal (``state`` is new or was replaced).
    """

    def __init__(self, jobs: Sequence[JobConfig], cluster: Cluster, executor: LocalExecutor, state: StateStore, *,
                 policy: str = "max_min_fairness", round_seconds: float = 30.0, out: TextIO | None = None,
                 rejected: Mapping[str, str] | None = None, retry_failed: bool = False,
                 profiles: str | Path | None = None, goodput_options: GoodputOptions | None = None,
                 placement: str = "best_fit", admission: str = "accept_all"):
        self.cluster, self.executor, self.state = cluster, executor, state
        self.admission = admission_policy(admission)
        if is_goodput_policy(policy) and (placement != "best_fit" or admission != "accept_all"):
            raise InvalidOptionError(f"placement and admission policies apply to rigid jobs; policy {policy} runs "
                                     "elastic jobs with its own placement (leave --placement and --admission out)")
        self.placement = placement
        self.round_seconds, self.out = float(round_seconds), out
        self._check_work_dir()
        self.jobs = state.load()
        self.rejected = {n: m for n, m in (rejected or {}).items() if n not in self.jobs}
        from_file = {c.name: c for c in jobs}
        for name, s in self.jobs.items():
            s.config = _with_env(s.config, from_file.get(name))
            if s.status == "failed" and retry_failed:
                s.status, s.finished, s.message = "pending", None, ""
                s.config = from_file.get(name, s.config)  # the operator's fix
            elif s.status == "failed":
                self._say(f"job {name} failed in an earlier run on {state.path} ({s.message}); pass --retry-failed "
                          "to run it again")
        for config in jobs:
            self.jobs.setdefault(config.name, JobState(config))
        self.elastic = is_goodput_policy(policy)
        self.profiles: dict[tuple[str, str], Any] = {}
        if self.elastic:
            apps = sorted({s.config.elastic.application for s in self.jobs.values()
                           if s.config.elastic is not None and s.config.elastic.application is not None})
            self.profiles = load_job_profiles(profiles, apps)
        self.engine: Engine | GoodputEngine = self._restored_engine(state.load_engine(), cluster, policy) or (
            GoodputEngine(cluster, policy, round_seconds=self.round_seconds, profiles=self.profiles,
                          options=goodput_options) if self.elastic else
            Engine(cluster, policy, round_seconds=self.round_seconds,
                   recompute_min_seconds=RECOMPUTE_ROUNDS * self.round_seconds, placement=placement))
        self.queued: list[str] = []  # submitted, not admitted yet (submission order)
        self.samples_done: dict[str, int] = {}  # elastic jobs: samples of their checkpointed steps
        for name, s in self.jobs.items():
            executor.add_job(name, s.config.spec())
            if s.status == "pending":  # reconcile with checkpoints written after the last journaled round
                s.steps_done = max(s.steps_done, executor.checkpointed_steps(name))
                if s.steps_done >= s.config.total_steps:
                    s.status, s.finished = "done", s.finished or time.time()
            s.placement = None  # a restarted scheduler holds no processes
            throughputs = self._throughputs(s.config) if s.status == "pending" else None
            if s.status == "pending" and self.elastic != (s.config.elastic is not None):
                s.status, s.finished = "failed", time.time()
                s.message = (f"is elastic (batch_size, application...), which policy {policy} does not run; use a "
                             f"goodput policy ({', '.join(_goodput_names())})" if s.config.elastic is not None else
                             f"is rigid (no batch_size), and policy {policy} runs elastic jobs only; give it "
                             "batch_size (and application, min_replicas, max_replicas), or use another policy")
            elif throughputs is not None and not any(v > 0 for v in throughputs.values()):
                s.status, s.finished = "failed", time.time()
                s.message = (f"can run on none of the cluster's GPU types {list(cluster.gpu_types)} (gpu_types "
                             f"{s.config.gpu_types}, scale_factor {s.config.scale_factor}, throughputs "
                             f"{s.config.throughputs}); allow a type the cluster has enough GPUs of")
            if s.status == "pending" and name not in self.engine and isinstance(self.engine, GoodputEngine):
                try:
                    self.engine.add_job(name, s.config.elastic, gpu_types=s.config.gpu_types,  # type: ignore[arg-type]
                                        submitted=s.submitted)
                except (InvalidProblemError, DataFileError) as err:
                    s.status, s.finished, s.message = "failed", time.time(), str(err)
            if s.status == "pending" and isinstance(self.engine, GoodputEngine) and name in self.engine:
                # steps checkpointed after the last journaled round
                self.samples_done[name] = self.engine.sync_progress(name, s.steps_done)
            elif s.status == "pending" and name not in self.engine and not self.elastic:
                self.queued.append(name)
            elif s.status != "pending" and name in self.engine:
                self.engine.remove_job(name)
        for name, message in self.rejected.items():
            self._say(f"job {name} is not run: {message}")
        self._admit()
        self.state.commit(list(self.jobs.values()), engine=self.engine.to_json())
        self.round_index = state.next_round()
        self.gpu_seconds_used = 0.0
        self.wall_start = time.time()

    def _restored_engine(self, document: Mapping[str, Any] | None, cluster: Cluster,
                         policy: str) -> Engine | GoodputEngine | None:
        """The journaled engine (its round counters: fairness carries over a restart), when it ran
        the same policy on the same cluster with the same rounds; its unrecorded leases are dropped
        (their rounds were not journaled, so they are run again). A goodput engine keeps its jobs'
        measured step times and gradient statistics."""
        if document is None:
            return None
        if document.get("format") == "allocopt-goodput-engine":
            if not self.elastic:
                return None
            goodput = GoodputEngine.from_json(document, self.profiles)
            if goodput.cluster != cluster or goodput.policy != policy or goodput.round_seconds != self.round_seconds:
                return None
            return goodput
        if self.elastic:
            return None
        engine = Engine.from_json(document)
        if (engine.cluster != cluster or engine.policy != policy or engine.placement.name != self.placement
                or engine.mechanism_options.round_seconds != self.round_seconds):
            return None
        engine.record_round([])
        return engine

    def _admit(self) -> None:
        """Ask the admission policy which queued jobs join the engine; the others get a message."""
        if not self.queued:
            return
        names = [n for n in self.jobs if n in self.engine] + self.queued
        scale = np.array([self.jobs[n].config.scale_factor for n in names], dtype=np.int64)
        submitted = np.array([self.jobs[n].submitted for n in names], dtype=float)
        active = np.arange(len(names)) < len(names) - len(self.queued)
        waiting = np.arange(len(names) - len(self.queued), len(names))
        mask = admit_jobs(self.admission, self.cluster, scale, submitted, active, waiting, time.time())
        demand = int(scale[active].sum() + scale[waiting[mask]].sum())
        still = []
        for name, admitted in zip(self.queued, mask.tolist()):
            s = self.jobs[name]
            if not admitted:
                message = (f"waiting for admission ({self.admission.name}): the admitted jobs ask for {demand} of "
                           f"the cluster's {int(self.cluster.capacity.sum())} GPUs")
                if s.message != message:
                    self._say(f"job {name} {message}")
                s.message = message
                still.append(name)
                continue
            s.message = ""
            self.engine.add_job(name, self._throughputs(s.config), scale_factor=s.config.scale_factor,
                                priority_weight=s.config.priority_weight)
            for gpu_type, value in s.measured.items():
                if gpu_type in self.cluster.gpu_types:
                    self.engine.observe_throughput(name, gpu_type, value)
        self.queued = still

    def _throughputs(self, config: JobConfig) -> dict[str, float]:
        """Steps/s the engine starts from: hints, else :data:`DEFAULT_STEPS_PER_S`, on the types the job
        may use and fits on; 0 elsewhere (all 0: the job cannot run on this cluster)."""
        return {t: float((config.throughputs or {}).get(t, DEFAULT_STEPS_PER_S))
                if (config.gpu_types is None or t in config.gpu_types) and config.scale_factor <= n else 0.0
                for t, n in zip(self.cluster.gpu_types, self.cluster.capacity.tolist())}

    def _check_work_dir(self) -> None:
        """The work directory remembers its journal's id: a work directory with jobs' files but a
        new or another journal means the journal was lost or replaced."""
        marker = self.executor.work_dir / "journal-id"
        try:
            known = marker.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            known = None
        if known is None:
            marker.write_text(self.state.journal_id + "\n", encoding="utf-8")
        elif known != self.state.journal_id:
            what = "is missing (a new one was created)" if self.state.created else "is another run's journal"
            raise StateError(f"the journal {self.state.path} {what}: the work directory {self.executor.work_dir} "
                             "belongs to another journal. Restore the journal, or move the work directory away to "
                             "start afresh")

    def _say(self, *lines: str) -> None:
        """Lines for the caller's stream (``out``; None: nothing is written)."""
        if self.out is not None:
            self.out.write("".join(line + "\n" for line in lines))
            self.out.flush()

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
            with _signals_deferred():  # a second Ctrl-C must not leave jobs behind
                self.executor.close()
        self.state.verify()
        report = self.report()
        if self.out is not None:
            self._say_report(report)
        return report

    def run_round(self) -> None:
        """Admit, plan (engine), run (executor), record and journal one round."""
        self._admit()
        names = [n for n in self.pending() if n not in self.queued]
        for name in names:
            s = self.jobs[name]
            self.engine.update_job(name, num_steps_remaining=max(s.config.total_steps - s.steps_done, 1))
        plan = self.engine.next_round()
        if isinstance(self.engine, GoodputEngine):
            for lease in plan.leases:  # a job measured in samples: this launch's steps reach them at its batch
                total = self.engine.launch_total_steps(lease.job_id, lease.batch.batch_size) if lease.batch else None
                if total is not None:
                    self.executor.add_job(lease.job_id, replace(self.jobs[lease.job_id].config.spec(),
                                                                total_steps=total))
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
            if isinstance(self.engine, GoodputEngine):
                self.samples_done[lease.job_id] = self.engine.sync_progress(lease.job_id, s.steps_done)
            total = self.executor.jobs[lease.job_id].total_steps  # a job measured in samples: this launch's
            if r.outcome is RoundOutcome.COMPLETED or s.steps_done >= total:  # its checkpoint says so
                s.status, s.finished, s.steps_done = "done", t1, max(s.steps_done, total)
            elif r.outcome is RoundOutcome.FAILED and self.executor.failed(lease.job_id):
                s.status, s.finished = "failed", t1
            elif lease.job_id in self.executor.held_jobs:
                s.placement = (lease.gpu_type, tuple(lease.gpu_ids))
            if s.status != "pending":
                self.engine.remove_job(lease.job_id)
        decisions = self.engine.decisions if isinstance(self.engine, GoodputEngine) else {}
        self.state.commit(list(self.jobs.values()),
                          (self.round_index, t0, t1, [[l.job_id, l.gpu_type, list(l.gpu_ids), l.extended]
                                                      + ([decisions[l.job_id].to_json()] if l.job_id in decisions
                                                         else []) for l in plan.leases],
                           [[r.job_id, r.outcome.value, r.steps, r.run_seconds, r.measured_steps_per_s,
                             r.restarted, r.message] for r in results]), self.engine.to_json())
        if self.out is not None:
            self._say_round(plan.leases, by_job, t1 - t0)
        self.round_index += 1

    # ----- reporting ----------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Per job: status, steps, JCT (s, submission to completion, across restarts), restarts;
        utilization: GPU-seconds leased / (GPUs x wall seconds) of this scheduler run."""
        wall = max(time.time() - self.wall_start, 1e-9)
        rejected = {n: {"status": "failed", "steps_done": 0, "total_steps": None, "jct_s": None, "restarts": 0,
                        "received_s": {}, "measured_steps_per_s": {}, "message": m} for n, m in self.rejected.items()}
        samples = self.samples_done
        return {"jobs": {n: {"status": s.status, "steps_done": s.steps_done, "total_steps": s.config.total_steps,
                             "jct_s": None if s.finished is None or s.status != "done" else s.finished - s.submitted,
                             "restarts": s.restarts, "received_s": s.received, "measured_steps_per_s": s.measured,
                             "message": s.message} | ({"samples_done": samples[n]} if n in samples else {})
                         for n, s in self.jobs.items()} | rejected,
                "utilization": self.gpu_seconds_used / (wall * int(self.cluster.capacity.sum())),
                "rounds": self.round_index, "executor": asdict(self.executor.stats)
                | {"extension_fraction": self.executor.stats.extension_fraction}}

    def _say_round(self, leases: Sequence[Lease], results: Mapping[Hashable, Any], seconds: float) -> None:
        held = {l.job_id: l for l in leases}
        cells = []
        for n, s in self.jobs.items():
            lease, r = held.get(n), results.get(n)
            where = f"{lease.gpu_type}{list(lease.gpu_ids)}{'*' if lease.extended else ''}" if lease else (
                "waiting for admission" if n in self.queued else "-")
            if lease is not None and lease.batch is not None:
                where += f" batch {lease.batch.batch_size}"
            rate = f" {r.measured_steps_per_s:.1f}/s" if r is not None and r.measured_steps_per_s else ""
            cells.append(f"{n} {s.steps_done}/{s.config.total_steps} {s.status} {where}{rate}")
        self._say(f"round {self.round_index} ({seconds:.1f}s): " + " | ".join(cells))

    def _say_report(self, report: Mapping[str, Any]) -> None:
        lines = ["", "job                 status    steps         JCT (s)  restarts"]
        for n, j in report["jobs"].items():
            jct = "-" if j["jct_s"] is None else f"{j['jct_s']:.1f}"
            total = "-" if j["total_steps"] is None else j["total_steps"]
            lines.append(f"{n:<19} {j['status']:<9} {j['steps_done']:>5}/{total:<6} {jct:>9}  {j['restarts']:>8}")
        stats = self.executor.stats
        med = lambda xs: f"{float(np.median(xs)):.3f}" if xs else "-"  # noqa: E731
        lines.append(f"utilization {report['utilization']:.1%} over {report['rounds']} rounds; leases extended "
                     f"{stats.extension_fraction:.0%}; median launch-to-first-step {med(stats.launch_to_first_step_s)} "
                     f"s, stop {med(stats.stop_s)} s")
        failed = [n for n, j in report["jobs"].items() if j["status"] == "failed"]
        if failed:
            lines.append(f"{len(failed)} job(s) failed: {', '.join(failed)}; see each job's message in the report "
                         f"and its log ({self.executor.work_dir}/jobs/NAME/rank0.log). Fix them and rerun with "
                         "--retry-failed to run them again")
        self._say(*lines)
