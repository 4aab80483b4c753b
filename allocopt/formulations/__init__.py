"""Scheduling policies, one module each, registered by name."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from allocopt.errors import UnknownPolicyError
from allocopt.formulations.base import ModelSolver, Policy, PolicyResult, base_model

# policy name -> (module, class); a policy's module is imported when the policy is first looked up
_REGISTRY: dict[str, tuple[str, str]] = {
    "max_min_fairness": ("allocopt.formulations.max_min_fairness", "MaxMinFairness"),
    "max_throughput": ("allocopt.formulations.max_throughput", "MaxThroughput"),
    "isolated": ("allocopt.formulations.shares", "Isolated"),
    "proportional": ("allocopt.formulations.shares", "Proportional"),
    "min_makespan": ("allocopt.formulations.makespan", "MinMakespan"),
    "finish_time_fairness": ("allocopt.formulations.finish_time_fairness", "FinishTimeFairness"),
    "water_filling": ("allocopt.formulations.water_filling", "WaterFilling"),
    "sia": ("allocopt.formulations.sia", "Sia"),
    "pollux": ("allocopt.formulations.pollux", "Pollux"),
    "optimus": ("allocopt.formulations.optimus", "Optimus"),
    "fifo": ("allocopt.formulations.baselines", "Fifo"),
    "gandiva": ("allocopt.formulations.baselines", "Gandiva"),
    "allox": ("allocopt.formulations.baselines", "AlloX"),
}


class _Policies(Mapping[str, Policy]):
    """The registered policies by name, each built on first lookup (a cold ``solve`` imports only its own)."""

    def __init__(self) -> None:
        self._built: dict[str, Policy] = {}

    def __getitem__(self, name: str) -> Policy:
        if name not in self._built:
            module, cls = _REGISTRY[name]
            policy = getattr(importlib.import_module(module), cls)()
            assert policy.name == name, (policy.name, name)
            self._built[name] = policy
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(_REGISTRY)

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __contains__(self, name: object) -> bool:
        return name in _REGISTRY

    def __repr__(self) -> str:
        return f"POLICIES({', '.join(_REGISTRY)})"


#: The registered policies by name (a read-only mapping).
POLICIES: Mapping[str, Policy] = _Policies()


def get_policy(name: str) -> Policy:
    """The registered policy called ``name``."""
    try:
        return POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(f"unknown policy {name!r}; choose one of {', '.join(sorted(POLICIES))}") from None


__all__ = ["POLICIES", "ModelSolver", "Policy", "PolicyResult", "base_model", "get_policy"]
