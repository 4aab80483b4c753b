"""A whole sweep's wall time against the sum of its runs' times (parallel efficiency), and Gavel's own
simulator on points of the same sweep, measured beside it.

The default spec is Gavel's continuous-arrival sweep (``examples/sweeps/gavel_continuous.yaml``:
``run_sweep_continuous.py -s 4000 -e 5000 -p max_min_fairness max_min_fairness_perf --seeds 0 1 2
-c 36:36:36 -a 0.0 -b 1.0 -n 5``, 2 policies x 4 rates x 3 seeds). The sweep runs into a fresh
directory with ``--workers N``; each run's own time is ``wall_s`` of its row (``simulate``'s wall
clock inside its worker), so parallel efficiency is ``sum(wall_s) / (N * sweep wall time)``. The
target is the whole sweep in <= 15 minutes on a 2-core machine.

With ``--gavel-dir`` (a checkout of github.com/stanford-futuredata/gavel with its simulator's
dependencies in ``--gavel-python``'s environment; ECOS), Gavel's
``scripts/drivers/simulate_scheduler_with_generated_jobs.py`` runs each of ``--gavel-points``
(``POLICY:RATE:SEED``) with the sweep's cluster, window and 360 s rounds. Gavel draws its own jobs, so
its average JCT is compared with the mean and 95% interval over allocopt's seeds at that rate.

Run: ``python benchmarks/bench_sweep.py --workers 2 --json sweep.json [--gavel-dir DIR --gavel-python
PY --gavel-points max_min_fairness_perf:1.0:0]``. The results file (``--results``, or ``--json``; default
``benchmarks/results/bench_sweep.json``) has the sweep's timing, each run's time and average JCT, the
average JCT per policy and rate, and Gavel's points.
"""

from __future__ import annotations

import argparse
import logging
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from allocopt.bench.machine import format_machine, machine_info
from allocopt.bench.output import Column, add_results_option, results_table, seconds, write_results
from allocopt.experiments import load_run, load_spec, run_sweep, summarize

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = ROOT / "examples" / "sweeps" / "gavel_continuous.yaml"


def run_gavel(gavel_dir: Path, python: str, policy: str, rate: float, seed: int, cluster: dict[str, int],
              window: tuple[int, int], timeout_s: float) -> dict:
    """Gavel's generated-jobs driver on one point: its average JCT (seconds) and wall time."""
    scheduler = gavel_dir / "scheduler"
    command = [python, "scripts/drivers/simulate_scheduler_with_generated_jobs.py",
               "-c", ":".join(str(cluster.get(t, 0)) for t in ("v100", "p100", "k80")), "-p", policy,
               "--seed", str(seed), "-l", repr(3600.0 / rate), "-s", str(window[0]), "-e", str(window[1]),
               "--solver", "ECOS", "--throughputs_file", "simulation_throughputs.json", "-v"]
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=scheduler, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout_s:.0f} s", "command": " ".join(command)}
    wall = time.perf_counter() - started
    match = re.search(rb"Results: average JCT=([0-9.]+), utilization=([0-9.]+)", proc.stderr)
    if proc.returncode != 0 or match is None:
        return {"error": (proc.stderr.strip().splitlines() or [b"no output"])[-1].decode(errors="replace")[:200]}
    return {"average_jct_s": float(match.group(1)), "utilization": float(match.group(2)), "wall_s": wall,
            "command": " ".join(command)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=DEFAULT_SPEC)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--output", type=Path, help="the sweep's directory (default: a fresh temporary one)")
    add_results_option(parser, "bench_sweep", ROOT / "benchmarks" / "results", ("--results", "--json"))
    parser.add_argument("--gavel-dir", type=Path)
    parser.add_argument("--gavel-python", default=sys.executable)
    parser.add_argument("--gavel-points", default="max_min_fairness_perf:1.0:0")
    parser.add_argument("--gavel-timeout-s", type=float, default=3600)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    info = machine_info()
    print(format_machine(info))
    spec = load_spec(args.spec)
    output = args.output or Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    spec = replace(spec, output=str(output.resolve()), workers=args.workers)
    started = time.perf_counter()
    result = run_sweep(spec)
    wall = time.perf_counter() - started
    if result.skipped:
        print(f"warning: {result.skipped} points were already in {output}: give a fresh --output")
    run_s = float(sum(r["wall_s"] for r in result.rows))
    covered = 0
    for row in result.rows:  # jobs still arrive when the last measured job finishes (a steady state)
        arrays = load_run(output, row["key"])
        a, b = arrays["window"]
        covered += bool(arrays["job_finish_s"][a:b].max() <= arrays["job_arrival_s"][-1])
    report = {"spec": str(args.spec), "workers": args.workers, "points": len(result.rows),
              "failed": len(result.failed), "sweep_wall_s": wall, "sum_of_run_s": run_s, "speedup": run_s / wall,
              "parallel_efficiency": run_s / (args.workers * wall), "target_wall_s": 900.0,
              "window_covered_by_arrivals": f"{covered} of {len(result.rows)}",
              "runs": [{name: row[name] for name in ("key", "policy_label", "jobs_per_hour", "seed", "wall_s",
                                                     "average_jct_s", "makespan_s", "num_rounds")}
                       for row in result.rows]}
    print(f"sweep: {len(result.rows)} points ({len(result.failed)} failed) in {wall:.1f} s with {args.workers} "
          f"workers; runs' own time {run_s:.1f} s; speedup {run_s / wall:.2f}, parallel efficiency "
          f"{run_s / (args.workers * wall):.2f}; target {'MET' if wall <= 900 else 'MISSED'} (<= 900 s); "
          f"arrivals cover the window in {covered} of {len(result.rows)} runs")
    summary = {(s["policy_label"], s["jobs_per_hour"]): s for s in summarize(result.rows, ("average_jct_s",))}
    report["average_jct_h"] = [{"policy": p, "jobs_per_hour": r, "n": s["n"], "mean": s["mean"] / 3600,
                                "ci95": None if s["ci95_low"] is None else [s["ci95_low"] / 3600,
                                                                           s["ci95_high"] / 3600]}
                               for (p, r), s in summary.items()]
    for entry in report["average_jct_h"]:
        ci = "" if entry["ci95"] is None else f" (95% CI {entry['ci95'][0]:.2f}..{entry['ci95'][1]:.2f})"
        print(f"  allocopt {entry['policy']:24s} {entry['jobs_per_hour']:5.2f} jobs/h: average JCT "
              f"{entry['mean']:.2f} h{ci}, n={entry['n']}")
    if args.gavel_dir is not None:
        cluster = dict(item.split("=") for item in result.rows[0]["cluster"].split(","))
        window = tuple(spec.window) if spec.window else (0, 5000)
        report["gavel"] = []
        for item in args.gavel_points.split(","):
            policy, rate, seed = item.split(":")
            gavel = run_gavel(args.gavel_dir, args.gavel_python, policy, float(rate), int(seed),
                              {k: int(v) for k, v in cluster.items()}, window, args.gavel_timeout_s)
            ours = [r for r in result.rows if r["policy_label"] == policy and r["jobs_per_hour"] == float(rate)]
            same_seed = [r for r in ours if r["seed"] == int(seed)]
            entry = {"policy": policy, "jobs_per_hour": float(rate), "seed": int(seed), "gavel": gavel,
                     "allocopt_average_jct_s": [r["average_jct_s"] for r in ours],
                     "allocopt_run_s": same_seed[0]["wall_s"] if same_seed else None}
            report["gavel"].append(entry)
            if "error" in gavel:
                print(f"  Gavel {policy} {rate} jobs/h seed {seed}: {gavel['error']}")
                continue
            values = np.array(entry["allocopt_average_jct_s"]) / 3600
            print(f"  Gavel    {policy:24s} {float(rate):5.2f} jobs/h seed {seed}: average JCT "
                  f"{gavel['average_jct_s'] / 3600:.2f} h in {gavel['wall_s']:.1f} s (allocopt: {values.mean():.2f} h "
                  f"over {values.size} seeds, this seed's run {entry['allocopt_run_s']:.1f} s)")
    if args.results:
        write_results(args.results, "bench_sweep", machine=info, data=report, tables=tables(report))
    return 0


