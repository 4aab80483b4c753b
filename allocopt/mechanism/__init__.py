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
    "AdmissionPolicy": "allocopt.mechanism.admission", "LoadBased": "allocopt.mechanism.admission",
    "OrderOptions": "allocopt.mechanism.order_planner", "OrderPlanner": "allocopt.mechanism.order_planner",
    "JobView": "allocopt.mechanism.order_policies", "OrderPolicy": "allocopt.mechanism.order_policies",
    "PlacementPolicy": "allocopt.mechanism.placement_policies", "TraceWorkload": "allocopt.mechanism.traces",
    "read_helios_trace": "allocopt.mechanism.traces", "read_pai_trace": "allocopt.mechanism.traces",
    "read_philly_trace": "allocopt.mechanism.traces", "read_tiresias_trace": "allocopt.mechanism.traces",
    "Tenants": "allocopt.mechanism.tenants", "TenantError": "allocopt.mechanism.tenants",
    "read_tenants": "allocopt.mechanism.tenants", "CapacitySchedule": "allocopt.mechanism.capacity",
    "CapacityEventError": "allocopt.mechanism.capacity", "read_capacity_events": "allocopt.mechanism.capacity",
}
__all__ = ["AdmissionPolicy", "CapacityEventError", "CapacitySchedule", "GpuLayout", "JobView", "LoadBased",
           "MechanismOptions", "OrderOptions", "OrderPlanner", "OrderPolicy", "Placement", "PlacementPolicy",
           "PriorityMechanism", "PriorityPlanner", "RoundPlanner", "SimulationError", "SimulationResult",
           "SimulationState", "TenantError", "Tenants", "TraceError", "TraceWorkload", "Workload",
           "generate_workload", "place", "priorities", "read_capacity_events", "read_gavel_trace",
           "read_helios_trace", "read_pai_trace", "read_philly_trace", "read_tenants", "read_tiresias_trace",
           "select_jobs", "shipped_trace", "simulate"]

if TYPE_CHECKING:
    from allocopt.mechanism.admission import AdmissionPolicy, LoadBased
    from allocopt.mechanism.capacity import CapacityEventError, CapacitySchedule, read_capacity_events
    from allocopt.mechanism.order_planner import OrderOptions, OrderPlanner
    from allocopt.mechanism.order_policies import JobView, OrderPolicy
    from allocopt.mechanism.placement import GpuLayout, Placement, place
    from allocopt.mechanism.placement_policies import PlacementPolicy
    from allocopt.mechanism.priority import MechanismOptions, PriorityMechanism, priorities, select_jobs
    from allocopt.mechanism.tenants import TenantError, Tenants, read_tenants
    from allocopt.mechanism.simulator import (PriorityPlanner, RoundPlanner, SimulationError, SimulationResult,
                                              SimulationState, simulate)
    from allocopt.mechanism.traces import (TraceWorkload, read_helios_trace, read_pai_trace, read_philly_trace,
                                           read_tiresias_trace)
    from allocopt.mechanism.workload import TraceError, Workload, generate_workload, read_gavel_trace, shipped_trace

__getattr__, __dir__ = attach(__name__, _EXPORTS, __all__)
