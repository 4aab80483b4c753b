"""From an allocation to what runs each round: priorities, placement, and the simulator."""

from typing import TYPE_CHECKING

from allocopt._lazy import attach

_EXPORTS = {
    "GpuLayout": "allocopt.mechanism.placement", "Placement": "allocopt.mechanism.placement",
    "place": "allocopt.mechanism.placement", "MechanismOptions": "allocopt.mechanism.priority",
    "PriorityMechanism": "allocopt.mechanism.priority", "priorities": "allocopt.mechanism.priority",
    "select_jobs": "allocopt.mechanism.priority", "PriorityPlanner": "allocopt.mechanism.simulator",
    "RoundPlanner": "allocopt.mechanism.simulator", "SimulationError": "allocopt.mechanism.simulator",
    "SimulationResult": "allocopt.mechanism.simulator", "SimulationState": "allocopt.mechanism.simulator",
    "simulate": "allocopt.mechanism.simulator", "TraceError": "allocopt.mechanism.workload",
    "Workload": "allocopt.mechanism.workload", "generate_workload": "allocopt.mechanism.workload",
    "read_gavel_trace": "allocopt.mechanism.workload", "shipped_trace": "allocopt.mechanism.workload",
}
__all__ = ["GpuLayout", "MechanismOptions", "Placement", "PriorityMechanism", "PriorityPlanner", "RoundPlanner",
           "SimulationError", "SimulationResult", "SimulationState", "TraceError", "Workload",
           "generate_workload", "place", "priorities", "read_gavel_trace", "select_jobs", "shipped_trace",
           "simulate"]

if TYPE_CHECKING:
    from allocopt.mechanism.placement import GpuLayout, Placement, place
    from allocopt.mechanism.priority import MechanismOptions, PriorityMechanism, priorities, select_jobs
    from allocopt.mechanism.simulator import (PriorityPlanner, RoundPlanner, SimulationError, SimulationResult,
                                              SimulationState, simulate)
    from allocopt.mechanism.workload import TraceError, Workload, generate_workload, read_gavel_trace, shipped_trace

__getattr__, __dir__ = attach(__name__, _EXPORTS, __all__)
