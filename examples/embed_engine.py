"""Embed allocopt.Engine in a round-based scheduler loop.

Run: python examples/embed_engine.py
"""

from __future__ import annotations

import allocopt
from allocopt.runtime.executor import JobRoundResult, RoundOutcome


def main() -> None:
    engine = allocopt.Engine({"v100": 2, "k80": 2}, policy="max_min_fairness", round_seconds=360.0)
    engine.add_job("resnet", throughputs={"v100": 40.0, "k80": 10.0})
    engine.add_job("lstm", throughputs={"v100": 12.0, "k80": 4.0}, scale_factor=2)
    engine.add_job("gan", throughputs={"v100": 100.0, "k80": 50.0})
    print("allocation:", {job: {t: round(x, 2) for t, x in row.items()}
                          for job, row in engine.allocate().to_dict().items()})
    for round_index in range(6):
        if round_index == 3:
            engine.set_capacity("v100", 4)  # a node joined
            engine.remove_job("gan")  # finished
        plan = engine.next_round()
        for lease in plan.leases:
            state = "keeps" if lease.extended else "starts on"
            print(f"round {plan.round_index}: {lease.job_id} {state} {lease.gpu_type} GPUs {list(lease.gpu_ids)}")
        for job in plan.stop:
            print(f"round {plan.round_index}: stop {job}")
        # ... run the leases; report how long each ran (and measured throughput, if any).
        engine.record_round([JobRoundResult(lease.job_id, RoundOutcome.PREEMPTED, 0, lease.max_seconds)
                             for lease in plan.leases])


if __name__ == "__main__":
    main()
