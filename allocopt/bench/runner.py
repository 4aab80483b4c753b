"""Running the suite: every (policy, instance kind, GPU types, jobs) cell with every backend and
technique, the cell's cvxpy baseline once per cell in the same run, and the scaling targets."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from allocopt.bench.baselines import BASELINES
from allocopt.bench.bounded import run_bounded
from allocopt.bench.output import Progress
from allocopt.bench.resolve import RESOLVE_TARGET, run_resolve_target
from allocopt.bench.suite import (
    BACKEND_SOLVER_OPTIONS,
    POLICIES,
    TARGETS,
    BenchPolicy,
    Target,
    techniques_for,
)
from allocopt.bench.timing import OBJECTIVE_RTOL, Measurement, time_allocopt

#: A baseline's process is stopped after this many times its time limit per run (building included),
#: plus the seconds a fresh process takes to import cvxpy.
BASELINE_WALL_FACTOR = 1.5
BASELINE_START_S = 15.0

#: Columns of a result row, in the order of the CSV.
ROW_FIELDS = ("policy", "instance", "n_jobs", "n_gpu_types", "backend", "technique", "status", "build_s",
              "transfer_s", "solve_s", "total_s", "objective", "num_solves", "baseline", "baseline_status",
              "baseline_build_s", "baseline_solve_s", "baseline_total_s", "baseline_objective", "ratio",
              "objective_rel_diff", "objectives_agree", "instance_s")


@dataclass
class Config:
    """What to run. Seconds: ``max_seconds`` is the allocopt budget per run (a run predicted from the
    smaller sizes to take longer is skipped; the solver's time limit per solve), ``baseline_time_limit_s``
    the baseline's (predicted longer: estimated instead of run; the solver's time limit)."""

    policies: Sequence[str]
    sizes: Sequence[int]
    types: Sequence[int]
    backends: Sequence[str]
    instances: Sequence[str]
    techniques: Sequence[str] | None = None
    seed: int = 0
    repeat: int = 1
    baseline: bool = True
    baseline_time_limit_s: float = 60.0
    max_seconds: float = 120.0
    progress: bool = True


@dataclass
class History:
    """Past (jobs, seconds, whether only a lower bound) of one series, to predict larger sizes."""

    points: list[tuple[int, float, bool]] = field(default_factory=list)

    def predict(self, n: int) -> tuple[float, bool] | None:
        """Seconds at ``n`` jobs by a power law through the two largest smaller sizes (exponent in [1, 3]),
        and whether it is only a lower bound (from a single size: linear, a lower bound); None without data."""
        below = sorted(p for p in self.points if p[0] < n)
        if not below:
            return None
        n1, t1, lower = below[-1]
        exponent = 1.0
        if len(below) > 1:
            n0, t0, _ = below[-2]
            if t0 > 0 and t1 > 0 and n1 > n0:
                exponent = min(3.0, max(1.0, math.log(t1 / t0) / math.log(n1 / n0)))
        return t1 * (n / n1) ** exponent, lower or len(below) == 1


def _estimate_note(predicted: tuple[float, bool], history: History) -> str:
    n1 = max(p[0] for p in history.points)
    bound = ">= " if predicted[1] else "~"
    return f"{bound}{predicted[0]:.3g} s, extrapolated from {n1} jobs"


def run_baseline(spec: BenchPolicy, instance: Any, n_jobs: int, history: History, limit_s: float,
                 repeat: int = 1) -> Measurement:
    """The cell's cvxpy baseline, or an estimate when the smaller sizes predict more than ``limit_s``."""
    predicted = history.predict(n_jobs)
    if predicted is not None and predicted[0] > limit_s:
        return Measurement(status=f"estimated: {_estimate_note(predicted, history)} (over --baseline-time-limit "
                                  f"{limit_s:g} s, not run)", total_s=predicted[0])
    # the build is bounded too: a child process, killed at the wall-clock limit or over its memory
    m = run_bounded(BASELINES[spec.name], (instance.problem, dict(instance.options), limit_s, repeat),
                    wall_limit_s=BASELINE_WALL_FACTOR * limit_s * repeat + BASELINE_START_S)
    if m.ok or m.status.startswith("timeout"):
        history.points.append((n_jobs, m.total_s, not m.ok))
    return m


