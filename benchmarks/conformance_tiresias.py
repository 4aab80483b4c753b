"""Conformance of allocopt's ``tiresias`` and ``tiresias_gittins`` order policies with Tiresias's own simulator.

Tiresias's simulator (github.com/SymbioticLab/Tiresias, ``simulator/``, Python 2.7 with
numpy) stays outside this repository: point ``--tiresias-dir`` at its ``simulator``
folder and ``--python2`` at a Python 2.7 that imports numpy::

    python benchmarks/conformance_tiresias.py --tiresias-dir /work/ref/tiresias/simulator \\
        --python2 "env PYENV_VERSION=2.7.18 PYTHONPATH=/work/ref/py2libs python2.7" \\
        --out benchmarks/results/conformance_tiresias.json

For each case, Tiresias's ``run_sim.py --scheme=count`` runs a job file on a
cluster spec with one of its schedules, and :func:`allocopt.simulate` runs the
same jobs (:func:`~allocopt.mechanism.traces.read_tiresias_trace`: one step per
second of ``duration``, every GPU alike) on a cluster of the spec's GPU count
(``count`` placement only counts GPUs) with the matching policy and Tiresias's
parameters (queues at 3250 and 7200 GPU-seconds, Gittins index over
``yarn-gput1000.csv`` with delta 3250, no starvation promotion as in ``dlas-gpu``;
``starvation_factor`` for ``dlas-gpu-N``), rounds ending at events
(``round_seconds`` 1e9: the planner's rounds end at arrivals, completions and queue
crossings, as Tiresias's events). Cases:

- ``60_job.csv`` (Tiresias's 60 jobs) on ``cluster_spec.csv`` (64 GPUs): the jobs'
  GPU-times stay below the first threshold, so this checks arrivals, the walk and
  completions;
- the same jobs with every ``duration`` multiplied by ``--scale`` (30 by default, a
  derived file written next to the results) on the same 64 GPUs and on 16 GPUs
  (``n4g4``, derived): jobs cross both thresholds and queue, which exercises demotion,
  preemption and, for Gittins, the index.

allocopt runs twice per case: with exact queue crossings (rounds end when a running
job's GPU-time reaches its threshold) and with ``faithful_events=True`` (crossings
timed as Tiresias's simulator times them, see :class:`~allocopt.mechanism.
order_policies.Tiresias`). Per case it writes average JCT and makespan of each,
their ratios to Tiresias's, and per job start, end and preemptions of both where
they differ. Exit status 0 always; the JSON says which cases are within
``--tolerance`` (5%).
"""

from __future__ import annotations

import argparse
import csv
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from allocopt import simulate  # noqa: E402
from allocopt.bench.output import Column, results_table, write_results  # noqa: E402
from allocopt.cluster import Cluster  # noqa: E402
from allocopt.mechanism.order_planner import OrderOptions, OrderPlanner  # noqa: E402
from allocopt.mechanism.order_policies import Tiresias, tiresias_service_sample  # noqa: E402
from allocopt.mechanism.state import SimulationState  # noqa: E402
from allocopt.mechanism.traces import read_tiresias_trace  # noqa: E402

DATA = ROOT / "allocopt" / "data" / "tiresias"
SCHEDULES = {  # Tiresias schedule -> allocopt policy options
    "dlas-gpu": {"gittins": False},
    "dlas-gpu-gittins": {"gittins": True},
    "dlas-gpu-2": {"gittins": False, "starvation_factor": 2.0},
}


