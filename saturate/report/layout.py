"""Report stage: a layered (Sugiyama) layout of a graph's nodes, by Graphviz dot or grandalf."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field

from saturate.core.errors import SaturateError
from saturate.core.ir import Graph
from saturate.frontend.text import written_dtype

# Pixel sizes of the drawing; dot takes inches, at 72 points per inch.
ROW = 26          # height of a box without a badge
BADGE = 15        # extra height for the line of constant shapes
GAP_Y = 14        # vertical gap between stacked boxes of one chain
RANK_SEP = 30     # vertical gap between layers
NODE_SEP = 22     # horizontal gap between boxes of one layer
MARGIN = 12
BADGE_SHAPES = 3  # constant shapes listed on a badge before "+k"
BIG = 600         # boxes + edges (after stacking chains) past which dot runs with iteration caps


@dataclass
class Box:
    """One drawn box: an op node, a graph input or a graph output, centred at (x, y)."""

    key: str
    kind: str                      # "node" | "input" | "output"
    label: str                     # the op, or the value name for inputs and outputs
    name: str                      # node name (or its first output), or the value name
    op: str = ""
    outputs: tuple[str, ...] = ()
    badge: str = ""                # shapes of the constants folded into the node
    tip: str = ""
    w: float = 0.0
    h: float = 0.0
    x: float = 0.0
    y: float = 0.0


@dataclass
class Edge:
    tail: str
    head: str
    points: list[tuple[float, float]] = field(default_factory=list)
    bezier: bool = False           # True: points are cubic Bezier control points (dot's splines)


@dataclass
class Drawing:
    boxes: list[Box]
    edges: list[Edge]
    width: float = 0.0
    height: float = 0.0
    engine: str = ""


def engine_available() -> str:
    """The layout engine `layout` uses by default: dot when Graphviz is installed, else grandalf."""
    return "dot" if shutil.which("dot") else "grandalf"


def _shape(shape: tuple | None) -> str:
    if shape is None:
        return "?"
    return "×".join(str(d) for d in shape) if shape else "scalar"


def build(graph: Graph) -> Drawing:
    """The boxes and edges to draw. Constants (initializers and Constant nodes) are not boxes:
    their shapes are listed as a badge on the node that reads them."""
    constant_nodes = {o: n for n in graph.nodes if n.op == "Constant" and not n.domain for o in n.outputs}
    inputs = set(graph.inputs)
    boxes: list[Box] = []
    producer: dict[str, str] = {}
    for i, value in enumerate(graph.inputs):
        box = Box(f"i{i}", "input", value, value, tip=f"input {value} {_value_text(graph, value)}")
        boxes.append(box)
        producer[value] = box.key
    edges: list[Edge] = []
    seen: set[tuple[str, str]] = set()

    def link(tail: str, head: str) -> None:
        if (tail, head) not in seen:          # a node reading one value twice gets one edge
            seen.add((tail, head))
            edges.append(Edge(tail, head))

    for i, n in enumerate(graph.nodes):
        if n.op == "Constant" and not n.domain:
            continue
        folded = [v for v in n.inputs
                  if v and ((v in graph.constants and v not in inputs) or v in constant_nodes)]
        shapes = [_shape(_constant_shape(graph, v, constant_nodes)) for v in folded]
        badge = " · ".join(shapes[:BADGE_SHAPES])
        if len(shapes) > BADGE_SHAPES:
            badge += f" +{len(shapes) - BADGE_SHAPES}"
        name = n.name or (n.outputs[0] if n.outputs else f"#{i}")
        tip = [f"{name}: {n.op}" + (f" ({n.domain})" if n.domain else "")]
        tip += [f"in  {v}" + (f"  [constant {_shape(_constant_shape(graph, v, constant_nodes))}]" if v in folded else "")
                for v in n.inputs if v]
        tip += [f"out {v} {_value_text(graph, v)}" for v in n.outputs if v]
        box = Box(f"n{i}", "node", n.op, name, n.op, tuple(n.outputs), badge, "\n".join(tip))
        boxes.append(box)
        for v in n.inputs:
            if v and v not in folded and v in producer:
                link(producer[v], box.key)
        for v in n.outputs:
            if v:
                producer[v] = box.key
    for i, value in enumerate(graph.outputs):
        box = Box(f"o{i}", "output", value, value, tip=f"output {value} {_value_text(graph, value)}")
        boxes.append(box)
        if value in producer:
            link(producer[value], box.key)
    for box in boxes:
        # Width from the text: about 7 px per character of the 12 px label, 6 px on the badge.
        box.w = max(56.0, 7.0 * len(box.label) + 18, 5.6 * len(box.badge) + 18)
        box.h = ROW + (BADGE if box.badge else 0)
    return Drawing(boxes, edges)


def _constant_shape(graph: Graph, value: str, constant_nodes: dict) -> tuple | None:
    # Straight from the array: graph.info would also build a dtype name, per input of 6,000 nodes.
    if value in graph.constants:
        return tuple(graph.constants[value].shape)
    node = constant_nodes.get(value)
    if node is not None and hasattr(node.attr("value"), "shape"):
        return tuple(node.attr("value").shape)
    return graph.info(value).shape


def _value_text(graph: Graph, value: str) -> str:
    info = graph.info(value)
    return f"{written_dtype(info.dtype)} {_shape(info.shape) if info.shape is not None else '?'}"


def layout(drawing: Drawing, engine: str | None = None) -> Drawing:
    """Place every box and route every edge, top to bottom in dataflow order.

    Runs of nodes with one producer and one consumer each are laid out as one tall box and
    stacked afterwards: a chain is drawn straight either way, and the layout engines (dot's
    network simplex, grandalf's pure-Python passes) grow faster than linearly with the number
    of boxes, so a 6,000-node chain becomes one box instead of minutes."""
    engine = engine or engine_available()
    by_key = {b.key: b for b in drawing.boxes}
    succ: dict[str, list[str]] = {b.key: [] for b in drawing.boxes}
    pred: dict[str, list[str]] = {b.key: [] for b in drawing.boxes}
    for e in drawing.edges:
        succ[e.tail].append(e.head)
        pred[e.head].append(e.tail)

    def continues(key: str) -> str | None:
        """The next box of key's chain: its only consumer, if key is that box's only producer."""
        if len(succ[key]) == 1 and len(pred[succ[key][0]]) == 1:
            return succ[key][0]
        return None

    chains: list[list[str]] = []
    group: dict[str, int] = {}
    for b in drawing.boxes:            # boxes are in topological order
        if b.key in group:
            continue
        chain = [b.key]
        while (nxt := continues(chain[-1])) is not None:
            chain.append(nxt)
        for k in chain:
            group[k] = len(chains)
        chains.append(chain)
    sizes = [(max(by_key[k].w for k in c), sum(by_key[k].h for k in c) + GAP_Y * (len(c) - 1))
             for c in chains]
    links = sorted({(group[e.tail], group[e.head]) for e in drawing.edges if group[e.tail] != group[e.head]})
    if engine == "dot":
        centres, routes, (width, height) = _dot(sizes, links)
    elif engine == "grandalf":
        centres, routes, (width, height) = _grandalf(sizes, links)
    else:
        raise SaturateError(f"unknown layout engine '{engine}' (dot or grandalf)")
    for c, chain in enumerate(chains):
        cx, cy = centres[c]
        top = cy - sizes[c][1] / 2
        for k in chain:
            box = by_key[k]
            box.x, box.y = cx, top + box.h / 2
            top += box.h + GAP_Y
    for e in drawing.edges:
        tail, head = by_key[e.tail], by_key[e.head]
        start, end = (tail.x, tail.y + tail.h / 2), (head.x, head.y - head.h / 2)
        route = routes.get((group[e.tail], group[e.head]))
        if route and route[1]:                 # dot: a spline from chain bottom to chain top
            e.points, e.bezier = [start, *route[0][1:-1], end], True
        else:                                  # grandalf: a polyline through the dummy nodes
            e.points = [start, *(route[0] if route else []), end]
    drawing.width, drawing.height, drawing.engine = width + 2 * MARGIN, height + 2 * MARGIN, engine
    for b in drawing.boxes:
        b.x += MARGIN
        b.y += MARGIN
    for e in drawing.edges:
        e.points = [(x + MARGIN, y + MARGIN) for x, y in e.points]
    return drawing


Routes = dict[tuple[int, int], tuple[list[tuple[float, float]], bool]]


def _dot(sizes: list[tuple[float, float]], links: list[tuple[int, int]]):
    """Layout by Graphviz: `dot -Tplain` gives centres (inches, y up) and edge splines."""
    # On big graphs the x-coordinate pass (network simplex) and crossing minimisation take most
    # of dot's time: capping their iterations keeps a 1,800-node transformer to a few seconds.
    limits = ["-Gnslimit=2", "-Gnslimit1=2", "-Gmclimit=0.5"] if len(sizes) + len(links) > BIG else []
    try:
        done = subprocess.run(["dot", "-Tplain", *limits], input=_dot_source(sizes, links), capture_output=True,
                              text=True, timeout=600, check=False)
    except OSError as err:
        raise SaturateError(f"layout: cannot run dot: {err}") from None
    if done.returncode != 0:
        raise SaturateError(f"layout: dot failed: {done.stderr.strip()[:200]}")
    centres: dict[int, tuple[float, float]] = {}
    routes: Routes = {}
    height = width = 0.0
    for line in done.stdout.splitlines():
        t = line.split()
        if not t:
            continue
        if t[0] == "graph":
            width, height = float(t[2]) * 72, float(t[3]) * 72
        elif t[0] == "node":
            centres[int(t[1][1:])] = (float(t[2]) * 72, height - float(t[3]) * 72)
        elif t[0] == "edge":
            n = int(t[3])
            pts = [(float(t[4 + 2 * j]) * 72, height - float(t[5 + 2 * j]) * 72) for j in range(n)]
            routes[(int(t[1][1:]), int(t[2][1:]))] = (pts, True)
    return [centres[i] for i in range(len(sizes))], routes, (width, height)


def _dot_source(sizes: list[tuple[float, float]], links: list[tuple[int, int]]) -> str:
    lines = ["digraph g {", f"nodesep={NODE_SEP / 72:.3f}; ranksep={RANK_SEP / 72:.3f};",
             'node [shape=box, fixedsize=true, label=""];',
             # A stacked chain is one tall box: edges leave its last node's bottom and enter its
             # first node's top, not the box's sides.
             "edge [tailport=s, headport=n];"]
    lines += [f"g{i} [width={w / 72:.4f}, height={h / 72:.4f}];" for i, (w, h) in enumerate(sizes)]
    lines += [f"g{a} -> g{b};" for a, b in links]
    lines.append("}")
    return "\n".join(lines)


class _View:
    """What grandalf reads (w, h) and writes (xy; setpath for edges) on each vertex and edge."""

    def __init__(self, w: float = 0.0, h: float = 0.0):
        self.w, self.h = w, h
        self.xy = (0.0, 0.0)
        self.path: list[tuple[float, float]] = []

    def setpath(self, pts) -> None:
        self.path = list(pts)


def _grandalf(sizes: list[tuple[float, float]], links: list[tuple[int, int]]):
    """Layout by grandalf's SugiyamaLayout, one connected component at a time, side by side."""
    from grandalf.graphs import Edge as GEdge, Graph as GGraph, Vertex
    from grandalf.layouts import SugiyamaLayout

    vertices = [Vertex(i) for i in range(len(sizes))]
    for v, (w, h) in zip(vertices, sizes):
        v.view = _View(w, h)
    edges = [GEdge(vertices[a], vertices[b]) for a, b in links]
    for e in edges:
        e.view = _View()
    centres: list[tuple[float, float]] = [(0.0, 0.0)] * len(sizes)
    routes: Routes = {}
    left = 0.0
    height = 0.0
    for core in GGraph(vertices, edges).C:
        sug = SugiyamaLayout(core)
        sug.xspace, sug.yspace = NODE_SEP, RANK_SEP
        sug.init_all()
        sug.draw()
        members = list(core.sV)
        x0 = min(v.view.xy[0] - v.view.w / 2 for v in members)
        y0 = min(v.view.xy[1] - v.view.h / 2 for v in members)
        x1 = max(v.view.xy[0] + v.view.w / 2 for v in members)
        y1 = max(v.view.xy[1] + v.view.h / 2 for v in members)
        dx, dy = left - x0, -y0
        for v in members:
            centres[v.data] = (v.view.xy[0] + dx, v.view.xy[1] + dy)
        for e in core.sE:
            routes[(e.v[0].data, e.v[1].data)] = ([(x + dx, y + dy) for x, y in e.view.path[1:-1]], False)
        left += x1 - x0 + NODE_SEP * 2
        height = max(height, y1 - y0)
    return centres, routes, (max(left - NODE_SEP * 2, 0.0), height)
