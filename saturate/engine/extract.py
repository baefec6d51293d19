"""Extract stage: the cheapest DAG in the e-graph, a shared node paid once, within a time budget.

A Knuth/Dijkstra bottom-up pass gives each e-class its cheapest e-node by tree cost (exact
Python ints). Tree cost over-counts shared nodes, so a local search then switches e-classes to
other e-nodes whenever the DAG cost (each chosen node paid once) drops, for instance to keep a
BatchNormalization on a conv output that another consumer also reads rather than duplicate the conv.
Where the e-graph is small enough, an integer program (extract_ilp) then finds the exact optimum
within the time budget; it replaces the local answer only when strictly cheaper.

Everything runs under a deadline. Pricing an op e-node asks the target (and the e-graph for the
types it reads), so the input graph's own e-nodes are priced first, then the rest; e-nodes left
unpriced at the deadline are not chosen, and the bottom-up pass still finds a graph, since the
input graph's e-nodes are always there. If the deadline passes inside the bottom-up pass itself,
the answer is the input graph (`Extraction.choice` is None). The work is per e-class and per
e-node position (`Prices`), never hashing an e-node, which is what made a 120,000 e-node
extraction take 8 to 14 s.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from saturate.engine.egraph import ENode
from saturate.engine.extract_ilp import solve
from saturate.engine.facts import Facts

UNRUNNABLE = None   # the cost of an e-node the target cannot run (never chosen)
UNPRICED = -1       # an e-node the deadline left unpriced (never chosen); real costs are >= 0
CHECK_EVERY = 2048  # e-nodes between two looks at the clock
PRICE_SHARE = 0.5   # of the time to the deadline, the most pricing may take


@dataclass
class Extraction:
    """The chosen e-node per e-class reachable from the roots, and its DAG cost.

    `choice` is None when the deadline passed before every root had a choice: the input graph is
    the answer. `cut` names the stage the deadline stopped ("" when extraction ran to the end)."""

    choice: dict[Any, ENode] | None
    dag_cost: int
    tree_dag_cost: int          # DAG cost of the tree-greedy answer, before the local search
    moves: int
    cut: str = ""
    priced: int = 0             # e-nodes priced, of
    nodes: int = 0              # all e-nodes


@dataclass
class Prices:
    """Cost of every e-node, as a list per e-class parallel to its e-nodes in the view: zero for
    leaves and constant expressions, the target's for ops, UNRUNNABLE, or UNPRICED. Pricing can
    stop at a deadline and go on later (one Prices serves every extraction of one e-graph)."""

    facts: Facts
    cost: Callable
    of: dict[Any, list] = field(default_factory=dict)
    done: bool = False
    count: int = 0
    _typed: dict = field(default_factory=dict)
    _same: dict = field(default_factory=dict)

    def fill(self, deadline: float | None = None) -> bool:
        """Price what is not priced yet, the input graph's e-nodes first; whether all are."""
        if self.done:
            return True
        classes, of = self.facts.view.classes, self.of
        if not of:
            for cls, nodes in classes.items():
                of[cls] = [0 if n.kind != "op" else UNPRICED for n in nodes]
                self.count += sum(1 for n in nodes if n.kind != "op")
            # The input graph's e-nodes always get a price: they are the answer of last resort.
            for cls, node in self.facts.original_nodes():
                nodes = classes.get(cls, ())
                for k, n in enumerate(nodes):
                    if n == node and of[cls][k] == UNPRICED:
                        of[cls][k] = self._price(cls, n)
                        self.count += 1
        if deadline is not None and time.perf_counter() > deadline:
            return False            # a later extraction of the same e-graph, already out of time
        seen = 0
        for cls, nodes in classes.items():
            row = of[cls]
            for k, n in enumerate(nodes):
                if row[k] != UNPRICED:
                    continue
                seen += 1
                if deadline is not None and seen % CHECK_EVERY == 0 and time.perf_counter() > deadline:
                    return False
                row[k] = self._price(cls, n)
                self.count += 1
        self.done = True
        return True

    def _type(self, cls: Any) -> tuple:
        """The type of an e-class and its dictionary key, asked of the e-graph once per e-class."""
        got = self._typed.get(cls)
        if got is None:
            info = self.facts.info(cls)
            got = self._typed[cls] = (info, _typed(info))
        return got

    def _price(self, cls: Any, node: ENode) -> int | None:
        # E-nodes of one op with the same attributes and types cost the same; a grown e-graph
        # holds many of them (16 per e-class on average under associativity), and the target's
        # formula is the slowest part of pricing: it runs once per distinct signature.
        typed = self._typed
        sig = [node.key, self._type(cls)[1]]
        for ch in node.children:
            got = typed.get(ch)
            sig.append((got if got is not None else self._type(ch))[1])
        sig = tuple(sig)
        got = self._same.get(sig, UNPRICED)
        if got == UNPRICED:
            op, a = self.facts.enc.attr_sets[node.key]
            c = self.cost(op, a, [self._type(ch)[0] for ch in node.children], self._type(cls)[0])
            got = self._same[sig] = UNRUNNABLE if c is None or not math.isfinite(c) else int(math.ceil(c))
        return got


