"""Run a sweep's points through :func:`allocopt.simulate`: in this process, in worker processes, or as Ray tasks.

Results stream back as points finish; each becomes a row of the results table
(:class:`~allocopt.experiments.table.ResultsTable`) and a per-run file
``runs/<key>.npz`` (per-job and per-round arrays, for the figures). Points whose
key is already in the table are skipped, so re-running a sweep does only the
work left, and a sweep killed at any moment and restarted ends with each point
once.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from allocopt.errors import StateError
from allocopt.experiments.grid import Point, expand
from allocopt.experiments.metrics import run_metrics
from allocopt.experiments.spec import SweepSpec
from allocopt.experiments.table import ResultsTable, row_of

logger = logging.getLogger(__name__)


@dataclass
class SweepResult:
    """Outcome of :func:`run_sweep`.

    Attributes
    ----------
    table : Path
        ``results.csv``: one row per point (all of them, including earlier runs').
    parquet : Path or None
        ``results.parquet`` (None without pyarrow).
    rows : list of dict
        The table's rows, typed.
    ran, skipped : int
        Points simulated now; points already in the table.
    failed : list of (dict, str)
        Parameters and error message of each point that raised; they are not in the table and run again
        next time.
    wall_s : float
    """

    table: Path
    parquet: Path | None
    rows: list[dict[str, Any]]
    ran: int
    skipped: int
    failed: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    wall_s: float = 0.0


def simulate_point(params: Mapping[str, Any]) -> Any:
    """:func:`allocopt.simulate` on one point, built as ``allocopt simulate`` builds its arguments.

    ``fidelity``, ``placement``, ``admission``, ``tenants`` and ``capacity_events`` are passed only when
    the point sets them;
    ``policy_options`` only when non-empty. A public trace's jobs run one step per second on every type.
    """
    from allocopt.cluster import Cluster
    from allocopt.mechanism import generate_workload, simulate
    from allocopt.mechanism.workload import load_throughputs, read_gavel_trace
    from allocopt.throughput.profiles import shipped_profiles_dir
    from allocopt.throughput.table import DEFAULT_SCALE_FACTOR_PROBS, ThroughputTable

    table = load_throughputs(params["throughputs"]) if params["throughputs"] else ThroughputTable.gavel()
    counts = dict(item.split("=") for item in params["cluster"].split(","))
    cluster = Cluster({k: int(v) for k, v in counts.items()}, params["gpus_per_node"])
    kind, profiles = params["workload_kind"], None
    if kind == "generate":
        probs = params["scale_factor_probs"]
        workload: Any = generate_workload(
            table, params["num_jobs"], jobs_per_hour=params["jobs_per_hour"], seed=params["seed"], cluster=cluster,
            scale_factor_probs=DEFAULT_SCALE_FACTOR_PROBS if probs is None else {int(k): v for k, v in probs.items()})
    elif kind == "trace" and params.get("trace_format", "gavel") != "gavel":
        from allocopt.mechanism.traces import read_trace

        converted = read_trace(params["workload_path"], params["trace_format"], list(cluster.gpu_types),
                               task_table=params.get("task_table"))
        workload, table = converted.workload, converted.throughputs
    elif kind == "trace":
        workload = read_gavel_trace(params["workload_path"], table)
    else:
        workload, profiles = params["workload_path"], params["profiles"] or shipped_profiles_dir()
    extra: dict[str, Any] = {}
    for name in ("fidelity", "placement", "admission", "tenants", "capacity_events"):
        if params.get(name) is not None:
            extra[name] = params[name]
    window = params["window"]
    return simulate(workload, cluster, params["policy"], throughputs=table, round_seconds=params["round_seconds"],
                    recompute_min_seconds=params["recompute_min_seconds"], seed=params["seed"], mode=params["mode"],
                    restart_overhead_s=params["restart_overhead_s"], window=tuple(window) if window else None,
                    backend=params["backend"], profiles=profiles, run_unallocated=params["run_unallocated"],
                    ftf=params["ftf"], policy_options=dict(params["policy_options"]) or None, **extra)


def run_point(params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Simulate one point: its metrics (:data:`~allocopt.experiments.metrics.METRICS`) and its arrays
    (``job_<column>`` per job, ``round_<column>`` per round, ``window``) for the figures."""
    result = simulate_point(params)
    arrays = {f"job_{k}": np.asarray(v) for k, v in result.jobs.items() if k != "model"}
    arrays.update({f"round_{k}": np.asarray(v) for k, v in result.rounds.items()})
    arrays["window"] = np.asarray(result.metrics["window"])
    return run_metrics(result), arrays


def _attempt(params: Mapping[str, Any]) -> tuple[dict[str, Any] | None, dict[str, np.ndarray] | None, str | None]:
    """:func:`run_point`, its error caught as a message (an error of one point does not stop the sweep)."""
    try:
        metrics, arrays = run_point(params)
        return metrics, arrays, None
    except Exception as err:  # noqa: BLE001 - reported per point, the sweep goes on
        logger.debug("point failed", exc_info=True)
        return None, None, f"{type(err).__name__}: {err}"


def _write_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    temporary = path.with_name(path.stem + ".tmp.npz")
    np.savez_compressed(temporary, **arrays)
    os.replace(temporary, path)


def load_run(output: str | os.PathLike[str], key: str) -> dict[str, np.ndarray]:
    """The per-job and per-round arrays of one point of a sweep's ``output`` directory."""
    with np.load(Path(output) / "runs" / f"{key}.npz") as data:
        return {k: data[k] for k in data.files}


Outcome = tuple[Point, dict[str, Any] | None, dict[str, np.ndarray] | None, str | None]


def _in_process(points: Sequence[Point], running: Callable[[int], None]) -> Iterator[Outcome]:
    for point in points:
        running(1)
        yield (point, *_attempt(point.params))


def _in_processes(points: Sequence[Point], workers: int, running: Callable[[int], None]) -> Iterator[Outcome]:
    context = multiprocessing.get_context("spawn")  # no state forked from the caller (solver threads, Ray)
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context)
    try:
        futures = {pool.submit(_attempt, point.params): point for point in points}
        pending = set(futures)
        while pending:
            running(min(workers, sum(f.running() for f in pending)))
            done, pending = concurrent.futures.wait(pending, timeout=1.0,
                                                    return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                yield (futures[future], *future.result())
    finally:  # interrupted: drop the points not started rather than wait for them
        pool.shutdown(wait=False, cancel_futures=True)


def _on_ray(points: Sequence[Point], address: str, running: Callable[[int], None]) -> Iterator[Outcome]:
    from allocopt.extras import require_extra
    require_extra("ray", "ray", "a sweep on Ray (--ray-address)")
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1, max_retries=2)(_attempt)
        refs = {task.remote(point.params): point for point in points}
        cpus = max(int(ray.cluster_resources().get("CPU", 1)), 1)
        while refs:
            running(min(len(refs), cpus))
            done, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
            for ref in done:
                yield (refs.pop(ref), *ray.get(ref))
    finally:
        if started:
            ray.shutdown()


