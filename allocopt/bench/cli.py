"""``allocopt bench``: the solver-scaling suite from the command line.

``add_parser(subparsers)`` adds the ``bench`` command to an argparse
subparsers object (``allocopt.cli`` does); ``main(args)`` runs it and returns
the exit code. ``python -m allocopt.bench ARGS`` runs it standalone.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path
from typing import Any

from allocopt.backends import BACKENDS
from allocopt.bench import instances, output
from allocopt.bench.families import (
    DEFAULT_FAMILY_POLICIES,
    FAMILY_FIELDS,
    FAMILY_POLICIES,
    family_policies,
    run_families,
)
from allocopt.bench.families import DEFAULT_SIZES as FAMILY_SIZES
from allocopt.bench.instances import FAMILIES
from allocopt.bench.machine import format_machine, machine_info
from allocopt.bench.output import Column, format_table, ratio, seconds
from allocopt.bench.runner import ROW_FIELDS, Config, plan, run_grid, run_targets
from allocopt.bench.suite import INSTANCE_KINDS, POLICIES, TECHNIQUES, get_policy
from allocopt.errors import AllocoptError, InvalidOptionError

DEFAULT_SIZES = (256, 1024, 4096, 16384)
DEFAULT_TYPES = (3, 8)
QUICK_SIZES = (32, 128)
QUICK_TYPES = (3,)

ROW_COLUMNS = (
    Column("policy", "policy", left=True), Column("instance", "inst", left=True), Column("n_jobs", "jobs"),
    Column("n_gpu_types", "types"), Column("backend", "backend", left=True),
    Column("technique", "technique", left=True), Column("build_s", "build_s", seconds),
    Column("solve_s", "solve_s", seconds), Column("total_s", "total_s", seconds),
    Column("baseline_total_s", "cvxpy_s", seconds), Column("ratio", "cvxpy/ours", ratio),
    Column("objective", "objective", ".8g"), Column("objective_rel_diff", "rel.diff", ".1e"),
    Column("note", "note", left=True))

TARGET_COLUMNS = (
    Column("name", "target", left=True), Column("limit_s", "limit_s", "g"), Column("total_s", "measured_s", seconds),
    Column("verdict", "verdict", left=True), Column("technique", "technique", left=True),
    Column("vs_plain", "vs plain", ratio), Column("baseline_total_s", "cvxpy_s", seconds),
    Column("ratio", "cvxpy/ours", ratio),
    Column("objective_rel_diff", "rel.diff", ".1e"), Column("note", "note", left=True))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``bench`` command to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser(
        "bench", help="benchmark policies x sizes x backends x techniques against cvxpy baselines",
        description="Time allocopt.solve for each policy, number of jobs, number of GPU types, backend and "
                    "technique, and the same policy written the straightforward way in cvxpy (as Gavel and Sia "
                    "do) solved by HiGHS in the same run; write JSON, CSV and log-log plots. --targets reports "
                    "the speed targets instead, --families every technique on every instance family. Times are "
                    "wall-clock seconds; nothing is asserted.")
    _arguments(p)
    p.set_defaults(run=main)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policies", metavar="NAMES", help=f"comma-separated (default: all: {', '.join(POLICIES)}; "
                                                       f"--families: {', '.join(DEFAULT_FAMILY_POLICIES)})")
    p.add_argument("--sizes", metavar="N,...",
                   help=f"numbers of jobs (default {','.join(map(str, DEFAULT_SIZES))}; "
                        f"--quick: {','.join(map(str, QUICK_SIZES))})")
    p.add_argument("--types", metavar="K,...",
                   help=f"numbers of GPU types (default {','.join(map(str, DEFAULT_TYPES))}; "
                        f"--quick: {','.join(map(str, QUICK_TYPES))})")
    p.add_argument("--backends", metavar="NAMES",
                   help=f"allocopt backends, of {', '.join(BACKENDS)} (default: highs)")
    p.add_argument("--techniques", metavar="NAMES",
                   help=f"of {', '.join(t.name for t in TECHNIQUES)} (default: every one that applies)")
    p.add_argument("--instances", metavar="KINDS",
                   help=f"instance kinds, of {', '.join(INSTANCE_KINDS)} (default: both)")
    p.add_argument("--seed", type=int, default=0, help="instance seed (default: %(default)s)")
    p.add_argument("--repeat", type=int, default=1, help="runs per measurement; times are medians (default: 1)")
    p.add_argument("--no-baseline", action="store_true", help="do not run the cvxpy baselines")
    p.add_argument("--baseline-time-limit", type=float, default=60.0, metavar="S",
                   help="seconds a baseline may take: one predicted from smaller sizes to take longer is "
                        "estimated (extrapolated) instead of run, and a run's solver is stopped there "
                        "(default: 60)")
    p.add_argument("--max-seconds", type=float, default=120.0, metavar="S",
                   help="allocopt runs predicted from smaller sizes to take longer are skipped, and it is the "
                        "solver's time limit per solve (default: 120)")
    p.add_argument("--quick", action="store_true",
                   help="CI smoke run: sizes 32,128, 3 types, highs (about 20 s on 2 cores)")
    p.add_argument("--targets", action="store_true",
                   help="measure the speed targets with allocopt.solve's defaults (minutes: the target sizes and "
                        "baselines at smaller sizes)")
    p.add_argument("--families", nargs="?", const="all", metavar="NAMES",
                   help=f"every technique x instance family x size (default sizes "
                        f"{','.join(map(str, FAMILY_SIZES))}), with the ratio to the plain LP and to cvxpy, slowdowns "
                        f"flagged, then (without NAMES) POP's figure-2 and Sia's scale instances; NAMES: comma-separated of "
                        f"{', '.join(FAMILIES)} (default: all); --policies picks of {', '.join(FAMILY_POLICIES)} "
                        f"(default: {', '.join(DEFAULT_FAMILY_POLICIES)}; given: no anchors), --techniques keeps the "
                        "plain LP and those named; rows are printed as they finish and written to "
                        "families.csv with each instance's baseline")
    p.add_argument("--sia-data", metavar="DIR",
                   help="a copy of Sia's artifact data (holding sia/workloads/scale and sia/seed_profiles) for the "
                        "Sia instances; default: the profiles shipped with allocopt and a seeded application mix")
    p.add_argument("--out", default="bench-results", metavar="DIR",
                   help="directory for bench.json, bench.csv, bench-<backend>.png (targets: targets.json, "
                        "targets.csv) (default: %(default)s)")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _names(text: str | None, field: str, allowed: Any, default: Any) -> list[str]:
    if text is None:
        return list(default)
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in allowed]
    if not names or unknown:
        raise InvalidOptionError(f"{field}: unknown name(s) {unknown or [text]}; choose from {', '.join(allowed)}")
    return names


def _ints(text: str | None, field: str, default: Any, maximum: int | None = None) -> list[int]:
    if text is None:
        return list(default)
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InvalidOptionError(f"{field}: expected comma-separated positive integers, got {text!r}") from None
    if not values or any(v < 1 or (maximum is not None and v > maximum) for v in values):
        bound = f" of at most {maximum}" if maximum is not None else ""
        raise InvalidOptionError(f"{field}: expected positive integers{bound}, got {text!r}")
    return sorted(set(values))


def config_from_args(args: argparse.Namespace) -> Config:
    """Validate the arguments into a :class:`Config`; raises InvalidOptionError naming the option."""
    for name in args.policies.split(",") if args.policies else ():
        if name.strip():
            get_policy(name.strip())
    if args.repeat < 1:
        raise InvalidOptionError(f"--repeat: expected at least 1, got {args.repeat}")
    for flag, value in (("--baseline-time-limit", args.baseline_time_limit), ("--max-seconds", args.max_seconds)):
        if not value > 0:
            raise InvalidOptionError(f"{flag}: expected a positive number of seconds, got {value}")
    return Config(
        policies=_names(args.policies, "--policies", POLICIES, POLICIES),
        sizes=_ints(args.sizes, "--sizes", QUICK_SIZES if args.quick else DEFAULT_SIZES),
        types=_ints(args.types, "--types", QUICK_TYPES if args.quick else DEFAULT_TYPES, maximum=64),
        backends=_names(args.backends, "--backends", BACKENDS, ["highs"]),
        instances=_names(args.instances, "--instances", INSTANCE_KINDS, INSTANCE_KINDS),
        techniques=(None if args.techniques is None
                    else _names(args.techniques, "--techniques", [t.name for t in TECHNIQUES], ())),
        seed=args.seed, repeat=args.repeat, baseline=not args.no_baseline,
        baseline_time_limit_s=args.baseline_time_limit, max_seconds=args.max_seconds,
        progress=not args.no_progress)


def _note(row: dict[str, Any]) -> str:
    notes = [] if row["status"] == "ok" else [row["status"]]
    if row.get("baseline_status") not in (None, "ok"):
        notes.append(f"cvxpy {row['baseline_status']}")
    if row.get("objectives_agree") is False:
        notes.append("OBJECTIVES DIFFER")
    return "; ".join(notes)


def main(args: argparse.Namespace) -> int:
    """Run ``allocopt bench`` with parsed ``args``; write the results under ``args.out``; return 0."""
    instances.set_data_dir(args.sia_data)
    config = config_from_args(args)
    cells, notes = plan(config)
    if not cells and not args.targets:
        raise InvalidOptionError("nothing to run: " + ("; ".join(notes) or "no policy runs on the chosen "
                                 "--instances") + "; change --policies, --techniques, --instances, --types or --sizes")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    print(format_machine(info), flush=True)
    if args.targets:
        return _targets(config, args, info, out)
    if args.families:
        return _families(config, args, info, out)
    for note in dict.fromkeys(notes):
        print(f"note: {note}")
    path = out / "bench.csv"
    with path.open("w", newline="") as handle:  # rows are written as they finish; rewritten whole at the end
        writer = csv.DictWriter(handle, fieldnames=ROW_FIELDS, extrasaction="ignore")
        writer.writeheader()

        def on_row(row: dict[str, Any]) -> None:
            row["note"] = _note(row)
            progress_line = "  ".join(f"{c.header}={c.show(row.get(c.key))}" for c in ROW_COLUMNS
                                      if row.get(c.key) is not None)
            print(progress_line, flush=True)
            writer.writerow(row)
            handle.flush()

        rows = run_grid(config, cells, on_row)
    print()
    print(format_table(rows, ROW_COLUMNS, group="policy"))
    agree = [r for r in rows if r.get("objectives_agree") is not None]
    print(f"\nratio = cvxpy baseline total / allocopt total, same run; objectives compared in {len(agree)} rows, "
          f"{sum(not r['objectives_agree'] for r in agree)} differ by more than 1e-6 (relative)")
    _finish(info)
    output.write_results(out / "bench.json", "allocopt_bench", machine=info,
                         tables=[output.results_table("allocopt against the cvxpy baselines, seconds end to end",
                                                      rows, ROW_COLUMNS)],
                         data={"config": vars(config), "notes": list(dict.fromkeys(notes)), "rows": rows})
    output.write_csv(out / "bench.csv", rows, ROW_FIELDS)
    written = [out / "bench.json", out / "bench.csv"]
    if not args.no_plot:
        plots = output.plot_times(rows, out)
        written += plots
        if not plots:
            print("no plots: matplotlib is not installed (pip install 'allocopt[plot]')")
    print("wrote " + ", ".join(map(str, written)))
    return 0


TARGET_FIELDS = ["name", "policy", "kind", "n_jobs", "n_gpu_types", "limit_s", "total_s", "verdict", "technique",
                 "vs_plain", "baseline_status", "baseline_total_s", "ratio", "objective_rel_diff", "note"]


def _targets(config: Config, args: argparse.Namespace, info: dict[str, Any], out: Path) -> int:
    with (out / "targets.csv").open("w", newline="") as handle:  # each target as it finishes
        writer = csv.DictWriter(handle, fieldnames=TARGET_FIELDS, extrasaction="ignore")
        writer.writeheader()

        def on_result(r: dict[str, Any]) -> None:
            _describe_target(r)
            print("  ".join(f"{c.header}={c.show(r.get(c.key))}" for c in TARGET_COLUMNS
                            if r.get(c.key) is not None), flush=True)
            writer.writerow(r)
            handle.flush()

        results = run_targets(config, config.policies if args.policies else None, on_result)
    print()
    print(format_table(results, TARGET_COLUMNS))
    print("\nmeasured_s: allocopt.solve end to end on highs with its defaults (technique auto; instance generation "
          "excluded); vs plain: the plain LP's seconds over that; cvxpy/ours: the baseline's end-to-end seconds "
          "over that")
    _finish(info)
    output.write_results(out / "targets.json", "allocopt_bench_targets", machine=info,
                         tables=[output.results_table("Targets: allocopt.solve on highs with its defaults, "
                                                      "seconds end to end", results, TARGET_COLUMNS)],
                         data={"config": vars(config), "targets": results})
    output.write_csv(out / "targets.csv", results, TARGET_FIELDS)
    print(f"wrote {out / 'targets.json'}, {out / 'targets.csv'}")
    return 0


def _describe_target(r: dict[str, Any]) -> None:
    """Add the verdict and the note to a target result."""
    r["verdict"] = {True: "MET", False: "MISSED", None: "NOT MEASURED"}[r["met"]]
    notes = [f"{name}: {t['status']}" for name, t in r["techniques"].items() if t["status"] != "ok"]
    notes += [f"{name} not run: {why}" for name, why in r["exclude"].items()]
    if r.get("techniques_agree") is False:
        notes.append(f"TECHNIQUES' OBJECTIVES DIFFER by {r['techniques_rel_diff']:.1e}")
    if r.get("baseline_status") not in (None, "ok"):
        notes.append(f"cvxpy {r['baseline_status']}")
    r["note"] = "; ".join(notes)


FAMILY_COLUMNS = (
    Column("policy", "policy", left=True), Column("family", "family", left=True), Column("n_jobs", "jobs"),
    Column("technique", "technique", left=True),
    Column("chosen", "chosen", left=True), Column("total_s", "total_s", seconds),
    Column("vs_reference", "vs plain", ratio), Column("vs_cvxpy", "cvxpy/ours", ratio),
    Column("objective", "objective", ".8g"), Column("objective_rel_diff", "rel.diff", ".1e"),
    Column("flag", "flag", left=True), Column("status", "status", left=True))


def _families(config: Config, args: argparse.Namespace, info: dict[str, Any], out: Path) -> int:
    names = _names(None if args.families == "all" else args.families, "--families", FAMILIES, FAMILIES)
    policies = family_policies(config.policies if args.policies else None)
    sizes = config.sizes if args.sizes else FAMILY_SIZES
    path = out / "families.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FAMILY_FIELDS, extrasaction="ignore")
        writer.writeheader()

        def on_row(row: dict[str, Any]) -> None:
            print("  ".join(f"{c.header}={c.show(row.get(c.key))}" for c in FAMILY_COLUMNS
                            if row.get(c.key) is not None), flush=True)

        def on_cell(rows: list[dict[str, Any]]) -> None:
            writer.writerows(rows)
            handle.flush()

        rows = run_families(names, sizes, policies=policies, techniques=config.techniques, seed=config.seed,
                            repeat=config.repeat, baseline=config.baseline, baseline_time_limit_s=config.baseline_time_limit_s,
                            max_seconds=config.max_seconds, anchors=args.families == "all" and not args.policies,
                            on_row=on_row, on_cell=on_cell)
    print()
    print(format_table(rows, FAMILY_COLUMNS, group="policy"))
    slower = [r for r in rows if r.get("flag") and "SLOWER" in r["flag"]]
    print(f"\nvs plain = technique seconds / plain LP seconds (sia: whole MILP; space sharing: job types), same "
          f"run; {len(slower)} row(s) more than 10% slower than it, "
          f"{sum('DIFFERS' in (r.get('flag') or '') for r in rows)} with objectives differing by more than 1e-6")
    _finish(info)
    output.write_results(out / "families.json", "allocopt_bench_families", machine=info,
                         tables=[output.results_table("Techniques by instance family, seconds end to end",
                                                      rows, FAMILY_COLUMNS)], data={"rows": rows})
    print(f"wrote {path}, {out / 'families.json'}")
    return 0


def _finish(info: dict[str, Any]) -> None:
    try:
        info["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return
    print(f"load average at the start {info['load_average']}, at the end {info['load_average_at_end']} "
          "(other processes make times noisy)")


def standalone_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m allocopt.bench`` (the same options as ``allocopt bench``)."""
    parser = argparse.ArgumentParser(prog="python -m allocopt.bench", description=__doc__.split("\n\n")[0])
    _arguments(parser)
    return parser


def run(argv: list[str] | None = None) -> int:
    """``python -m allocopt.bench ARGS``: parse ``argv`` and run; errors are one line on stderr, exit 2."""
    args = standalone_parser().parse_args(argv)
    try:
        return main(args)
    except AllocoptError as err:
        print(f"allocopt bench: error: {err}", file=sys.stderr)
        return 2


__all__ = ["add_parser", "config_from_args", "main", "run", "standalone_parser"]
