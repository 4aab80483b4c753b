"""Order-based scheduling policies: they rank jobs instead of solving an allocation program.

An order-based policy sees a read-only :class:`JobView` of the active jobs at the
start of a round (attained service, GPU-time, arrival, remaining steps and
estimated durations, whether each job holds GPUs) and returns sort keys; the
:class:`~allocopt.mechanism.order_planner.OrderPlanner` walks the jobs in that
order, gives each its ``scale_factor`` GPUs while they fit, preempts the running
jobs that no longer fit (preemptive policies) or keeps them (non-preemptive
ones), and places the round on servers. A new policy is a class with a
``name``, a ``preemptive`` flag and a ``rank`` method::

    class LargestFirst:
        name, preemptive = "largest_first", True

        def rank(self, view):
            return -view.num_gpus          # most GPUs first; ties: arrival order

    simulate(workload, cluster, LargestFirst())

Built-in policies (:data:`ORDER_POLICIES`, by name in :func:`allocopt.simulate`):

``order:fifo``
    Arrival order, non-preemptive (bare ``fifo`` names allocopt's FIFO formulation).
``las``
    Least attained service first (``service="time"``: seconds run; ``"gpu_time"``:
    GPU-seconds), preemptive; ranks change continuously, so rounds are
    ``round_seconds`` long.
``tiresias``
    Tiresias's discretized 2D-LAS (Gu et al., NSDI 2019, "Tiresias: A GPU
    Cluster Manager for Distributed Deep Learning"): queues by attained
    GPU-time since the last promotion with thresholds, a new job enters the
    first queue, a running job whose GPU-time reaches its queue's threshold
    moves to the end of the next queue, and within a queue jobs keep their
    order with the running ones ahead of the waiting ones; optional starvation
    promotion back to the first queue.
``tiresias_gittins``
    The same queues, each sorted by the Gittins index of the job's attained
    GPU-time over a sample of job GPU-times (Tiresias's ``dlas-gpu-gittins``).
``srtf``
    Shortest remaining time first, preemptive (oracle remaining time, or an
    estimate of each job's duration minus its attained time).
``sjf``
    Shortest job first, non-preemptive (oracle or estimated durations).
``optimus``
    Optimus on rigid jobs: SRTF's order, each job at its own GPUs (:class:`Optimus`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from importlib import resources
from typing import Any, Protocol, runtime_checkable

import numpy as np

from allocopt.errors import InvalidOptionError


@dataclass(frozen=True)
class JobView:
    """Read-only view of the active jobs at the start of a round (arrays of shape (m,), arrival order).

    Attributes
    ----------
    now_s : float
        Start of the round, seconds.
    rows : ndarray of int
        Job index of each active job (its row in the workload, arrival order).
    arrival_s : ndarray
        Arrival time, seconds.
    num_gpus : ndarray of int
        GPUs the job uses (its scale factor).
    attained_s : ndarray
        Seconds the job has held GPUs so far.
    attained_gpu_s : ndarray
        GPU-seconds it has held (``attained_s`` times its GPUs).
    remaining_steps, total_steps : ndarray of int
    remaining_s : ndarray
        Oracle remaining run time, seconds: remaining steps over the job's steps/s on its fastest type.
    duration_s : ndarray
        Oracle total run time, seconds, on its fastest type.
    running : ndarray of bool
        The job held GPUs in the last round.
    started_s : ndarray
        When the job first held GPUs (NaN: never).
    priority_weights : ndarray
    models : tuple of str
    """

    now_s: float
    rows: np.ndarray
    arrival_s: np.ndarray
    num_gpus: np.ndarray
    attained_s: np.ndarray
    attained_gpu_s: np.ndarray
    remaining_steps: np.ndarray
    total_steps: np.ndarray
    remaining_s: np.ndarray
    duration_s: np.ndarray
    running: np.ndarray
    started_s: np.ndarray
    priority_weights: np.ndarray
    models: tuple[str, ...]

    def __post_init__(self) -> None:
        for value in vars(self).values():
            if isinstance(value, np.ndarray):
                value.setflags(write=False)

    @property
    def num_jobs(self) -> int:
        """Active jobs in the view."""
        return int(self.rows.size)


@runtime_checkable
class OrderPolicy(Protocol):
    """What an order-based policy implements.

    Attributes
    ----------
    name : str
    preemptive : bool
        True: each round the walk is over every active job in rank order, and a
        running job that no longer fits is preempted. False: running jobs keep
        their GPUs until they finish; only waiting jobs are ranked for the rest.

    Methods
    -------
    rank(view) -> ndarray of shape (m,) or (k, m)
        Sort keys of the view's jobs, smaller first; with ``k`` rows the first
        row is the most significant (as ``np.lexsort`` of the reversed rows).
        Ties keep arrival order.

    A policy may also define ``next_change_s(view) -> float``: seconds from
    ``view.now_s`` until its ranking can change other than by an arrival or a
    completion (``math.inf``: never), given that the jobs ``view.running``
    marks run this round (the planner calls it after the walk). Rounds then
    end at the next such event, at most ``round_seconds`` long; without it,
    rounds are ``round_seconds`` long.
    """

    name: str
    preemptive: bool

    def rank(self, view: JobView) -> np.ndarray: ...


def _estimated(view: JobView, estimates: np.ndarray | None, remaining: bool) -> np.ndarray:
    """Oracle or estimated duration (``remaining``: minus attained time) of the view's jobs, seconds."""
    if estimates is None:
        return view.remaining_s if remaining else view.duration_s
    if int(view.rows.max(initial=-1)) >= estimates.size:
        raise InvalidOptionError(f"estimates_s has {estimates.size} entries; the workload has a job "
                                 f"{int(view.rows.max())}: give one estimated duration per job")
    total = estimates[view.rows]
    return np.maximum(total - view.attained_s, 0.0) if remaining else total


