"""Slurm's own commands, batched: what :mod:`allocopt.integrations.slurm` reads and changes.

One ``squeue`` call lists every job of the managed partitions, one ``sinfo``
call their nodes; each change is one ``scontrol`` call for many job ids
(``scontrol release 12,13,14``). Nothing here keeps state.

GPU types are Slurm's typed GRES (``Gres=gpu:a100:4`` on a node). A job's type
is pinned by excluding the nodes of every other type (``ExcNodeList``): Slurm
22.05 appends a job's GRES on a second ``scontrol update ... Gres=`` instead of
replacing it (``JOB_GRES=gpu:a100:1,gpu:v100:1``: never runnable), so a job
whose type changes between runs cannot be re-typed through its GRES.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from allocopt.errors import AllocoptError

log = logging.getLogger(__name__)

#: squeue fields (``--Format``, each ended by "|"); the comment is last: it may hold the separator.
_SQUEUE_FIELDS = ("JobID", "State", "Reason", "tres-per-node", "tres-per-job", "tres-per-task", "NumNodes",
                  "NumTasks", "NodeList", "StartTime", "EndTime", "Partition", "Name", "Comment")
_SQUEUE_FORMAT = ",".join(f"{field}:|" for field in _SQUEUE_FIELDS)
_SINFO_FORMAT = "%N|%G|%t"
#: node states whose GPUs count as capacity
#: a list of job ids goes to scontrol in up to this many concurrent calls of at least _MIN_CHUNK ids
_PARALLEL, _MIN_CHUNK = 4, 25
_UP_STATES = ("idle", "mix", "alloc", "comp")
#: job states after which a job never runs again
FINAL_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                          "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT"})


class SlurmError(AllocoptError, RuntimeError):
    """A Slurm command is missing, did not answer, or failed as a whole."""


@dataclass(frozen=True)
class SlurmJob:
    """One job as ``squeue`` shows it; times in epoch seconds (None: unknown)."""

    job_id: str
    state: str
    reason: str
    gres: str  # tres per node, e.g. "gres:gpu:2" ("" for none)
    nodes: tuple[str, ...]
    start_s: float | None
    end_s: float | None
    excluded: str  # nodes the job excludes ("" unless read by Slurm.excluded_nodes)
    partition: str
    name: str
    comment: str
    tres_per_job: str = ""  # e.g. "gres:gpu:a100:8" (sbatch --gpus)
    tres_per_task: str = ""  # e.g. "gres:gpu:2" (sbatch --gpus-per-task)
    num_nodes: int = 1
    num_tasks: int = 1

    @property
    def held(self) -> bool:
        """Pending with a hold (user, admin, or requeued held)."""
        return self.state == "PENDING" and ("held" in self.reason.lower() or self.reason == "JobHeldUser")

    @property
    def requeueing(self) -> bool:
        """Requeued and still stopping (its release must wait until it is pending)."""
        return self.state == "COMPLETING" and "requeue" in self.reason.lower()

    @property
    def gpus(self) -> tuple[str | None, int]:
        """GPU type (None: any) and count the whole job asks for, over all its nodes and tasks
        (``--gres``/``--gpus-per-node`` times nodes, ``--gpus``, ``--gpus-per-task`` times tasks);
        (None, 0) without GPUs."""
        for tres, times in ((self.gres, self.num_nodes), (self.tres_per_job, 1), (self.tres_per_task, self.num_tasks)):
            parsed = _gpu_tres(tres)
            if parsed is not None:
                return parsed[0], parsed[1] * max(times, 1)
        return None, 0

    def gpus_on(self, node_index: int) -> int:
        """GPUs the job holds on its ``node_index``-th node (a job-wide count split evenly, the remainder on
        the first nodes)."""
        _, total = self.gpus
        share, extra = divmod(total, max(len(self.nodes), 1))
        return share + (node_index < extra)


@dataclass(frozen=True)
class SlurmNode:
    """A node: its GPU type (None when it has none or several), GPU count and state."""

    name: str
    gpu_type: str | None
    gpus: int
    state: str
    mixed: bool = False  # several GPU types on the node

    @property
    def up(self) -> bool:
        return self.state.rstrip("*~#!%$@^-").lower() in _UP_STATES


def parse_gpu_gres(text: str) -> tuple[str | None, int] | None:
    """``gpu``, ``gpu:2``, ``gpu:a100``, ``gpu:a100:2`` or ``gpu:a100:2(S:0-1)`` -> (type or None, count);
    None for another GRES."""
    parts = re.sub(r"\(.*\)$", "", text).split(":")
    if parts[0] != "gpu" or len(parts) > 3:
        return None
    count = int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    named = parts[1] if len(parts) == 3 or (len(parts) == 2 and not parts[1].isdigit()) else None
    return named, count


def _gpu_tres(text: str) -> tuple[str | None, int] | None:
    """The GPU part of a TRES list (``gres:gpu:a100:2,gres:mps:10``); None when it has none."""
    for part in text.split(","):
        parsed = parse_gpu_gres(part.strip().removeprefix("gres:").removeprefix("gres/"))
        if parsed is not None:
            return parsed
    return None


def _none_if_unset(text: str) -> str:
    return "" if text in ("N/A", "(null)") else text


def _count(text: str) -> int:
    return int(text) if text.strip().isdigit() else 1


def _time(text: str) -> float | None:
    if not text or text in ("N/A", "Unknown", "None"):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()  # Slurm prints local time
    except ValueError:
        return None


def _node_list(text: str) -> tuple[str, ...]:
    """Expand a compressed Slurm host list (``gpu-[1-3],cpu1``)."""
    if not text or text in ("(null)", "N/A"):
        return ()
    out, depth, part = [], 0, ""
    for ch in text + ",":
        if ch == "," and depth == 0:
            match = re.fullmatch(r"(.*)\[(.*)\](.*)", part)
            if match:
                head, ranges, tail = match.groups()
                for r in ranges.split(","):
                    lo, _, hi = r.partition("-")
                    for k in range(int(lo), int(hi or lo) + 1):
                        out.append(f"{head}{str(k).zfill(len(lo))}{tail}")
            elif part:
                out.append(part)
            part = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        part += ch
    return tuple(out)


class Slurm:
    """Runs Slurm's commands (found on ``PATH``) for the jobs and nodes of ``partitions``.

    Parameters
    ----------
    partitions : sequence of str
        The partitions allocopt manages (empty: every partition).
    timeout_s : float
        Seconds a command may take before :class:`SlurmError`.
    """

    def __init__(self, partitions: Sequence[str] = (), timeout_s: float = 60.0):
        self.partitions = tuple(partitions)
        self.timeout_s = float(timeout_s)
        self.commands_run = 0  # for benchmarks
        self._pool = ThreadPoolExecutor(_PARALLEL * 3, thread_name_prefix="allocopt-scontrol")
        for command in ("squeue", "sinfo", "scontrol"):
            if shutil.which(command) is None:
                raise SlurmError(f"{command} not found on PATH; run allocopt slurm on a host with the Slurm client "
                                 "commands (Debian: apt-get install slurm-client)")

    def _run(self, args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
        self.commands_run += 1
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(list(args), capture_output=True, text=True, timeout=self.timeout_s)
            log.debug("%s %s: %.3f s", args[0], args[1] if len(args) > 1 else "", time.perf_counter() - t0)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{args[0]} did not answer within {self.timeout_s:g} s; is slurmctld up?") from None
        if check and proc.returncode != 0:
            raise SlurmError(f"{' '.join(args[:3])} failed (exit {proc.returncode}): {proc.stderr.strip()[:500]}")
        return proc

    def _partition_args(self) -> list[str]:
        return ["--partition", ",".join(self.partitions)] if self.partitions else []

    def jobs(self, job_ids: Sequence[str] | None = None) -> list[SlurmJob]:
        """The pending and running jobs of the managed partitions; or the jobs ``job_ids`` in any state
        (finished ones as long as Slurm keeps them: ``MinJobAge``)."""
        if job_ids is not None and not job_ids:
            return []
        select = ["--states=all", f"--jobs={','.join(job_ids)}"] if job_ids else self._partition_args()
        # (squeue fails for a list with an id Slurm forgot, yet lists the others)
        out = self._run(["squeue", "--noheader", *select, f"--Format={_SQUEUE_FORMAT}"], check=not job_ids).stdout
        jobs = []
        for line in out.splitlines():
            fields = line.split("|", len(_SQUEUE_FIELDS) - 1)
            if len(fields) != len(_SQUEUE_FIELDS):
                continue
            jid, state, reason, per_node, per_job, per_task, n_nodes, n_tasks, nodes, start, end, partition, name, \
                comment = (_none_if_unset(f) for f in (*fields[:-1], fields[-1].removesuffix("|")))
            jobs.append(SlurmJob(jid, state, reason, per_node, _node_list(nodes), _time(start), _time(end), "",
                                 partition, name, comment, per_job, per_task, _count(n_nodes),
                                 _count(n_tasks)))
        return jobs

    def excluded_nodes(self, job_ids: Sequence[str]) -> dict[str, str]:
        """The nodes each of ``job_ids`` excludes (``sbatch --exclude``), as Slurm's host list; "" for none.

        (``squeue --Format`` has no field for them, so newly seen jobs are asked once, in one call.)
        """
        if not job_ids:
            return {}
        out = self._run(["squeue", "--noheader", "--states=all", f"--jobs={','.join(job_ids)}", "--format=%i|%x"],
                        check=False).stdout
        found = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
        return {jid: _none_if_unset(found.get(jid, "")) for jid in job_ids}

    def nodes(self) -> list[SlurmNode]:
        """The nodes of the managed partitions with their GPU type (typed GRES) and count."""
        out = self._run(["sinfo", "--noheader", "--Node", *self._partition_args(),
                         f"--format={_SINFO_FORMAT}"]).stdout
        nodes: dict[str, SlurmNode] = {}
        for line in out.splitlines():
            name, _, rest = line.partition("|")
            gres, _, state = rest.partition("|")
            counts: dict[str | None, int] = {}
            for part in re.split(r",(?![^(]*\))", gres):
                parsed = parse_gpu_gres(part.strip())
                if parsed is not None:
                    counts[parsed[0]] = counts.get(parsed[0], 0) + parsed[1]
            typed = len(counts) == 1 and None not in counts
            gpu_type = next(iter(counts)) if typed else None
            nodes[name] = SlurmNode(name, gpu_type, sum(counts.values()), state.strip(), mixed=len(counts) > 1)
        return list(nodes.values())

    # ----- batched changes: one scontrol call per list of jobs ------------------------
    def _each(self, verb: Sequence[str], job_ids: Iterable[str], *extra: str) -> dict[str, str]:
        """``scontrol VERB ID,ID,... EXTRA``; the ids Slurm refused, with its message."""
        return self._batch([(verb, job_ids, extra)])

    def _batch(self, calls: Sequence[tuple[Sequence[str], Iterable[str], Sequence[str]]]) -> dict[str, str]:
        """``scontrol VERB ID,ID,... EXTRA`` for each ``(VERB, ids, EXTRA)`` of ``calls``; the ids Slurm refused,
        with its message.

        Long lists go as a few concurrent calls (slurmctld handles each id of a list as one request,
        so concurrent clients overlap their round trips), all from one pool.
        """
        tasks: list[tuple[Sequence[str], list[str], Sequence[str]]] = []
        for verb, job_ids, extra in calls:
            ids = list(dict.fromkeys(job_ids))
            size = min(max(_MIN_CHUNK, -(-len(ids) // _PARALLEL)), 2000)  # 2000: keeps the command line short
            if verb[0] == "update" and any(x.startswith("NumNodes=") for x in extra):
                size = 1  # Slurm 22.05's scontrol refuses NumNodes for a list of jobs ("Invalid job ID 1,2")
            tasks += [(verb, ids[start:start + size], extra) for start in range(0, len(ids), size)]

        def run(task: tuple[Sequence[str], list[str], Sequence[str]]) -> dict[str, str]:
            verb, chunk, extra = task
            target = [f"jobid={','.join(chunk)}"] if verb[0] == "update" else [",".join(chunk)]
            proc = self._run(["scontrol", *verb, *target, *extra], check=False)
            failed: dict[str, str] = {}
            if proc.returncode != 0:
                for line in proc.stderr.splitlines():
                    match = re.search(r"job(?:id)?[ =]?(\d+(?:_\d+)?)\b", line, re.IGNORECASE)
                    failed[match[1] if match and match[1] in chunk else ",".join(chunk)] = line.strip()
                if not failed:
                    failed[",".join(chunk)] = proc.stderr.strip() or f"exit {proc.returncode}"
                whole = failed.pop(",".join(chunk), None)  # a message naming no job of the chunk: each failed
                if whole is not None:
                    failed |= dict.fromkeys(chunk, whole)
                log.warning("scontrol %s %s: %s", " ".join(verb), ",".join(failed), "; ".join(set(failed.values())))
            return failed

        failed: dict[str, str] = {}
        for part in (map(run, tasks) if len(tasks) < 2 else self._pool.map(run, tasks)):
            failed |= part
        return failed

    def hold(self, job_ids: Iterable[str]) -> dict[str, str]:
        """Hold pending jobs (``scontrol hold``)."""
        return self._each(["hold"], job_ids)

    def requeue_hold(self, job_ids: Iterable[str]) -> dict[str, str]:
        """Preempt running jobs: ``scontrol requeuehold`` (SIGTERM, ``KillWait`` grace, back to pending held)."""
        return self._each(["requeuehold"], job_ids)

    def release(self, placements: Mapping[str, str | Sequence[str]]) -> dict[str, str]:
        """Start held jobs: set each job's ``ExcNodeList`` (the nodes it must not use, which pins its GPU
        type) and ``StartTime=now`` (a requeued job otherwise waits ~2 minutes), then ``scontrol release``.

        ``placements`` maps job id to its exclusion list, or to the fields to set (``ExcNodeList=...``,
        ``NumNodes=...``, ``Gres=...``); one update per distinct list.
        """
        return self.update_release({jid: (f"ExcNodeList={value}",) if isinstance(value, str) else tuple(value)
                                    for jid, value in placements.items()})

    def update_release(self, updates: Mapping[str, Sequence[str]], start: str = "now") -> dict[str, str]:
        """Update held jobs (``scontrol update jobid=... FIELD=VALUE ... StartTime=START``, one call per distinct
        list of fields, e.g. ``("ExcNodeList=gpu-v", "NumNodes=1", "Gres=gpu:2")``), then release those
        Slurm took the update of; the ids Slurm refused.

        ``start``: ``now``, or ``now+2`` for jobs that may start again on the node they were requeued from
        (slurmd refuses a job's credential issued in the second its previous one was revoked: the job
        fails with "Job credential revoked")."""
        groups: dict[tuple[str, ...], list[str]] = {}
        for jid, fields in updates.items():
            groups.setdefault(tuple(fields), []).append(jid)
        failed = self._batch([(["update"], ids, (*fields, f"StartTime={start}")) for fields, ids in groups.items()])
        failed |= self._each(["release"], [jid for jid in updates if jid not in failed])
        return failed

    def enact(self, hold: Sequence[str], requeue_hold: Sequence[str],
              release: Mapping[str, str | Sequence[str]]) -> dict[str, str]:
        """:meth:`hold`, :meth:`release` and :meth:`requeue_hold` of disjoint job sets, in that order;
        the ids Slurm refused.

        The order keeps slurmctld's job lock free for the round's own calls: a requeued job's stop
        (its termination, the GPUs it frees, the released jobs Slurm then starts) is work slurmctld
        does after the call returns, and updates or releases sent during it wait for that work (with
        the preemptions first, a round of 200 preemptions and 200 starts took 2.3-3.4 s against
        1.3-1.9 s in this order). Holds go first so that no pending job takes the GPUs the preempted
        jobs free; the released jobs wait for those GPUs in Slurm's queue.
        """
        failed = self.hold(hold) if hold else {}
        if release:
            failed |= self.release(release)
        if requeue_hold:
            failed |= self.requeue_hold(requeue_hold)
        return failed

    def wait_requeued(self, job_ids: Sequence[str], timeout_s: float) -> list[str]:
        """Wait until requeued jobs have stopped (``COMPLETING`` -> ``PENDING``); the ids that did, in order.

        A release sent while a requeued job still completes is undone by its requeue hold.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            states = {j.job_id: j.state for j in self.jobs(job_ids)}
            if all(states.get(j) != "COMPLETING" for j in job_ids) or time.monotonic() >= deadline:
                return [j for j in job_ids if states.get(j) == "PENDING"]
            time.sleep(0.1)
