"""Throughput data: measured tables of job types on GPU types.

:class:`ThroughputTable` looks up the steps/s of a ``(model, scale_factor)``
entry on each GPU type and turns lists of job types, or random workloads, into
:class:`~allocopt.Problem` instances. ``ThroughputTable.gavel()`` loads the
measurements published with Gavel (k80, p100, v100, with co-located pairs),
shipped with allocopt; ``from_csv`` / ``from_json`` / ``from_frame`` read your
own. :class:`ThroughputEstimator` keeps smoothed online estimates of measured
throughput, with priors for what was never measured.

The Pollux/Sia goodput model (:mod:`allocopt.throughput.goodput`) fits
:class:`PerfParams` to measured step times, scales throughput by statistical
efficiency (:class:`GoodputModel`) and gives the ``goodput`` matrix of a
:class:`~allocopt.GoodputProblem` (:func:`goodput_matrix`);
:mod:`allocopt.throughput.profiles` loads Sia's application profiles and
:mod:`allocopt.throughput.bootstrap` projects models across GPU types from
1-GPU profiles (:class:`BootstrappedJob`).
"""

from typing import TYPE_CHECKING

from allocopt._lazy import attach

_EXPORTS = {
    "BootstrappedJob": "allocopt.throughput.bootstrap", "project": "allocopt.throughput.bootstrap",
    "throughput_ratio": "allocopt.throughput.bootstrap", "GoodputModel": "allocopt.throughput.goodput",
    "GradParams": "allocopt.throughput.goodput", "PerfParams": "allocopt.throughput.goodput",
    "fit_perf_params": "allocopt.throughput.goodput", "goodput_matrix": "allocopt.throughput.goodput",
    "ThroughputEstimator": "allocopt.throughput.online", "ApplicationProfile": "allocopt.throughput.profiles",
    "Observations": "allocopt.throughput.profiles", "ProfileFormatError": "allocopt.throughput.profiles",
    "load_profiles": "allocopt.throughput.profiles", "DEFAULT_SCALE_FACTOR_PROBS": "allocopt.throughput.table",
    "MEASUREMENT_COLUMNS": "allocopt.throughput.table", "ThroughputTable": "allocopt.throughput.table",
}
__all__ = ["DEFAULT_SCALE_FACTOR_PROBS", "MEASUREMENT_COLUMNS", "ApplicationProfile", "BootstrappedJob", "GoodputModel",
           "GradParams", "Observations", "PerfParams", "ProfileFormatError", "ThroughputEstimator", "ThroughputTable",
           "fit_perf_params", "goodput_matrix", "load_profiles", "project", "throughput_ratio"]

if TYPE_CHECKING:
    from allocopt.throughput.bootstrap import BootstrappedJob, project, throughput_ratio
    from allocopt.throughput.goodput import GoodputModel, GradParams, PerfParams, fit_perf_params, goodput_matrix
    from allocopt.throughput.online import ThroughputEstimator
    from allocopt.throughput.profiles import ApplicationProfile, Observations, ProfileFormatError, load_profiles
    from allocopt.throughput.table import DEFAULT_SCALE_FACTOR_PROBS, MEASUREMENT_COLUMNS, ThroughputTable

__getattr__, __dir__ = attach(__name__, _EXPORTS, __all__)
