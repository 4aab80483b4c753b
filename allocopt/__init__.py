"""allocopt: declarative scheduling policies for heterogeneous GPU clusters.

>>> import allocopt
>>> cluster = allocopt.Cluster({"v100": 1, "k80": 1})
>>> problem = allocopt.Problem([[40, 10], [12, 4], [100, 50]], cluster)
>>> allocopt.solve(problem, "max_min_fairness").matrix.round(3)
array([[0.455, 0.   ],
       [0.455, 0.091],
       [0.091, 0.909]])
"""

from allocopt.allocation import Allocation, Timings
from allocopt.api import solve
from allocopt.backends import BACKENDS, SolveOptions, installed_backends
from allocopt.cluster import Cluster
from allocopt.configurations import Configurations, sia_configurations
from allocopt.formulations import POLICIES
from allocopt.goodput_problem import ConfigurationAllocation, GoodputProblem, restart_factor
from allocopt.model import Model
from allocopt.problem import Problem
from allocopt.solution import Solution, Status

__version__ = "0.1.0"

__all__ = ["Allocation", "BACKENDS", "Cluster", "ConfigurationAllocation", "Configurations", "GoodputProblem",
           "Model", "POLICIES", "Problem", "Solution", "SolveOptions",
           "Status", "Timings", "installed_backends", "restart_factor", "sia_configurations", "solve", "__version__"]
