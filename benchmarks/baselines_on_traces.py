"""The standard baselines on public traces, one command: average JCT, p99 JCT and makespan per policy.

    python benchmarks/baselines_on_traces.py --out benchmarks/results/baselines_on_traces.json

Workloads (all shipped with allocopt):

- ``sia-philly-1``: Sia's ``philly/workload-1.csv`` (160 jobs derived from the Philly
  trace) on Sia's 64-GPU cluster (24 T4 ``aws`` in servers of 4, 24 ``rtx`` and 16
  A100 ``dgx-ext`` in servers of 8), each job at its requested GPUs and batch size
  with its profiled throughput on each type
  (:func:`~allocopt.mechanism.sia_rounds.rigid_throughputs`);
- ``tiresias-60x30``: Tiresias's ``60_job.csv`` with every duration 30 times longer
  on 16 GPUs in servers of 4 (one step a second on every GPU).

Policies: the order-based baselines (``order:fifo``, ``las``, ``tiresias``,
``tiresias_gittins``, ``srtf``, ``sjf``) and allocopt's ``max_min_fairness_perf`` and
``finish_time_fairness_perf`` (Gavel's), 360 s rounds. ``--policies`` and
``--workloads`` select. Simulated times do not depend on the machine's load;
``wall_s`` does.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from allocopt import simulate  # noqa: E402
from allocopt.bench.output import Column, results_table, write_results  # noqa: E402
from allocopt.cluster import Cluster  # noqa: E402
from allocopt.mechanism.traces import read_tiresias_trace  # noqa: E402
from allocopt.throughput.profiles import shipped_profiles_dir  # noqa: E402

DATA = ROOT / "allocopt" / "data"
POLICIES = ["order:fifo", "las", "tiresias", "tiresias_gittins", "srtf", "sjf", "max_min_fairness_perf",
            "finish_time_fairness_perf"]


def tiresias_x30(work: Path) -> Path:
    with open(DATA / "tiresias" / "60_job.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    path = work / "60_job_x30.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows({**r, "duration": int(r["duration"]) * 30} for r in rows)
    return path


def run(workload: str, policy: str, work: Path) -> dict:
    if workload == "sia-philly-1":
        cluster = Cluster({"aws": 24, "rtx": 24, "dgx-ext": 16}, gpus_per_node={"aws": 4, "rtx": 8, "dgx-ext": 8})
        result = simulate(str(DATA / "sia_workloads" / "philly" / "workload-1.csv"), cluster, policy,
                          profiles=shipped_profiles_dir(), ftf=False)
    else:
        jobs = read_tiresias_trace(tiresias_x30(work))
        result = simulate(jobs.workload, Cluster({"gpu": 16}, gpus_per_node=4), policy,
                          throughputs=jobs.throughputs, ftf=False)
    keys = ("average_jct_s", "p99_jct_s", "makespan_s", "utilization", "restarts_per_job", "num_rounds", "wall_s")
    return {k: result.metrics[k] for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["sia-philly-1", "tiresias-60x30"],
                        choices=["sia-philly-1", "tiresias-60x30"])
    parser.add_argument("--policies", nargs="+", default=POLICIES)
    parser.add_argument("--out", type=Path, help="write the results here (JSON)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="baselines-"))
    results: dict = {"results": {}}
    print(f"{'workload':>15} {'policy':>26} {'avg JCT h':>10} {'p99 JCT h':>10} {'makespan h':>11} {'restarts':>9}")
    for workload in args.workloads:
        for policy in args.policies:
            got = run(workload, policy, work)
            results["results"][f"{workload}/{policy}"] = got
            print(f"{workload:>15} {policy:>26} {got['average_jct_s'] / 3600:>10.2f} {got['p99_jct_s'] / 3600:>10.2f} "
                  f"{got['makespan_s'] / 3600:>11.2f} {got['restarts_per_job']:>9.2f}", flush=True)
    if args.out:
        rows = [{"workload": key.split("/")[0], "policy": key.split("/", 1)[1], **got}
                for key, got in results["results"].items()]
        hours = lambda v: f"{v / 3600:.2f}"  # noqa: E731
        columns = [Column("workload", "workload", left=True), Column("policy", "policy", left=True),
                   Column("average_jct_s", "average JCT (h)", hours), Column("p99_jct_s", "p99 JCT (h)", hours),
                   Column("makespan_s", "makespan (h)", hours), Column("restarts_per_job", "restarts/job", ".2f")]
        write_results(args.out, "baselines_on_traces", data=results,
                      tables=[results_table("order-based baselines on public workloads", rows, columns)])


if __name__ == "__main__":
    main()
