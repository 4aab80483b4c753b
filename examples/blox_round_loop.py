"""allocopt as the scheduling policy of a Blox-like round loop.

Run: python examples/blox_round_loop.py
"""

from __future__ import annotations

from allocopt.adapters.blox import BloxPolicy


def main() -> None:
    cluster = {gpu: {"gpu_type": "v100" if gpu < 4 else "k80", "node": gpu // 2, "running_job": None}
               for gpu in range(8)}
    job_dict = {
        1: {"num_GPUs": 1, "throughputs": {"v100": 40.0, "k80": 10.0}},
        2: {"num_GPUs": 2, "throughputs": {"v100": 12.0, "k80": 4.0}, "priority": 2.0},
        3: {"num_GPUs": 1, "throughputs": {"v100": 100.0, "k80": 50.0}},
        4: {"num_GPUs": 4, "throughputs": {"v100": 30.0, "k80": 6.0}},
    }
    policy = BloxPolicy("max_min_fairness", round_seconds=300.0, recompute_min_seconds=0.0)
    for round_index in range(5):
        to_suspend, to_launch = policy.schedule(job_dict, cluster)
        for gpu in cluster.values():
            if gpu["running_job"] in to_suspend:
                gpu["running_job"] = None
        for job, gpus in to_launch.items():
            for gpu in gpus:
                cluster[gpu]["running_job"] = job
        print(f"round {round_index}: suspend {to_suspend}, launch {to_launch}")
        print("  GPUs:", {gpu: state["running_job"] for gpu, state in cluster.items()})


if __name__ == "__main__":
    main()
