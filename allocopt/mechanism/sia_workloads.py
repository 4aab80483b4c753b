"""Sia workloads: the job lists of the Sia (SOSP 2023) artifact.

A workload CSV has the columns ``name, time, application, num_replicas,
batch_size`` (other columns are ignored): ``name`` is ``<application>-<n>``,
``time`` the submission time in seconds, ``num_replicas`` the GPUs the job
requests and ``batch_size`` its requested global batch size (samples), the
settings a job keeps under rigid (Gavel-style) scheduling. Copies of two
workloads ship in ``allocopt/data/sia_workloads`` (see its README.md).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from allocopt.documents import read_text
from allocopt.errors import WorkloadFormatError
from allocopt.throughput.profiles import discover

#: Largest num_replicas and batch_size a workload may give.
MAX_COUNT = 2**31 - 1

#: Columns every Sia workload file must have.
WORKLOAD_COLUMNS: tuple[str, ...] = ("name", "time", "application", "num_replicas", "batch_size")


@dataclass(frozen=True)
class SiaWorkloadJob:
    """One job of a Sia workload.

    Attributes
    ----------
    name : str
        ``<application>-<n>``, unique within the workload.
    time_s : float
        Submission time, seconds from the workload's start (>= 0).
    application : str
    num_replicas : int
        GPUs requested (>= 1).
    batch_size : int
        Requested global batch size, samples (>= 1).
    line : int
        1-based line of the file it came from.
    """

    name: str
    time_s: float
    application: str
    num_replicas: int
    batch_size: int
    line: int


def shipped_workloads_dir() -> Path:
    """The Sia workloads shipped with allocopt (``saturn/workload-1.csv``, ``phoebe_workload.csv``)."""
    return Path(str(resources.files("allocopt").joinpath("data", "sia_workloads")))


def read_sia_workload(path: str | Path, *, applications: Iterable[str] | str | Path | None = None
                      ) -> list[SiaWorkloadJob]:
    """Read a Sia workload CSV, jobs sorted by submission time (ties in file order).

    Parameters
    ----------
    path : str or Path
    applications : iterable of str, or str / Path of a profile directory, optional
        Applications the caller has profiles for (for a directory: those of
        :func:`allocopt.throughput.profiles.discover`); a job of any other
        application is an error. None accepts every application.

    Returns
    -------
    list of SiaWorkloadJob

    Raises
    ------
    WorkloadFormatError
        Naming the file and line: a missing file or column, an empty workload,
        a repeated or malformed name, a non-numeric, negative or infinite time,
        a non-integer or non-positive ``num_replicas`` / ``batch_size``, or an
        unknown application.
    """
    path = Path(path)
    known = _known_applications(applications)
    reader = csv.reader(io.StringIO(read_text(path, what="the workload", error=WorkloadFormatError), newline=""))
    try:
        rows = list(reader)
    except csv.Error as err:
        raise WorkloadFormatError(f"not a CSV file: {err}", path=path, line=reader.line_num) from None
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise WorkloadFormatError(f"empty file; expected a header {','.join(WORKLOAD_COLUMNS)}", path=path, line=1)
    header = [cell.strip() for cell in rows[0]]
    missing = [c for c in WORKLOAD_COLUMNS if c not in header]
    if missing:
        raise WorkloadFormatError(f"missing column(s) {missing}; the header is {header}, expected "
                                  f"{list(WORKLOAD_COLUMNS)}", path=path, line=1)
    index = {c: header.index(c) for c in WORKLOAD_COLUMNS}
    jobs: list[SiaWorkloadJob] = []
    seen: dict[str, int] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) < len(header):
            raise WorkloadFormatError(f"{len(row)} field(s), the header has {len(header)}", path=path, line=line)
        cells = {c: row[i].strip() for c, i in index.items()}
        jobs.append(_job(cells, path, line, known, seen))
    if not jobs:
        raise WorkloadFormatError("no jobs after the header", path=path)
    return sorted(jobs, key=lambda job: job.time_s)


def _known_applications(applications: Iterable[str] | str | Path | None) -> frozenset[str] | None:
    if applications is None:
        return None
    if isinstance(applications, (str, Path)):
        return frozenset(app for app, _ in discover(applications))
    return frozenset(map(str, applications))


def _job(cells: dict[str, str], path: Path, line: int, known: frozenset[str] | None,
         seen: dict[str, int]) -> SiaWorkloadJob:
    def fail(message: str) -> WorkloadFormatError:
        return WorkloadFormatError(message, path=path, line=line)

    name, application = cells["name"], cells["application"]
    if not application:
        raise fail("empty application")
    if known is not None and application not in known:
        raise fail(f"unknown application {application!r} of job {name!r}; profiles are available for "
                   f"{sorted(known)}")
    prefix, _, number = name.rpartition("-")
    if prefix != application or not number.isdigit():
        raise fail(f"job name {name!r} is not <application>-<n> with application {application!r}")
    if name in seen:
        raise fail(f"job name {name!r} repeats line {seen[name]}; names must be unique")
    seen[name] = line
    try:
        time_s = float(cells["time"])
    except ValueError:
        raise fail(f"time {cells['time']!r} of job {name!r} is not a number (seconds)") from None
    if not math.isfinite(time_s) or time_s < 0:
        raise fail(f"time {cells['time']!r} of job {name!r} must be a finite number of seconds >= 0")
    counts = {}
    for column in ("num_replicas", "batch_size"):
        text = cells[column]
        try:
            value = float(text)
        except ValueError:
            raise fail(f"{column} {text!r} of job {name!r} is not a number") from None
        if not (math.isfinite(value) and 1 <= value <= MAX_COUNT and value == int(value)):
            raise fail(f"{column} {text!r} of job {name!r} must be a whole number from 1 to {MAX_COUNT}")
        counts[column] = int(value)
    return SiaWorkloadJob(name, time_s, application, counts["num_replicas"], counts["batch_size"], line)


__all__ = ["WORKLOAD_COLUMNS", "SiaWorkloadJob", "WorkloadFormatError", "read_sia_workload",
           "shipped_workloads_dir"]
