"""What a job's ranks report, and what a round counts of it: each rank's progress records (the JSON-lines
file :mod:`allocopt.runtime.client` writes), the steps a job made since its last result, its steady-state
throughput, and the executor's latency statistics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from allocopt.runtime.launch import RankProcess


@dataclass
class ExecutorStats:
    """Latencies (seconds) and counts the executor measured, for reports and benchmarks."""

    launch_to_start_s: list[float] = field(default_factory=list)  # Popen to the client's first record
    launch_to_first_step_s: list[float] = field(default_factory=list)  # Popen to the first completed step
    popen_s: list[float] = field(default_factory=list)  # time spent in the executor launching one rank
    stop_s: list[float] = field(default_factory=list)  # stop request to every process of the job gone
    leases: int = 0
    extended: int = 0
    launches: int = 0
    retries: int = 0

    @property
    def extension_fraction(self) -> float:
        """Fraction of leases served by extending a running process instead of (re)starting it."""
        return self.extended / self.leases if self.leases else 0.0


@dataclass
class Rank:
    """One rank of a running job: its process and what its progress file said so far."""

    proc: RankProcess
    progress: Path
    launched_t: float  # epoch s
    offset: int = 0
    buf: bytes = b""
    step: int | None = None
    samples: int | None = None
    ckpt: int | None = None
    paused_seq: int | None = None
    exit_reason: str | None = None
    started_t: float | None = None
    first_step: tuple[float, int] | None = None
    records: list[tuple[float, int, str]] = field(default_factory=list)  # (t, step, event) this round
    metrics: dict[str, float] = field(default_factory=dict)  # latest numeric value of each reported metric

    def read(self) -> None:
        """Consume new progress records."""
        try:
            with open(self.progress, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        lines = (self.buf + data).split(b"\n")
        self.buf = lines.pop()
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            event, t = rec.get("event"), float(rec.get("t", 0.0))
            if "ckpt" in rec and rec["ckpt"] is not None:
                self.ckpt = int(rec["ckpt"])
            if rec.get("samples") is not None:
                self.samples = int(rec["samples"])
            if event == "metrics":
                self.metrics.update({k: float(v) for k, v in rec.items() if k not in ("event", "t")
                                     and isinstance(v, (int, float)) and not isinstance(v, bool)})
                continue
            if "step" not in rec:
                continue
            self.step = int(rec["step"])
            self.records.append((t, self.step, event))
            if event == "start" and self.started_t is None:
                self.started_t = t
            elif event == "step" and self.first_step is None:
                self.first_step = (t, self.step)
            elif event == "paused":
                self.paused_seq = int(rec.get("seq", 0))
            elif event == "resumed":
                self.paused_seq = None
            elif event == "exit":
                self.exit_reason = str(rec.get("reason"))

    def started_step(self) -> int | None:
        """The step this round's records start from (its first start or paused record), None before any."""
        return next((step for _, step, event in self.records if event in ("start", "paused")), None)


def steady_steps_per_s(rank: Rank) -> float | None:
    """Steady-state steps/s of ``rank`` this round: from its first step (or resume) record to its last record;
    None where that spans no step or at most 20 ms."""
    recs = [(t, s) for t, s, e in rank.records if e in ("step", "resumed", "paused", "exit")]
    first = next(((t, s) for t, s, e in rank.records if e in ("step", "resumed")), None)
    if first is None or not recs:
        return None
    t_last, s_last = recs[-1]
    if t_last - first[0] <= 0.02 or s_last <= first[1]:
        return None
    return (s_last - first[1]) / (t_last - first[0])


class StepLedger:
    """The steps each job made since its last result, whatever launches made them.

    A launch that crashed after a checkpoint its progress file did not yet show, or one that started after
    its round's end, counts in the next result; steps redone from an older checkpoint count once.
    """

    def __init__(self) -> None:
        self._counted: dict[Hashable, int] = {}  # each job's step as of its last result

    def count(self, job_id: Hashable, ranks: Sequence[Rank]) -> int:
        """Steps ``job_id`` made since its last count, read from its ``ranks`` (the slowest rank's step);
        the first count starts from where its first rank's records start."""
        steps_now = min((r.step for r in ranks if r.step is not None), default=None)
        counted = self._counted.get(job_id)
        if counted is None and ranks:
            counted = ranks[0].started_step()
        steps = max(0, steps_now - counted) if steps_now is not None and counted is not None else 0
        if steps_now is not None:
            self._counted[job_id] = steps_now if counted is None else max(counted, steps_now)
        return steps


__all__ = ["ExecutorStats", "Rank", "StepLedger", "steady_steps_per_s"]
