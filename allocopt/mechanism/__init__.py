"""From an allocation to what runs each round: priorities, placement, and the simulator."""

from allocopt.mechanism.admission import AdmissionPolicy, LoadBased
from allocopt.mechanism.order_planner import OrderOptions, OrderPlanner
from allocopt.mechanism.order_policies import JobView, OrderPolicy
from allocopt.mechanism.placement import GpuLayout, Placement, place
from allocopt.mechanism.placement_policies import PlacementPolicy
from allocopt.mechanism.priority import MechanismOptions, PriorityMechanism, priorities, select_jobs
from allocopt.mechanism.simulator import (PriorityPlanner, RoundPlanner, SimulationError, SimulationResult,
                                          SimulationState, simulate)
from allocopt.mechanism.traces import (TraceWorkload, read_helios_trace, read_pai_trace, read_philly_trace,
                                       read_tiresias_trace)
from allocopt.mechanism.workload import TraceError, Workload, generate_workload, read_gavel_trace, shipped_trace

__all__ = ["AdmissionPolicy", "GpuLayout", "JobView", "LoadBased", "MechanismOptions", "OrderOptions", "OrderPlanner",
           "OrderPolicy", "Placement", "PlacementPolicy", "PriorityMechanism", "PriorityPlanner", "RoundPlanner",
           "SimulationError", "SimulationResult", "SimulationState", "TraceError", "TraceWorkload", "Workload",
           "generate_workload", "place", "priorities", "read_gavel_trace", "read_helios_trace", "read_pai_trace",
           "read_philly_trace", "read_tiresias_trace", "select_jobs", "shipped_trace", "simulate"]
