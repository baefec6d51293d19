"""Extract stage: the cheapest DAG in the e-graph, a shared node paid once.

A Knuth/Dijkstra bottom-up pass gives each e-class its cheapest e-node by tree cost (exact
Python ints). Tree cost over-counts shared nodes, so a local search then switches e-classes to
other e-nodes whenever the DAG cost (each chosen node paid once) drops, for instance to keep a
BatchNormalization on a conv output that another consumer also reads rather than duplicate the conv.
Where the e-graph is small enough, an integer program (extract_ilp) then finds the exact optimum
within the time budget; it replaces the local answer only when strictly cheaper.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from saturate.engine.egraph import ENode
from saturate.engine.extract_ilp import solve
from saturate.engine.facts import Facts

UNRUNNABLE = None   # the cost of an e-node the target cannot run (never chosen)


@dataclass
class Extraction:
    """The chosen e-node per e-class reachable from the roots, and its DAG cost."""

    choice: dict[Any, ENode]
    dag_cost: int
    tree_dag_cost: int          # DAG cost of the tree-greedy answer, before the local search
    moves: int


def node_costs(facts: Facts, cost: Callable, banned: set) -> dict[tuple, int | None]:
    """Cost of every e-node: zero for leaves and constant expressions, the target's for ops."""
    costs: dict[tuple, int | None] = {}
    attrs = facts.enc.attr_sets
    # E-nodes of one op with the same attributes and types cost the same; a grown e-graph holds
    # many of them, and the target's formula is the slowest part of extraction.
    same: dict[tuple, int | None] = {}
    for cls, nodes in facts.view.classes.items():
        for node in nodes:
            key = (cls, node)
            if key in banned:
                costs[key] = UNRUNNABLE
            elif node.kind == "op":
                ins, out = [facts.info(ch) for ch in node.children], facts.info(cls)
                sig = (node.key, tuple(map(_typed, ins)), _typed(out))
                if sig not in same:
                    op, a = attrs[node.key]
                    c = cost(op, a, ins, out)
                    same[sig] = UNRUNNABLE if c is None or not math.isfinite(c) else int(math.ceil(c))
                costs[key] = same[sig]
            else:
                costs[key] = 0
    return costs


def _typed(info: Any) -> tuple | None:
    """What a cost can read of a value's type, as a dictionary key."""
    if info is None:
        return None
    return info.dtype, None if info.shape is None else tuple(info.shape)


def greedy(facts: Facts, costs: dict) -> tuple[dict[Any, tuple[int, ENode]], dict[Any, Any]]:
    """Cheapest e-node of every e-class by tree cost, bottom-up in cost order.

    Ties go to the e-node the input graph had, then to a structural key of the e-node (never
    to e-class ids, which depend on the order rules fired): the same rules in any order give
    the same graph. Returns the choice and each e-class's structural key.
    """
    view = facts.view
    ckey: dict[Any, Any] = {cls: ("v", min(facts.order[n] for n in names))
                            for cls, names in facts.names.items()}
    original = facts.original_nodes()

    def tie(cls: Any, node: ENode) -> tuple:
        kids = tuple(ckey[ch] for ch in node.children)
        return ((cls, node) not in original, node.kind, node.head, str(node.key), kids)

    parents: dict[Any, list[tuple[Any, ENode]]] = {}
    waiting: dict[tuple, int] = {}
    heap: list = []
    for cls, nodes in view.classes.items():
        for node in nodes:
            if costs[(cls, node)] is UNRUNNABLE:
                continue
            kids = set(node.children)
            waiting[(cls, node)] = len(kids)
            for ch in kids:
                parents.setdefault(ch, []).append((cls, node))
            if not kids:
                heapq.heappush(heap, (costs[(cls, node)], tie(cls, node), id(node), cls, node))
    best: dict[Any, tuple[int, ENode]] = {}
    while heap:
        c, t, _, cls, node = heapq.heappop(heap)
        if cls in best:
            continue
        best[cls] = (c, node)
        if cls not in ckey:
            ckey[cls] = ("h", hashlib.blake2b(repr(t[1:]).encode(), digest_size=8).hexdigest())
        for pcls, pnode in parents.get(cls, ()):
            key = (pcls, pnode)
            waiting[key] -= 1
            if waiting[key] == 0 and pcls not in best:
                total = costs[key] + sum(best[ch][0] for ch in pnode.children)
                heapq.heappush(heap, (total, tie(pcls, pnode), id(pnode), pcls, pnode))
    return best, ckey


def extract(facts: Facts, roots: list[Any], cost: Callable, banned: set = frozenset(),
            budget: float = 2.0) -> Extraction:
    """Choose one e-node per needed e-class; `budget` bounds the local search in seconds."""
    costs = node_costs(facts, cost, banned)
    best, ckey = greedy(facts, costs)
    missing = [r for r in roots if r not in best]
    if missing:
        from saturate.core.errors import SaturateError
        raise SaturateError("no extractable graph: an output needs an op the target cannot run")
    search = _DagSearch(best, costs, roots, ckey)
    start = search.total()
    moves = search.improve(budget / 2)
    choice, total = search.chosen, search.total()
    # The exact program only runs where sharing is known to matter: the local answer still costs
    # more than the input graph did (a conv feeding two batch norms, folded into both). Where the
    # local search only had to move, the program never found better on the 46 corpus models and
    # cost up to 1.2 s each.
    needed = total > _original_cost(facts, best, costs, roots)
    exact = solve(best, costs, roots, facts.view.consts, ckey, budget / 2) if needed else None
    if exact is not None:
        exact_total = sum(costs[(c, n)] for c, n in exact.items())
        if exact_total < total:
            choice, total = exact, exact_total
    return Extraction(choice, total, start, moves)