def _estimates(values: Sequence[float] | np.ndarray | None) -> np.ndarray | None:
    if values is None:
        return None
    array = np.asarray(values, dtype=np.float64).ravel()
    if not np.isfinite(array).all() or (array < 0).any():
        raise InvalidOptionError("estimates_s must be finite non-negative seconds, one per job")
    return array


class Fifo:
    """First in, first out: arrival order, no preemption."""

    name = "fifo"
    preemptive = False

    def rank(self, view: JobView) -> np.ndarray:
        return view.arrival_s

    def next_change_s(self, view: JobView) -> float:
        return math.inf


class Las:
    """Least attained service first, preemptive.

    Parameters
    ----------
    service : {"time", "gpu_time"}, default "time"
        Attained seconds, or attained GPU-seconds.
    """

    name = "las"
    preemptive = True

    def __init__(self, service: str = "time"):
        if service not in ("time", "gpu_time"):
            raise InvalidOptionError(f"las: service must be 'time' or 'gpu_time', got {service!r}")
        self.service = service

    def rank(self, view: JobView) -> np.ndarray:
        return view.attained_s if self.service == "time" else view.attained_gpu_s


class Srtf:
    """Shortest remaining time first, preemptive.

    Parameters
    ----------
    estimates_s : array-like of shape (n_jobs,), optional
        Estimated duration of each job (seconds; e.g. the run-time limit its user asked for);
        remaining time is the estimate minus the attained seconds. Default: the oracle.
    gpu_time : bool, default False
        Rank by remaining GPU-time (remaining time times GPUs), Tiresias's ``shortest-gpu``.
    """

    name = "srtf"
    preemptive = True

    def __init__(self, estimates_s: Sequence[float] | np.ndarray | None = None, gpu_time: bool = False):
        self.estimates_s, self.gpu_time = _estimates(estimates_s), bool(gpu_time)

    def rank(self, view: JobView) -> np.ndarray:
        remaining = _estimated(view, self.estimates_s, remaining=True)
        return remaining * view.num_gpus if self.gpu_time else remaining

    def next_change_s(self, view: JobView) -> float:
        # a running job's remaining time only shrinks, a waiting job's stays: with oracle times the order
        # changes only at arrivals and completions; an estimate can run out (its remaining time stops at 0)
        return math.inf


