"""Gavel's round-based priority mechanism, vectorized over jobs.

Each round, job ``i`` on GPU type ``j`` gets priority
``X[i, j] / (received[i, j] / received[:, j].sum())``: its allocated time
fraction over the share of that type's time it has received since the last
reset. GPU types are visited one at a time; each type's (job, type) entries
are walked in descending ``(priority, deficit, X)`` and a job gets its
``scale_factor`` GPUs of the type while enough are free. A job runs on at most
one type per round. Entries of priority 0 (no allocation on the type) come
last and fill otherwise idle GPUs, so the mechanism is work-conserving. As in
Gavel, a job that arrived after the last recompute (no allocation at all yet)
takes its place in the walk at priority 0 but does not run until the next
recompute (``run_unallocated=False``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from allocopt.errors import InvalidOptionError

#: Priority of an entry that has received no time yet: larger than any finite priority, ordered by X.
UNSERVED_PRIORITY_SCALE = 1e9


@dataclass(frozen=True)
class MechanismOptions:
    """Options of the priority mechanism; the defaults are Gavel's published ones.

    Attributes
    ----------
    round_seconds : float, default 360
        Length of a round, in seconds.
    recompute_min_seconds : float, default 1920
        The allocation is recomputed when jobs arrive or leave, at most once per
        this many seconds (the first computation happens at once).
    initial_received_rounds : float, default 0.5
        Received-time counters start at this many rounds for every (job, type).
    type_order : {"fastest_first", "random"} or sequence of str, default "fastest_first"
        Order in which GPU types are visited each round: by descending mean
        throughput, a seeded random order drawn every round (Gavel's choice for
        heterogeneity-agnostic policies), or the given type names.
    seed : int, default 0
        Seed of the random type order. The draw is Gavel's: the fastest-first
        list of the types with GPUs, shuffled each round by Python's
        ``random.Random(seed + 5)``, so a seed gives the orders of Gavel's
        ``--seed``.
    work_conserving : bool, default True
        Let entries of priority 0 (no allocation on the type) fill GPUs left
        idle, as Gavel does; False runs only allocated entries (Gavel's FIFO
        policies).
    run_unallocated : bool, default False
        Whether a job that arrived after the last recompute runs before it has
        an allocation. Gavel's (False): such a job is walked at priority 0 and
        takes its GPUs in the greedy fill, but is not placed, so they stay idle
        for the round; True lets it run there.
    """

    round_seconds: float = 360.0
    recompute_min_seconds: float = 1920.0
    initial_received_rounds: float = 0.5
    type_order: str | Sequence[str] = "fastest_first"
    seed: int = 0
    work_conserving: bool = True
    run_unallocated: bool = False

    def __post_init__(self) -> None:
        if not self.round_seconds > 0:
            raise InvalidOptionError(f"round_seconds must be > 0, got {self.round_seconds!r}")
        if not self.recompute_min_seconds >= 0:
            raise InvalidOptionError(f"recompute_min_seconds must be >= 0, got {self.recompute_min_seconds!r}")
        if not self.initial_received_rounds >= 0:
            raise InvalidOptionError(f"initial_received_rounds must be >= 0, got {self.initial_received_rounds!r}")
        if isinstance(self.type_order, str) and self.type_order not in ("fastest_first", "random"):
            raise InvalidOptionError(f"type_order must be 'fastest_first', 'random' or a list of GPU types, "
                                     f"got {self.type_order!r}")


def priorities(allocation: np.ndarray, received_s: np.ndarray, throughputs: np.ndarray) -> np.ndarray:
    """Priority of each (job, type) entry.

    Parameters
    ----------
    allocation : ndarray of shape (n_jobs, n_gpu_types)
        Allocated time fractions ``X``.
    received_s : ndarray of shape (n_jobs, n_gpu_types)
        Seconds each job has run on each type since the last reset.
    throughputs : ndarray of shape (n_jobs, n_gpu_types)
        Steps/s; entries with 0 get priority 0.

    Returns
    -------
    ndarray of shape (n_jobs, n_gpu_types)
        ``X / (received / received.sum(axis=0))``; ``X * 1e9`` (above every finite
        priority, ordered by X) where nothing was received; 0 where X or the
        throughput is 0.
    """
    total = received_s.sum(axis=0)
    share = np.divide(received_s, total, out=np.zeros_like(received_s, dtype=np.float64), where=total > 0)
    served = share > 0
    prio = np.where(served, allocation / np.where(served, share, 1.0), allocation * UNSERVED_PRIORITY_SCALE)
    prio[(allocation <= 0) | (throughputs <= 0)] = 0.0
    return prio


def greedy_fill(sizes: np.ndarray, capacity: int) -> np.ndarray:
    """Which entries a sequential walk accepts: each entry, in order, is taken when its size fits.

    Vectorized: each pass accepts the longest prefix that fits (cumulative sum),
    then drops the first rejected entry and every entry larger than what is left.

    Parameters
    ----------
    sizes : ndarray of int of shape (n,)
        GPUs each entry needs, in walk order.
    capacity : int
        Free GPUs.

    Returns
    -------
    ndarray of bool of shape (n,)
    """
    taken = np.zeros(sizes.size, dtype=bool)
    idx = np.arange(sizes.size)
    free = int(capacity)
    while free > 0 and idx.size:
        idx = idx[sizes[idx] <= free]
        if not idx.size:
            break
        used = np.cumsum(sizes[idx])
        stop = int(np.searchsorted(used, free, side="right"))
        taken[idx[:stop]] = True
        if stop:
            free -= int(used[stop - 1])
        idx = idx[stop + 1:]
    return taken


def select_jobs(priority: np.ndarray, deficit: np.ndarray, allocation: np.ndarray, throughputs: np.ndarray,
                scale_factors: np.ndarray, capacity: np.ndarray, type_order: Sequence[int], *,
                work_conserving: bool = True) -> np.ndarray:
    """The GPU type each job runs on this round (-1: none).

    Types are visited in ``type_order``; each type's entries are sorted by
    ``(priority, deficit, allocation)`` descending (stable in job order) and
    filled greedily (:func:`greedy_fill`). Jobs already placed on an earlier
    type and entries with zero throughput are skipped.

    Parameters
    ----------
    priority, deficit, allocation, throughputs : ndarray of shape (n_jobs, n_gpu_types)
        ``deficit`` in seconds, ``throughputs`` in steps/s.
    scale_factors : ndarray of int of shape (n_jobs,)
    capacity : ndarray of int of shape (n_gpu_types,)
        GPUs of each type.
    type_order : sequence of int
        Column indices, in visiting order.
    work_conserving : bool, default True
        Also walk entries of priority 0 (they come last); False skips them.

    Returns
    -------
    ndarray of int of shape (n_jobs,)
    """
    chosen = np.full(priority.shape[0], -1, dtype=np.int64)
    for j in type_order:
        ok = (chosen < 0) & (throughputs[:, j] > 0) & (scale_factors <= capacity[j])
        cand = np.flatnonzero(ok if work_conserving else ok & (priority[:, j] > 0))
        order = cand[np.lexsort((-allocation[cand, j], -deficit[cand, j], -priority[cand, j]))]
        chosen[order[greedy_fill(scale_factors[order], int(capacity[j]))]] = j
    return chosen


class PriorityMechanism:
    """State of the mechanism over a fixed set of jobs (rows), of which some are active.

    Parameters
    ----------
    throughputs : ndarray of shape (n_jobs, n_gpu_types)
        Steps/s of every job that will ever be active, on each type.
    scale_factors : ndarray of int of shape (n_jobs,)
    capacity : ndarray of int of shape (n_gpu_types,)
    gpu_types : sequence of str
    options : MechanismOptions

    Attributes
    ----------
    allocation : ndarray of shape (n_jobs, n_gpu_types)
        Current target time fractions (0 for jobs without an allocation).
    received_s : ndarray of shape (n_jobs, n_gpu_types)
        Seconds received since the last reset (starting at ``initial_received_rounds`` rounds).
    deficit_s : ndarray of shape (n_jobs, n_gpu_types)
        ``X * elapsed - received``, accumulated over past resets, in seconds.
    allocated : ndarray of bool of shape (n_jobs,)
        Whether each job was active at the last recompute (has an allocation).
    last_reset_s : float or None
        Time of the last recompute.
    """

    def __init__(self, throughputs: np.ndarray, scale_factors: np.ndarray, capacity: np.ndarray,
                 gpu_types: Sequence[str], options: MechanismOptions = MechanismOptions()):
        self.throughputs = np.asarray(throughputs, dtype=np.float64)
        self.scale_factors = np.asarray(scale_factors, dtype=np.int64)
        self.capacity = np.asarray(capacity, dtype=np.int64)
        self.options = options
        n, k = self.throughputs.shape
        self.allocation = np.zeros((n, k))
        self.received_s = np.zeros((n, k))
        self.deficit_s = np.zeros((n, k))
        self.allocated = np.zeros(n, dtype=bool)
        self.last_reset_s: float | None = None
        self._shuffler = random.Random(options.seed + 5)
        if isinstance(options.type_order, str):
            self._order = np.argsort(-self.throughputs.mean(axis=0), kind="stable") if n else np.arange(k)
        else:
            names = list(gpu_types)
            unknown = [t for t in options.type_order if t not in names]
            if unknown or len(set(options.type_order)) != len(options.type_order):
                raise InvalidOptionError(f"type_order {list(options.type_order)} must list distinct GPU types "
                                         f"of the cluster {names}")
            self._order = np.array([names.index(t) for t in options.type_order], dtype=np.int64)

    @property
    def initial_received_s(self) -> float:
        return self.options.initial_received_rounds * self.options.round_seconds

    def add_jobs(self, jobs: np.ndarray) -> None:
        """Start the counters of newly arrived ``jobs`` (row indices); they have no allocation yet."""
        self.received_s[jobs] = self.initial_received_s
        self.allocation[jobs] = 0.0
        self.deficit_s[jobs] = 0.0
        self.allocated[jobs] = False

    def remove_jobs(self, jobs: np.ndarray) -> None:
        """Forget finished ``jobs`` (row indices)."""
        self.received_s[jobs] = 0.0
        self.allocation[jobs] = 0.0
        self.deficit_s[jobs] = 0.0
        self.allocated[jobs] = False

    def recompute_due(self, now_s: float) -> bool:
        """Whether a recompute may happen now: ``recompute_min_seconds`` since the last one.

        As in Gavel, whose throttle tests ``last_reset_time == 0``, recomputes at
        time 0 do not start the throttle: the first one at a later time does.
        """
        return (not self.last_reset_s  # None, or only recomputed at time 0
                or now_s - self.last_reset_s >= self.options.recompute_min_seconds)

    def reset(self, now_s: float, active: np.ndarray, allocation: np.ndarray) -> None:
        """Install a new allocation for ``active`` rows; carry the deficit over and restart the counters.

        Parameters
        ----------
        now_s : float
        active : ndarray of int of shape (m,)
        allocation : ndarray of shape (m, n_gpu_types)
        """
        if self.last_reset_s is not None:
            elapsed = now_s - self.last_reset_s
            got = self.received_s[active] - self.initial_received_s
            self.deficit_s[active] += self.allocation[active] * elapsed - got
        self.allocation[active] = allocation
        self.received_s[active] = self.initial_received_s
        self.allocated[active] = True
        self.last_reset_s = now_s

    def type_order(self) -> np.ndarray:
        """This round's visiting order of the GPU types (column indices)."""
        if self.options.type_order == "random":
            order = [j for j in self._order.tolist() if self.capacity[j] > 0]
            self._shuffler.shuffle(order)
            return np.array(order, dtype=np.int64)
        return self._order

    def select(self, active: np.ndarray) -> np.ndarray:
        """The type each of ``active`` (row indices) runs on this round (-1: none), shape (m,)."""
        X, T = self.allocation[active], self.throughputs[active]
        prio = priorities(X, self.received_s[active], T)
        chosen = select_jobs(prio, self.deficit_s[active], X, T, self.scale_factors[active], self.capacity,
                             self.type_order(), work_conserving=self.options.work_conserving)
        if not self.options.run_unallocated:
            chosen[~self.allocated[active]] = -1
        return chosen

    def record(self, jobs: np.ndarray, gpu_types: np.ndarray, seconds: np.ndarray) -> None:
        """Add ``seconds`` of run time of ``jobs`` on ``gpu_types`` (column indices) to the counters."""
        np.add.at(self.received_s, (jobs, gpu_types), seconds)


__all__ = ["MechanismOptions", "PriorityMechanism", "UNSERVED_PRIORITY_SCALE", "greedy_fill", "priorities",
           "select_jobs"]
