"""Pollux's MILP over groups of nodes: exact without a variable per job and node.

The MILP of :mod:`allocopt.formulations.pollux` places every job on every node
(``y[i, n]``), which at 512 jobs on 512 nodes is 260,000 integers and as many
binaries, most of them interchangeable. This model replaces the nodes of each
*group* (the nodes of one GPU type in a heterogeneity-aware problem, all nodes
in an unaware one) by an arc-flow packing (Valério de Carvalho, 1999) of the
group's nodes: each node is a path over vertices ``0..g`` (``g`` its largest
node's GPUs) whose arcs are

* *items* ``(a, a + r)``: the ``r`` replicas of one job that runs on one node;
* *parts* ``(0, d)``, only from vertex 0, so at most one per node: ``d``
  replicas of a job that spans several nodes (Pollux's interference avoidance);
* *idle* ``(v - 1, v)``: an unused GPU;

and ends at the node's free GPUs. Nodes that hold a previous allocation that may
be kept end where the kept replicas leave off (a linear function of the keep
decisions ``k``), on a second graph without parts when a kept job spans several
nodes. Each job spanning several nodes chooses its parts per size
``x[u, d]`` (``sum_d d x = replicas``, ``2 <= sum_d x <= max_nodes``). The
model (constraint blocks named as below)::

    minimize   sum_e coef_e z_e + sum_i kcoef_i k_i
    one_choice     sum_{e of class u} z_e + sum_{i of u} k_i <= jobs in u
    copy_order     the copies of a class take shapes spanning several nodes in order
    part_replicas  sum_d d x[u, d] = sum_{e of u} rep_e z_e     (u: a job, or a class copy, spanning nodes)
    part_nodes     2 sum z_e <= sum_d x[u, d] <= max_nodes sum z_e
    {group}_flow   into v - out of v = nodes ending at v        (both graphs, v = 1..g)
    {group}_items  items of size r >= jobs on one node with r replicas
    {group}_parts  parts of size d >= sum_u x[u, d]
    shared_node    nodes of several keepers: one residual and graph each (``w``)

is exact: every integer solution decomposes into one path per node
(:func:`place_paths`), and every placement gives such a solution. Untouched nodes
of a group are interchangeable, so the model has no symmetry among them.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from allocopt.backends import solve_model
from allocopt.errors import SolverError
from allocopt.formulations.base import ModelSolver
from allocopt.formulations.pollux_shapes import ZERO_GAP, _by_job, _Choices, choices
from allocopt.model import Model
from allocopt.pollux_problem import PolluxProblem
from allocopt.solution import Status

logger = logging.getLogger(__name__)


@dataclass
class Classes:
    """Jobs with identical choices merged (:func:`job_classes`)."""

    choices: _Choices  # job: class index; keepers: class index of each keeper
    size: np.ndarray  # jobs per class
    members: list  # problem rows of each class
    max_nodes: np.ndarray  # per class


def job_classes(problem: PolluxProblem, c: _Choices) -> Classes:
    """Merge jobs that have the same shapes, coefficients and node limit and cannot keep a previous
    allocation: a round of many copies of few jobs then has one integer count per class and shape
    on one node instead of symmetric binaries. Jobs that may keep their allocation stay classes of
    their own."""
    n = problem.num_jobs
    bounds = np.searchsorted(c.job, np.arange(n + 1))
    keeper = np.zeros(n, dtype=bool)
    keeper[c.keepers] = True
    unit_of: dict[bytes, int] = {}
    members: list[list[int]] = []
    for i in range(n):
        lo, hi = bounds[i], bounds[i + 1]
        if hi == lo and not keeper[i]:
            continue  # nothing to choose
        key = (b"" if keeper[i] else np.stack([c.t[lo:hi], c.s[lo:hi], c.rep[lo:hi]]).tobytes()
               + c.coef[lo:hi].tobytes() + int(problem.max_nodes[i]).to_bytes(8, "little"))
        if keeper[i] or key not in unit_of:
            if not keeper[i]:
                unit_of[key] = len(members)
            members.append([i])
        else:
            members[unit_of[key]].append(i)
    first = np.array([rows[0] for rows in members], dtype=np.int64)
    take = np.concatenate([np.arange(bounds[i], bounds[i + 1]) for i in first]) if first.size else \
        np.zeros(0, dtype=np.int64)
    unit_job = np.repeat(np.arange(first.size), bounds[first + 1] - bounds[first])
    unit_index = {int(row): u for u, row in enumerate(first)}
    keepers = np.array([unit_index[int(i)] for i in c.keepers], dtype=np.int64)
    merged = _Choices(unit_job, c.t[take], c.s[take], c.rep[take], c.coef[take], keepers, c.kcoef, c.ktype,
                      c.kspread)
    return Classes(merged, np.array([len(rows) for rows in members], dtype=np.int64), members,
                   problem.max_nodes[first] if first.size else np.zeros(0, dtype=np.int64))


@dataclass
class GroupModel:
    """The model and what :func:`place_paths` needs to read its solution."""

    model: Model
    entry: np.ndarray  # per z column: its entry in the classes' choices
    copy: np.ndarray  # per z column: the class copy (0 for shapes on one node)
    unit: np.ndarray  # per z column: its row of x (-1 for shapes on one node)
    unit_class: np.ndarray  # per row of x: its class
    graphs: list  # per group and graph: (group, graph (0 with parts), g, item starts, item sizes, name)
    width: int  # part sizes per row of x (the largest node's GPUs)


def _groups(problem: PolluxProblem) -> tuple[np.ndarray, int]:
    """Group of each node (its type in an aware problem, else 0) and the number of groups."""
    if problem.speedup.shape[1] > 1:
        return problem.node_type, problem.cluster.num_gpu_types
    return np.zeros(problem.num_nodes, dtype=np.int64), 1


def node_ends(problem: PolluxProblem, keepers: np.ndarray, kspread: np.ndarray, kept: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """Free GPUs of each node and whether a kept job spanning several nodes holds it, when the
    keepers ``keepers`` (problem rows) keep their allocation where ``kept`` is 1."""
    held = problem.previous[keepers] * kept[:, None]
    free = problem.node_gpus - held.sum(axis=0)
    blocked = ((held > 0) & (kspread[:, None] > 0)).any(axis=0)
    return free, blocked


def _sum_matrix(rows: np.ndarray, cols: np.ndarray, values: Any, shape: tuple[int, int]) -> sp.csr_matrix:
    values = np.broadcast_to(np.asarray(values, dtype=np.float64), np.shape(rows))
    return sp.csr_matrix((values, (rows, cols)), shape=shape)


def group_model(problem: PolluxProblem, cl: Classes, keeper_rows: np.ndarray, *,
                integer_flows: bool = True) -> GroupModel:
    """Build the model of the module docstring over the classes ``cl`` (``keeper_rows``: the problem
    row of each keeper); with ``integer_flows=False`` the arcs' flows are continuous (a relaxation)."""
    c, size = cl.choices, cl.size
    group, G = _groups(problem)
    gpus, m = problem.node_gpus, problem.num_nodes
    zg = c.t if problem.speedup.shape[1] > 1 else np.zeros(c.job.size, dtype=np.int64)
    # shapes on several nodes get one binary per copy of their class (a class of 1 job: one)
    copies = np.minimum(size, max(m // 2, 1))
    reps = np.where(c.s == 1, copies[c.job], 1)
    entry = np.repeat(np.arange(c.job.size), reps)
    copy = np.arange(entry.size) - np.repeat(np.cumsum(reps) - reps, reps)
    spread = c.s[entry] == 1
    zjob, zgroup, rep = c.job[entry], zg[entry], c.rep[entry]
    ub = np.where(spread, 1, size[zjob]).astype(np.float64)
    n_cls, E, K = size.size, entry.size, c.keepers.size
    model = Model("pollux_groups")
    z = model.add_variable("z", E, lb=0.0, ub=ub, kind="binary" if np.all(ub <= 1) else "integer")
    k = model.add_variable("keep", K, kind="binary")
    model.add_constraint("one_choice", _by_job(n_cls, zjob, 1.0, E) @ z + _by_job(n_cls, c.keepers, 1.0, K) @ k
                         <= size.astype(np.float64))
    # units: (class, copy, group) of the shapes spanning several nodes, each with its parts per size
    Q = int(copies.max(initial=1)) + 1
    sel = np.flatnonzero(spread)
    ukeys, unit_sel = np.unique((zjob[sel] * Q + copy[sel]) * G + zgroup[sel], return_inverse=True)
    unit = np.full(E, -1, dtype=np.int64)
    unit[sel] = unit_sel
    U = ukeys.size
    unit_group, unit_copy, unit_class = ukeys % G, (ukeys // G) % Q, ukeys // G // Q
    largest = np.array([gpus[group == j].max(initial=0) for j in range(G)])
    D = int(largest.max(initial=1))
    unit_rep = np.zeros(U)
    np.maximum.at(unit_rep, unit_sel, rep[sel])
    dd = np.arange(1, D + 1)
    xub = np.minimum(np.floor(unit_rep[:, None] / dd[None, :]), cl.max_nodes[unit_class][:, None])
    xub[dd[None, :] > largest[unit_group][:, None]] = 0.0
    x = model.add_variable("parts", U * D, lb=0.0, ub=xub.ravel(), kind="integer")
    if U:
        xu = np.repeat(np.arange(U), D)
        chosen = _sum_matrix(unit_sel, sel, 1.0, (U, E)) @ z
        model.add_constraint("part_replicas", _sum_matrix(xu, np.arange(U * D), np.tile(dd, U), (U, U * D)) @ x
                             - _sum_matrix(unit_sel, sel, rep[sel], (U, E)) @ z == 0.0)
        nodes = _sum_matrix(xu, np.arange(U * D), 1.0, (U, U * D)) @ x
        model.add_constraint("part_nodes_lower", nodes - chosen * 2.0 >= 0.0)
        model.add_constraint("part_nodes_upper", nodes - chosen * cl.max_nodes[unit_class].astype(np.float64)
                             <= 0.0)
        later = np.flatnonzero(unit_copy > 0)
        if later.size:  # copy q of a class spans nodes only if copy q - 1 does
            before = np.searchsorted(ukeys, ukeys[later] - G)
            rows = np.arange(later.size)
            model.add_constraint("copy_order", (_sum_matrix(rows, before, 1.0, (later.size, U))
                                                - _sum_matrix(rows, later, 1.0, (later.size, U))) @ chosen >= 0.0)
    # where each node's path ends: (group, graph 0 with parts or 1 without, vertex) flattened
    V = D + 1
    rows_total = G * 2 * V
    prev = problem.previous[keeper_rows]
    on = prev > 0
    holders = on.sum(axis=0)
    ends_const = np.bincount(group[holders == 0] * 2 * V + gpus[holders == 0], minlength=rows_total)
    one = np.flatnonzero(holders == 1)
    who = np.argmax(on[:, one], axis=0) if one.size else np.zeros(0, dtype=np.int64)
    held = prev[who, one]
    graph_of = (c.kspread[who] > 0).astype(np.int64)
    # a node of one keeper ends at its size, or, kept, where the kept replicas leave off
    ends_const = ends_const + np.bincount(group[one] * 2 * V + gpus[one], minlength=rows_total)
    ends = _sum_matrix(np.r_[group[one] * 2 * V + gpus[one], (group[one] * 2 + graph_of) * V + gpus[one] - held],
                       np.r_[who, who], np.r_[-np.ones(one.size), np.ones(one.size)], (rows_total, K)) @ k \
        + ends_const.astype(np.float64)
    shared = np.flatnonzero(holders >= 2)
    if shared.size:  # a node of several keepers: one binary per (free GPUs, graph)
        S = shared.size
        wn = np.repeat(np.arange(S), 2 * (gpus[shared] + 1))
        wv = np.repeat(np.concatenate([np.arange(gpus[n] + 1) for n in shared]), 2)
        wb = np.tile([0, 1], wv.size // 2)
        W = wn.size
        w = model.add_variable("shared_node", W, kind="binary")
        model.add_constraint("shared_node_one", _by_job(S, wn, 1.0, W) @ w == 1.0)
        model.add_constraint("shared_node_load", _by_job(S, wn, (gpus[shared][wn] - wv), W) @ w
                             - sp.csr_matrix(prev[:, shared].T.astype(np.float64)) @ k == 0.0)
        spanning = sp.csr_matrix((on[:, shared] & (c.kspread[:, None] > 0)).T.astype(np.float64))
        model.add_constraint("shared_node_graph", _by_job(S, wn, wb, W) @ w - spanning @ k == 0.0)
        ends = ends + _sum_matrix((group[shared][wn] * 2 + wb) * V + wv, np.arange(W), 1.0, (rows_total, W)) @ w
    graphs = []
    single = np.flatnonzero(~spread)
    for j in range(G):
        g = int(largest[j])
        if g == 0:
            continue
        a_item, s_item = np.nonzero(np.add.outer(np.arange(g), np.arange(1, g + 1)) <= g)
        s_item = s_item + 1
        A_ = a_item.size
        v = np.arange(1, g + 1)
        items = []
        for b in (0, 1):
            name = f"group_{j}_{'parts' if b == 0 else 'spanned'}"
            flow_kind = "integer" if integer_flows else "continuous"
            item = model.add_variable(f"{name}_items", A_, kind=flow_kind)
            idle = model.add_variable(f"{name}_idle", g, kind=flow_kind)
            starts = a_item >= 1
            # into vertex v minus out of it, v = 1..g (vertex 0 sends every path)
            flow = (_sum_matrix(a_item + s_item - 1, np.arange(A_), 1.0, (g, A_))
                    - _sum_matrix(a_item[starts] - 1, np.flatnonzero(starts), 1.0, (g, A_))) @ item \
                + (_sum_matrix(v - 1, np.arange(g), 1.0, (g, g))
                   - _sum_matrix(np.arange(g - 1), np.arange(1, g), 1.0, (g, g))) @ idle
            if b == 0:
                part = model.add_variable(f"{name}_parts", g, kind=flow_kind)
                flow = flow + part
                mine = np.flatnonzero(unit_group == j)
                cols = (mine[:, None] * D + np.arange(g)[None, :]).ravel()
                model.add_constraint(f"{name}_supply", part - _sum_matrix(np.tile(np.arange(g), mine.size), cols,
                                                                          1.0, (g, U * D)) @ x >= 0.0)
            model.add_constraint(f"{name}_flow", flow - ends[(j * 2 + b) * V + v] == 0.0)
            items.append(_sum_matrix(s_item - 1, np.arange(A_), 1.0, (g, A_)) @ item)
            graphs.append((j, b, g, a_item, s_item, name))
        mine = single[zgroup[single] == j]
        model.add_constraint(f"group_{j}_items", items[0] + items[1]
                             - _sum_matrix(rep[mine] - 1, mine, 1.0, (g, E)) @ z >= 0.0)
    model.minimize(z.dot(c.coef[entry]) + k.dot(c.kcoef))
    return GroupModel(model, entry, copy, unit, unit_class, graphs, D)


def place_paths(problem: PolluxProblem, cl: Classes, gm: GroupModel, keeper_rows: np.ndarray,
                values: dict[str, np.ndarray]) -> np.ndarray:
    """Replicas per job and node from an integer solution of :func:`group_model`: kept jobs where they
    were; each graph's flow split into one path per node (a path ends where its node's free GPUs end);
    each path's part and items handed to the jobs that chose parts and shapes of those sizes."""
    c = cl.choices
    n, m = problem.num_jobs, problem.num_nodes
    group, _ = _groups(problem)
    kept = np.rint(values["keep"]).astype(np.int64)
    replicas = np.zeros((n, m), dtype=np.int64)
    replicas[keeper_rows[kept > 0]] = problem.previous[keeper_rows[kept > 0]]
    free, blocked = node_ends(problem, keeper_rows, c.kspread, kept)
    # members of each class in turn take the shapes chosen for the class
    z = np.rint(values["z"]).astype(np.int64)
    taken = np.zeros(cl.size.size, dtype=np.int64)
    items: dict[tuple[int, int], deque] = defaultdict(deque)
    unit_job: dict[int, int] = {}
    zg = c.t if problem.speedup.shape[1] > 1 else np.zeros(c.job.size, dtype=np.int64)
    for col in np.flatnonzero(z > 0):
        e, u = gm.entry[col], c.job[gm.entry[col]]
        rows = cl.members[u][taken[u]:taken[u] + z[col]]
        taken[u] += z[col]
        if gm.unit[col] >= 0:
            unit_job[int(gm.unit[col])] = rows[0]
        else:
            items[(int(zg[e]), int(c.rep[e]))].extend(rows)
    x = np.rint(values["parts"]).astype(np.int64).reshape(-1, gm.width)
    parts: dict[tuple[int, int], deque] = defaultdict(deque)
    for u, i in unit_job.items():
        j = int(zg[gm.entry[np.flatnonzero(gm.unit == u)[0]]])
        for d in np.flatnonzero(x[u]):
            parts[(j, int(d) + 1)].extend([i] * int(x[u, d]))
    for j, b, g, a_item, s_item, name in gm.graphs:
        # arcs out of each vertex: [size, kind (0 item, 1 part, 2 idle), remaining flow]
        out: list[list[list[int]]] = [[] for _ in range(g + 1)]
        for a, s, f in zip(a_item, s_item, np.rint(values[f"{name}_items"]).astype(np.int64)):
            if f > 0:
                out[a].append([int(s), 0, int(f)])
        for v, f in enumerate(np.rint(values[f"{name}_idle"]).astype(np.int64)):
            if f > 0:
                out[v].append([1, 2, int(f)])
        if b == 0:
            for d, f in enumerate(np.rint(values[f"{name}_parts"]).astype(np.int64), start=1):
                if f > 0:
                    out[0].append([d, 1, int(f)])
        here = np.flatnonzero((group == j) & (blocked == bool(b)) & (free > 0))
        nodes_at: dict[int, list[int]] = defaultdict(list)
        for node in here:
            nodes_at[int(free[node])].append(int(node))
        for _ in range(here.size):
            v, arcs = 0, []
            while v == 0 or not nodes_at.get(v):
                arc = next((a for a in out[v] if a[2] > 0), None)
                if arc is None:
                    raise SolverError(f"pollux: the solver's flow on {name} does not reach a node's free GPUs "
                                      "(numerical trouble); try another backend")
                arc[2] -= 1
                arcs.append((arc[0], arc[1]))
                v += arc[0]
            node = nodes_at[v].pop()
            for s, kind in arcs:
                queue = items.get((j, s)) if kind == 0 else parts.get((j, s)) if kind == 1 else None
                if queue:
                    replicas[queue.popleft(), node] += s
    if any(items.values()) or any(parts.values()):
        raise SolverError("pollux: the solver's packing leaves chosen jobs without nodes (numerical trouble); "
                          "try another backend")
    return replicas


#: Variable blocks of :func:`group_model` that are decisions (the rest are the arcs' flows).
DECISIONS = ("z", "keep", "parts", "shared_node")


def solve_by_groups(problem: PolluxProblem, solver: ModelSolver, p: float, scale: float, epsilon: float
                    ) -> tuple[np.ndarray, dict[str, Any], Status, str]:
    """Pollux's MILP over groups of nodes (:func:`group_model`), to zero gap unless the caller gives
    ``mip_gap``, its optimum placed on nodes by :func:`place_paths`.

    The MILP is solved first with continuous flows (the arcs' integrality costs HiGHS most of its
    cutting rounds); its decisions are then fixed and integer flows sought for them (a MILP over a
    few dozen arcs). Found, they realize the relaxation's optimum, so it is the MILP's; else the
    MILP with integer flows is solved whole."""
    n, m = problem.num_jobs, problem.num_nodes
    c = choices(problem, p, scale, epsilon)
    if c.job.size + c.keepers.size == 0:
        return np.zeros((n, m), dtype=np.int64), {"mip_gap": 0.0, "job_classes": 0}, Status.OPTIMAL, \
            "No job gains from an allocation: every job idles."
    cl = job_classes(problem, c)
    options = replace(solver.options, mip_gap=solver.options.mip_gap or 0.0)
    relaxed = group_model(problem, cl, c.keepers, integer_flows=False).model.compile()
    solution = solver.check(solver.record(solve_model(relaxed, solver.backend, options, ZERO_GAP)),
                            "pollux (the MILP over groups of nodes, continuous flows)")
    gm = group_model(problem, cl, c.keepers)
    whole = gm.model.compile()
    lb, ub = whole.col_lb.copy(), whole.col_ub.copy()
    for name in DECISIONS:
        if name in whole.variables:
            cols = whole.variables[name][0]
            lb[cols] = ub[cols] = np.rint(solution.values[name])
    fixed = solver.record(solve_model(replace(whole, col_lb=lb, col_ub=ub, c=np.zeros_like(whole.c)),
                                      solver.backend, replace(solver.options, mip_gap=None), None))
    flows_found = fixed.status is Status.OPTIMAL
    if flows_found:
        values = fixed.values
    else:
        logger.info("pollux: the optimum with continuous flows has no integer flows (%s); solving the MILP with "
                    "integer flows", fixed.status.value)
        solution = solver.check(solver.record(solve_model(whole, solver.backend, options, ZERO_GAP)),
                                "pollux (the MILP over groups of nodes)")
        values = solution.values
    replicas = place_paths(problem, cl, gm, c.keepers, values)
    gap = 0.0 if solution.mip_gap is None else float(solution.mip_gap)
    return replicas, {"mip_gap": gap, "job_classes": int(cl.size.size), "milp_columns": int(whole.num_cols),
                      "milp_rows": int(whole.num_rows), "integer_flows_solved_whole": not flows_found}, \
        solution.status, solution.message