def _typed(info: Any) -> tuple | None:
    """What a cost can read of a value's type, as a dictionary key."""
    if info is None:
        return None
    return info.dtype, None if info.shape is None else tuple(info.shape)


def _usable(price: Any) -> bool:
    return price is not UNRUNNABLE and price != UNPRICED


def _banned_positions(facts: Facts, banned: set) -> dict[Any, set[int]]:
    """Banned (e-class, e-node) pairs as positions in the view's e-node lists."""
    out: dict[Any, set[int]] = {}
    for cls, node in banned:
        for k, n in enumerate(facts.view.classes.get(cls, ())):
            if n == node:
                out.setdefault(cls, set()).add(k)
    return out


def greedy(facts: Facts, prices: dict[Any, list], banned: dict[Any, set[int]],
           deadline: float | None = None) -> tuple[dict[Any, tuple[int, int]], dict[Any, Any], bool]:
    """Cheapest e-node of every e-class by tree cost, bottom-up in cost order.

    Ties go to the e-node the input graph had, then to a structural key of the e-node (never
    to e-class ids, which depend on the order rules fired): the same rules in any order give
    the same graph. Returns the choice (e-class -> (tree cost, position of its e-node)), each
    e-class's structural key, and whether it finished before the deadline.
    """
    view = facts.view
    ckey: dict[Any, Any] = {cls: ("v", min(facts.order[n] for n in names))
                            for cls, names in facts.names.items()}
    original: dict[Any, set[int]] = {}
    for cls, node in facts.original_nodes():
        for k, n in enumerate(view.classes.get(cls, ())):
            if n == node:
                original.setdefault(cls, set()).add(k)

    # E-nodes by number: their e-class, position in it, children; parents by e-class.
    owner: list = []
    place: list[int] = []
    waiting: list[int] = []
    parents: dict[Any, list[int]] = {}
    heap: list = []
    add_owner, add_place, add_waiting, parent_of = owner.append, place.append, waiting.append, parents.get
    seen, look = 0, CHECK_EVERY
    for cls, nodes in view.classes.items():
        seen += len(nodes)
        if deadline is not None and seen >= look:
            look = seen + CHECK_EVERY
            if time.perf_counter() > deadline:
                return {}, ckey, False
        row, bad = prices[cls], banned.get(cls, ())
        for k, node in enumerate(nodes):
            c = row[k]
            if c is UNRUNNABLE or c == UNPRICED or k in bad:
                continue
            j = len(owner)
            add_owner(cls)
            add_place(k)
            kids = node[3]          # children, read by position: the hottest loop of extraction
            if len(kids) > 1:
                kids = set(kids)
            add_waiting(len(kids))
            for ch in kids:
                got = parent_of(ch)
                if got is None:
                    parents[ch] = [j]
                else:
                    got.append(j)
            if not kids:
                heap.append((c, _tie(cls, node, k, original, ckey), j))
    heapq.heapify(heap)
    best: dict[Any, tuple[int, int]] = {}
    # The least (tree cost, tie) pushed so far per e-class: an e-node above it can never be
    # popped first, so it is not pushed (a grown e-class holds many e-nodes of equal cost).
    pushed: dict[Any, tuple] = {}
    pops = 0
    while heap:
        pops += 1
        if deadline is not None and pops % CHECK_EVERY == 0 and time.perf_counter() > deadline:
            return best, ckey, False
        c, t, j = heapq.heappop(heap)
        cls = owner[j]
        if cls in best:
            continue
        best[cls] = (c, place[j])
        if cls not in ckey:
            ckey[cls] = ("h", hashlib.blake2b(repr(t[1:]).encode(), digest_size=8).hexdigest())
        for p in parents.get(cls, ()):
            waiting[p] -= 1
            if waiting[p] == 0:
                pcls = owner[p]
                if pcls in best:
                    continue
                pk = place[p]
                pnode = view.classes[pcls][pk]
                total = prices[pcls][pk]
                for ch in pnode.children:
                    total += best[ch][0]
                low = pushed.get(pcls)
                if low is not None and total > low[0]:
                    continue
                entry = (total, _tie(pcls, pnode, pk, original, ckey), p)
                if low is not None and entry >= low:
                    continue
                pushed[pcls] = entry
                heapq.heappush(heap, entry)
    return best, ckey, True


