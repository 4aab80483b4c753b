#!/usr/bin/env python
"""Reliability: `allocopt run` SIGKILLed again and again; counts by outcome.

Runtime faults part. Each chain starts a fresh state with three jobs on three
``cpu`` devices (``tests/jobs/count_steps.py`` run plainly, through a shell
command line that forks it, and through a launcher that runs it as its child and
leaves an orphan ``sleep`` in a session of its own) and kills the scheduler
``--kills-per-chain`` times before letting it finish. A kill is, at random:

* ``random``: SIGKILL at a random time in the first 2.5 s of a run;
* ``after-fork``: the scheduler kills itself right after its N-th process start
  (N random in 1..4), so the child is recorded by launch token only;
* ``before-death-signal``: the N-th child kills the scheduler after fork, before
  it arms its death signal.

After each kill it counts the job processes still alive 5 s later: those
using the client stop on their own (their scheduler is gone) and the executor's
watchdog kills every journaled tree, the orphans that never use the client
included. After the final run it counts, per
job, whether its step log lists each step exactly once (else steps repeated or
missing), and every process of every job still alive. The job logs are the
evidence: a stale copy that committed would repeat steps.

Usage: ``python benchmarks/reliability.py [--kills 100] [--kills-per-chain 10] [--seed 0]``
(the default runs 100 kills: several minutes; ``--kills 20`` is a quick look).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from allocopt.bench.machine import machine_info
from allocopt.bench.output import (
    Column,
    add_results_option,
    results_table,
    write_results,
)

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "tests" / "jobs"
TOTALS = {"plain": 3000, "shell": 2500, "launcher": 2800}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _marked(mark: str) -> list[tuple[int, str]]:
    """(pid, command line) of live processes whose environment holds ALLOCOPT_TEST_MARK=<mark>."""
    needle, out = f"ALLOCOPT_TEST_MARK={mark}".encode(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                continue
            if needle in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                out.append((int(name), Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except (OSError, IndexError):
            continue
    return out


def _job_file(directory: Path, mark: str) -> Path:
    def count(name: str) -> list[str]:
        return [sys.executable, str(JOBS / "count_steps.py"), str(directory / f"{name}.txt"), "--sleep-s", "0.003"]

    cmds = {"plain": count("plain"), "shell": shlex.join(count("shell")) + "; true",
            "launcher": [sys.executable, str(JOBS / "launcher.py"), "--orphan", "--", *count("launcher")]}
    path = directory / "jobs.json"
    path.write_text(json.dumps({"jobs": [{"name": n, "command": cmds[n], "total_steps": t,
                                          "throughputs": {"cpu": 150.0}, "env": {"ALLOCOPT_TEST_MARK": mark}}
                                         for n, t in TOTALS.items()]}))
    return path


def _args(directory: Path, jobs_file: Path) -> list[str]:
    return [str(jobs_file), "--cluster", "cpu=3", "--round-seconds", "1", "--grace-s", "1",
            "--state", str(directory / "state.db")]


def _kill_once(directory: Path, jobs_file: Path, kind: str, rng: random.Random) -> bool:
    """One scheduler run ended by a SIGKILL of ``kind``; False when the run finished first."""
    if kind == "random":
        proc = subprocess.Popen([sys.executable, "-m", "allocopt", "run", *_args(directory, jobs_file)], env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=rng.uniform(0.2, 2.5))
            return False
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
    nth = rng.randint(1, 4) if kind == "after-fork" else rng.randint(1, 3)
    run = subprocess.run([sys.executable, str(JOBS / "fault_scheduler.py"), kind, str(nth),
                          *_args(directory, jobs_file)], env=_env(), capture_output=True, timeout=120)
    return run.returncode == -signal.SIGKILL


def _steps(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def chain(kills: int, rng: random.Random, counts: collections.Counter) -> int:
    """A fresh state killed up to ``kills`` times, then run to the end; outcomes added to ``counts``.

    Returns the kills that happened (a run that finishes before its kill ends the chain's kills).
    """
    killed = 0
    mark = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="allocopt-reliability-") as tmp:
        directory = Path(tmp)
        jobs_file = _job_file(directory, mark)
        try:
            for _ in range(kills):
                kind = rng.choice(["random", "random", "after-fork", "before-death-signal"])
                if not _kill_once(directory, jobs_file, kind, rng):
                    counts["run finished before its kill"] += 1
                    break
                killed += 1
                counts[f"kills: {kind}"] += 1
                limit = time.time() + 5.0
                while (left := _marked(mark)) and time.time() < limit:
                    time.sleep(0.05)
                counts["client processes alive 5 s after a kill"] += sum("sleep" not in c for _, c in left)
                counts["orphans (no client) alive 5 s after a kill"] += sum("sleep" in c for _, c in left)
            final = subprocess.run([sys.executable, "-m", "allocopt", "run", *_args(directory, jobs_file)],
                                   env=_env(), capture_output=True, text=True, timeout=300)
            counts[f"final runs exiting {final.returncode}"] += 1
            for name, total in TOTALS.items():
                steps = _steps(directory / f"{name}.txt")
                if steps == list(range(total)):
                    counts["jobs: each step exactly once"] += 1
                else:
                    repeated = len(steps) - len(set(steps))
                    missing = len(set(range(total)) - set(steps))
                    counts["jobs: steps repeated"] += repeated > 0
                    counts["jobs: steps missing"] += missing > 0
            time.sleep(0.5)
            counts["job processes left after the final run"] += len(_marked(mark))
        finally:
            for pid, _ in _marked(mark):
                os.kill(pid, signal.SIGKILL)
    return killed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=100, help="scheduler kills in all (default: 100)")
    parser.add_argument("--kills-per-chain", type=int, default=10, help="kills before a chain runs to its end")
    parser.add_argument("--seed", type=int, default=0)
    add_results_option(parser, "reliability", Path(__file__).parent / "results")
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        print("reliability: needs Linux (/proc)", file=sys.stderr)
        return 2
    rng, counts = random.Random(args.seed), collections.Counter()
    start = time.time()
    done = chains = 0
    while done < args.kills:  # chains until that many kills happened (runs that finished first do not count)
        done += chain(min(args.kills_per_chain, args.kills - done), rng, counts)
        chains += 1
    info = machine_info()
    print("machine: " + ", ".join(f"{k} {info[k]}" for k in ("cpu", "cpus_usable", "load_average")
                                  if k in info))
    print(f"{done} kills in {chains} chains, {time.time() - start:.0f} s")
    for key in sorted(counts):
        print(f"  {key:<52} {counts[key]}")
    bad = counts["jobs: steps repeated"] + counts["jobs: steps missing"] + \
        counts["job processes left after the final run"] + counts["client processes alive 5 s after a kill"] + \
        counts["orphans (no client) alive 5 s after a kill"]
    verdict = "every step exactly once, no job process left" if bad == 0 else f"{bad} bad outcome(s)"
    print("verdict:", verdict)
    if args.results:
        rows = [{"outcome": key, "count": counts[key]} for key in sorted(counts)]
        write_results(args.results, "reliability", machine=info,
                      data={"kills": done, "chains": chains, "counts": dict(counts), "verdict": verdict},
                      tables=[results_table(f"{done} scheduler kills in {chains} chains (seed {args.seed}): {verdict}",
                                            rows, [Column("outcome", "outcome", left=True),
                                                   Column("count", "count", ",")])])
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