def _original_cost(facts: Facts, best: dict, costs: dict, roots: list) -> int | float:
    """DAG cost of the input graph's own e-nodes (cheapest e-nodes where it had none)."""
    original = {c: n for c, n in facts.original_nodes() if costs.get((c, n)) is not UNRUNNABLE}
    seen: set = set()
    total, stack = 0, list(roots)
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        node = original.get(c) or best[c][1]
        if any(ch not in best for ch in node.children):
            return math.inf
        total += costs[(c, node)]
        stack.extend(node.children)
    return total


class _DagSearch:
    """Reference-counted chosen DAG; a move switches one e-class to another e-node."""

    def __init__(self, best: dict, costs: dict, roots: list, ckey: dict):
        self.best, self.costs, self.roots, self.ckey = best, costs, roots, ckey
        self.alternatives: dict[Any, list[ENode]] = {}
        for (c, n), v in costs.items():
            if v is not UNRUNNABLE and all(ch in best for ch in n.children):
                self.alternatives.setdefault(c, []).append(n)
        for c, alts in self.alternatives.items():
            alts.sort(key=lambda n: (costs[(c, n)], n.kind, n.head, str(n.key),
                                     [ckey[ch] for ch in n.children]))
        self.chosen: dict[Any, ENode] = {}
        self.refs: dict[Any, int] = {}
        for r in roots:
            self._add(r)

    def _add(self, root: Any) -> None:
        stack = [root]
        while stack:
            cls = stack.pop()
            self.refs[cls] = self.refs.get(cls, 0) + 1
            if self.refs[cls] == 1:
                node = self.best[cls][1]
                self.chosen[cls] = node
                stack.extend(node.children)

    def total(self) -> int:
        return sum(self.costs[(c, n)] for c, n in self.chosen.items())

    def order(self) -> dict[Any, int]:
        """Position of each chosen e-class in a topological order (children first)."""
        pos: dict[Any, int] = {}
        for root in self.roots:
            stack = [(root, False)]
            while stack:
                cls, done = stack.pop()
                if cls in pos:
                    continue
                if done:
                    pos[cls] = len(pos)
                    continue
                stack.append((cls, True))
                stack.extend((c, False) for c in self.chosen[cls].children if c not in pos)
        return pos

    def improve(self, budget: float) -> int:
        """Apply improving moves until none is left or the time budget is spent."""
        deadline = time.perf_counter() + budget
        moves, changed = 0, True
        while changed and time.perf_counter() < deadline:
            changed = False
            pos = self.order()
            for cls in sorted(pos, key=pos.get):
                alts = self.alternatives.get(cls, ())
                if cls not in self.chosen or len(alts) < 2:
                    continue
                if time.perf_counter() > deadline:
                    break
                for node in alts:
                    if node != self.chosen[cls] and self._try(cls, node, pos):
                        moves += 1
                        changed = True
                        pos = self.order()
                        break
        return moves

    def _reaches(self, src: Any, dst: Any, pos: dict) -> bool:
        """Whether `dst` is among the chosen descendants of `src`.

        In a topological order a descendant sits before its ancestor, so the search skips
        every e-class placed before `dst`.
        """
        seen, stack = set(), [src]
        limit = pos[dst]
        while stack:
            c = stack.pop()
            if c == dst:
                return True
            if c in seen or pos.get(c, -1) < limit:
                continue
            seen.add(c)
            stack.extend(self.chosen[c].children)
        return False

    def _try(self, cls: Any, node: ENode, pos: dict) -> bool:
        """Switch `cls` to `node` if that lowers the DAG cost and keeps the graph acyclic."""
        dref: dict[Any, int] = {}
        added: dict[Any, ENode] = {}
        delta = self.costs[(cls, node)] - self.costs[(cls, self.chosen[cls])]
        stack = list(node.children)
        while stack:
            c = stack.pop()
            if c in self.chosen and self.refs.get(c, 0) > 0:
                if pos[c] >= pos[cls] and self._reaches(c, cls, pos):
                    return False     # c depends on cls: switching would close a cycle
            elif c not in added:
                added[c] = self.best[c][1]
                delta += self.costs[(c, added[c])]
                stack.extend(added[c].children)
            dref[c] = dref.get(c, 0) + 1
        stack = list(self.chosen[cls].children)
        removed: set = set()
        while stack:
            c = stack.pop()
            dref[c] = dref.get(c, 0) - 1
            if c in self.chosen and self.refs[c] + dref[c] == 0 and c not in removed:
                removed.add(c)
                delta -= self.costs[(c, self.chosen[c])]
                stack.extend(self.chosen[c].children)
        if delta >= 0:
            return False
        self.chosen[cls] = node
        for c, n in added.items():
            self.chosen[c] = n
        for c, d in dref.items():
            self.refs[c] = self.refs.get(c, 0) + d
        for c in removed:
            if self.refs[c] == 0:
                del self.chosen[c]
        return True