def tables(report: dict) -> list[dict]:
    """The results file's tables: the sweep's timing, average JCT per policy and rate, and Gavel's points."""
    out = [results_table(f"The sweep ({report['points']} runs, {report['workers']} workers): wall time against the "
                         "sum of its runs' own times", [report],
                         [Column("points", "runs"), Column("failed", "failed"),
                          Column("sweep_wall_s", "sweep wall s", seconds),
                          Column("sum_of_run_s", "sum of runs s", seconds), Column("speedup", "speedup", ".2f"),
                          Column("parallel_efficiency", "parallel efficiency", ".2f"),
                          Column("window_covered_by_arrivals", "arrivals cover the window")]),
           results_table("allocopt's average JCT of the measured jobs (mean and 95% interval over seeds)",
                         [{**e, "low": e["ci95"][0] if e["ci95"] else None,
                           "high": e["ci95"][1] if e["ci95"] else None} for e in report["average_jct_h"]],
                         [Column("policy", "policy", left=True), Column("jobs_per_hour", "jobs/h", ".2f"),
                          Column("n", "seeds"), Column("mean", "average JCT h", ".2f"),
                          Column("low", "95% CI low h", ".2f"), Column("high", "95% CI high h", ".2f")])]
    if report.get("gavel"):
        rows = [{"policy": e["policy"], "jobs_per_hour": e["jobs_per_hour"], "seed": e["seed"],
                 "gavel_h": e["gavel"].get("average_jct_s", float("nan")) / 3600,
                 "gavel_wall_s": e["gavel"].get("wall_s"),
                 "allocopt_h": float(np.mean(e["allocopt_average_jct_s"])) / 3600 if e["allocopt_average_jct_s"]
                 else None, "allocopt_n": len(e["allocopt_average_jct_s"]), "allocopt_run_s": e["allocopt_run_s"],
                 "note": e["gavel"].get("error", "")} for e in report["gavel"]]
        out.append(results_table("Gavel's own simulator on points of the sweep (its own jobs) against allocopt's "
                                 "mean over seeds", rows,
                                 [Column("policy", "policy", left=True), Column("jobs_per_hour", "jobs/h", ".2f"),
                                  Column("seed", "Gavel seed"), Column("gavel_h", "Gavel average JCT h", ".2f"),
                                  Column("gavel_wall_s", "Gavel run s", seconds),
                                  Column("allocopt_h", "allocopt average JCT h", ".2f"),
                                  Column("allocopt_n", "allocopt seeds"),
                                  Column("allocopt_run_s", "allocopt run s (same seed)", seconds),
                                  Column("note", "", left=True)]))
    return out


if __name__ == "__main__":
    sys.exit(main())
