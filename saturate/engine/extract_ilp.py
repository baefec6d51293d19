"""Extract stage, exact: the cheapest DAG as an integer program (scipy's HiGHS), bounded in time.

The local search in extract.py moves one e-class at a time; some improvements need several at
once (a conv feeding two batch-norms: keeping it shared means undoing both folds together).
This program sees all of them: one 0/1 variable per e-node, every chosen e-node's children
chosen too, a level per e-class that must grow along chosen edges so the answer is acyclic.
Constant and free leaves (cost 0, always computable) are left out, which keeps it small.
"""

from __future__ import annotations

from typing import Any

import numpy as np


MAX_VARIABLES = 6000


def solve(classes: dict, best: dict, prices: dict, banned: dict, roots: list, consts: set, ckey: dict,
          budget: float) -> dict[Any, int] | None:
    """Optimal choice per e-class by DAG cost, or None (too large, out of time, infeasible).

    E-nodes are positions in their e-class's list (`classes`, the view's), priced by `prices`
    (lists parallel to it); `best` is the bottom-up choice, e-class -> (tree cost, position).
    The answer maps each needed e-class to a position. `ckey` (structural keys of e-classes)
    orders the program, so the answer does not depend on the order egglog stored its tables in.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp   # only when needed: 0.1 s import
    from scipy.sparse import coo_matrix

    free = {c for c, (cost, k) in best.items() if cost == 0 and (c in consts or not classes[c][k].children)}
    reached, found = _reachable(classes, best, prices, banned, roots, free)
    if not found or len(found) > MAX_VARIABLES:
        return None
    reached.sort(key=lambda c: ckey[c])
    nodes = [(c, classes[c][k], k) for c, k in found]
    nodes.sort(key=lambda cn: (ckey[cn[0]], cn[1].kind, cn[1].head, str(cn[1].key),
                               [ckey[ch] for ch in cn[1].children]))
    index = {c: k for k, c in enumerate(reached)}
    nx, nc = len(nodes), len(reached)
    # Variables: x (one per e-node), then t (one level per e-class).
    rows, cols, vals, lo, hi = [], [], [], [], []

    def row(entries: list[tuple[int, float]], low: float, high: float) -> None:
        r = len(lo)
        for col, v in entries:
            rows.append(r)
            cols.append(col)
            vals.append(v)
        lo.append(low)
        hi.append(high)

    members: dict[Any, list[int]] = {}
    for k, (c, _, _) in enumerate(nodes):
        members.setdefault(c, []).append(k)
    for r in dict.fromkeys(roots):
        if r not in free:
            row([(k, 1.0) for k in members[r]], 1.0, np.inf)
    big = float(nc + 1)
    for k, (c, node, _) in enumerate(nodes):
        for ch in dict.fromkeys(node.children):
            if ch in free:
                continue
            # Choosing this e-node chooses one e-node of each child ...
            row([(m, 1.0) for m in members[ch]] + [(k, -1.0)], 0.0, np.inf)
            # ... placed strictly below it: t_c - t_ch >= 1 when chosen.
            row([(nx + index[c], 1.0), (nx + index[ch], -1.0), (k, -big)], 1.0 - big, np.inf)
    a = coo_matrix((vals, (rows, cols)), shape=(len(lo), nx + nc)).tocsr()
    objective = np.concatenate([np.array([prices[c][k] for c, _, k in nodes], dtype=float), np.zeros(nc)])
    result = milp(objective, constraints=LinearConstraint(a, lo, hi),
                  integrality=np.concatenate([np.ones(nx), np.zeros(nc)]),
                  bounds=Bounds(np.zeros(nx + nc), np.concatenate([np.ones(nx), np.full(nc, big)])),
                  options={"time_limit": max(budget, 0.01), "disp": False})
    if result.x is None:
        return None
    chosen: dict[Any, int] = {}
    for x, (c, _, k) in enumerate(nodes):
        if result.x[x] > 0.5 and (c not in chosen or prices[c][k] < prices[c][chosen[c]]):
            chosen[c] = k
    return _walk(classes, chosen, best, roots)


def _reachable(classes: dict, best: dict, prices: dict, banned: dict, roots: list, free: set
               ) -> tuple[list, list[tuple[Any, int]]]:
    """E-classes reachable from the roots through usable e-nodes, and those e-nodes (e-class,
    position); only the reachable e-classes are looked at, not the whole e-graph."""
    seen: dict[Any, None] = {}
    stack = [r for r in roots if r not in free]
    found: list[tuple[Any, int]] = []
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen[c] = None
        row, bad = prices[c], banned.get(c, ())
        for k, n in enumerate(classes[c]):
            v = row[k]
            if v is None or v < 0 or k in bad or not all(ch in best for ch in n.children):
                continue
            found.append((c, k))
            stack.extend(ch for ch in n.children if ch not in free and ch not in seen)
        if len(found) > MAX_VARIABLES:
            break
    return list(seen), found


def _walk(classes: dict, chosen: dict, best: dict, roots: list) -> dict[Any, int]:
    """The choice restricted to what the roots reach (free leaves take their cheapest e-node)."""
    out: dict[Any, int] = {}
    stack = list(roots)
    while stack:
        c = stack.pop()
        if c in out:
            continue
        out[c] = chosen[c] if c in chosen else best[c][1]
        stack.extend(classes[c][out[c]].children)
    return out