def _compare(row: dict[str, Any], base: Measurement | None) -> None:
    """Fill the baseline columns, the ratio baseline / allocopt and the objective agreement."""
    if base is None:
        return
    row.update(baseline_status=base.status, baseline_build_s=base.build_s, baseline_solve_s=base.solve_s,
               baseline_total_s=base.total_s, baseline_objective=base.objective)
    if row["status"] == "ok" and base.total_s and (base.ok or base.status.startswith(("estimated", "timeout"))):
        row["ratio"] = base.total_s / row["total_s"]
    if row["status"] == "ok" and base.ok and base.objective is not None and row["objective"] is not None:
        diff = abs(row["objective"] - base.objective) / max(abs(base.objective), 1e-12)
        row.update(objective_rel_diff=diff, objectives_agree=bool(diff <= OBJECTIVE_RTOL))


def _row(spec: BenchPolicy, kind: str, n: int, k: int, backend: str, technique: str, m: Measurement,
         instance_s: float | None) -> dict[str, Any]:
    row = dict.fromkeys(ROW_FIELDS)
    row.update(policy=spec.name, instance=kind, n_jobs=n, n_gpu_types=k, backend=backend, technique=technique,
               status=m.status, build_s=m.build_s, transfer_s=m.transfer_s, solve_s=m.solve_s, total_s=m.total_s,
               objective=m.objective, num_solves=m.num_solves, baseline=spec.baseline, instance_s=instance_s)
    return row


def plan(config: Config) -> tuple[list[tuple[BenchPolicy, str, int, int]], list[str]]:
    """The cells to run, (policy, kind, GPU types, jobs) in order, and notes on combinations left out."""
    cells, notes = [], []
    for name in config.policies:
        spec = POLICIES[name]
        if not techniques_for(name, _names(config)):
            notes.append(f"{name}: none of --techniques {','.join(config.techniques or ())} applies")
            continue
        for kind in config.instances:
            if kind not in spec.instances:
                continue
            for k in config.types:
                why = spec.unsupported(kind, k)
                if why is not None:
                    notes.append(why)
                    continue
                for n in sorted(config.sizes):
                    if spec.max_jobs is not None and n > spec.max_jobs:
                        notes.append(f"{name} ({kind}, {k} types) at {n} jobs left out: the instance is limited "
                                     f"to {spec.max_jobs} jobs")
                        continue
                    cells.append((spec, kind, k, n))
    return cells, notes


def run_grid(config: Config, cells: list[tuple[BenchPolicy, str, int, int]],
             on_row: Callable[[dict[str, Any]], None] = lambda row: None) -> list[dict[str, Any]]:
    """Measure every cell; one row per (cell, backend, technique), each passed to ``on_row`` once measured."""
    runs_per_cell = {spec.name: len(techniques_for(spec.name, _names(config))) * len(config.backends)
                     + int(config.baseline) for spec, *_ in cells}
    progress = Progress(sum(runs_per_cell[spec.name] for spec, *_ in cells), config.progress)
    histories: dict[tuple[Any, ...], History] = {}
    rows: list[dict[str, Any]] = []
    try:
        for spec, kind, k, n in cells:
            t0 = time.perf_counter()
            instance = spec.instance(kind, n, k, config.seed)
            instance_s = time.perf_counter() - t0
            base = None
            if config.baseline:
                progress.step(f"{spec.name} {kind} {n}x{k} cvxpy")
                base = run_baseline(spec, instance, n, histories.setdefault((spec.name, kind, k), History()),
                                    config.baseline_time_limit_s, config.repeat)
                progress.advance()
            for backend in config.backends:
                for technique in techniques_for(spec.name, _names(config)):
                    progress.step(f"{spec.name} {kind} {n}x{k} {backend} {technique.name}")
                    history = histories.setdefault((spec.name, kind, k, backend, technique.name), History())
                    predicted = history.predict(n)
                    if predicted is not None and predicted[0] > config.max_seconds:
                        m = Measurement(status=f"skipped: {_estimate_note(predicted, history)} > --max-seconds "
                                               f"{config.max_seconds:g}")
                    else:
                        m = time_allocopt(instance.problem, spec.policy, backend=backend, repeat=config.repeat,
                                          options={**spec.options, **instance.options, **technique.options},
                                          solver_options=dict(BACKEND_SOLVER_OPTIONS.get(backend, {})),
                                          time_limit_s=config.max_seconds)
                        if m.ok:
                            history.points.append((n, m.total_s, False))
                    row = _row(spec, kind, n, k, backend, technique.name, m, instance_s)
                    _compare(row, base)
                    rows.append(row)
                    on_row(row)
                    progress.advance()
    finally:
        progress.close()
    return rows


def _names(config: Config) -> tuple[str, ...] | None:
    return None if config.techniques is None else tuple(config.techniques)


