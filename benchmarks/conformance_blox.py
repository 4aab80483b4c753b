"""Conformance of allocopt's ``las``, ``srtf``, ``order:fifo`` and ``optimus`` with Blox's own simulator on a Philly log.

Blox (github.com/msr-fiddle/blox) stays outside this repository: point ``--blox-dir``
at a checkout whose ``blox/deployment/grpc_stubs`` were generated (``make grpc`` in
``blox/deployment``) and ``--blox-python`` at a Python with Blox's dependencies
(grpcio and grpcio-tools < 1.63, protobuf < 4.26, pandas < 2, numpy < 2, matplotlib)::

    python benchmarks/conformance_blox.py --blox-dir /work/ref/blox \\
        --blox-python /work/ref/blox-venv/bin/python --track 60 90 \\
        --out benchmarks/results/conformance_blox.json

For each scheduler, Blox's simulator (``simulator_simple.py --sim-type
trace-synthetic``: Poisson arrivals at ``--load`` jobs per hour, seed 1, job
durations from the Philly log, one GPU each, 300 s rounds, ``--servers`` servers
of 4 GPUs: 28 by default, 112 GPUs, so that jobs queue at load 6; a wrapper sets
it and calls Blox's own ``launch_server`` in place of Blox's default of 32) serves jobs to Blox's ``las_scheduler.py --simulate`` with its ``schedulers.Las``
replaced by ``schedulers.Srtf``, ``schedulers.Fifo`` or ``schedulers.Optimus`` for those runs (Blox's code
is not modified; a two-line wrapper swaps the class before running the script).
Blox reports the jobs ``--track`` A..B. The same job sequence is then regenerated
with Blox's own workload code (its ``SimulatorRunner`` and ``Workload``, seed 1,
no cached pickle, as in the run) up to the last completion, checked against
Blox's per-job log (arrival and duration of every tracked job), and simulated by
:func:`allocopt.simulate` with the matching policy,
``OrderOptions(round_seconds=300, event_rounds=False)`` on the same GPUs (fixed rounds on a grid,
as Blox's), one step a second and ``ceil(duration)`` steps. Blox records a
completion at the end of the round in which the job completes; allocopt's finish
time is rounded up to that round end before comparing. SRTF and Optimus get each job's
exact (fractional) duration as their estimate, as Blox's rank by it. Blox's Optimus
hands the GPUs left after every job's demand out round-robin (``job_gpu_demand``),
but its placement places ``num_GPUs`` and its simulator's progress ignores them
(their speed-up table is commented out in ``grpc_client_rm.py``), so allocopt's
rigid ``optimus`` order policy (SRTF's order, each job at its GPUs) is its counterpart.

``--trace`` defaults to allocopt's Philly sample built to the schema
(``allocopt/data/traces/philly_cluster_job_log.json``); pass Philly's real
``cluster_job_log`` for the real trace. Writes per scheduler the average JCT of
the tracked jobs of both, their ratio, the last completion of a tracked job in each
(``makespan``, seconds from the start) and the jobs whose JCT differs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from allocopt import simulate  # noqa: E402
from allocopt.bench.output import Column, results_table, write_results  # noqa: E402
from allocopt.cluster import Cluster  # noqa: E402
from allocopt.mechanism.order_planner import OrderOptions, OrderPlanner  # noqa: E402
from allocopt.mechanism.order_policies import Fifo, Las, Optimus, Srtf  # noqa: E402
from allocopt.mechanism.state import SimulationState  # noqa: E402
from allocopt.mechanism.traces import unit_throughputs  # noqa: E402
from allocopt.mechanism.workload import Workload  # noqa: E402

ROUND_S = 300
SWAP = '''import os, runpy, sys
sys.argv = ["las_scheduler.py", *sys.argv[1:]]
sys.path.insert(0, os.getcwd())
import schedulers
schedulers.Las = schedulers.{cls}
runpy.run_path("las_scheduler.py", run_name="__main__")
'''
SIMULATOR = '''import argparse, os, sys
servers = int(sys.argv.pop(1))
sys.path.insert(0, os.getcwd())
import simulator_simple as ss
init = ss.SimulatorRunner.__init__
def with_servers(self, *args, **kwargs):
    kwargs.setdefault("number_of_machines", servers)
    init(self, *args, **kwargs)
ss.SimulatorRunner.__init__ = with_servers
server = ss.launch_server(ss.parse_args(argparse.ArgumentParser()))
server.wait_for_termination()
'''
REGENERATE = '''import json, os, sys
log, load, horizon, out = sys.argv[1:5]
sys.argv = ["regenerate"]
sys.path.insert(0, os.getcwd())
import simulator_simple as ss
runner = ss.SimulatorRunner(log, [float(load)], (0, 1), ["Las"], ["Place"], ["AcceptAll"], exp_prefix="regen")
runner.workload = runner._generate_workload(runner.simulator_config.pop(0))
jobs, prev = [], 0
while prev <= float(horizon):
    d = runner._clean_sim_job(runner.workload.generate_next_job(prev).__dict__)
    jobs.append({"job_id": d["job_id"], "arrival_s": d["job_arrival_time"], "total_iteration": d["job_total_iteration"],
                 "iteration_time": d["job_iteration_time"], "gpus": d["job_gpu_demand"]})
    prev = d["job_arrival_time"]
json.dump(jobs, open(out, "w"))
'''


def clear_pickles(blox: Path) -> None:
    for cached in blox.glob("philly_jobs_*.pickle"):  # Blox caches the parsed log; a cold start draws as the run
        cached.unlink()


def run_blox(blox: Path, python: str, trace: Path, load: float, track: tuple[int, int], cls: str, prefix: str,
             work: Path, servers: int) -> dict:
    clear_pickles(blox)
    env = {"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python", "PATH": "/usr/bin:/bin"}
    simulator = work / "simulator.py"
    simulator.write_text(SIMULATOR)
    sim = subprocess.Popen([python, str(simulator), str(servers), "--cluster-job-log", str(trace), "--sim-type",
                            "trace-synthetic", "--jobs-per-hour", str(int(load)), "--exp-prefix", prefix,
                            "--start-job-track", str(track[0]), "--end-job-track", str(track[1])],
                           cwd=blox, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(5)
        swap = work / f"run_{cls}.py"
        swap.write_text(SWAP.format(cls=cls))
        done = subprocess.run([python, str(swap), "--simulate", "--load", str(int(load)), "--exp-prefix", prefix],
                              cwd=blox, env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"Blox's scheduler failed:\n{done.stderr[-2000:]}")
    finally:
        sim.terminate()
        sim.wait(timeout=30)
    stem = f"{prefix}_{track[0]}_{track[1]}_Las_load_{float(load)}"
    return {"job_stats": json.loads((blox / f"{stem}_job_stats.json").read_text()),
            "run_time_stats": json.loads((blox / f"{stem}_run_time_stats.json").read_text())}


def regenerate(blox: Path, python: str, trace: Path, load: float, horizon: float, work: Path) -> list[dict]:
    clear_pickles(blox)
    script, out = work / "regenerate.py", work / "jobs.json"
    script.write_text(REGENERATE)
    env = {"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python", "PATH": "/usr/bin:/bin"}
    subprocess.run([python, str(script), str(trace), str(load), str(horizon), str(out)], cwd=blox, env=env,
                   check=True, capture_output=True, timeout=600)
    return json.loads(out.read_text())


def run_allocopt(jobs: list[dict], cls: str, servers: int) -> np.ndarray:
    n = len(jobs)
    seconds = np.array([j["total_iteration"] * j["iteration_time"] for j in jobs])
    wl = Workload(("philly",) * n, np.array([j["gpus"] for j in jobs]), np.ceil(seconds).astype(np.int64),
                  np.array([float(j["arrival_s"]) for j in jobs]), np.ones(n), "blox")
    cluster = Cluster({"gpu": 4 * servers}, gpus_per_node=4)
    policy = {"Las": Las(), "Srtf": Srtf(estimates_s=seconds), "Fifo": Fifo(), "Optimus": Optimus(estimates_s=seconds)}[cls]
    planner = OrderPlanner(SimulationState(wl, cluster, np.ones((n, 1))), policy,
                           OrderOptions(round_seconds=ROUND_S, event_rounds=False))
    result = simulate(wl, cluster, policy, throughputs=unit_throughputs(wl, ["gpu"]), planner=planner, ftf=False,
                      round_seconds=ROUND_S)
    return np.ceil(result.jobs["finish_s"] / ROUND_S - 1e-9) * ROUND_S  # Blox logs the end of the round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blox-dir", type=Path, required=True)
    parser.add_argument("--blox-python", required=True)
    parser.add_argument("--trace", type=Path, default=ROOT / "allocopt" / "data" / "traces" /
                        "philly_cluster_job_log.json")
    parser.add_argument("--load", type=float, default=6.0, help="jobs per hour")
    parser.add_argument("--track", type=int, nargs=2, default=(0, 20), metavar=("A", "B"))
    parser.add_argument("--servers", type=int, default=28,
                        help="servers of 4 GPUs in both simulators (Blox's default: 32)")
    parser.add_argument("--schedulers", nargs="+", default=["Las", "Srtf", "Fifo", "Optimus"],
                        choices=["Las", "Srtf", "Fifo", "Optimus"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="blox-conformance-"))
    trace = args.trace.resolve()
    results: dict = {"config": {"trace": args.trace.name, "load_jobs_per_hour": args.load, "track": list(args.track),
                                "servers": args.servers, "gpus_per_server": 4, "round_s": ROUND_S}, "cases": {}}
    for cls in args.schedulers:
        started = time.perf_counter()
        blox = run_blox(args.blox_dir, args.blox_python, trace, args.load, tuple(args.track), cls,
                        f"allocopt_{cls}", work, args.servers)
        blox_s = time.perf_counter() - started
        stats = blox["job_stats"]
        horizon = max(end for _, end in stats.values())
        jobs = regenerate(args.blox_dir, args.blox_python, trace, args.load, horizon, work)
        mismatched = [k for k, v in blox["run_time_stats"].items()
                      if v["job_arrival_time"] != jobs[int(k)]["arrival_s"]
                      or v["job_total_iteration"] != jobs[int(k)]["total_iteration"]]
        if mismatched:
            raise RuntimeError(f"the regenerated jobs differ from Blox's log for jobs {mismatched[:5]}")
        finish = run_allocopt(jobs, cls, args.servers)
        ids = sorted(int(k) for k in stats)
        theirs = np.array([stats[str(k)][1] - stats[str(k)][0] for k in ids], dtype=np.float64)
        ours = np.array([finish[k] - jobs[k]["arrival_s"] for k in ids])
        ends = (float(max(stats[str(k)][1] for k in ids)), float(max(finish[k] for k in ids)))
        differ = {str(k): {"blox_jct_s": float(t), "allocopt_jct_s": float(o)}
                  for k, t, o in zip(ids, theirs, ours) if abs(t - o) > 1e-6}
        case = {"blox_average_jct_s": float(theirs.mean()), "allocopt_average_jct_s": float(ours.mean()),
                "jct_ratio": float(ours.mean() / theirs.mean()), "blox_makespan_s": ends[0],
                "allocopt_makespan_s": ends[1], "makespan_ratio": ends[1] / ends[0], "tracked_jobs": len(ids),
                "identical_jobs": len(ids) - len(differ), "jobs_simulated": len(jobs), "jobs_that_differ": differ,
                "blox_wall_s": blox_s}
        results["cases"][cls] = case
        print(f"{cls:>5}  average JCT allocopt {case['allocopt_average_jct_s']:>10.1f} s  Blox "
              f"{case['blox_average_jct_s']:>10.1f} s  ratio {case['jct_ratio']:.4f}  makespan ratio "
              f"{case['makespan_ratio']:.4f}  identical jobs "
              f"{case['identical_jobs']}/{len(ids)}  ({len(jobs)} jobs simulated)", flush=True)
    if args.out:
        rows = [{"scheduler": cls, "ours": c["allocopt_average_jct_s"], "theirs": c["blox_average_jct_s"],
                 "ours_end": c["allocopt_makespan_s"], "theirs_end": c["blox_makespan_s"],
                 "identical": f"{c['identical_jobs']} of {c['tracked_jobs']}"} for cls, c in results["cases"].items()]
        columns = [Column("scheduler", "scheduler", left=True), Column("ours", "allocopt average JCT (s)", ",.1f"),
                   Column("theirs", "Blox average JCT (s)", ",.1f"),
                   Column("ours_end", "allocopt makespan (s)", ",.1f"), Column("theirs_end", "Blox makespan (s)", ",.1f"),
                   Column("identical", "jobs identical")]
        write_results(args.out, "conformance_blox", data=results,
                      tables=[results_table("allocopt against Blox's simulator", rows, columns)])


if __name__ == "__main__":
    main()