def _unrunnable(facts: Facts, prices: dict[Any, list], best: dict, root: Any) -> str:
    """Why `root` has no extractable e-node, naming the op: below it, the first e-class with no
    choice although every input of its e-nodes has one holds only ops the target cannot run."""
    classes, seen, cls = facts.view.classes, set(), root
    while cls not in seen:
        seen.add(cls)
        lacking = [c for n in classes.get(cls, ()) for c in n.children if c not in best and c not in seen]
        if not lacking:
            break
        cls = lacking[0]
    ops = sorted({n.head for k, n in enumerate(classes.get(cls, ()))
                  if n.kind == "op" and prices[cls][k] is UNRUNNABLE})
    values = facts.names.get(cls, [])
    nodes = [n.name or n.outputs[0] for n in facts.enc.graph.nodes if n.outputs and n.outputs[0] in values]
    where = f"node '{nodes[0]}'" if nodes else f"value '{values[0]}'" if values else "a value the rules built"
    return (f"the target cannot run {' or '.join(ops) or 'any op that computes it'} ({where}), "
            "and no rewrite gives an equivalent it can run")


def _tie(cls: Any, node: ENode, k: int, original: dict, ckey: dict) -> tuple:
    kids = tuple(ckey[ch] for ch in node.children)
    return (k not in original.get(cls, ()), node.kind, node.head, str(node.key), kids)


