"""allocopt as the scheduling policy of a Sia-like round loop: goodput per configuration in,
each job's (GPU type, nodes, GPUs) and GPU ids out.

Run: python examples/sia_rounds.py
"""

from __future__ import annotations

from allocopt import Cluster
from allocopt.adapters.sia import SiaPolicy


def main() -> None:
    cluster = Cluster({"aws": 8, "rtx": 16}, gpus_per_node={"aws": 4, "rtx": 8})
    policy = SiaPolicy(cluster, round_seconds=60.0)
    configs = policy.configurations
    speed = {"small": {"aws": 1.0, "rtx": 1.5}, "large": {"aws": 3.0, "rtx": 6.0}}

    def goodput(kind: str) -> dict[tuple[str, int, int], float]:
        """The goodput estimate of a job of ``kind`` per configuration (sub-linear scaling)."""
        return {(t, int(n), int(g)): speed[kind][t] * g ** (0.9 if kind == "large" else 0.5)
                for t, n, g in zip(configs.gpu_type_names, configs.num_nodes, configs.num_gpus)}

    jobs = {"s1": {"goodput": goodput("small"), "application": "cifar10"},
            "l1": {"goodput": goodput("large"), "application": "imagenet"}}
    held: dict[str, list[int]] = {}
    for round_index in range(5):
        if round_index == 2:
            jobs["s2"] = {"goodput": goodput("small"), "application": "cifar10"}
            jobs["l2"] = {"goodput": goodput("large"), "application": "bert"}
        if round_index == 4:
            del jobs["s1"]
        assignments = policy.optimize(jobs, held)
        print(f"round {round_index}:")
        for job, a in assignments.items():
            how = "keeps its GPUs" if a.extended else f"(re)starts, {a.restore_delay_s:.0f} s restore"
            print(f"  {job}: {a.gpu_type} x {a.num_gpus} on {a.num_nodes} node(s), GPUs {list(a.gpu_ids)}, {how}")
        held = {job: list(a.gpu_ids) for job, a in assignments.items()}


if __name__ == "__main__":
    main()
