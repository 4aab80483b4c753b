"""allocopt: declarative scheduling policies for heterogeneous GPU clusters.

>>> import allocopt
>>> cluster = allocopt.Cluster({"v100": 1, "k80": 1})
>>> problem = allocopt.Problem([[40, 10], [12, 4], [100, 50]], cluster)
>>> allocopt.solve(problem, "max_min_fairness").matrix.round(3)
array([[0.455, 0.   ],
       [0.455, 0.091],
       [0.091, 0.909]])
"""

import logging
from typing import TYPE_CHECKING

from allocopt._lazy import attach

__version__ = "0.2.0"

# A quiet library: allocopt logs to the "allocopt" logger (children per module) and prints nothing;
# an application (or the CLI's -v/-q) decides where records go.
logging.getLogger(__name__).addHandler(logging.NullHandler())

# Public names and their modules, imported on first use: a training script that
# imports allocopt.runtime.client must not pay for scipy and the solvers.
_EXPORTS = {
    "Allocation": "allocopt.allocation", "Timings": "allocopt.allocation", "solve": "allocopt.api",
    "BACKENDS": "allocopt.backends", "SolveOptions": "allocopt.backends", "installed_backends": "allocopt.backends",
    "Cluster": "allocopt.cluster", "Configurations": "allocopt.configurations",
    "sia_configurations": "allocopt.configurations", "Engine": "allocopt.engine", "POLICIES": "allocopt.formulations",
    "ConfigurationAllocation": "allocopt.goodput_problem", "GoodputProblem": "allocopt.goodput_problem",
    "restart_factor": "allocopt.goodput_problem", "simulate": "allocopt.mechanism.simulator",
    "Model": "allocopt.model", "PolluxAllocation": "allocopt.pollux_problem",
    "PolluxProblem": "allocopt.pollux_problem", "pollux_restart_factor": "allocopt.pollux_problem", "Partitioning": "allocopt.partitioning", "Problem": "allocopt.problem", "Solution": "allocopt.solution",
    "Status": "allocopt.solution",
}
__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:
    from allocopt.allocation import Allocation, Timings
    from allocopt.api import solve
    from allocopt.backends import BACKENDS, SolveOptions, installed_backends
    from allocopt.cluster import Cluster
    from allocopt.configurations import Configurations, sia_configurations
    from allocopt.engine import Engine
    from allocopt.formulations import POLICIES
    from allocopt.goodput_problem import ConfigurationAllocation, GoodputProblem, restart_factor
    from allocopt.mechanism.simulator import simulate
    from allocopt.model import Model
    from allocopt.partitioning import Partitioning
    from allocopt.problem import Problem
    from allocopt.solution import Solution, Status

__getattr__, __dir__ = attach(__name__, _EXPORTS, __all__)