class Sjf(Srtf):
    """Shortest job first, non-preemptive (oracle or estimated total durations).

    Parameters
    ----------
    estimates_s : array-like of shape (n_jobs,), optional
        Estimated duration of each job, seconds. Default: the oracle.
    gpu_time : bool, default False
        Rank by duration times GPUs.
    """

    name = "sjf"
    preemptive = False

    def rank(self, view: JobView) -> np.ndarray:
        duration = _estimated(view, self.estimates_s, remaining=False)
        return duration * view.num_gpus if self.gpu_time else duration


class Optimus(Srtf):
    """Optimus (Peng et al., EuroSys 2018) on rigid jobs: shortest estimated remaining time first, preemptive.

    Optimus gives every job one worker in order of its estimated remaining
    time, then adds workers where they cut remaining time the most. A rigid job
    runs on its ``scale_factor`` GPUs only, and a rigid workload gives no speed
    at other GPU counts, so every added worker gains nothing and the allocation
    is the first pass: jobs by remaining time (the oracle, Optimus's
    convergence estimate taken as known; or ``estimates_s`` minus the attained
    seconds), each with its own GPUs. This is the order Blox's
    ``schedulers.Optimus`` computes; the workers it adds (``job_gpu_demand``) are
    read neither by Blox's placement, which places ``num_GPUs``, nor by its
    simulator's progress, which scales only under a policy named ``Optimus``
    through a table its code leaves commented out. Optimus with workers added by
    marginal gain is :mod:`allocopt.formulations.optimus`, run in the
    simulator over a Sia workload (``simulate(..., "optimus", profiles=...)``).

    Parameters
    ----------
    estimates_s : array-like of shape (n_jobs,), optional
        Estimated duration of each job, seconds. Default: the oracle.
    gpu_time : bool, default False
        Rank by remaining GPU-time.
    """

    name = "optimus"


#: Tiresias's simulator's queue thresholds (``jobs.py``: three queues, limits 3250 and 7200 GPU-seconds).
TIRESIAS_THRESHOLDS_GPU_S: tuple[float, ...] = (3250.0, 7200.0)


def tiresias_service_sample() -> np.ndarray:
    """GPU-seconds of the jobs Tiresias's Gittins policy learns its index from (``yarn-gput1000.csv``
    of Tiresias's simulator, shipped in ``allocopt/data/tiresias/``), sorted."""
    path = resources.files("allocopt") / "data" / "tiresias" / "yarn-gput1000.csv"
    lines = path.read_text(encoding="utf-8").split()
    return np.sort(np.array([int(v) for v in lines[1:]], dtype=np.int64))