class _Progress:
    """A tqdm bar over the points: done (skipped ones counted from the start), running, ETA."""

    def __init__(self, total: int, skipped: int, enabled: bool):
        self.bar = None
        if enabled:
            from allocopt.extras import require_extra
            require_extra("tqdm", "progress", "the sweep's progress bar")
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=skipped, unit="run", desc="sweep")
        self.failed = 0

    def running(self, count: int) -> None:
        if self.bar is not None:
            self.bar.set_postfix(running=count, failed=self.failed, refresh=True)

    def done(self, failed: bool) -> None:
        self.failed += failed
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_sweep(spec: SweepSpec, *, progress: bool = False, points: Sequence[Point] | None = None) -> SweepResult:
    """Run every point of ``spec`` not yet in its results table.

    Parameters
    ----------
    spec : SweepSpec
        ``output`` is the directory written (``results.csv``, ``results.parquet``, ``runs/``);
        ``workers`` > 1 runs points in that many processes, ``ray_address`` as Ray tasks (``"auto"``,
        ``"local"`` or an address; a Ray already initialized in this process is used as it is).
    progress : bool, default False
        Show a progress bar (needs tqdm, the ``progress`` extra).
    points : sequence of Point, optional
        Default: :func:`~allocopt.experiments.grid.expand` of ``spec``.

    Returns
    -------
    SweepResult

    Raises
    ------
    StateError
        Another sweep is writing ``spec.output``.
    """
    wall = time.perf_counter()
    points = list(points) if points is not None else expand(spec)
    output = Path(spec.output)
    (output / "runs").mkdir(parents=True, exist_ok=True)
    with _locked(output):
        return _run(spec, points, output, progress, wall)


@contextlib.contextmanager
def _locked(output: Path) -> Iterator[None]:
    """Hold ``output/.lock`` (an advisory ``flock``): one sweep writes a directory at a time."""
    with open(output / ".lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StateError(f"{output}: another sweep is writing this directory; wait for it or give another "
                             "output") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(spec: SweepSpec, points: list[Point], output: Path, progress: bool, wall: float) -> SweepResult:
    table = ResultsTable(output / "results.csv")
    done_keys = table.keys
    todo = [p for p in points if p.key not in done_keys]
    skipped = len(points) - len(todo)
    logger.info("sweep: %d points, %d already in %s, %d to run", len(points), skipped, table.path, len(todo))
    bar = _Progress(len(points), skipped, progress)
    if not todo:
        outcomes: Iterator[Outcome] = iter(())
    elif spec.ray_address:
        outcomes = _on_ray(todo, spec.ray_address, bar.running)
    elif spec.workers > 1 and len(todo) > 1:
        outcomes = _in_processes(todo, min(spec.workers, len(todo)), bar.running)
    else:
        outcomes = _in_process(todo, bar.running)
    failed: list[tuple[dict[str, Any], str]] = []
    ran = 0
    try:
        for point, metrics, arrays, error in outcomes:
            if error is not None:
                failed.append((point.params, error))
                logger.warning("sweep point %s (%s, %s, seed %s) failed: %s", point.key, point.params["policy_label"],
                               point.params["workload"], point.params["seed"], error)
            else:
                _write_arrays(output / "runs" / f"{point.key}.npz", arrays)  # before its row: a row has its arrays
                table.append(row_of(point.key, point.params, metrics))
                ran += 1
            bar.done(error is not None)
    finally:
        bar.close()
    parquet = table.write_parquet(output / "results.parquet")
    return SweepResult(table.path, parquet, list(table.rows), ran, skipped, failed, time.perf_counter() - wall)


__all__ = ["SweepResult", "load_run", "run_point", "run_sweep", "simulate_point"]