def extract(facts: Facts, roots: list[Any], cost: Callable, banned: set = frozenset(),
            budget: float = 2.0, deadline: float | None = None, prices: Prices | None = None,
            exact: bool = False) -> Extraction:
    """Choose one e-node per needed e-class; `deadline` (a time.perf_counter() value) bounds the
    whole extraction, the local search taking at most half of what pricing left and the exact
    program the rest; without a deadline, `budget` seconds are shared that way. `prices`
    carries the e-nodes' costs from an earlier extraction of the same e-graph. `exact` runs the
    exact program whatever the local answer costs (a node several e-classes could share)."""
    prices = prices if prices is not None else Prices(facts, cost)
    nodes = sum(len(v) for v in facts.view.classes.values())
    # Pricing stops halfway to the deadline: the bottom-up pass over what it priced needs about
    # as long again, and without it there is no answer but the input graph.
    now = time.perf_counter()
    cut = "" if prices.fill(None if deadline is None else now + PRICE_SHARE * (deadline - now)) else "pricing"
    bans = _banned_positions(facts, banned) if banned else {}
    best, ckey, finished = greedy(facts, prices.of, bans, deadline)
    missing = [r for r in roots if r not in best]
    if not finished:
        return Extraction(None, 0, 0, 0, "bottom-up pass", prices.count, nodes)
    if missing:
        from saturate.core.errors import SaturateError
        raise SaturateError(f"no extractable graph: {_unrunnable(facts, prices.of, best, missing[0])}")
    classes = facts.view.classes
    search = _DagSearch(classes, best, prices.of, bans, roots, ckey)
    start = search.total()

    def left(share: float) -> float:
        """Seconds for the next step: `share` of the remaining time (of `budget` without a
        deadline). Not a fixed number of seconds under a deadline: on a loaded machine the same
        search takes longer, and a cut search returns a different graph."""
        if deadline is None:
            return share * budget
        return max(0.0, share * (deadline - time.perf_counter()))

    moves = search.improve(left(0.5))
    # A node that several e-classes could read at once (one MatMul for q, k and v) pays off only
    # when they all switch to it together, a move the one-class search never makes: tried here
    # as one move per such node, and left to the exact program below where it is not enough.
    shared = _shared_candidates(classes, search.chosen, prices.of, best, ckey, bans) if exact else []
    for moves_together in shared:
        moves += search.group(moves_together)
    if deadline is not None and time.perf_counter() > deadline:
        cut = cut or "local search"
    choice = {c: classes[c][k] for c, k in search.chosen.items()}
    total = search.total()
    # The exact program only runs where sharing is known to matter: the local answer still costs
    # more than the input graph did (a conv feeding two batch norms, folded into both). Where the
    # local search only had to move, the program never found better on the corpus models and cost
    # more than the rest of extraction.
    needed = (exact and bool(_shared_candidates(classes, search.chosen, prices.of, best, ckey, bans))) \
        or total > _original_cost(facts, prices.of)
    seconds = left(1.0) if deadline is not None else left(0.5)
    exact = solve(classes, best, prices.of, bans, roots, facts.view.consts, ckey, seconds) \
        if needed and seconds > 0 else None
    if exact is not None:
        exact_total = sum(prices.of[c][k] for c, k in exact.items())
        if exact_total < total:
            choice, total = {c: classes[c][k] for c, k in exact.items()}, exact_total
    return Extraction(choice, total, start, moves, cut, prices.count, nodes)


def _shared_candidates(classes: dict, chosen: dict, prices: dict, best: dict, ckey: dict,
                       banned: dict) -> list[dict]:
    """E-classes outside the chosen graph that could pay for themselves if every chosen e-class
    with a cheaper e-node reading one switched to that e-node: what each saves, summed, above the
    e-node it would be computed by. For each, those switches (e-class -> e-node position), in a
    fixed order. Not exact (an e-node's other new inputs are not counted): it tells where sharing
    may pay from where it cannot."""
    saving: dict[Any, int] = {}
    moves: dict[Any, dict[Any, int]] = {}
    for c, k in chosen.items():
        own = prices[c][k]
        for j, node in enumerate(classes[c]):
            p = prices[c][j]
            if j != k and _usable(p) and p < own and j not in banned.get(c, ()) \
                    and all(ch in best for ch in node.children):
                for ch in set(node.children):
                    if ch not in chosen:
                        saving[ch] = saving.get(ch, 0) + own - p
                        mine = moves.setdefault(ch, {})
                        if c not in mine or p < prices[c][mine[c]]:
                            mine[c] = j
    out = []
    for ch in sorted(saving, key=lambda c: ckey[c]):
        got = best.get(ch)
        # A free input (a constant, a leaf) needs no sharing: the local search takes it alone.
        if got is not None and _usable(prices[ch][got[1]]) and saving[ch] > prices[ch][got[1]] > 0:
            out.append(moves[ch])
    return out


def _original_cost(facts: Facts, prices: dict) -> int | float:
    """Cost of the input graph as it was, priced as the e-graph prices it: each of its ops once
    (its op e-nodes and its opaque ones). Infinite when one of them is not priced (past the
    pricing deadline), so that the exact program is not started on a guess."""
    classes = facts.view.classes
    total: int | float = 0
    for c, n in facts.original_nodes():
        k = next((k for k, m in enumerate(classes.get(c, ())) if m == n), None)
        if k is None or not _usable(prices[c][k]):
            return math.inf
        total += prices[c][k]
    for c, nodes in classes.items():
        for k, n in enumerate(nodes):
            if n.kind == "opaque":
                if not _usable(prices[c][k]):
                    return math.inf
                total += prices[c][k]
    return total


