"""Throughput data: measured tables of job types on GPU types.

:class:`ThroughputTable` looks up the steps/s of a ``(model, scale_factor)``
entry on each GPU type and turns lists of job types, or random workloads, into
:class:`~allocopt.Problem` instances. ``ThroughputTable.gavel()`` loads the
measurements published with Gavel (k80, p100, v100, with co-located pairs),
shipped with allocopt; ``from_csv`` / ``from_json`` / ``from_frame`` read your
own. :class:`ThroughputEstimator` keeps smoothed online estimates of measured
throughput, with priors for what was never measured.

"""

from allocopt.throughput.online import ThroughputEstimator
from allocopt.throughput.table import DEFAULT_SCALE_FACTOR_PROBS, MEASUREMENT_COLUMNS, ThroughputTable

__all__ = ["DEFAULT_SCALE_FACTOR_PROBS", "MEASUREMENT_COLUMNS", "ThroughputEstimator", "ThroughputTable"]
