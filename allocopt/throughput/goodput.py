"""The Pollux goodput model (reused by Sia): fitted throughput x statistical efficiency.

A data-parallel job runs ``K`` replicas on ``N`` nodes; each replica processes
``s + 1`` micro-batches of ``m`` samples per iteration (``s`` gradient
accumulation steps), so the global batch is ``M = K m (s + 1)`` samples.
With :class:`PerfParams` (all times in seconds)::

    T_acc  = alpha_c + beta_c * m                                  compute time of one micro-batch
    T_net  = 0                                         if K == 1
           = alpha_n + beta_n * max(K - 2, 0)          if N > 1   (across nodes)
           = alpha_r + beta_r * max(K - 2, 0)          otherwise  (within one node)
    T_sync = (T_acc ** gamma + T_net ** gamma) ** (1 / gamma)      last micro-batch overlapped with all-reduce
    T_iter = s * T_acc + T_sync
    throughput = M / T_iter                                        samples/s

``gamma`` in [1, 10] is the degree of overlap of computation and
synchronization (1: none, T_sync = T_acc + T_net; 10: about max(T_acc, T_net)).

Statistical efficiency follows the gradient noise scale: with
:class:`GradParams` ``(sqr, var)`` measured at the initial batch size ``M0``,
``phi = M0 * var / sqr`` and ``efficiency(M) = (phi + M0) / (phi + M)``: the
progress one sample makes at batch size ``M`` relative to one sample at
``M0``. Goodput = throughput x efficiency, in samples/s at ``M0``-equivalent
progress. :class:`GoodputModel` picks the goodput-optimal batch size and
accumulation steps of a configuration under a memory limit (largest
micro-batch per GPU), and :func:`goodput_matrix` evaluates every job in every
configuration of a :class:`~allocopt.configurations.Configurations` at once,
the ``goodput`` input of :class:`~allocopt.goodput_problem.GoodputProblem`.

References: Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for
Goodput-Optimized Deep Learning", OSDI 2021 (``adaptdl/goodput.py`` of
petuum/adaptdl); Jayaram Subramanya et al., "Sia: Heterogeneity-aware,
goodput-optimized ML-cluster scheduling", SOSP 2023.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass, field
from numbers import Real
from typing import Any

import numpy as np

from allocopt.configurations import Configurations
from allocopt.errors import InvalidOptionError, InvalidProblemError

#: Lower bound of every time parameter (seconds); Pollux's slack that keeps logs finite.
PARAM_FLOOR_S = 1e-8
#: Bounds of the overlap exponent ``gamma``.
GAMMA_BOUNDS = (1.0, 10.0)
#: Losses of :func:`fit_perf_params`: Pollux's RMSE, or the outlier-robust Cauchy (Lorentzian) loss.
LOSSES = ("rmse", "cauchy")
#: Default loss: lower held-out error than RMSE on Sia's profiles, whose step times have outliers.
DEFAULT_LOSS = "cauchy"
#: Default Cauchy scale: log-time residual (about 5% relative error) beyond which a point counts less.
DEFAULT_LOSS_SCALE = 0.05
#: Candidate global batch sizes searched per configuration (Pollux samples 50, geometrically spaced).
DEFAULT_CANDIDATES = 50

_EPS = 1e-8  # tolerance of floor/ceil on batch sizes (Pollux's)
_REG_GAMMA = 1e-3  # pull gamma towards 1: easier to fit alpha and beta
_REG_RETRO = 1e-2  # penalize retrogression beta / alpha: prefer an optimistic model
_DEFAULT_START = (1e-1, 1e-2, 1e-1, 1e-2, 1e-1, 1e-2, 1.0 + 1e-3)  # Pollux's initial parameters
_MAX_EVALUATIONS = 1000  # objective evaluations per fit
_CEILING = 1e3  # upper bound of every time parameter, times the longest observed iteration
_CHUNK = 1 << 20  # elements per block in the vectorized batch-size search


@dataclass(frozen=True)
class PerfParams:
    """Parameters of the throughput model; every ``alpha``/``beta`` is in seconds.

    Attributes
    ----------
    alpha_c, beta_c : float
        Compute time of one micro-batch of ``m`` samples: ``alpha_c + beta_c * m`` (s, s/sample).
    alpha_n, beta_n : float
        All-reduce time across nodes: ``alpha_n + beta_n * max(K - 2, 0)`` for ``K`` replicas (s).
    alpha_r, beta_r : float
        The same within one node (s).
    gamma : float
        Overlap of compute and synchronization, in [1, 10].
    """

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float

    def __post_init__(self) -> None:
        values = astuple(self)
        if not all(np.isfinite(values)) or min(values[:6]) < 0 or self.gamma < 1:
            raise InvalidProblemError(f"invalid {self!r}: times must be finite and >= 0 and gamma >= 1",
                                      field="perf_params")

    def scaled(self, factor: float) -> PerfParams:
        """Every time parameter multiplied by ``factor`` (a GPU ``1 / factor`` times as fast)."""
        return PerfParams(*(v * factor for v in astuple(self)[:6]), self.gamma)

    def compute_time(self, micro_bsz: Any) -> np.ndarray:
        """Compute time of one micro-batch of ``micro_bsz`` samples (s)."""
        return self.alpha_c + self.beta_c * np.asarray(micro_bsz, dtype=np.float64)

    def network_time(self, num_nodes: Any, num_replicas: Any) -> np.ndarray:
        """All-reduce time of ``num_replicas`` replicas on ``num_nodes`` nodes (s); 0 for one replica."""
        nodes, replicas = np.broadcast_arrays(np.asarray(num_nodes), np.asarray(num_replicas, dtype=np.float64))
        retro = np.maximum(replicas - 2, 0)
        return np.where(replicas <= 1, 0.0, np.where(nodes > 1, self.alpha_n + self.beta_n * retro,
                                                      self.alpha_r + self.beta_r * retro))

    def iter_time(self, num_nodes: Any, num_replicas: Any, micro_bsz: Any, accum_steps: Any = 0) -> np.ndarray:
        """Time of one iteration, ``s * T_acc + T_sync`` (s), broadcast over the arguments."""
        t_acc = self.compute_time(micro_bsz)
        return np.asarray(accum_steps) * t_acc + _sync_time(t_acc, self.network_time(num_nodes, num_replicas),
                                                            self.gamma)

    def throughput(self, num_nodes: Any, num_replicas: Any, micro_bsz: Any, accum_steps: Any = 0) -> np.ndarray:
        """Samples per second, ``K m (s + 1) / T_iter``, broadcast over the arguments."""
        batch = np.asarray(num_replicas) * np.asarray(micro_bsz) * (np.asarray(accum_steps) + 1)
        return batch / self.iter_time(num_nodes, num_replicas, micro_bsz, accum_steps)


@dataclass(frozen=True)
class GradParams:
    """Gradient statistics at the initial batch size: squared norm of the mean ``sqr`` and variance ``var``."""

    sqr: float
    var: float

    def __post_init__(self) -> None:
        if not (np.isfinite(self.sqr) and np.isfinite(self.var) and self.sqr >= 0 and self.var >= 0):
            raise InvalidProblemError(f"invalid {self!r}: sqr and var must be finite and >= 0", field="grad_params")

    def noise_scale(self, init_batch_size: float) -> float:
        """Gradient noise scale ``phi = M0 * var / sqr`` (samples; inf where ``sqr`` is 0)."""
        return init_batch_size * self.var / self.sqr if self.sqr > 0 else np.inf


def _sync_time(t_acc: np.ndarray, t_net: np.ndarray, gamma: Any) -> np.ndarray:
    """``(t_acc^g + t_net^g)^(1/g)`` without overflow: ``hi * (1 + (lo/hi)^g)^(1/g)``."""
    hi = np.maximum(t_acc, t_net)
    lo = np.minimum(t_acc, t_net)
    ratio = np.divide(lo, hi, out=np.zeros(np.broadcast(lo, hi).shape), where=hi > 0)
    return hi * (1.0 + ratio ** gamma) ** (1.0 / gamma)


def _efficiency(sqr: Any, var: Any, init_batch_size: Any, batch_size: Any) -> np.ndarray:
    """``(phi + M0) / (phi + M)`` written as ``(var + sqr) / (var + sqr M / M0)``; ``M0 / M`` when both are 0."""
    num = var + sqr
    den = var + sqr * (batch_size / init_batch_size)
    return np.where(num > 0, num / np.where(num > 0, den, 1.0), init_batch_size / batch_size)


# ----- fitting --------------------------------------------------------------------------------
def fit_perf_params(num_nodes: Any, num_replicas: Any, local_bsz: Any, compute_time_s: Any, iter_time_s: Any,
                    *, initial: PerfParams | None = None, loss: str = DEFAULT_LOSS,
                    loss_scale: float = DEFAULT_LOSS_SCALE, optimizer: str = "tnc") -> PerfParams:
    """Fit :class:`PerfParams` to measured times, as Pollux does, optionally with a robust loss.

    Minimizes ``L(log T_acc) + L(log T_sync) + 1e-3 (gamma - 1)^2 +
    1e-2 ((beta_n / alpha_n)^2 + (beta_r / alpha_r)^2)`` where ``L`` of the
    log-time residuals ``r`` (predicted minus measured) is
    ``sqrt(mean rho(r))``: ``rho(r) = r^2`` for ``loss="rmse"`` (Pollux's
    RMSE) and ``rho(r) = s^2 log(1 + (r / s)^2)`` for ``loss="cauchy"``, which
    matches the RMSE for residuals well below ``s = loss_scale`` but grows
    only logarithmically beyond, so a few outlying measurements (e.g. a
    step time that falls as GPUs are added) do not pull the fit off. The
    Cauchy loss is not convex: without ``initial`` it starts from the RMSE
    fit. Both are minimized with an analytic
    gradient by a bounded truncated-Newton method (scipy's TNC), over the
    logarithms of the time parameters (between 1e-8 s and 1000 times the
    longest observed iteration) and ``gamma`` in [1, 10]. Pollux's priors
    where data is missing:

    * one micro-batch size observed: ``alpha_c`` fixed at half the mean compute
      time (optimistic about larger batches);
    * no multi-node observation: ``alpha_n, beta_n`` pinned at 1e-8 during the
      fit, then raised to at least 1.1x ``alpha_r, beta_r`` (crossing nodes is
      never faster than staying within one);
    * no single-node multi-replica observation: ``alpha_r, beta_r`` pinned at 1e-8;
    * no observation with more than 2 replicas: ``beta_n, beta_r`` pinned at 1e-8.

    Parameters
    ----------
    num_nodes, num_replicas, local_bsz : array-like of shape (n,)
        Nodes, replicas (GPUs) and micro-batch size (samples per GPU) of each observation.
    compute_time_s : array-like of shape (n,)
        Compute time of one micro-batch (forward and backward), in seconds (> 0).
    iter_time_s : array-like of shape (n,)
        Time of one iteration without accumulation (compute plus synchronization), in seconds (> 0).
    initial : PerfParams, optional
        Warm start, e.g. the previous fit of the same job; default Pollux's starting point.
    loss : {"cauchy", "rmse"}, default "cauchy"
        Loss of the log-time residuals (see above).
    loss_scale : float, default 0.05
        Cauchy scale ``s``, a log-time residual (0.05: about 5% relative error); > 0.
    optimizer : {"tnc", "pollux"}, default "tnc"
        ``"pollux"``: Pollux's (and Sia's simulator's) own minimization instead -- L-BFGS-B over
        the raw parameters (time parameters >= 1e-8 s, unbounded above) from Pollux's starting
        point, tolerance 1e-5, ignoring ``initial``; needs ``loss="rmse"``. With few
        observations the fit is underdetermined and the two optimizers end at different
        minimizers; this one evaluates Pollux's objective and gradient in Pollux's own
        floating-point arithmetic, so with the same scipy it takes Pollux's iterates and returns
        its parameters to the bit.

    Raises
    ------
    InvalidProblemError
        For mismatched lengths, no observations, counts below 1, more nodes
        than replicas, or times that are not finite and positive.
    InvalidOptionError
        For an unknown ``loss`` or ``optimizer``, a ``loss_scale`` that is not finite and positive, or
        ``optimizer="pollux"`` with a loss other than ``"rmse"``.
    """
    if loss not in LOSSES:
        raise InvalidOptionError(f"loss must be one of {', '.join(LOSSES)}; got {loss!r}")
    if optimizer not in ("tnc", "pollux"):
        raise InvalidOptionError(f"optimizer must be 'tnc' or 'pollux'; got {optimizer!r}")
    if isinstance(loss_scale, bool) or not isinstance(loss_scale, Real) or not 0 < loss_scale < np.inf:
        raise InvalidOptionError(f"loss_scale must be a finite number > 0; got {loss_scale!r}")
    if optimizer == "pollux" and loss != "rmse":
        raise InvalidOptionError(f"optimizer='pollux' minimizes Pollux's RMSE objective; pass loss='rmse' "
                                 f"(got loss={loss!r})")
    if optimizer == "pollux":
        initial = None
    elif loss != "rmse" and initial is None:
        initial = fit_perf_params(num_nodes, num_replicas, local_bsz, compute_time_s, iter_time_s, loss="rmse")
    nodes, replicas, bsz, compute, iteration = _observations(num_nodes, num_replicas, local_bsz, compute_time_s,
                                                             iter_time_s)
    ceiling = _CEILING * float(iteration.max())
    start = np.array(astuple(initial) if initial is not None else _DEFAULT_START, dtype=np.float64)
    start[:6] = np.clip(start[:6], PARAM_FLOOR_S, ceiling)
    start[6] = np.clip(start[6], *GAMMA_BOUNDS)
    fixed: dict[int, float] = {}
    if np.unique(bsz).size == 1:
        fixed[0] = float(np.mean(compute)) / 2
    multi_node = bool(np.any(nodes > 1))
    if not multi_node:
        fixed.update({2: PARAM_FLOOR_S, 3: PARAM_FLOOR_S})
    if not np.any((nodes == 1) & (replicas > 1)):
        fixed.update({4: PARAM_FLOOR_S, 5: PARAM_FLOOR_S})
    if not np.any(replicas > 2):
        fixed.update({3: PARAM_FLOOR_S, 5: PARAM_FLOOR_S})
    for k, v in fixed.items():
        start[k] = v
    free = np.array([k for k in range(7) if k not in fixed], dtype=np.int64)
    if optimizer == "pollux":
        params = _pollux_minimize(nodes, replicas, bsz, compute, iteration, start, fixed)
    else:
        objective = _Objective(nodes, replicas, bsz, compute, iteration, start, loss, loss_scale)
        params = _tnc_minimize(objective, start, free, ceiling)
    if not multi_node:
        params[2] = max(params[2], 1.1 * params[4])
        params[3] = max(params[3], 1.1 * params[5])
    return PerfParams(*map(float, params))


def _pollux_minimize(nodes: np.ndarray, replicas: np.ndarray, bsz: np.ndarray, compute: np.ndarray,
                     iteration: np.ndarray, start: np.ndarray, fixed: dict[int, float]) -> np.ndarray:
    """Pollux's minimization: L-BFGS-B over the raw parameters, fixed ones as equal bounds, tolerance 1e-5,
    on :func:`_pollux_objective` (Pollux's RMSE objective in its own floating-point arithmetic)."""
    lower = np.array([PARAM_FLOOR_S] * 6 + [GAMMA_BOUNDS[0]])
    upper = np.array([np.inf] * 6 + [GAMMA_BOUNDS[1]])
    for k, v in fixed.items():
        lower[k] = upper[k] = v
    data = (nodes, replicas, bsz, np.log(compute), np.log(iteration))
    import scipy.optimize  # on first use: scipy.optimize costs a cold start 0.1 s

    result = scipy.optimize.minimize(_pollux_objective, start, args=data, jac=True, method="L-BFGS-B",
                                     bounds=scipy.optimize.Bounds(lower, upper, keep_feasible=True), tol=1e-5)
    return result.x


def _pollux_objective(p: np.ndarray, nodes: np.ndarray, replicas: np.ndarray, bsz: np.ndarray,
                      log_compute: np.ndarray, log_iter: np.ndarray) -> tuple[float, np.ndarray]:
    """Pollux's fitting objective and its gradient over the raw parameters ``p``, computed with the
    operations, and in the order, Pollux's reverse-mode (autograd) evaluation performs them.

    The fit of a few observations is underdetermined and L-BFGS-B's path through its flat
    valley turns on the last bits of the gradient, so matching Pollux's iterates (and Sia's
    simulator's fits) takes the same arithmetic, not just the same function:

    * network time ``alpha + beta * max(K - 2, 1e-8)`` with ``alpha, beta = 1e-8`` for one replica
      (``T_sync = (T_acc^g + T_net^g)^(1/g)`` on every observation, computed as ``log(a^g + n^g) / g``);
    * each RMSE as ``sqrt(mean(r^2))`` with ``r^2`` from numpy's ``power`` ufunc (its vectorized
      kernels may round differently from ``r * r``), its derivative ``0.5 * m^-0.5 / n * 2 * r``;
    * the gradient of ``alpha_n, beta_n, alpha_r, beta_r`` summed starting from the regularizer's
      term, then the observations' in reverse order; that of ``gamma`` as
      ``((d/d(1/g) + d reg) + d T_net^g) + d T_acc^g``.
    """
    a_c, b_c, a_n, b_n, a_r, b_r, g = p
    inter, multi = nodes > 1, replicas > 1
    t_acc = a_c + b_c * bsz
    alpha = np.select([inter, multi], [a_n, a_r], PARAM_FLOOR_S)
    beta = np.select([inter, multi], [b_n, b_r], PARAM_FLOOR_S)
    retro = np.maximum(replicas - 2, PARAM_FLOOR_S)
    t_net = alpha + beta * retro
    acc_g, net_g = t_acc ** g, t_net ** g
    total = acc_g + net_g
    log_total = np.log(total)
    r1 = np.log(t_acc) - log_compute
    r2 = log_total / g - log_iter
    m1, m2 = np.power(r1, 2).mean(), np.power(r2, 2).mean()  # the power ufunc, not x * x: not always equal
    ratio_n, ratio_r = b_n / a_n, b_r / a_r
    value = np.sqrt(m1) + np.sqrt(m2) + _REG_GAMMA * np.power(g - 1, 2) + \
        _REG_RETRO * (np.power(ratio_n, 2) + np.power(ratio_r, 2))
    n = r1.size
    d1 = 0.5 * m1 ** -0.5 / n * 2 * r1  # d value / d r1
    d2 = 0.5 * m2 ** -0.5 / n * 2 * r2
    d_total = d2 / g / total
    d_acc = d1 / t_acc + d_total * g * t_acc ** (g - 1)
    d_net = d_total * g * t_net ** (g - 1)
    d_beta = retro * d_net
    reg_n, reg_r = _REG_RETRO * 2 * ratio_n, _REG_RETRO * 2 * ratio_r
    grad = np.empty(7)
    grad[0] = np.sum(d_acc, axis=0)
    grad[1] = np.sum(bsz * d_acc, axis=0)
    intra = multi & ~inter
    for k, reg, rows, d in ((2, -reg_n * b_n / a_n ** 2, inter, d_net), (3, reg_n / a_n, inter, d_beta),
                            (4, -reg_r * b_r / a_r ** 2, intra, d_net), (5, reg_r / a_r, intra, d_beta)):
        for term in d[rows][::-1].tolist():
            reg = reg + term
        grad[k] = reg
    d_inv = np.sum(-d2 * log_total / g ** 2, axis=0)
    d_reg = _REG_GAMMA * 2 * (g - 1)
    grad[6] = d_inv + d_reg + np.sum(d_total * np.log(t_net) * net_g, axis=0) + \
        np.sum(d_total * np.log(t_acc) * acc_g, axis=0)
    return float(value), grad


def _tnc_minimize(objective: _Objective, start: np.ndarray, free: np.ndarray, ceiling: float) -> np.ndarray:
    """The default minimization: TNC over the logarithms of the time parameters (see fit_perf_params)."""
    x0 = np.where(free < 6, np.log(start[free]), start[free])
    bounds = [(np.log(PARAM_FLOOR_S), np.log(ceiling)) if k < 6 else GAMMA_BOUNDS for k in free]
    # Truncated Newton (TNC): for 7 variables L-BFGS-B spends far longer in its BLAS-based bookkeeping than in
    # the objective (0.5 ms per iteration with multi-threaded OpenBLAS), TNC needs no BLAS.
    import scipy.optimize  # on first use: scipy.optimize costs a cold start 0.1 s

    result = scipy.optimize.minimize(objective, x0, args=(free,), jac=True, method="TNC", bounds=bounds,
                                     options={"maxfun": _MAX_EVALUATIONS})
    return objective.params(result.x, free)


def _observations(*arrays: Any) -> tuple[np.ndarray, ...]:
    names = ("num_nodes", "num_replicas", "local_bsz", "compute_time_s", "iter_time_s")
    try:
        out = tuple(np.asarray(a, dtype=np.float64).ravel() for a in arrays)
    except (TypeError, ValueError) as err:
        raise InvalidProblemError(f"observations must be numeric arrays: {err}", field="observations") from None
    sizes = {name: a.size for name, a in zip(names, out)}
    if len(set(sizes.values())) != 1 or not out[0].size:
        raise InvalidProblemError(f"give one or more observations, the same number in every array; got {sizes}",
                                  field="observations")
    nodes, replicas, bsz, compute, iteration = out
    for name, bad in (("num_nodes", ~(nodes >= 1)), ("num_replicas", ~(replicas >= nodes)),
                      ("local_bsz", ~(bsz >= 1)),
                      ("compute_time_s", ~((compute > 0) & np.isfinite(compute))),
                      ("iter_time_s", ~((iteration > 0) & np.isfinite(iteration)))):
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            need = {"num_nodes": ">= 1", "num_replicas": ">= num_nodes", "local_bsz": ">= 1"}.get(
                name, "finite and > 0 seconds")
            raise InvalidProblemError(f"observation {i}: {name} is {out[names.index(name)][i]:g}; it must be {need}",
                                      field=name)
    return out


class _Objective:
    """The fitting objective (Pollux's, with an RMSE or Cauchy loss) and its analytic gradient over
    (log alpha/beta, gamma)."""

    def __init__(self, nodes: np.ndarray, replicas: np.ndarray, bsz: np.ndarray, compute: np.ndarray,
                 iteration: np.ndarray, start: np.ndarray, loss: str, loss_scale: float):
        self.bsz = bsz
        self.log_compute = np.log(compute)
        self.log_iter = np.log(iteration)
        self.multi = np.flatnonzero(replicas > 1)
        retro = np.maximum(replicas[self.multi] - 2, 0)
        inter = (nodes[self.multi] > 1).astype(np.float64)
        intra = 1.0 - inter
        # d T_net / d (alpha_n, beta_n, alpha_r, beta_r) of the multi-replica observations, shape (4, n_multi)
        self.dnet = np.stack([inter, inter * retro, intra, intra * retro])
        self.start = start
        self.scale = None if loss == "rmse" else loss_scale

    def loss(self, e: np.ndarray) -> tuple[float, np.ndarray]:
        """Root mean loss of log-time residuals ``e`` and its gradient: ``sqrt(mean rho(e))`` with
        ``rho(e) = e^2`` (RMSE) or ``s^2 log(1 + (e/s)^2)`` (Cauchy, scale ``s``)."""
        if self.scale is None:
            rho, psi = e * e, e
        else:
            z = (e / self.scale) ** 2
            rho, psi = self.scale ** 2 * np.log1p(z), e / (1.0 + z)
        n = e.size
        root = np.sqrt(rho.sum() / n)
        return float(root), (psi / (n * root) if root > 0 else np.zeros(n))

    def params(self, x: np.ndarray, free: np.ndarray) -> np.ndarray:
        p = self.start.copy()
        p[free] = np.where(free < 6, np.exp(x), x)
        return p

    def __call__(self, x: np.ndarray, free: np.ndarray) -> tuple[float, np.ndarray]:
        p = self.params(x, free)
        a_c, b_c, a_n, b_n, a_r, b_r, g = p
        multi = self.multi
        t_acc = a_c + b_c * self.bsz
        u = np.log(t_acc)
        t_net = p[2:6] @ self.dnet
        v = np.log(t_net)
        # on multi-replica observations log T_sync = logaddexp(g u, g v) / g; elsewhere T_sync = T_acc
        um = u[multi]
        log_sync_m = np.logaddexp(g * um, g * v) / g
        w_acc = np.exp(g * (um - log_sync_m))
        w_net = 1.0 - w_acc
        e1 = u - self.log_compute
        e2 = u - self.log_iter
        e2[multi] = log_sync_m - self.log_iter[multi]
        loss1, d1 = self.loss(e1)
        loss2, d2 = self.loss(e2)
        retro_n, retro_r = b_n / a_n, b_r / a_r
        value = loss1 + loss2 + _REG_GAMMA * (g - 1) ** 2 + _REG_RETRO * (retro_n ** 2 + retro_r ** 2)
        d2m = d2[multi]
        g_acc = d1 + d2  # d value / d log T_acc per observation
        g_acc[multi] = d1[multi] + d2m * w_acc
        g_acc /= t_acc
        g_net = d2m * w_net / t_net
        grad = np.empty(7)
        grad[0] = g_acc.sum()
        grad[1] = g_acc @ self.bsz
        grad[2:6] = self.dnet @ g_net
        grad[:6] *= p[:6]  # chain rule to log parameters
        grad[6] = d2m @ ((w_acc * um + w_net * v - log_sync_m) / g) + 2 * _REG_GAMMA * (g - 1)
        reg_n, reg_r = 2 * _REG_RETRO * retro_n ** 2, 2 * _REG_RETRO * retro_r ** 2
        grad[2:6] += (-reg_n, reg_n, -reg_r, reg_r)
        return float(value), grad[free]


# ----- goodput ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class GoodputModel:
    """Goodput of one job on one GPU type: a fitted throughput model x statistical efficiency.

    Parameters
    ----------
    perf_params : PerfParams
    grad_params : GradParams
    init_batch_size : int
        The job's initial (smallest) global batch size ``M0``, in samples.
    max_batch_size : int
        Largest global batch size the job may use (>= ``init_batch_size``).
    max_local_bsz : int
        Largest micro-batch that fits in one GPU's memory of this type (samples).
    min_local_bsz : int, default 1
        Smallest micro-batch worth running.
    accumulation : bool, default True
        Allow gradient accumulation (several micro-batches per iteration) to
        reach batch sizes larger than memory allows.
    """

    perf_params: PerfParams
    grad_params: GradParams
    init_batch_size: int
    max_batch_size: int
    max_local_bsz: int
    min_local_bsz: int = 1
    accumulation: bool = True
    _spec: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        m0, m_max, lo, hi = self.init_batch_size, self.max_batch_size, self.min_local_bsz, self.max_local_bsz
        if not (1 <= m0 <= m_max and 1 <= lo <= hi):
            raise InvalidProblemError(
                f"GoodputModel needs 1 <= init_batch_size <= max_batch_size and 1 <= min_local_bsz <= "
                f"max_local_bsz, got {m0}, {m_max}, {lo}, {hi}", field="batch_size")
        p, g = self.perf_params, self.grad_params
        spec = np.array([p.alpha_c, p.beta_c, p.alpha_n, p.beta_n, p.alpha_r, p.beta_r, p.gamma, m0, m_max, lo, hi,
                         float(self.accumulation), g.sqr, g.var], dtype=np.float64)
        spec.setflags(write=False)
        object.__setattr__(self, "_spec", spec)

    def throughput(self, num_nodes: Any, num_replicas: Any, micro_bsz: Any, accum_steps: Any = 0) -> np.ndarray:
        """Samples per second (see :meth:`PerfParams.throughput`)."""
        return self.perf_params.throughput(num_nodes, num_replicas, micro_bsz, accum_steps)

    def efficiency(self, batch_size: Any) -> np.ndarray:
        """Statistical efficiency ``(phi + M0) / (phi + M)`` of global batch size ``M`` (samples)."""
        return _efficiency(self.grad_params.sqr, self.grad_params.var, float(self.init_batch_size),
                           np.asarray(batch_size, dtype=np.float64))

    def goodput(self, num_nodes: Any, num_replicas: Any, micro_bsz: Any, accum_steps: Any = 0) -> np.ndarray:
        """Throughput x efficiency (samples/s at ``M0``-equivalent progress)."""
        batch = np.asarray(num_replicas) * np.asarray(micro_bsz) * (np.asarray(accum_steps) + 1)
        return self.throughput(num_nodes, num_replicas, micro_bsz, accum_steps) * self.efficiency(batch)

    def optimize(self, num_nodes: Any, num_replicas: Any, *, n_candidates: int = DEFAULT_CANDIDATES
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Goodput-optimal micro-batch size and accumulation steps of each configuration.

        Searches ``n_candidates`` global batch sizes spaced geometrically from
        ``max(M0, min_local_bsz * K)`` to ``max_batch_size``. Each is split into
        ``s`` accumulation steps of micro-batches ``m <= max_local_bsz``
        (``s`` the fewest that fit; a single replica above ``M0`` accumulates at
        least once, as in Pollux, since one micro-batch gives no gradient noise
        estimate); the resulting ``M = K m (s + 1)`` stays in ``[M0, max_batch_size]``.

        Parameters
        ----------
        num_nodes, num_replicas : array-like of int
            Broadcast together; ``1 <= num_nodes <= num_replicas``.
        n_candidates : int, default 50

        Returns
        -------
        goodput, micro_bsz, accum_steps : ndarray
            Of the broadcast shape; goodput 0.0 (and micro_bsz, accum_steps 0)
            where no batch size fits.
        """
        nodes, replicas = np.broadcast_arrays(np.asarray(num_nodes, dtype=np.float64),
                                              np.asarray(num_replicas, dtype=np.float64))
        if np.any(nodes < 1) or np.any(replicas < nodes):
            raise InvalidProblemError("optimize needs 1 <= num_nodes <= num_replicas", field="num_nodes")
        n = nodes.size
        spec = np.broadcast_to(self._spec, (n, self._spec.size))
        g, m, s = _search(spec[:, _M0:_TPUT], replicas.ravel(), spec[:, :_M0], nodes.ravel(), np.arange(n),
                          np.arange(n), spec[:, _TPUT:], n_candidates, with_batch=True)
        return g.reshape(nodes.shape), m.reshape(nodes.shape), s.reshape(nodes.shape)


def optimize_models(models: Sequence[GoodputModel], num_nodes: Any, num_replicas: Any, *,
                    n_candidates: int = DEFAULT_CANDIDATES) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:meth:`GoodputModel.optimize` of ``models[i]`` at ``(num_nodes[i], num_replicas[i])`` for every ``i``,
    in one vectorized search (e.g. the batch of every lease of a round).

    Returns
    -------
    goodput, micro_bsz, accum_steps : ndarray of shape (len(models),)
    """
    n = len(models)
    nodes = np.broadcast_to(np.asarray(num_nodes, dtype=np.float64), (n,))
    replicas = np.broadcast_to(np.asarray(num_replicas, dtype=np.float64), (n,))
    if n == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    if np.any(nodes < 1) or np.any(replicas < nodes):
        raise InvalidProblemError("optimize_models needs 1 <= num_nodes <= num_replicas", field="num_nodes")
    spec = np.stack([m._spec for m in models])
    rows = np.arange(n)
    return _search(spec[:, _M0:_TPUT], replicas.copy(), spec[:, :_M0], nodes.copy(), rows, rows, spec[:, _TPUT:],
                   n_candidates, with_batch=True)


# A model's spec row: perf params (7), then its batch limits (M0, max batch, min and max micro-batch,
# accumulation flag), then gradient statistics (sqr, var). Throughput depends on the first _TPUT entries only.
_M0 = 7
_TPUT = 12


def _search(limits: np.ndarray, replicas: np.ndarray, perf: np.ndarray, nodes: np.ndarray, batch_of: np.ndarray,
            tput_of: np.ndarray, grad: np.ndarray, n_candidates: int, *, with_batch: bool
            ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Best goodput (and micro-batch, accumulation steps) of each query, sharing work at three levels.

    Batch rows ``limits`` (M0, max batch, min and max micro-batch, accumulation
    flag) with ``replicas`` fix the candidate batch splits; throughput rows
    ``perf`` with ``nodes`` and batch row ``batch_of`` add throughput; query
    ``i`` is throughput row ``tput_of[i]`` with gradient statistics
    ``grad[i] = (sqr, var)``. Queries are processed in blocks, each computing
    only the batch and throughput rows it needs.
    """
    if isinstance(n_candidates, bool) or not isinstance(n_candidates, (int, np.integer)) or n_candidates < 1:
        raise InvalidProblemError(f"n_candidates must be a positive integer, got {n_candidates!r}",
                                  field="n_candidates")
    n = tput_of.size
    goodput = np.zeros(n)
    micro_out = np.zeros(n, dtype=np.int64) if with_batch else None
    steps_out = np.zeros(n, dtype=np.int64) if with_batch else None
    grid = np.linspace(0.0, 1.0, n_candidates)
    order = np.argsort(tput_of, kind="stable")
    block = max(1, _CHUNK // n_candidates)
    for lo in range(0, n, block):
        queries = order[lo:lo + block]
        t_rows, t_of_q = np.unique(tput_of[queries], return_inverse=True)
        b_rows, b_of_t = np.unique(batch_of[t_rows], return_inverse=True)
        total, micro, steps, valid = _batch_candidates(limits[b_rows], replicas[b_rows], grid)
        tput = _throughputs(perf[t_rows], nodes[t_rows], replicas[b_rows][b_of_t], _take(total, b_of_t),
                            _take(micro, b_of_t), _take(steps, b_of_t), _take(valid, b_of_t))
        b_of_q = b_of_t[t_of_q]
        total_q, tput = _take(total, b_of_q), _take(tput, t_of_q)
        m0 = limits[b_rows, 0][b_of_q][:, None]
        sqr, var = grad[queries, 0][:, None], grad[queries, 1][:, None]
        # goodput = tput * (var + sqr) / (var + sqr * total / m0), in place
        good = total_q * (sqr / m0)
        good += var
        np.divide(var + sqr, good, out=good, where=good > 0)
        good *= tput
        none = (var + sqr)[:, 0] <= 0  # no gradient information: efficiency m0 / total
        if none.any():
            good[none] = tput[none] * m0[none] / total_q[none]
        best = np.argmax(good, axis=1)
        pick = np.arange(queries.size)
        goodput[queries] = good[pick, best]
        if with_batch:
            ok = goodput[queries] > 0
            micro_out[queries] = np.where(ok, micro[b_of_q, best], 0)
            steps_out[queries] = np.where(ok, steps[b_of_q, best], 0)
    return goodput, micro_out, steps_out


def _take(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``a[rows]``, without copying when ``rows`` is ``0..len(a)-1``."""
    return a if rows.size == a.shape[0] and (rows.size == 0 or rows[-1] == rows.size - 1) else a[rows]


def _batch_candidates(limits: np.ndarray, replicas: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, ...]:
    """Candidate global batch sizes of each batch row, split into micro-batches and accumulation steps.

    Returns total batch, micro-batch, accumulation steps and validity, each (rows, candidates).
    """
    m0, m_max, min_local, max_local, accumulate = (col[:, None] for col in limits.T)
    K = replicas[:, None]
    smallest = np.maximum(m0, min_local * K)
    batch = smallest * np.exp(np.log(np.maximum(m_max / smallest, 1.0)) * grid)
    local = batch / K
    steps = np.where(accumulate > 0, np.ceil(local / max_local - _EPS) - 1, 0.0)
    steps = np.where((accumulate > 0) & (K == 1) & (local > m0 + _EPS), np.maximum(steps, 1), steps)
    count = K * (steps + 1)
    micro = np.minimum(np.ceil(local / (steps + 1) - _EPS), np.floor(m_max / count + _EPS))
    total = count * micro
    valid = ((micro >= min_local) & (micro <= max_local) & (total >= m0 - _EPS) & (total <= m_max + _EPS)
             & (smallest <= m_max))
    return total, micro, steps, valid


def _throughputs(perf: np.ndarray, nodes: np.ndarray, replicas: np.ndarray, total: np.ndarray, micro: np.ndarray,
                 steps: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Samples/s of each throughput row at each candidate (0 where invalid), shape (rows, candidates)."""
    a_c, b_c, a_n, b_n, a_r, b_r, gamma = (col[:, None] for col in perf.T)
    K = replicas[:, None]
    retro = np.maximum(K - 2, 0)
    t_net = np.where(K <= 1, 0.0, np.where(nodes[:, None] > 1, a_n + b_n * retro, a_r + b_r * retro))
    t_acc = micro * b_c
    t_acc += a_c
    t_iter = _sync_time(t_acc, t_net, gamma)
    t_iter += steps * t_acc
    np.divide(total, t_iter, out=t_iter)
    t_iter[~valid] = 0.0
    return t_iter


def goodput_matrix(models: Sequence[Mapping[str, GoodputModel | None] | Sequence[GoodputModel | None]],
                   configurations: Configurations, *, n_candidates: int = DEFAULT_CANDIDATES) -> np.ndarray:
    """Goodput of every job in every configuration, the ``goodput`` of a :class:`~allocopt.GoodputProblem`.

    Each job gets its optimal batch size and accumulation steps per
    configuration (:meth:`GoodputModel.optimize`). Work is shared: identical
    models (e.g. jobs of one application) are evaluated once; candidate
    batch splits once per distinct batch limits and configuration, and
    throughputs once per distinct throughput part (perf params and batch
    limits) and configuration, so jobs that differ only in their gradient
    statistics cost one efficiency evaluation each.

    Parameters
    ----------
    models : sequence of mapping or sequence
        One entry per job: a mapping from GPU type name to that job's
        :class:`GoodputModel` on the type, or a sequence in
        ``configurations.cluster.gpu_types`` order. A missing type or None means
        the job cannot run on it.
    configurations : Configurations
    n_candidates : int, default 50
        Candidate global batch sizes per configuration.

    Returns
    -------
    ndarray of shape (n_jobs, n_configurations)
        Goodput (samples/s at ``M0``-equivalent progress); 0.0 where the job
        has no model for the type or no batch size fits the configuration.
    """
    if not isinstance(configurations, Configurations):
        raise InvalidProblemError(f"configurations must be an allocopt.Configurations, got "
                                  f"{type(configurations).__name__}", field="configurations")
    types = configurations.cluster.gpu_types
    n_jobs, n_cfg = len(models), len(configurations)
    # each job's model per type as an index into the distinct specs (-1: none); identical models share one
    which = np.full((n_jobs, len(types)), -1, dtype=np.int64)
    by_id: dict[int, int] = {}
    by_spec: dict[bytes, int] = {}
    by_tput: dict[bytes, int] = {}
    by_limits: dict[bytes, int] = {}
    specs: list[np.ndarray] = []
    tput_of: list[int] = []
    limits_of: list[int] = []
    for i, entry in enumerate(models):
        for j, model in enumerate(_per_type(entry, types, i)):
            if model is None:
                continue
            k = by_id.get(id(model))
            if k is None:
                if not isinstance(model, GoodputModel):
                    raise InvalidProblemError(f"job {i}: the model for GPU type {types[j]!r} is a "
                                              f"{type(model).__name__}, not a GoodputModel", field="models", job=i)
                spec = model._spec
                k = by_id[id(model)] = by_spec.setdefault(spec.tobytes(), len(specs))
                if k == len(specs):
                    specs.append(spec)
                    tput_of.append(by_tput.setdefault(spec[:_TPUT].tobytes(), len(by_tput)))
                    limits_of.append(by_limits.setdefault(spec[_M0:_TPUT].tobytes(), len(by_limits)))
            which[i, j] = k
    out = np.zeros((n_jobs, n_cfg))
    if not specs:
        return out
    spec_a = np.stack(specs)
    tput_a, limits_a = np.array(tput_of, dtype=np.int64), np.array(limits_of, dtype=np.int64)
    # queries: each distinct spec used on a type, in every configuration of that type
    cfg_type = configurations.gpu_type
    used = [np.unique(which[:, j][which[:, j] >= 0]) for j in range(len(types))]
    q_spec = np.concatenate([used[cfg_type[c]] for c in range(n_cfg)])
    q_cfg = np.concatenate([np.full(used[cfg_type[c]].size, c) for c in range(n_cfg)])
    # throughput rows: distinct (perf and limits, configuration); batch rows: distinct (limits, configuration)
    t_keys, t_first, tput_of_q = np.unique(tput_a[q_spec] * n_cfg + q_cfg, return_index=True, return_inverse=True)
    t_spec, t_cfg = q_spec[t_first], q_cfg[t_first]
    b_keys, b_first, batch_of_t = np.unique(limits_a[t_spec] * n_cfg + t_cfg, return_index=True,
                                            return_inverse=True)
    b_spec, b_cfg = t_spec[b_first], t_cfg[b_first]
    g, _, _ = _search(spec_a[b_spec, _M0:_TPUT], configurations.num_gpus[b_cfg].astype(np.float64),
                      spec_a[t_spec, :_M0], configurations.num_nodes[t_cfg].astype(np.float64), batch_of_t.ravel(),
                      tput_of_q.ravel(), spec_a[q_spec, _TPUT:], n_candidates, with_batch=False)
    table = np.zeros((len(specs), n_cfg))
    table[q_spec, q_cfg] = g
    job_spec = which[:, cfg_type]  # (n_jobs, n_configurations)
    np.copyto(out, table[np.maximum(job_spec, 0), np.arange(n_cfg)], where=job_spec >= 0)
    return out


def _per_type(entry: Any, types: tuple[str, ...], job: int) -> list[Any]:
    if isinstance(entry, Mapping):
        unknown = set(entry) - set(types)
        if unknown:
            raise InvalidProblemError(f"job {job}: unknown GPU type(s) {sorted(map(str, unknown))}; the cluster "
                                      f"has {list(types)}", field="models", job=job)
        return [entry.get(t) for t in types]
    if isinstance(entry, GoodputModel) or not isinstance(entry, Sequence) or len(entry) != len(types):
        raise InvalidProblemError(f"job {job}: give a mapping of GPU type to GoodputModel, or a sequence of "
                                  f"{len(types)} models (None where it cannot run) in the order {list(types)}",
                                  field="models", job=job)
    return list(entry)


__all__ = ["DEFAULT_CANDIDATES", "GAMMA_BOUNDS", "PARAM_FLOOR_S", "GoodputModel", "GradParams", "PerfParams",
           "fit_perf_params", "goodput_matrix", "optimize_models"]
