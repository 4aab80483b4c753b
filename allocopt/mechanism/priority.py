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
    time_zero_recomputes_free : bool, default True
        Gavel's throttle tests ``last_reset_time == 0``, so recomputes at time 0
        do not start it (the first one at a later time does); False throttles
        from the first recompute whenever it happens.
    deficit_in_priority : bool, default False
        Count the deficit carried over from earlier recomputes as time still
        owed: priorities use ``received - deficit`` (an entry owed more than it
        received ranks with the unserved). Gavel's (False) uses the deficit
        only to break ties, so with a recompute every round (counters reset
        each time) a job whose time fraction is a hair below an equal job's
        never runs; True lets long-run shares follow the allocation however
        often it is recomputed.
    pair_finishes_at_lease_end : bool, default False
        When the time a co-located job finishes is recorded. False: when its
        own steps are done. Gavel's simulator (True): when its pair's lease
        ends, i.e. when the later of the two members stops (at the latest the
        round's end), so a job that completes early next to a partner still
        running is reported finished with its partner. :func:`allocopt.simulate`
        sets it for Gavel's policy names.
    running_type_totals : bool, default False
        The total a job's received time is divided by on each type. False: the
        sum of the active entries' counters. True (Gavel's): a running total,
        restarted at each recompute at the initial counters of the entries
        then (jobs and pairs) and growing by every second credited since, in
        the order Gavel's simulator credits them (the latest-ending lease
        first; ties by job, single jobs before pairs); a job that leaves keeps
        its seconds in it. The total scales every priority of a type alike, so
        the two differ only in the last bits, which decide Gavel's ties between
        entries with equal shares. :func:`allocopt.simulate` sets it for
        Gavel's policy names.
    """

    round_seconds: float = 360.0
    recompute_min_seconds: float = 1920.0
    initial_received_rounds: float = 0.5
    type_order: str | Sequence[str] = "fastest_first"
    seed: int = 0
    work_conserving: bool = True
    run_unallocated: bool = False
    time_zero_recomputes_free: bool = True
    deficit_in_priority: bool = False
    pair_finishes_at_lease_end: bool = False
    running_type_totals: bool = False

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


def priorities(allocation: np.ndarray, received_s: np.ndarray, throughputs: np.ndarray,
               total_s: np.ndarray | None = None) -> np.ndarray:
    """Priority of each (job, type) entry.

    Parameters
    ----------
    allocation : ndarray of shape (n_jobs, n_gpu_types)
        Allocated time fractions ``X``.
    received_s : ndarray of shape (n_jobs, n_gpu_types)
        Seconds each job has run on each type since the last reset.
    throughputs : ndarray of shape (n_jobs, n_gpu_types)
        Steps/s; entries with 0 get priority 0.
    total_s : ndarray of shape (n_gpu_types,), optional
        The received time of each type the shares are taken of (default: ``received_s.sum(axis=0)``;
        see ``MechanismOptions.running_type_totals``).

    Returns
    -------
    ndarray of shape (n_jobs, n_gpu_types)
        ``X / (received / received.sum(axis=0))``; ``X * 1e9`` (above every finite
        priority, ordered by X) where nothing was received; 0 where X or the
        throughput is 0.
    """
    total = received_s.sum(axis=0) if total_s is None else total_s
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


def quota_fill(sizes: np.ndarray, tenant_of: np.ndarray, capacity: int, left: np.ndarray) -> np.ndarray:
    """Which entries a sequential walk accepts when each entry, in order, is taken if its size fits both the
    free GPUs and what its tenant has left of its quota (``left``, updated in place).

    Vectorized like :func:`greedy_fill`: each pass accepts the longest prefix
    whose running totals fit (overall and per tenant), then rejects the first entry that does not.

    Parameters
    ----------
    sizes : ndarray of int of shape (n,)
        GPUs each entry needs, in walk order.
    tenant_of : ndarray of int of shape (n,)
        Tenant of each entry.
    capacity : int
        Free GPUs.
    left : ndarray of shape (n_tenants,)
        GPUs each tenant may still take (``inf``: no quota); decreased by what is taken.

    Returns
    -------
    ndarray of bool of shape (n,)
    """
    taken = np.zeros(sizes.size, dtype=bool)
    idx = np.arange(sizes.size)
    free = int(capacity)
    while free > 0 and idx.size:
        idx = idx[(sizes[idx] <= free) & (sizes[idx] <= left[tenant_of[idx]])]
        if not idx.size:
            break
        s, t = sizes[idx], tenant_of[idx]
        used = np.cumsum(s)
        order = np.argsort(t, kind="stable")  # running total of each entry's tenant, in walk order
        running = np.empty(idx.size, dtype=np.int64)
        sorted_used = np.cumsum(s[order])
        group_start = np.r_[True, t[order][1:] != t[order][:-1]]
        base = np.maximum.accumulate(np.where(group_start, sorted_used - s[order], 0))
        running[order] = sorted_used - base
        fits = (used <= free) & (running <= left[t])
        stop = int(np.argmin(fits)) if not fits.all() else idx.size
        accepted = idx[:stop]
        taken[accepted] = True
        if stop:
            free -= int(used[stop - 1])
            np.subtract.at(left, tenant_of[accepted], sizes[accepted])
        idx = idx[stop + 1:]
    return taken


def select_jobs(priority: np.ndarray, deficit: np.ndarray, allocation: np.ndarray, throughputs: np.ndarray,
                scale_factors: np.ndarray, capacity: np.ndarray, type_order: Sequence[int], *,
                work_conserving: bool = True, tenant_of: np.ndarray | None = None,
                gpu_quotas: np.ndarray | None = None) -> np.ndarray:
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
    tenant_of : ndarray of int of shape (n_jobs,), optional
        Tenant of each job, with ``gpu_quotas``.
    gpu_quotas : ndarray of shape (n_tenants,), optional
        Most GPUs (all types together) each tenant's jobs take this round (``inf``: no quota); a job
        whose tenant would exceed it is skipped (:func:`quota_fill`).

    Returns
    -------
    ndarray of int of shape (n_jobs,)
    """
    chosen = np.full(priority.shape[0], -1, dtype=np.int64)
    left = None if gpu_quotas is None else np.asarray(gpu_quotas, dtype=np.float64).copy()
    for j in type_order:
        ok = (chosen < 0) & (throughputs[:, j] > 0) & (scale_factors <= capacity[j])
        cand = np.flatnonzero(ok if work_conserving else ok & (priority[:, j] > 0))
        order = cand[np.lexsort((-allocation[cand, j], -deficit[cand, j], -priority[cand, j]))]
        if left is None:
            chosen[order[greedy_fill(scale_factors[order], int(capacity[j]))]] = j
        else:
            chosen[order[quota_fill(scale_factors[order], tenant_of[order], int(capacity[j]), left)]] = j
    return chosen