def run_target(target: Target, config: Config) -> dict[str, Any]:
    """Measure one target on highs with each of its techniques, and its baseline: measured at the target
    size when the smaller sizes (n / 256, n / 64, ...) predict it within ``baseline_time_limit_s``, else
    extrapolated from them."""
    spec = POLICIES[target.policy]
    t0 = time.perf_counter()
    instance = spec.instance(target.kind, target.n_jobs, target.n_gpu_types, config.seed)
    instance_s = time.perf_counter() - t0
    result: dict[str, Any] = {**asdict(target), "instance": instance.description, "instance_s": instance_s,
                              "techniques": {}}
    best: tuple[str, Measurement] | None = None
    auto_choice: dict[str, str] = {}
    for technique in target.techniques():
        m = time_allocopt(instance.problem, spec.policy, repeat=config.repeat,
                          options={**spec.options, **instance.options, **technique.options})
        result["techniques"][technique.name] = m.summary()
        if m.ok and m.values is not None:
            auto_choice[technique.name] = str(m.values.extras.get("technique"))
        if m.ok and (best is None or m.total_s < best[1].total_s):
            best = (technique.name, m)
    result.update(technique=None, total_s=None, met=None)
    auto = result["techniques"].get("auto")
    if best is not None and auto is not None and auto["status"] == "ok":
        objectives = [t["objective"] for t in result["techniques"].values() if t["status"] == "ok"]
        spread = (max(objectives) - min(objectives)) / max(abs(best[1].objective), 1e-12)
        plain = result["techniques"].get("plain")
        result.update(technique=f"auto: {auto_choice.get('auto', '?')}", total_s=auto["total_s"],
                      objective=auto["objective"], met=bool(auto["total_s"] <= target.limit_s),
                      fastest=best[0], techniques_rel_diff=spread, techniques_agree=bool(spread <= OBJECTIVE_RTOL),
                      vs_plain=(plain["total_s"] / auto["total_s"] if plain and plain["status"] == "ok" else None))
        best = ("auto", Measurement(total_s=auto["total_s"], objective=auto["objective"]))
    if not config.baseline:
        return result
    history = History()
    base, size = None, 0
    for size in sorted({target.n_jobs // 4 ** j for j in range(4, 0, -1)} | {target.n_jobs}):
        if size < 64:
            continue
        smaller = instance if size == target.n_jobs else spec.instance(target.kind, size, target.n_gpu_types,
                                                                       config.seed)
        base = run_baseline(spec, smaller, size, history, config.baseline_time_limit_s, config.repeat)
        if not base.ok:
            break
    if base is not None and not base.ok and not base.status.startswith("skipped"):
        predicted = history.predict(target.n_jobs)
        if base.status.startswith("timeout") and size == target.n_jobs:
            base = Measurement(status=f"estimated: >= {base.total_s:.3g} s (stopped at --baseline-time-limit)",
                               total_s=base.total_s)
        elif predicted is not None:
            base = Measurement(status=f"estimated: {_estimate_note(predicted, history)} (over "
                                      f"--baseline-time-limit {config.baseline_time_limit_s:g} s, not run)",
                               total_s=predicted[0])
    row = {"status": "ok" if best is not None else "error", "total_s": result["total_s"],
           "objective": result.get("objective")}
    _compare(row, base)
    result.update(baseline=spec.baseline, baseline_status=base.status if base else None,
                  baseline_total_s=row.get("baseline_total_s"), ratio=row.get("ratio"),
                  objective_rel_diff=row.get("objective_rel_diff"), objectives_agree=row.get("objectives_agree"),
                  baseline_points=[list(p) for p in history.points])
    return result


def run_targets(config: Config, names: Sequence[str] | None = None,
                on_result: Callable[[dict[str, Any]], None] = lambda result: None) -> list[dict[str, Any]]:
    """Every target (or those whose policy is in ``names``), then the re-solve target
    (:mod:`allocopt.bench.resolve`) when max-min fairness is among them; each result also goes
    to ``on_result`` as soon as it is measured."""
    chosen = [t for t in TARGETS if names is None or t.policy in names]
    resolve = names is None or "max_min_fairness" in names
    progress = Progress(len(chosen) + resolve, config.progress)
    out = []
    try:
        for target in chosen:
            progress.step(target.name)
            out.append(run_target(target, config))
            on_result(out[-1])
            progress.advance()
        if resolve:
            progress.step(RESOLVE_TARGET["name"])
            for row in run_resolve_target(seed=config.seed):
                out.append(row)
                on_result(row)
            progress.advance()
    finally:
        progress.close()
    return out
