"""GPU check: several PyTorch jobs time-share this machine's NVIDIA GPUs over several rounds.

Runs ``2 * n_gpus + 1`` (at least 3) copies of ``examples/pytorch_mlp.py`` under
``allocopt.runtime.loop.Scheduler`` with the local executor and max-min
fairness, so every job is preempted and resumed from its checkpoint at least
once, then prints per-job steps, measured throughput and restarts, and the
executor's launch-to-first-step and stop (preempt) latencies and its fraction
of extended leases. Skips itself (exit 0) without NVIDIA GPUs or without torch.
Two stand-alone runs of the slowest job on the first GPU measure its steps per
second and its start-up (launch to first step). By default a round lasts four
start-ups (at least 15 s), and each job has two rounds of work after its
start-ups, so that every job is preempted on any GPU, however fast. Jobs
checkpoint every quarter of their steps and when stopped.

    python benchmarks/gpu_time_sharing.py [--round-seconds S] [--steps N] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from allocopt.bench.output import (
    Column,
    add_results_option,
    results_table,
    write_results,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-seconds", type=float, help="default: four job start-ups, at least 15 s")
    parser.add_argument("--steps", type=int, help="total steps of each job (default: sized from a stand-alone run)")
    parser.add_argument("--work-dir", help="state and job files (default: a temporary directory)")
    add_results_option(parser, "gpu_time_sharing", Path(__file__).parent / "results")
    args = parser.parse_args()

    from allocopt.runtime.devices import discover_nvidia_smi, discover_nvml
    gpus = discover_nvml() or discover_nvidia_smi()
    if not gpus:
        print("skipped: no NVIDIA GPU found (NVML and nvidia-smi report none)")
        return 0
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed (pip install torch)")
        return 0
    if not torch.cuda.is_available():
        print("skipped: torch cannot use CUDA on this machine")
        return 0

    from allocopt.cluster import Cluster
    from allocopt.runtime.local import LocalExecutor
    from allocopt.runtime.loop import JobConfig, Scheduler, StateStore

    gpu_type = gpus[0].gpu_type
    same = [d for d in gpus if d.gpu_type == gpu_type]
    script = str(Path(__file__).resolve().parents[1] / "examples" / "pytorch_mlp.py")
    n_jobs = max(3, 2 * len(same) + 1)
    model = [[sys.executable, script, "--hidden", str(1024 * (1 + k % 3)), "--batch-size", "512"] for k in range(n_jobs)]
    rate, startup_s = stand_alone_rate(model[2], same[0].index)
    print(f"stand-alone {' '.join(model[2][2:])} on GPU {same[0].index}: {rate:.0f} steps/s, "
          f"{startup_s:.1f} s from launch to the first step")
    # a job restarted every round makes progress only after its start-up: rounds of at least four start-ups
    round_s = args.round_seconds or max(15.0, math.ceil(4 * startup_s))
    steps = args.steps or math.ceil(2 * max(round_s - startup_s, round_s / 4) * rate)
    print(f"devices: {len(same)} x {gpu_type} ({same[0].name}, {same[0].memory_mib} MiB); "
          f"round {round_s:g} s, {steps} steps per job")
    # a checkpoint of the largest model (~120 MB with Adam's state) takes a good part of a second: every
    # quarter of a job's steps keeps them a small share of its time (a stop request checkpoints too)
    every = ["--checkpoint-every", str(max(50, steps // 4))]
    jobs = [JobConfig(f"mlp{k}", command + every, steps) for k, command in enumerate(model)]
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="allocopt-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    executor = LocalExecutor({}, same, work / "runtime", grace_s=5.0)
    state = StateStore(work / "state.db")
    scheduler = Scheduler(jobs, Cluster({gpu_type: len(same)}), executor, state, round_seconds=round_s)
    report = scheduler.run()
    state.close()

    print("\njob      status  steps  restarts  measured steps/s  JCT (s)")
    for name, job in report["jobs"].items():
        rate = job["measured_steps_per_s"].get(gpu_type)
        print(f"{name:<8} {job['status']:<6} {job['steps_done']:>6} {job['restarts']:>9} "
              f"{'-' if rate is None else f'{rate:.1f}':>17} {job['jct_s'] or float('nan'):>8.1f}")
    stats = executor.stats

    def summary(values: list[float]) -> str:
        return f"median {np.median(values):.3f} s, max {np.max(values):.3f} s (n={len(values)})" if values else "-"

    print(f"\nlaunch to first step (job start-up included): {summary(stats.launch_to_first_step_s)}")
    print(f"launch to client start (interpreter + imports): {summary(stats.launch_to_start_s)}")
    print(f"executor Popen per rank: {summary(stats.popen_s)}")
    print(f"stop (preempt) request to all processes gone: {summary(stats.stop_s)}")
    print(f"leases extended without restart: {stats.extension_fraction:.0%} of {stats.leases}")
    resumed = [n for n, j in report["jobs"].items() if j["restarts"] >= 2]
    print(f"jobs preempted and resumed at least once: {len(resumed)} of {len(jobs)}")
    ok = len(resumed) == len(jobs) and all(j["status"] == "done" for j in report["jobs"].values())
    print("PASS" if ok else "FAIL")
    if args.results:
        latency = [{"what": what, "median_s": float(np.median(v)) if v else None,
                    "max_s": float(np.max(v)) if v else None, "n": len(v)}
                   for what, v in (("launch to first step (job start-up included)", stats.launch_to_first_step_s),
                                   ("launch to client start (interpreter and imports)", stats.launch_to_start_s),
                                   ("executor Popen per rank", stats.popen_s),
                                   ("stop request to all processes gone", stats.stop_s))]
        write_results(args.results, "gpu_time_sharing", data={"jobs": report["jobs"], "latency": latency,
                                                              "gpu_type": gpu_type, "round_s": round_s, "ok": ok},
                      tables=[results_table(f"{len(jobs)} PyTorch jobs time-sharing {len(same)} x {gpu_type} in "
                                            f"{round_s:g} s rounds ({'PASS' if ok else 'FAIL'})", latency,
                                            [Column("what", "latency", left=True), Column("median_s", "median s", ".3f"),
                                             Column("max_s", "max s", ".3f"), Column("n", "n")])])
    return 0 if ok else 1


def stand_alone_rate(command: list[str], gpu_index: int) -> tuple[float, float]:
    """Steps per second of ``command`` run stand-alone on one GPU, and seconds from its launch to its
    first step (interpreter, imports, CUDA context, model), from two runs of different lengths."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu_index), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    seconds = []
    for steps in (200, 2200):
        start = time.perf_counter()
        subprocess.run([*command, "--steps", str(steps)], env=env, check=True, stdout=subprocess.DEVNULL)
        seconds.append(time.perf_counter() - start)
    rate = 2000 / max(seconds[1] - seconds[0], 1e-3)
    return rate, max(seconds[0] - 200 / rate, 0.0)


if __name__ == "__main__":
    sys.exit(main())