def select_entries(priority: np.ndarray, deficit: np.ndarray, allocation: np.ndarray, runnable: np.ndarray,
                   sizes: np.ndarray, members: np.ndarray, capacity: np.ndarray, type_order: Sequence[int], *,
                   work_conserving: bool = True) -> np.ndarray:
    """The GPU type each entry (a job, or a pair of jobs sharing GPUs) runs on this round (-1: none).

    Like :func:`select_jobs` over entries that may share jobs: types are visited
    in ``type_order``, each type's entries sorted by ``(priority, deficit,
    allocation)`` descending (stable in entry order) and taken while their GPUs
    are free, skipping an entry whose job (either member of a pair) already
    runs this round. The walk is sequential (an entry's eligibility depends on
    the entries taken before it), vectorized per type up to the loop over the
    sorted candidates, which stops when the type is full.

    Parameters
    ----------
    priority, deficit, allocation : ndarray of shape (n_entries, n_gpu_types)
    runnable : ndarray of bool of shape (n_entries, n_gpu_types)
        The entry (both members of a pair) has positive throughput on the type.
    sizes : ndarray of int of shape (n_entries,)
        GPUs of each entry (a pair uses its members' common scale factor once).
    members : ndarray of int of shape (n_entries, 2)
        Job indices of each entry; -1 in the second column for a single job.
    capacity : ndarray of int of shape (n_gpu_types,)
    type_order : sequence of int
    work_conserving : bool, default True

    Returns
    -------
    ndarray of int of shape (n_entries,)
    """
    chosen = np.full(priority.shape[0], -1, dtype=np.int64)
    busy = np.zeros(int(members.max(initial=-1)) + 2, dtype=bool)  # job -> runs this round (last slot: -1)
    for j in type_order:
        ok = runnable[:, j] & (sizes <= capacity[j]) & ~busy[members].any(axis=1)
        cand = np.flatnonzero(ok if work_conserving else ok & (priority[:, j] > 0))
        order = cand[np.lexsort((-allocation[cand, j], -deficit[cand, j], -priority[cand, j]))]
        free = int(capacity[j])
        for e in order.tolist():
            if free == 0:
                break
            if sizes[e] > free or busy[members[e]].any():
                continue
            chosen[e] = j
            busy[members[e]] = True
            busy[-1] = False
            free -= int(sizes[e])
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
    tenant_of : ndarray of int of shape (n_jobs,) or None
        Tenant of each job, when tenants have GPU quotas (:meth:`set_quotas`).
    gpu_quotas : ndarray of shape (n_tenants,) or None
        Most GPUs each tenant's jobs hold in a round (``inf``: no quota).
    pairs : ndarray of int of shape (n_pairs, 2)
        Under space sharing, the pairs of jobs (rows) of the last recompute
        whose members are both still active, with their own
        ``pair_allocation``, ``pair_received_s``, ``pair_deficit_s`` (shape
        (n_pairs, n_gpu_types)) and ``pair_throughputs`` (shape (n_pairs,
        n_gpu_types, 2), steps/s of each member).
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
        self.pairs = np.zeros((0, 2), dtype=np.int64)
        self.pair_allocation = np.zeros((0, k))
        self.pair_received_s = np.zeros((0, k))
        self.pair_deficit_s = np.zeros((0, k))
        self.pair_throughputs = np.zeros((0, k, 2))
        self.type_received_s = np.zeros(k)  # running totals (MechanismOptions.running_type_totals)
        self.tenant_of: np.ndarray | None = None
        self.gpu_quotas: np.ndarray | None = None
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

    def set_quotas(self, tenant_of: np.ndarray, gpu_quotas: np.ndarray) -> None:
        """Enforce tenants' GPU quotas in :meth:`select`: ``tenant_of`` (shape (n_jobs,)) gives each job's
        tenant, ``gpu_quotas`` (shape (n_tenants,), GPUs, ``inf``: none) the most each tenant's jobs hold."""
        if self.pairs.size:
            raise InvalidOptionError("tenant GPU quotas do not apply to co-located pairs (space sharing)")
        self.tenant_of = np.asarray(tenant_of, dtype=np.int64)
        self.gpu_quotas = np.asarray(gpu_quotas, dtype=np.float64)

    @property
    def initial_received_s(self) -> float:
        """Seconds every received-time counter starts at."""
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
        if self.pairs.size:
            self._keep_pairs(~np.isin(self.pairs, jobs).any(axis=1))

    def _keep_pairs(self, keep: np.ndarray) -> None:
        self.pairs, self.pair_allocation = self.pairs[keep], self.pair_allocation[keep]
        self.pair_received_s, self.pair_deficit_s = self.pair_received_s[keep], self.pair_deficit_s[keep]
        self.pair_throughputs = self.pair_throughputs[keep]

    def recompute_due(self, now_s: float) -> bool:
        """Whether a recompute may happen now: ``recompute_min_seconds`` since the last one
        (see ``MechanismOptions.time_zero_recomputes_free``)."""
        never = self.last_reset_s is None or (self.options.time_zero_recomputes_free and self.last_reset_s == 0)
        return never or now_s - self.last_reset_s >= self.options.recompute_min_seconds

    def reset(self, now_s: float, active: np.ndarray, allocation: np.ndarray, pairs: np.ndarray | None = None,
              pair_allocation: np.ndarray | None = None, pair_throughputs: np.ndarray | None = None) -> None:
        """Install a new allocation for ``active`` rows; carry the deficit over and restart the counters.

        Parameters
        ----------
        now_s : float
        active : ndarray of int of shape (m,)
        allocation : ndarray of shape (m, n_gpu_types)
        pairs : ndarray of int of shape (p, 2), optional
            Under space sharing, the candidate pairs (rows, ``a < b``); they
            replace the previous pairs. A pair kept from the previous recompute
            carries its deficit over; a new pair starts with a deficit of the
            initial counter (Gavel starts a pair's counter at 0, not at the
            initial half round, and credits the difference at its first reset).
        pair_allocation : ndarray of shape (p, n_gpu_types), optional
        pair_throughputs : ndarray of shape (p, n_gpu_types, 2), optional
        """
        elapsed = now_s - self.last_reset_s if self.last_reset_s is not None else 0.0
        if self.last_reset_s is not None:
            got = self.received_s[active] - self.initial_received_s
            self.deficit_s[active] += self.allocation[active] * elapsed - got
        self.allocation[active] = allocation
        self.received_s[active] = self.initial_received_s
        self.allocated[active] = True
        self.last_reset_s = now_s
        if pairs is not None:
            self._reset_pairs(pairs, pair_allocation, pair_throughputs, elapsed)
        # Gavel's running totals restart at the initial counter of every entry, jobs and pairs
        self.type_received_s[:] = self.initial_received_s * (np.asarray(active).size + self.pairs.shape[0])

    def _reset_pairs(self, pairs: np.ndarray, pair_allocation: np.ndarray | None,
                     pair_throughputs: np.ndarray | None, elapsed: float) -> None:
        pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        n = self.throughputs.shape[0]
        deficit = np.full((pairs.shape[0], self.throughputs.shape[1]), self.initial_received_s)
        if self.pairs.size:
            old = self.pairs[:, 0] * n + self.pairs[:, 1]
            old_deficit = (self.pair_deficit_s + self.pair_allocation * elapsed
                           - (self.pair_received_s - self.initial_received_s))
            order = np.argsort(old)
            keys = pairs[:, 0] * n + pairs[:, 1]
            slot = np.minimum(np.searchsorted(old[order], keys), old.size - 1)
            found = old[order][slot] == keys
            deficit[found] = old_deficit[order][slot[found]]
        self.pairs, self.pair_deficit_s = pairs, deficit
        self.pair_allocation = np.asarray(pair_allocation, dtype=np.float64).reshape(deficit.shape)
        self.pair_throughputs = np.asarray(pair_throughputs, dtype=np.float64).reshape(*deficit.shape, 2)
        self.pair_received_s = np.full(deficit.shape, self.initial_received_s)

    def credit_totals(self, gpu_types: np.ndarray, seconds: np.ndarray) -> None:
        """Add ``seconds`` credited on ``gpu_types`` (column indices) to the running totals, in the
        order given (``MechanismOptions.running_type_totals``)."""
        np.add.at(self.type_received_s, gpu_types, seconds)

    def _totals(self) -> np.ndarray | None:
        return self.type_received_s if self.options.running_type_totals else None

    def type_order(self) -> np.ndarray:
        """This round's visiting order of the GPU types (column indices)."""
        if self.options.type_order == "random":
            order = [j for j in self._order.tolist() if self.capacity[j] > 0]
            self._shuffler.shuffle(order)
            return np.array(order, dtype=np.int64)
        return self._order

    def _owed(self, received_s: np.ndarray, deficit_s: np.ndarray) -> np.ndarray:
        """The received time priorities use (see ``MechanismOptions.deficit_in_priority``)."""
        if not self.options.deficit_in_priority:
            return received_s
        return np.maximum(received_s - deficit_s, 0.0)

    def select(self, active: np.ndarray) -> np.ndarray:
        """The type each of ``active`` (row indices) runs on this round (-1: none), shape (m,)."""
        X, T = self.allocation[active], self.throughputs[active]
        prio = priorities(X, self._owed(self.received_s[active], self.deficit_s[active]), T, self._totals())
        tenants = None if self.tenant_of is None else self.tenant_of[active]
        chosen = select_jobs(prio, self.deficit_s[active], X, T, self.scale_factors[active], self.capacity,
                             self.type_order(), work_conserving=self.options.work_conserving, tenant_of=tenants,
                             gpu_quotas=self.gpu_quotas)
        if not self.options.run_unallocated:
            chosen[~self.allocated[active]] = -1
        return chosen

    def select_with_pairs(self, active: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This round's choice among the ``active`` jobs and the current pairs.

        Returns
        -------
        single_types : ndarray of int of shape (m,)
            Type each of ``active`` runs on alone (-1: none).
        pair_index : ndarray of int of shape (q,)
            Indices into :attr:`pairs` of the pairs that run.
        pair_types : ndarray of int of shape (q,)
            Type each of those runs on.
        """
        m = active.size
        X = np.concatenate([self.allocation[active], self.pair_allocation])
        received = np.concatenate([self.received_s[active], self.pair_received_s])
        runnable = np.concatenate([self.throughputs[active] > 0, (self.pair_throughputs > 0).all(axis=2)])
        position = np.full(self.throughputs.shape[0], -1, dtype=np.int64)
        position[active] = np.arange(m)
        members = np.concatenate([np.column_stack([np.arange(m), np.full(m, -1)]), position[self.pairs]])
        # Gavel's entry order: job b, then its pairs (a, b) with earlier jobs a, then job b + 1, ...
        last = np.concatenate([active, self.pairs[:, 1]])
        first = np.concatenate([np.full(m, -1), self.pairs[:, 0]])
        order = np.lexsort((first, last))
        deficit = np.concatenate([self.deficit_s[active], self.pair_deficit_s])
        prio = priorities(X, self._owed(received, deficit), runnable.astype(np.float64), self._totals())
        sizes = np.concatenate([self.scale_factors[active], self.scale_factors[self.pairs[:, 0]]])
        chosen = np.full(order.size, -1, dtype=np.int64)
        chosen[order] = select_entries(prio[order], deficit[order], X[order], runnable[order], sizes[order],
                                       members[order], self.capacity, self.type_order(),
                                       work_conserving=self.options.work_conserving)
        single = chosen[:m]
        if not self.options.run_unallocated:
            single[~self.allocated[active]] = -1
        pair_index = np.flatnonzero(chosen[m:] >= 0)
        return single, pair_index, chosen[m:][pair_index]

    def record(self, jobs: np.ndarray, gpu_types: np.ndarray, seconds: np.ndarray) -> None:
        """Add ``seconds`` of run time of ``jobs`` on ``gpu_types`` (column indices) to the counters."""
        np.add.at(self.received_s, (jobs, gpu_types), seconds)

    def record_pairs(self, pairs: np.ndarray, gpu_types: np.ndarray, seconds: np.ndarray) -> None:
        """Add ``seconds`` (the longer member's run time) to the counters of ``pairs`` (rows of :attr:`pairs`)."""
        np.add.at(self.pair_received_s, (pairs, gpu_types), seconds)


__all__ = ["MechanismOptions", "PriorityMechanism", "UNSERVED_PRIORITY_SCALE", "greedy_fill", "priorities", "quota_fill",
           "select_entries", "select_jobs"]
