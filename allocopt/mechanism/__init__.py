"""From an allocation to what runs each round: priorities, placement, and the simulator."""

from allocopt.mechanism.placement import GpuLayout, Placement, place
from allocopt.mechanism.priority import MechanismOptions, PriorityMechanism, priorities, select_jobs
from allocopt.mechanism.simulator import (PriorityPlanner, RoundPlanner, SimulationError, SimulationResult,
                                          SimulationState, simulate)
from allocopt.mechanism.workload import TraceError, Workload, generate_workload, read_gavel_trace, shipped_trace

__all__ = ["GpuLayout", "MechanismOptions", "Placement", "PriorityMechanism", "PriorityPlanner", "RoundPlanner",
           "SimulationError", "SimulationResult", "SimulationState", "TraceError", "Workload",
           "generate_workload", "place", "priorities", "read_gavel_trace", "select_jobs", "shipped_trace",
           "simulate"]