def run_tiresias(sim_dir: Path, python2: str, trace: Path, spec: Path, schedule: str, log: Path) -> list[dict]:
    """Tiresias's per-job log (job.csv) of one run."""
    cmd = [*shlex.split(python2), "run_sim.py", f"--cluster_spec={spec}", "--scheme=count",
           f"--trace_file={trace}", f"--schedule={schedule}", f"--log_path={log}"]
    done = subprocess.run(cmd, cwd=sim_dir, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"Tiresias's simulator failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
    with open(log / "job.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def run_allocopt(trace: Path, gpus: int, gpus_per_node: int, options: dict, faithful: bool) -> dict:
    converted = read_tiresias_trace(trace)
    wl = converted.workload
    cluster = Cluster({"gpu": gpus}, gpus_per_node={"gpu": gpus_per_node})
    T = wl.throughputs(converted.throughputs, cluster.gpu_types)
    policy = Tiresias(service_sample=tiresias_service_sample(), faithful_events=faithful, **options)
    planner = OrderPlanner(SimulationState(wl, cluster, T), policy, OrderOptions(round_seconds=1e9))
    result = simulate(wl, cluster, policy, throughputs=converted.throughputs, planner=planner, ftf=False,
                      round_seconds=1e9)
    ids = list(converted.job_ids)
    return {"jobs": {ids[k]: {"submit_s": float(wl.arrival_s[k]), "start_s": float(planner.started_s[k]),
                              "end_s": float(result.jobs["finish_s"][k]),
                              "preemptions": int(planner.preemptions[k])} for k in range(wl.num_jobs)},
            "average_jct_s": result.metrics["average_jct_s"], "makespan_s": result.metrics["makespan_s"],
            "num_rounds": result.metrics["num_rounds"], "wall_s": result.metrics["wall_s"]}


def spec_gpus(spec: Path) -> tuple[int, int]:
    with open(spec, newline="") as fh:
        row = next(csv.DictReader(fh))
    per = int(row["num_gpu_p_node"])
    return int(row["num_switch"]) * int(row["num_node_p_switch"]) * per, per


def tiresias_jobs(theirs: list[dict]) -> tuple[dict, dict]:
    """Per job (submit, start, end, preemptions) and the averages of Tiresias's job.csv."""
    jobs = {}
    for row in theirs:
        jobs[row["job_id"]] = {"submit_s": float(row["submit_time"]), "start_s": float(row["start_time"]),
                               "end_s": float(row["end_time"]), "preemptions": int(row["preempt"])}
    jct = np.array([j["end_s"] - j["submit_s"] for j in jobs.values()])
    return jobs, {"average_jct_s": float(jct.mean()), "makespan_s": max(j["end_s"] for j in jobs.values())}


def compare(ours: dict, jobs: dict, base: dict, tolerance: float) -> dict:
    out = {**{k: ours[k] for k in ("average_jct_s", "makespan_s", "num_rounds")},
           "jct_ratio": ours["average_jct_s"] / base["average_jct_s"],
           "makespan_ratio": ours["makespan_s"] / base["makespan_s"]}
    out["within_tolerance"] = bool(abs(out["jct_ratio"] - 1) <= tolerance and abs(out["makespan_ratio"] - 1)
                                   <= tolerance)
    differ = {}
    for job_id, t in jobs.items():
        a = ours["jobs"][job_id]
        if abs(a["end_s"] - t["end_s"]) > 0.5 or abs(a["start_s"] - t["start_s"]) > 0.5:
            differ[job_id] = {"tiresias": t, "allocopt": a}
    out["jobs_that_differ"] = len(differ)
    out["identical_jobs"] = len(jobs) - len(differ)
    out["timelines_that_differ"] = differ
    return out


def scaled_trace(source: Path, factor: float, path: Path) -> Path:
    with open(source, newline="") as fh:
        rows = list(csv.DictReader(fh))
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "duration": round(float(row["duration"]) * factor)})
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiresias-dir", type=Path, required=True, help="Tiresias's simulator/ folder")
    parser.add_argument("--python2", default="python2.7", help="command of a Python 2.7 with numpy")
    parser.add_argument("--scale", type=float, default=30.0, help="duration factor of the derived job file")
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=list(SCHEDULES))
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--out", type=Path, help="write the results here (JSON)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tiresias-conformance-"))
    trace = DATA / "60_job.csv"
    scaled = scaled_trace(trace, args.scale, work / f"60_job_x{args.scale:g}.csv")
    n4g4 = work / "n4g4.csv"
    n4g4.write_text("num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n1,4,4,128,254\n")
    cases = [("60_job", trace, DATA / "cluster_spec.csv"),
             (f"60_job_x{args.scale:g}", scaled, DATA / "cluster_spec.csv"),
             (f"60_job_x{args.scale:g}_n4g4", scaled, n4g4)]
    results: dict = {"tolerance": args.tolerance, "cases": {}}
    for label, job_file, spec in cases:
        gpus, per = spec_gpus(spec)
        for schedule in args.schedules:
            theirs = run_tiresias(args.tiresias_dir, args.python2, job_file.resolve(), spec.resolve(), schedule,
                                  work / f"{label}-{schedule}")
            jobs, base = tiresias_jobs(theirs)
            case = {"trace": job_file.name, "cluster_gpus": gpus, "schedule": schedule, "tiresias": base}
            for variant, faithful in (("allocopt", False), ("allocopt_faithful_events", True)):
                ours = run_allocopt(job_file, gpus, per, SCHEDULES[schedule], faithful)
                case[variant] = compare(ours, jobs, base, args.tolerance)
                got = case[variant]
                print(f"{label:>22} {schedule:>17} {variant:>24}  JCT {got['average_jct_s']:>9.1f} vs "
                      f"{base['average_jct_s']:>9.1f} ({got['jct_ratio']:.4f})  makespan {got['makespan_s']:>7.0f} "
                      f"vs {base['makespan_s']:>7.0f} ({got['makespan_ratio']:.4f})  identical jobs "
                      f"{got['identical_jobs']}/{len(jobs)}", flush=True)
            results["cases"][f"{label}/{schedule}"] = case
    if args.out:
        rows = [{"case": name, "variant": variant, "jct": case[variant]["jct_ratio"],
                 "makespan": case[variant]["makespan_ratio"],
                 "identical": f"{case[variant]['identical_jobs']} of {case[variant]['identical_jobs'] + case[variant]['jobs_that_differ']}"}
                for name, case in results["cases"].items() for variant in ("allocopt", "allocopt_faithful_events")]
        columns = [Column("case", "case", left=True), Column("variant", "allocopt", left=True),
                   Column("jct", "average JCT / Tiresias's", ".4f"), Column("makespan", "makespan / Tiresias's", ".4f"),
                   Column("identical", "jobs identical")]
        write_results(args.out, "conformance_tiresias", data=results,
                      tables=[results_table("allocopt against Tiresias's simulator", rows, columns)])


if __name__ == "__main__":
    main()
