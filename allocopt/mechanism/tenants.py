"""Tenants of a simulated cluster: users or virtual clusters with weights and GPU quotas.

Each job of a :class:`~allocopt.mechanism.workload.Workload` may name a tenant
(``Workload.tenants``: the 11th column of a Gavel trace, a public trace's virtual
cluster or user). :func:`allocopt.simulate` with ``tenants=`` applies the tenants'
weights and quotas to every round:

- **Weights** (positive, default 1). Water-filling policies
  (``max_min_fairness_water_filling*`` and the ``water_filling`` policy) get the
  tenants as the problem's entities and their weights as the entity weights:
  hierarchical max-min fairness, each tenant's share split among its jobs. Every
  other allocation policy gets them folded into the jobs' priority weights: a
  job's weight in a round is ``W_e * w_i / (sum of w_j over the active jobs j of
  its tenant e)``, so a tenant's jobs together weigh ``W_e`` (the first level of
  the hierarchy; weighted max-min fairness then gives a weight-2 tenant twice the
  normalized throughput of a weight-1 tenant under contention). The folded weights
  are rescaled by a common factor into allocopt's weight range. Order-based policies
  rank jobs without weights; for them the weights change nothing.
- **GPU quotas** (optional, GPUs): the most GPUs, of all types together, a tenant's
  jobs hold in any round. The allocation is computed without the quotas; the round
  mechanism enforces them: in its walk, a job whose tenant would exceed its quota
  is skipped and the GPUs go to the next jobs (work-conserving). A quota smaller
  than a job's GPU count keeps that job from ever running, and
  :func:`resolve_tenants` refuses it.

Tenant files are CSV (header ``tenant,weight`` with an optional ``gpu_quota``
column, empty for none) or JSON (``{"tenant": {"weight": 2, "gpu_quota": 16}}``,
or ``{"tenant": 2}``: a weight). Errors name the file, line and column.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from os import PathLike
from typing import Any

import numpy as np

from allocopt.documents import read_text
from allocopt.mechanism.workload import MAX_TRACE_SCALE, TraceError, Workload
from allocopt.problem import WEIGHT_RANGE

#: Columns of a tenants CSV file (``gpu_quota`` optional).
TENANT_COLUMNS: tuple[str, ...] = ("tenant", "weight", "gpu_quota")


class TenantError(TraceError):
    """A tenants file, or a job's tenant, is malformed; the message names the file (or job), line and field."""


@dataclass(frozen=True)
class Tenants:
    """Tenants' weights and GPU quotas.

    Attributes
    ----------
    names : tuple of str
    weights : ndarray of shape (n_tenants,)
        Positive weights (a tenant of weight 2 is entitled to twice the share).
    gpu_quotas : ndarray of shape (n_tenants,)
        Most GPUs each tenant's jobs hold in a round (``inf``: no quota).
    source : str
        Where they came from (a path, or a description).
    """

    names: tuple[str, ...]
    weights: np.ndarray
    gpu_quotas: np.ndarray
    source: str = ""

    @property
    def has_quotas(self) -> bool:
        """Whether any tenant has a finite quota."""
        return bool(np.isfinite(self.gpu_quotas).any())

    def index(self, workload: Workload) -> np.ndarray:
        """Tenant index of each job of ``workload``, shape (n_jobs,).

        Raises
        ------
        TenantError
            The workload has no tenant column, or a job names a tenant not in :attr:`names`
            (the message gives the job's file and line).
        """
        if workload.tenants is None:
            raise TenantError(f"{workload.source or 'the workload'}: tenants are given ({self.source}) but the "
                              "workload's jobs name no tenant; add a tenant column (the 11th column of a Gavel "
                              "trace) or read a public trace with its vc or user", field="tenant")
        position = {name: k for k, name in enumerate(self.names)}
        labels = np.array(workload.tenants, dtype=object)
        unique, inverse = np.unique(labels.astype(str), return_inverse=True)
        known = np.array([name in position for name in unique.tolist()], dtype=bool)
        if not known.all():
            k = int(np.flatnonzero(~known[inverse])[0])
            raise TenantError(f"{workload._where(k)}: job {k} names tenant {workload.tenants[k]!r}, which "
                              f"{self.source or 'the tenants'} does not list (tenants: {list(self.names)[:10]})",
                              line=workload._line(k), field="tenant")
        return np.array([position[name] for name in unique.tolist()], dtype=np.int64)[inverse]

    def to_dict(self) -> dict[str, Any]:
        """``{tenant: {"weight": w, "gpu_quota": q or None}}``."""
        return {name: {"weight": float(w), "gpu_quota": None if not math.isfinite(q) else int(q)}
                for name, w, q in zip(self.names, self.weights.tolist(), self.gpu_quotas.tolist())}


