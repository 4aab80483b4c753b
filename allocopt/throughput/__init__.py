"""Throughput data: measured tables of job types on GPU types.

:class:`ThroughputTable` looks up the steps/s of a ``(model, scale_factor)``
entry on each GPU type and turns lists of job types, or random workloads, into
:class:`~allocopt.Problem` instances. ``ThroughputTable.gavel()`` loads the
measurements published with Gavel (k80, p100, v100), shipped with allocopt.
"""

from allocopt.throughput.table import DEFAULT_SCALE_FACTOR_PROBS, ThroughputTable

__all__ = ["DEFAULT_SCALE_FACTOR_PROBS", "ThroughputTable"]
