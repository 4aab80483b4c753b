"""Scheduling policies, one module each, registered by name."""

from __future__ import annotations

from allocopt.errors import UnknownPolicyError
from allocopt.formulations.base import ModelSolver, Policy, PolicyResult, base_model
from allocopt.formulations.baselines import AlloX, Fifo, Gandiva
from allocopt.formulations.finish_time_fairness import FinishTimeFairness
from allocopt.formulations.makespan import MinMakespan
from allocopt.formulations.max_min_fairness import MaxMinFairness
from allocopt.formulations.max_throughput import MaxThroughput
from allocopt.formulations.pollux import Pollux
from allocopt.formulations.shares import Isolated, Proportional
from allocopt.formulations.sia import Sia
from allocopt.formulations.water_filling import WaterFilling

POLICIES: dict[str, Policy] = {p.name: p for p in (MaxMinFairness(), MaxThroughput(), Isolated(), Proportional(),
                                                     MinMakespan(), FinishTimeFairness(), WaterFilling(), Sia(), Pollux(),
                                                     Fifo(), Gandiva(), AlloX())}


def get_policy(name: str) -> Policy:
    """The registered policy called ``name``."""
    try:
        return POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(f"unknown policy {name!r}; choose one of {', '.join(sorted(POLICIES))}") from None


__all__ = ["POLICIES", "ModelSolver", "Policy", "PolicyResult", "base_model", "get_policy"]