def gittins_ranks(sample: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Tiresias's Gittins-index table over a sample of job services (its ``parse_job_dist``).

    For a job with attained service ``a``, the index is ``P / E`` with ``P`` the
    share of sampled jobs longer than ``a`` that finish within ``delta`` more and
    ``E`` their mean service up to ``a + delta`` (Tiresias's
    ``cal_r_gittins_index``, evaluated at ``a = s - 1`` for each sampled ``s``:
    ``E`` sums the sampled services of those that finish and ``delta`` for the
    others, divided by the survivors with Python 2's integer floor; ``P`` is
    rounded to 5 decimals, the index ``P * 1e6 / E`` to 4, halves away from zero
    as Python 2's ``round``).

    Parameters
    ----------
    sample : ndarray of int
        Sorted sampled services (GPU-seconds).
    delta : int
        Service quantum, GPU-seconds.

    Returns
    -------
    bounds : ndarray of int
        The sample, sorted.
    index : ndarray
        ``index[i]``: the Gittins index of a job whose attained service lies in
        ``[bounds[i - 1], bounds[i])`` (:func:`gittins_index`).
    """
    data = np.sort(np.asarray(sample, dtype=np.int64))
    num = data.size
    a = data - 1
    idx = np.searchsorted(data, a, side="right")  # first sample > a
    nxt = a + delta
    idx_delta = np.where(nxt > data[-1] - 1, num - 1, np.searchsorted(data, nxt, side="right"))
    cumulative = np.concatenate([[0], np.cumsum(data)])
    survivors = num - idx
    p = _round_half_away((idx_delta - idx) / survivors, 5)
    # Python 2 divides Tiresias's integer sums with the floor
    e = ((cumulative[idx_delta] - cumulative[idx] + int(delta) * (num - idx_delta)) // survivors).astype(np.float64)
    return data, _round_half_away(p * 1_000_000 / e, 4)


def _round_half_away(values: np.ndarray, digits: int) -> np.ndarray:
    """Python 2's ``round``: the exact binary value rounded to ``digits`` decimals, halves away from zero
    (numpy rounds halves to even: 0.078125 -> 0.07812, Python 2 -> 0.07813). Once per table entry."""
    quantum = Decimal(1).scaleb(-digits)
    return np.array([float(Decimal(v).quantize(quantum, rounding=ROUND_HALF_UP)) for v in values.tolist()])


def gittins_index(bounds: np.ndarray, index: np.ndarray, attained: np.ndarray) -> np.ndarray:
    """Gittins index of each attained service (Tiresias's ``get_gittins_index``): the table entry of the
    first sampled service above it; 0 beyond the largest sample."""
    attained = np.asarray(attained, dtype=np.float64)
    k = np.searchsorted(bounds, attained, side="right")
    out = np.zeros(attained.shape)
    inside = k < bounds.size
    out[inside] = index[k[inside]]
    return out


class Tiresias:
    """Tiresias's discretized two-dimensional LAS (and its Gittins-index variant), preemptive.

    The policy keeps each job's queue and its place in it between rounds, as
    Tiresias's simulator does (``run_sim.py``, ``dlas_sim_jobs``):

    - a job arrives at the end of queue 0;
    - a running job whose attained GPU-time since its last promotion reaches the
      threshold of its queue moves to the end of the next queue;
    - with ``starvation_factor`` set, a waiting job in a lower queue that has
      waited, since it first ran or was last promoted, at least
      ``starvation_factor`` times its run time since then returns to the end of
      queue 0 with its counters reset (Tiresias's ``solve_starvation``);
    - queues are walked in order; within a queue, jobs keep their order except
      that after every round the jobs that ran move ahead of those that did not
      (both keeping their order), and with ``gittins=True`` each queue is
      sorted by the Gittins index of the job's attained GPU-time (highest
      first; earlier arrival breaks ties).

    Parameters
    ----------
    thresholds_gpu_s : sequence of float, default (3250, 7200)
        GPU-seconds at which a job leaves queue 0, 1, ... (Tiresias's simulator's).
    starvation_factor : float, optional
        Promotion rule above; None (Tiresias's ``dlas-gpu``): no promotion.
    gittins : bool, default False
    service_sample : array-like of int, optional
        Job GPU-times the Gittins index is learned from (default:
        :func:`tiresias_service_sample`).
    gittins_delta_gpu_s : int, default 3250
        Service quantum of the index (Tiresias's ``gittins_delta``).
    faithful_events : bool, default False
        Time queue crossings as Tiresias's simulator does: it schedules a running
        job's next check ``floor((threshold - executed seconds) / GPUs)`` seconds
        ahead (seconds where GPU-seconds are meant), so a job whose GPU-time
        passes its threshold is demoted at the first event (arrival, completion
        or such a check) after that. False: rounds end exactly when a running
        job's GPU-time reaches its threshold.
    """

    name = "tiresias"
    preemptive = True

    def __init__(self, thresholds_gpu_s: Sequence[float] = TIRESIAS_THRESHOLDS_GPU_S,
                 starvation_factor: float | None = None, gittins: bool = False,
                 service_sample: Sequence[int] | np.ndarray | None = None, gittins_delta_gpu_s: int = 3250,
                 faithful_events: bool = False):
        limits = np.asarray(thresholds_gpu_s, dtype=np.float64)
        if limits.ndim != 1 or not np.isfinite(limits).all() or (limits <= 0).any() or (np.diff(limits) < 0).any():
            raise InvalidOptionError(f"tiresias: thresholds_gpu_s must be positive, non-decreasing GPU-seconds, "
                                     f"got {thresholds_gpu_s!r}")
        if starvation_factor is not None and not starvation_factor > 0:
            raise InvalidOptionError(f"tiresias: starvation_factor must be > 0 or None, got {starvation_factor!r}")
        self.thresholds_gpu_s = limits
        self.starvation_factor = starvation_factor
        self.gittins = bool(gittins)
        self.faithful_events = bool(faithful_events)
        if self.gittins:
            self.name = "tiresias_gittins"
            if not gittins_delta_gpu_s > 0:
                raise InvalidOptionError(f"tiresias: gittins_delta_gpu_s must be > 0, got {gittins_delta_gpu_s!r}")
            sample = tiresias_service_sample() if service_sample is None else np.asarray(service_sample)
            if sample.size < 2 or (sample <= 0).any():
                raise InvalidOptionError("tiresias: service_sample needs at least two positive GPU-times")
            self._bounds, self._index = gittins_ranks(sample, gittins_delta_gpu_s)
        size = 0
        self._queue = np.zeros(size, dtype=np.int64)
        self._seq = np.zeros(size)  # place in its queue (smaller: ahead)
        self._base_s = np.zeros(size)  # attained seconds at the last promotion
        self._since_s = np.full(size, np.nan)  # first run or last promotion (start of the pending count)
        self._known = np.zeros(size, dtype=bool)
        self._counter = 0.0

    def _grow(self, n: int) -> None:
        extra = n - self._queue.size
        if extra > 0:
            self._queue = np.concatenate([self._queue, np.zeros(extra, dtype=np.int64)])
            self._seq = np.concatenate([self._seq, np.zeros(extra)])
            self._base_s = np.concatenate([self._base_s, np.zeros(extra)])
            self._since_s = np.concatenate([self._since_s, np.full(extra, np.nan)])
            self._known = np.concatenate([self._known, np.zeros(extra, dtype=bool)])

    def _append(self, rows: np.ndarray) -> None:
        """Put ``rows`` at the end of their queues, in the given order."""
        self._seq[rows] = self._counter + np.arange(1, rows.size + 1)
        self._counter += rows.size

    def executed_gpu_s(self, view: JobView) -> np.ndarray:
        """GPU-seconds each job of the view has run since its last promotion (what its queue depends on)."""
        return (view.attained_s - self._base_s[view.rows]) * view.num_gpus

    def rank(self, view: JobView) -> np.ndarray:
        rows = view.rows
        self._grow(int(rows.max(initial=-1)) + 1)
        # last round's walk: the jobs that ran move ahead of those that did not, each keeping its order
        order = np.lexsort((self._seq[rows], ~view.running))
        self._seq[rows[order]] = np.arange(rows.size) - rows.size
        new = rows[~self._known[rows]]
        self._known[new] = True
        self._queue[new] = 0
        self._append(new)
        # the pending count starts when a job first runs after arriving or after a promotion
        first_run = np.isnan(self._since_s[rows]) & view.running
        self._since_s[rows[first_run]] = view.now_s - (view.attained_s - self._base_s[rows])[first_run]
        last = self.thresholds_gpu_s.size
        executed = self.executed_gpu_s(view)
        queue = self._queue[rows]
        limit = np.append(self.thresholds_gpu_s, np.inf)[queue]
        demote = view.running & (queue < last) & (executed >= limit)
        if demote.any():  # one queue per check, as Tiresias's simulator
            self._queue[rows[demote]] += 1
            self._append(rows[demote])
        if self.starvation_factor is not None:
            ran_s = view.attained_s - self._base_s[rows]
            pending_s = (view.now_s - self._since_s[rows]) - ran_s
            promote = (~view.running & (self._queue[rows] > 0) & (ran_s > 0)
                       & (pending_s >= ran_s * self.starvation_factor))
            if promote.any():
                self._queue[rows[promote]] = 0
                self._base_s[rows[promote]] = view.attained_s[promote]
                self._since_s[rows[promote]] = np.nan
                self._append(rows[promote])
        if not self.gittins:
            return np.vstack([self._queue[rows], self._seq[rows]])
        index = gittins_index(self._bounds, self._index, np.floor(self.executed_gpu_s(view)))
        return np.vstack([self._queue[rows], -index, view.arrival_s, self._seq[rows]])

    def next_change_s(self, view: JobView) -> float:
        """Seconds until the next demotion of a running job or promotion of a waiting one (the Gittins
        index is re-evaluated at every round start, as Tiresias re-evaluates it at every event)."""
        rows = view.rows
        if not rows.size:
            return math.inf
        queue = self._queue[rows]
        executed = self.executed_gpu_s(view)
        limit = np.append(self.thresholds_gpu_s, np.inf)[queue]
        run = view.running
        if self.faithful_events:  # run_sim.py: int(ceil((queue_limit - executed_time) / num_gpu)), Python 2 ints
            executed_s = np.floor(view.attained_s - self._base_s[rows])
            ahead = np.floor((np.where(np.isfinite(limit), limit, 0) - executed_s) / view.num_gpus)
            times = np.where(run & np.isfinite(limit), ahead, np.inf)
        else:
            times = np.where(run & np.isfinite(limit), (limit - executed) / view.num_gpus, np.inf)
        if self.starvation_factor is not None:
            ran_s = view.attained_s - self._base_s[rows]
            pending_s = (view.now_s - self._since_s[rows]) - ran_s
            waits = ~run & (queue > 0) & (ran_s > 0) & np.isfinite(pending_s)
            times = np.minimum(times, np.where(waits, ran_s * self.starvation_factor - pending_s, np.inf))
        times = times[times > 0]
        return float(times.min()) if times.size else math.inf


def tiresias_gittins(**options: Any) -> Tiresias:
    """:class:`Tiresias` with ``gittins=True``."""
    return Tiresias(gittins=True, **options)


#: Order-based policies by name: each a factory taking the policy's options as keywords.
ORDER_POLICIES: dict[str, Any] = {
    "fifo": Fifo, "las": Las, "tiresias": Tiresias, "tiresias_gittins": tiresias_gittins,
    "srtf": Srtf, "sjf": Sjf, "optimus": Optimus,
}


def order_policy(policy: Any, options: Mapping[str, Any] | None = None) -> OrderPolicy | None:
    """The order policy ``policy`` names (or is), with ``options``; None when it is not one.

    A name is one of :data:`ORDER_POLICIES`, optionally prefixed ``order:``; a name
    that is also an allocopt formulation over time fractions (``fifo``) is the
    formulation's unless prefixed (``order:fifo``); one whose formulation allocates
    configurations (``optimus``, over a :class:`~allocopt.GoodputProblem`) is the
    order policy's.

    Raises
    ------
    InvalidOptionError
        Options the policy does not take.
    """
    if isinstance(policy, str):
        from allocopt.formulations import POLICIES
        from allocopt.problem import Problem

        name = policy.removeprefix("order:")
        if name == policy and name in POLICIES and POLICIES[name].problem_type is Problem:
            return None
        factory = ORDER_POLICIES.get(name)
        if factory is None:
            return None
        try:
            return factory(**dict(options or {}))
        except TypeError as err:
            raise InvalidOptionError(f"policy {policy!r}: {err}") from None
    if isinstance(policy, OrderPolicy):
        if options:
            raise InvalidOptionError(f"policy_options {sorted(options)} given with a policy object "
                                     f"({type(policy).__name__}): set them on the object")
        return policy
    return None


__all__ = ["ORDER_POLICIES", "TIRESIAS_THRESHOLDS_GPU_S", "Fifo", "JobView", "Las", "Optimus", "OrderPolicy", "Sjf",
           "Srtf",
           "Tiresias", "gittins_index", "gittins_ranks", "order_policy", "tiresias_gittins",
           "tiresias_service_sample"]
