"""Report stage: SVG pictures drawn as text: a laid-out graph, and a line chart."""

from __future__ import annotations

import math
from html import escape

from saturate.report.layout import BADGE, ROW, Drawing

# Op kinds and their fill / stroke colours; an op not listed is "other".
KINDS: dict[str, tuple[str, ...]] = {
    "linear": ("Conv", "ConvTranspose", "ConvInteger", "Gemm", "MatMul", "MatMulInteger", "QLinearConv",
               "QLinearMatMul", "Einsum"),
    "normalization": ("BatchNormalization", "LayerNormalization", "InstanceNormalization",
                      "GroupNormalization", "LpNormalization", "MeanVarianceNormalization"),
    "activation": ("Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "PRelu", "Elu", "Selu", "Gelu", "Erf",
                   "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Softmax", "LogSoftmax", "Mish",
                   "ThresholdedRelu", "Celu"),
    "pooling": ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "GlobalLpPool",
                "MaxRoiPool", "RoiAlign"),
    "arithmetic": ("Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Exp", "Log", "Abs",
                   "Min", "Max", "Sum", "Mean", "Floor", "Ceil", "Round", "Sign", "Where", "Equal",
                   "Less", "Greater", "Not", "And", "Or", "ReduceMean", "ReduceSum", "ReduceMax",
                   "ReduceMin", "ReduceProd", "ReduceL2", "ReduceL1", "ReduceSumSquare",
                   "ReduceLogSumExp", "CumSum"),
    "shape": ("Reshape", "Flatten", "Transpose", "Concat", "Split", "Slice", "Gather", "GatherElements",
              "Squeeze", "Unsqueeze", "Expand", "Pad", "Shape", "Size", "Cast", "CastLike", "Identity",
              "Resize", "Tile", "ConstantOfShape", "Range", "Dropout", "DepthToSpace", "SpaceToDepth"),
}
COLORS = {"linear": ("#cfe2f7", "#2f6aa8"), "normalization": ("#fde2c4", "#b5651d"),
          "activation": ("#d4f0d0", "#3c8c3c"), "pooling": ("#e6dcf5", "#6a4ca3"),
          "arithmetic": ("#fbf3c0", "#9a8420"), "shape": ("#e4e6e8", "#5f6670"),
          "other": ("#f7d6e6", "#a33d70"), "io": ("#ffffff", "#333333")}
MARK_STROKE = {"removed": "#d32f2f", "created": "#1b8a2f"}
_OP_KIND = {op: kind for kind, ops in KINDS.items() for op in ops}


def op_kind(op: str) -> str:
    return _OP_KIND.get(op, "other")


