"""allocopt as a drop-in for Gavel's policy objects: the same ``get_allocation`` arguments.

Run: python examples/gavel_drop_in.py
"""

from __future__ import annotations

from allocopt.adapters.gavel import get_policy


def main() -> None:
    # Gavel's inputs: steps/s per job and worker type, GPUs per job, priority weights, workers per type.
    throughputs = {0: {"v100": 40.0, "p100": 25.0, "k80": 10.0},
                   1: {"v100": 12.0, "p100": 8.0, "k80": 4.0},
                   2: {"v100": 100.0, "p100": 70.0, "k80": 50.0},
                   3: {"v100": 30.0, "p100": 20.0, "k80": 6.0}}
    scale_factors = {0: 1, 1: 2, 2: 1, 3: 1}
    priority_weights = {0: 1.0, 1: 2.0, 2: 1.0, 3: 1.0}
    cluster_spec = {"v100": 2, "p100": 2, "k80": 2}
    for name in ("max_min_fairness", "max_min_fairness_perf", "max_sum_throughput_perf"):
        policy = get_policy(name)  # Gavel: policy = utils.get_policy(name, solver=...)
        if name == "max_sum_throughput_perf":
            allocation = policy.get_allocation(throughputs, scale_factors, cluster_spec)
        else:
            allocation = policy.get_allocation(throughputs, scale_factors, priority_weights, cluster_spec)
        print(f"{name}:")
        for job, fractions in allocation.items():
            shares = ", ".join(f"{t} {x:.2f}" for t, x in fractions.items())
            steps = sum(x * throughputs[job][t] for t, x in fractions.items())
            print(f"  job {job}: {shares}  ->  {steps:.1f} steps/s")


if __name__ == "__main__":
    main()