class _DagSearch:
    """Reference-counted chosen DAG; a move switches one e-class to another e-node.

    E-nodes are positions in their e-class's list in the view; an e-class's alternatives are
    sorted the first time the search looks at it (most e-classes of a grown e-graph it never does).
    """

    def __init__(self, classes: dict, best: dict, prices: dict, banned: dict, roots: list, ckey: dict):
        self.classes, self.best, self.prices, self.banned = classes, best, prices, banned
        self.roots, self.ckey = roots, ckey
        self._alternatives: dict[Any, list[int]] = {}
        self._bound: dict[Any, int] | None = None     # see `freed`, for the choice as it stands
        self._walked = 0                                # e-classes the tries walked since
        self.chosen: dict[Any, int] = {}
        self.refs: dict[Any, int] = {}
        for r in roots:
            self._add(r)

    def alternatives(self, cls: Any) -> list[int]:
        got = self._alternatives.get(cls)
        if got is None:
            nodes, row, bad, best, ckey = self.classes[cls], self.prices[cls], self.banned.get(cls, ()), \
                self.best, self.ckey
            got = [k for k, n in enumerate(nodes)
                   if _usable(row[k]) and k not in bad and all(ch in best for ch in n.children)]
            got.sort(key=lambda k: (row[k], nodes[k].kind, nodes[k].head, str(nodes[k].key),
                                    [ckey[ch] for ch in nodes[k].children]))
            self._alternatives[cls] = got
        return got

    def _cost(self, cls: Any, k: int) -> int:
        return self.prices[cls][k]

    def _kids(self, cls: Any, k: int) -> tuple:
        return self.classes[cls][k].children

    def _add(self, root: Any, pick: dict | None = None) -> None:
        stack = [root]
        while stack:
            cls = stack.pop()
            self.refs[cls] = self.refs.get(cls, 0) + 1
            if self.refs[cls] == 1:
                k = pick[cls] if pick is not None and cls in pick else self.best[cls][1]
                self.chosen[cls] = k
                stack.extend(self._kids(cls, k))

    def total(self) -> int:
        return sum(self.prices[c][k] for c, k in self.chosen.items())

    def group(self, moves: dict[Any, int]) -> int:
        """Switch these e-classes to these e-nodes at once if that lowers the DAG cost and keeps
        the graph acyclic (e-classes newly needed take their bottom-up choice); 1 if it did."""
        pick = {**self.chosen, **moves}
        new: dict[Any, int] = {}
        stack = list(self.roots)
        while stack:
            c = stack.pop()
            if c not in new:
                new[c] = pick.get(c, self.best[c][1])
                stack.extend(self._kids(c, new[c]))
        if sum(self.prices[c][k] for c, k in new.items()) >= self.total() or not self._acyclic(new):
            return 0
        self.chosen, self.refs = {}, {}
        for r in self.roots:
            self._add(r, new)
        return 1

    def _acyclic(self, choice: dict[Any, int]) -> bool:
        state: dict[Any, int] = {}        # 1: on the current path, 2: done
        for root in self.roots:
            stack = [(root, iter(self._kids(root, choice[root])))]
            if state.get(root) == 2:
                continue
            state[root] = 1
            while stack:
                cls, kids = stack[-1]
                for ch in kids:
                    if state.get(ch) == 1:
                        return False
                    if ch not in state:
                        state[ch] = 1
                        stack.append((ch, iter(self._kids(ch, choice[ch]))))
                        break
                else:
                    state[cls] = 2
                    stack.pop()
        return True

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
                stack.extend((c, False) for c in self._kids(cls, self.chosen[cls]) if c not in pos)
        return pos

    def improve(self, budget: float) -> int:
        """Apply improving moves until none is left or the time budget is spent."""
        deadline = time.perf_counter() + budget
        moves, changed = 0, True
        while changed and time.perf_counter() < deadline:
            changed = False
            pos = self.order()
            self._bound, self._walked = None, 0
            for cls in list(pos):       # children first, as `order` filled it
                if cls not in self.chosen or len(self.classes[cls]) < 2:
                    continue
                alts = self.alternatives(cls)
                if len(alts) < 2:
                    continue
                if time.perf_counter() > deadline:
                    break
                for k in alts:
                    if self._bound is None and self._walked > len(pos):
                        # Since the pass began or the last move, the tries have walked as far as
                        # finding every bound at once does: from here on the bounds spare walks.
                        # Finding them at once whenever the choice changed cost more than the
                        # tries they spared: ViTs after each move, most CNNs' one pass (whose
                        # tries are short), where extraction took 9% longer.
                        self._bound = self.freed(pos)
                    if k != self.chosen[cls] and self._try(cls, k, pos):
                        moves += 1
                        changed = True
                        pos = self.order()
                        self._bound, self._walked = None, 0      # stale after the move
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
            self._walked += 1
            if c in seen or pos.get(c, -1) < limit:
                continue
            seen.add(c)
            stack.extend(self._kids(c, self.chosen[c]))
        return False

    def freed(self, pos: dict) -> dict[Any, int]:
        """Per chosen e-class, the cost of the chosen e-classes below it that only it holds: what
        switching it to another e-node frees at most (the new e-node may hold some again).

        Those are the e-classes it dominates in the chosen DAG (every path from a root passes
        through it), found for all at once with Cooper, Harvey and Kennedy's iteration, one pass
        in topological order, then summed up the dominator tree. Walking each e-class's own part
        instead cost time quadratic in a chain's length."""
        classes, chosen, prices = self.classes, self.chosen, self.prices
        ordered = list(pos)             # `order` numbers e-classes children first, from 0 on
        n = len(ordered)
        parents: list[list[int]] = [[] for _ in range(n)]
        for i, c in enumerate(ordered):
            for ch in classes[c][chosen[c]].children:
                parents[pos[ch]].append(i)
        # Numbers, not e-classes, in the hot loop; n stands above the roots (a root is never freed),
        # and a dominator is numbered above what it dominates.
        idom = [n] * (n + 1)
        roots = {pos[r] for r in self.roots}
        for i in range(n - 1, -1, -1):
            d = n if i in roots else -1
            for a in parents[i]:
                if d < 0:
                    d = a
                    continue
                b = d
                while a != b:
                    while a < b:
                        a = idom[a]
                    while b < a:
                        b = idom[b]
                d = a
            idom[i] = n if d < 0 else d
        own = [prices[c][chosen[c]] for c in ordered]
        below = own + [0]
        for i in range(n):
            below[idom[i]] += below[i]
        return {c: below[i] - own[i] for i, c in enumerate(ordered)}

    def _try(self, cls: Any, k: int, pos: dict) -> bool:
        """Switch `cls` to its e-node `k` if that lowers the DAG cost and keeps the graph acyclic."""
        dref: dict[Any, int] = {}
        added: dict[Any, int] = {}
        delta = self._cost(cls, k) - self._cost(cls, self.chosen[cls])
        # Costs are never negative, so the e-classes the new e-node adds only raise `delta`: once it
        # passes what the switch could free, it cannot pay (most alternatives bring a chain of their
        # own, and walking it whole cost 80 us a try on MobileNetV2's dynamo export).
        bound = self._bound[cls] if self._bound is not None else math.inf
        if delta >= bound:
            return False
        stack = list(self._kids(cls, k))
        while stack:
            c = stack.pop()
            self._walked += 1
            if c in self.chosen and self.refs.get(c, 0) > 0:
                if pos[c] >= pos[cls] and self._reaches(c, cls, pos):
                    return False     # c depends on cls: switching would close a cycle
            elif c not in added:
                added[c] = self.best[c][1]
                delta += self._cost(c, added[c])
                if delta >= bound:
                    return False
                stack.extend(self._kids(c, added[c]))
            dref[c] = dref.get(c, 0) + 1
        stack = list(self._kids(cls, self.chosen[cls]))
        removed: set = set()
        while stack:
            c = stack.pop()
            self._walked += 1
            dref[c] = dref.get(c, 0) - 1
            if c in self.chosen and self.refs[c] + dref[c] == 0 and c not in removed:
                removed.add(c)
                delta -= self._cost(c, self.chosen[c])
                stack.extend(self._kids(c, self.chosen[c]))
        if delta >= 0:
            return False
        self.chosen[cls] = k
        for c, n in added.items():
            self.chosen[c] = n
        for c, d in dref.items():
            self.refs[c] = self.refs.get(c, 0) + d
        for c in removed:
            if self.refs[c] == 0:
                del self.chosen[c]
        return True