def graph_svg(drawing: Drawing, marks: dict[str, str] | None = None, svg_id: str = "graph",
              standalone: bool = False, scale: float = 1.0) -> str:
    """The drawing as one <svg>. `marks` maps a box key to "removed" or "created". Each box is a
    <g class="box ..."> carrying data-name and data-op; hovering shows its inputs and outputs.
    `standalone` adds the XML namespace a separate .svg file needs (HTML does not)."""
    marks = marks or {}
    w, h = math.ceil(drawing.width), math.ceil(drawing.height)
    ns = ' xmlns="http://www.w3.org/2000/svg"' if standalone else ""
    out = [f'<svg{ns} id="{svg_id}" class="graph" width="{w * scale:.0f}" height="{h * scale:.0f}" '
           f'viewBox="0 0 {w} {h}" data-engine="{drawing.engine}" font-family="sans-serif">',
           f'<defs><marker id="{svg_id}-arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L8,4 L0,8 z" fill="#666"/></marker></defs>',
           '<rect width="100%" height="100%" fill="#ffffff"/>', '<g class="edges" fill="none" stroke="#888" '
           f'stroke-width="1.2" marker-end="url(#{svg_id}-arrow)">']
    for e in drawing.edges:
        pts = e.points
        if e.bezier and len(pts) >= 4 and (len(pts) - 1) % 3 == 0:
            d = f"M{pts[0][0]:.1f},{pts[0][1]:.1f}" + "".join(
                f" C{pts[i][0]:.1f},{pts[i][1]:.1f} {pts[i + 1][0]:.1f},{pts[i + 1][1]:.1f}"
                f" {pts[i + 2][0]:.1f},{pts[i + 2][1]:.1f}" for i in range(1, len(pts) - 1, 3))
        else:
            d = "M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        out.append(f'<path d="{d}"/>')
    out.append("</g>")
    for b in drawing.boxes:
        kind = "io" if b.kind != "node" else op_kind(b.op)
        fill, stroke = COLORS[kind]
        mark = marks.get(b.key, "")
        classes = f"box {b.kind} kind-{kind}" + (f" {mark}" if mark else "")
        x0, y0 = b.x - b.w / 2, b.y - b.h / 2
        width = 1.2
        dash = ""
        if mark:
            stroke, width = MARK_STROKE[mark], 2.6
            dash = ' stroke-dasharray="5,3"' if mark == "removed" else ""
        radius = b.h / 2 if b.kind != "node" else 5
        out.append(f'<g class="{classes}" data-name="{escape(b.name)}" data-op="{escape(b.op)}"'
                   + (f' data-badge="{escape(b.badge)}"' if b.badge else "") + ">")
        out.append(f"<title>{escape(b.tip)}</title>")
        out.append(f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{b.w:.1f}" height="{b.h:.1f}" rx="{radius:.1f}" '
                   f'fill="{fill}" stroke="{stroke}" stroke-width="{width}"{dash}/>')
        size = 12 if b.kind == "node" else 11
        out.append(f'<text x="{b.x:.1f}" y="{y0 + ROW / 2 + 4:.1f}" font-size="{size}" text-anchor="middle" '
                   f'fill="#222">{escape(b.label)}</text>')
        if b.badge:
            bw = 5.6 * len(b.badge) + 8
            out.append(f'<g class="badge"><rect x="{b.x - bw / 2:.1f}" y="{y0 + ROW - 3:.1f}" width="{bw:.1f}" '
                       f'height="{BADGE - 2}" rx="6" fill="#fff" fill-opacity="0.85" stroke="{COLORS[kind][1]}" '
                       f'stroke-width="0.6"/><text x="{b.x:.1f}" y="{y0 + ROW + 8:.1f}" font-size="9.5" '
                       f'text-anchor="middle" fill="#444">{escape(b.badge)}</text></g>')
        if mark:
            sign = "−" if mark == "removed" else "+"
            out.append(f'<circle cx="{x0 + b.w:.1f}" cy="{y0:.1f}" r="7" fill="{MARK_STROKE[mark]}"/>'
                       f'<text x="{x0 + b.w:.1f}" y="{y0 + 4:.1f}" font-size="12" font-weight="bold" '
                       f'text-anchor="middle" fill="#fff">{sign}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _nice_step(span: float, ticks: int = 5) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about `ticks` ticks."""
    raw = max(span / ticks, 1e-9)
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def line_chart(values: list[float], svg_id: str, x_label: str, y_label: str,
               width: int = 640, height: int = 240) -> str:
    """A line chart of values[i] against i, with axes, ticks and a tooltip on every point."""
    left, right, top, bottom = 64, 16, 14, 40
    pw, ph = width - left - right, height - top - bottom
    n = len(values)
    y_max = max(values, default=0) or 1
    step = _nice_step(y_max)
    y_top = math.ceil(y_max / step) * step
    x_step = max(1, math.ceil(_nice_step(max(n - 1, 1), 8)))

    def px(i: int) -> float:
        return left + (pw * i / (n - 1) if n > 1 else pw / 2)

    def py(v: float) -> float:
        return top + ph - ph * v / y_top

    out = [f'<svg id="{svg_id}" class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="#fff"/>']
    t = 0.0
    while t <= y_top + step / 2:
        y = py(t)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{t:,.0f}</text>')
        t += step
    for i in range(0, n, x_step):
        out.append(f'<text x="{px(i):.1f}" y="{top + ph + 16}" text-anchor="middle" fill="#555">{i}</text>')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" stroke="#444"/>'
               f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" stroke="#444"/>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle" fill="#333">{escape(x_label)}</text>'
               f'<text x="14" y="{top + ph / 2}" text-anchor="middle" fill="#333" '
               f'transform="rotate(-90 14 {top + ph / 2})">{escape(y_label)}</text>')
    if n:
        pts = " ".join(f"{px(i):.1f},{py(v):.1f}" for i, v in enumerate(values))
        out.append(f'<polyline class="series" points="{pts}" fill="none" stroke="#2f6aa8" stroke-width="2"/>')
        for i, v in enumerate(values):
            out.append(f'<circle class="point" cx="{px(i):.1f}" cy="{py(v):.1f}" r="3.2" fill="#2f6aa8">'
                       f'<title>iteration {i}: {v:,} e-nodes</title></circle>')
    out.append("</svg>")
    return "\n".join(out)