def _weight(value: Any, where: str, line: int | None) -> float:
    try:
        weight = float(value)
    except (TypeError, ValueError):
        raise TenantError(f"{where}: weight is {value!r}, not a number", line=line, field="weight") from None
    low, high = WEIGHT_RANGE
    if not (math.isfinite(weight) and weight > 0):
        raise TenantError(f"{where}: weight is {value!r}; it must be a positive number", line=line, field="weight")
    if not low <= weight <= high:
        raise TenantError(f"{where}: weight is {weight:g}; tenant weights go from {low:g} to {high:g}: rescale them",
                          line=line, field="weight")
    return weight


def _quota(value: Any, where: str, line: int | None) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        return math.inf
    try:
        quota = float(value)
    except (TypeError, ValueError):
        raise TenantError(f"{where}: gpu_quota is {value!r}, not a number", line=line, field="gpu_quota") from None
    if isinstance(value, bool) or not (math.isfinite(quota) and quota == int(quota) and 1 <= quota <= MAX_TRACE_SCALE):
        raise TenantError(f"{where}: gpu_quota is {value!r}; it must be a whole number of GPUs from 1 to "
                          f"{MAX_TRACE_SCALE} (empty or null: no quota)", line=line, field="gpu_quota")
    return quota


def _from_mapping(entries: Mapping[Any, Any], source: str, lines: Mapping[str, int] | None = None) -> Tenants:
    names, weights, quotas = [], [], []
    for name, entry in entries.items():
        line = (lines or {}).get(name)
        where = f"{source}:{line}" if line else f"{source or 'tenants'}: tenant {name!r}"
        if not isinstance(name, str) or not name.strip():
            raise TenantError(f"{where}: a tenant's name must be a non-empty string, got {name!r}", line=line,
                              field="tenant")
        if isinstance(entry, Mapping):
            unknown = sorted(set(map(str, entry)) - {"weight", "gpu_quota"})
            if unknown:
                raise TenantError(f"{where}: unknown keys {unknown}; a tenant has weight and gpu_quota", line=line,
                                  field=unknown[0])
            weight, quota = entry.get("weight", 1.0), entry.get("gpu_quota")
        else:
            weight, quota = entry, None
        names.append(name.strip())
        weights.append(_weight(weight, where, line))
        quotas.append(_quota(quota, where, line))
    if not names:
        raise TenantError(f"{source or 'tenants'}: no tenant given", field="tenant")
    return Tenants(tuple(names), np.array(weights), np.array(quotas), source)


def read_tenants(path: str | PathLike[str]) -> Tenants:
    """Tenants from a CSV (``tenant,weight[,gpu_quota]`` with a header) or JSON file (see the module).

    Raises
    ------
    TenantError
        A missing column, a duplicate tenant, a weight that is not a positive number in allocopt's
        weight range, a quota that is not a whole number of GPUs; the message starts with ``path:line:``.
    DataFileError
        A file that cannot be read, or is not UTF-8.
    """
    name = str(path)
    text = read_text(path, what="the tenants file")
    if text.lstrip().startswith("{"):
        try:
            document = json.loads(text)
        except json.JSONDecodeError as err:
            raise TenantError(f"{name}:{err.lineno}: invalid JSON at column {err.colno}: {err.msg}", line=err.lineno,
                              field="json") from None
        if not isinstance(document, Mapping):
            raise TenantError(f"{name}: expected a JSON object of tenants", field="json")
        return _from_mapping(document, name)
    rows = list(csv.reader(io.StringIO(text)))
    numbered = [(k + 1, [c.strip() for c in row]) for k, row in enumerate(rows) if any(c.strip() for c in row)]
    if not numbered:
        raise TenantError(f"{name}: no tenant given", field="tenant")
    head_line, header = numbered[0]
    missing = [c for c in ("tenant", "weight") if c not in header]
    unknown = [c for c in header if c not in TENANT_COLUMNS]
    if missing or unknown or len(set(header)) != len(header):
        raise TenantError(f"{name}:{head_line}: the header must name the columns tenant, weight and optionally "
                          f"gpu_quota, each once, got {','.join(header)!r}", line=head_line,
                          field=(missing or ["columns"])[0])
    entries: dict[str, dict[str, Any]] = {}
    lines: dict[str, int] = {}
    for line, values in numbered[1:]:
        if len(values) != len(header):
            raise TenantError(f"{name}:{line}: {len(values)} comma-separated columns, expected {len(header)}: "
                              f"{', '.join(header)}", line=line, field="columns")
        row = dict(zip(header, values))
        tenant = row["tenant"]
        if tenant in entries:
            raise TenantError(f"{name}:{line}: tenant {tenant!r} is listed twice (first on line {lines[tenant]})",
                              line=line, field="tenant")
        if not tenant:
            raise TenantError(f"{name}:{line}: empty tenant name", line=line, field="tenant")
        entries[tenant] = {"weight": row["weight"], "gpu_quota": row.get("gpu_quota")}
        lines[tenant] = line
    return _from_mapping(entries, name, lines)


