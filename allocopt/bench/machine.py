"""The machine a benchmark ran on, recorded next to its numbers."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import Any


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """Platform, CPU model, usable cores, memory, load average, Python and package versions."""
    cpu_model = platform.processor() or None
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem_gib = round(int(line.split()[1]) / 2**20, 1)
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    from allocopt import (
        __version__,  # the code that runs (a stale install's metadata may say otherwise)
    )

    versions = {"allocopt": __version__, **{name: _version(name) for name in
                                            ("numpy", "scipy", "highspy", "cvxpy", "gurobipy", "pulp", "clarabel")}}
    try:
        import gurobipy
        versions["gurobi (library)"] = ".".join(map(str, gurobipy.gurobi.version()))
    except Exception:  # noqa: BLE001
        pass
    try:
        load = [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        load = None
    return {"platform": platform.platform(), "machine": platform.machine(), "cpu": cpu_model,
            "load_average": load,
            "cpu_count": os.cpu_count(), "cpus_usable": usable, "memory_gib": mem_gib,
            "python": f"{platform.python_implementation()} {platform.python_version()}",
            "versions": {k: v for k, v in versions.items() if v is not None}}


def format_machine(info: dict[str, Any]) -> str:
    """One paragraph describing ``machine_info()``'s result, for the top of a report."""
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    return (f"Machine: {info['platform']} ({info['machine']}), CPU {info['cpu']}, "
            f"{info['cpu_count']} CPUs ({info['cpus_usable']} usable), {info['memory_gib']} GiB RAM, "
            f"load average {info['load_average']} at start\nPython {info['python']}; {versions}")
