"""Carrying out round plans: the executor interface and its implementations."""

from allocopt.runtime.executor import Executor, JobRoundResult, Lease, RoundOutcome, RoundPlan

__all__ = ["Executor", "JobRoundResult", "Lease", "RoundOutcome", "RoundPlan"]

# Imported on first use, so that training scripts importing the client stay light.
_LAZY = {"LocalExecutor": "allocopt.runtime.local", "JobSpec": "allocopt.runtime.local",
         "RayExecutor": "allocopt.runtime.ray_executor", "Scheduler": "allocopt.runtime.loop",
         "Device": "allocopt.runtime.devices",
         "discover_devices": "allocopt.runtime.devices"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        module = importlib.import_module(_LAZY[name])
        return getattr(module, "discover" if name == "discover_devices" else name)
    raise AttributeError(f"module 'allocopt.runtime' has no attribute {name!r}")