def resolve_tenants(tenants: Tenants | Mapping[str, Any] | str | PathLike[str], workload: Workload
                    ) -> tuple[Tenants, np.ndarray]:
    """The tenants of a simulation and each job's tenant index (shape (n_jobs,)).

    ``tenants``: a :class:`Tenants`, a mapping (``{name: weight}`` or ``{name: {"weight": w,
    "gpu_quota": q}}``), a tenants file, or ``"equal"`` (weight 1 for every tenant the workload names,
    no quotas).

    Raises
    ------
    TenantError
        Malformed tenants, a job of an unknown tenant, or a quota below the GPUs one of its jobs needs.
    """
    if isinstance(tenants, str) and tenants == "equal":
        if workload.tenants is None:
            raise TenantError(f"{workload.source or 'the workload'}: tenants='equal' needs jobs that name "
                              "their tenant", field="tenant")
        names = tuple(dict.fromkeys(workload.tenants))
        tenants = Tenants(names, np.ones(len(names)), np.full(len(names), math.inf), "equal weights")
    elif isinstance(tenants, Mapping):
        tenants = _from_mapping(tenants, "tenants")
    elif not isinstance(tenants, Tenants):
        tenants = read_tenants(tenants)
    index = tenants.index(workload)
    too_big = workload.scale_factors > tenants.gpu_quotas[index]
    if too_big.any():
        k = int(np.argmax(too_big))
        raise TenantError(f"{workload._where(k)}: job {k} needs {int(workload.scale_factors[k])} GPUs but its tenant "
                          f"{tenants.names[index[k]]!r} has gpu_quota {int(tenants.gpu_quotas[index[k]])}: it could "
                          "never run", line=workload._line(k), field="gpu_quota")
    return tenants, index


def folded_weights(job_weights: np.ndarray, tenant_of: np.ndarray, tenant_weights: np.ndarray) -> np.ndarray:
    """Jobs' priority weights with their tenants' weights folded in: ``W_e * w_i / sum_{j in e} w_j`` over the
    given jobs, rescaled by a common factor to lie within allocopt's weight range where their spread allows.

    Parameters
    ----------
    job_weights : ndarray of shape (m,)
        Priority weights of the (active) jobs.
    tenant_of : ndarray of int of shape (m,)
        Tenant index of each.
    tenant_weights : ndarray of shape (n_tenants,)
    """
    per_tenant = np.bincount(tenant_of, job_weights, minlength=tenant_weights.size)
    folded = tenant_weights[tenant_of] * job_weights / per_tenant[tenant_of]
    if not folded.size:
        return folded
    return folded / math.sqrt(float(folded.max()) * float(folded.min()))  # centred on 1 in log scale


def tenant_metrics(tenant_names: tuple[str, ...], tenant_of: np.ndarray, jct_s: np.ndarray, gpu_hours: np.ndarray,
                   ftf: np.ndarray | None) -> dict[str, dict[str, float]]:
    """Per tenant (over the given jobs): ``num_jobs``, ``average_jct_s``, ``gpu_hours`` (GPU-hours leased),
    ``gpu_hours_share`` (of all the given jobs' GPU-hours) and, with ``ftf``, ``average_ftf`` and ``max_ftf``.
    Tenants without jobs among the given ones are left out."""
    n = len(tenant_names)
    count = np.bincount(tenant_of, minlength=n)
    jct_sum = np.bincount(tenant_of, jct_s, minlength=n)
    hours = np.bincount(tenant_of, gpu_hours, minlength=n)
    total = float(hours.sum())
    out: dict[str, dict[str, float]] = {}
    worst = np.full(n, -np.inf)
    if ftf is not None:
        ftf_sum = np.bincount(tenant_of, ftf, minlength=n)
        np.maximum.at(worst, tenant_of, ftf)
    for k in np.flatnonzero(count).tolist():
        entry = {"num_jobs": int(count[k]), "average_jct_s": float(jct_sum[k] / count[k]),
                 "gpu_hours": float(hours[k]), "gpu_hours_share": float(hours[k] / total) if total > 0 else 0.0}
        if ftf is not None:
            entry.update(average_ftf=float(ftf_sum[k] / count[k]), max_ftf=float(worst[k]))
        out[tenant_names[k]] = entry
    return out


__all__ = ["TENANT_COLUMNS", "TenantError", "Tenants", "folded_weights", "read_tenants",
           "resolve_tenants", "tenant_metrics"]
