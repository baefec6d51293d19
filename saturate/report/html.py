"""Report stage: one self-contained HTML page showing what an optimize run changed."""

from __future__ import annotations

from html import escape
from typing import Any

from saturate.core.fileio import write_atomic
from saturate.core.ir import Graph
from saturate.report.layout import Drawing, build, layout
from saturate.report.svg import COLORS, KINDS, MARK_STROKE, graph_svg, line_chart


def draw(graph: Graph, engine: str | None = None) -> Drawing:
    """Boxes and edges of `graph`, placed by `engine` (default: dot if installed, else grandalf)."""
    return layout(build(graph), engine)


def graph_svg_file(graph: Graph, engine: str | None = None) -> str:
    """One graph as a standalone SVG document (what `saturate show --svg` writes)."""
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + graph_svg(draw(graph, engine), standalone=True) + "\n"


def changes(before: Drawing, after: Drawing) -> tuple[dict[str, str], dict[str, str]]:
    """Marks for the boxes of each drawing: a node of `before` is "removed" unless `after` has a
    node of the same op with its name or one of its outputs; a node of `after` is "created"
    unless `before` has one. Matching needs the op too: a rewrite that keeps a name for another
    op (bn1 becoming a Conv) has replaced the node, not kept it."""
    def keys(d: Drawing) -> set[tuple[str, str, str]]:
        found = set()
        for b in d.boxes:
            if b.kind == "node":
                found.add((b.op, "name", b.name))
                found.update((b.op, "out", o) for o in b.outputs if o)
        return found

    def marks(d: Drawing, other: set[tuple[str, str, str]], mark: str) -> dict[str, str]:
        return {b.key: mark for b in d.boxes if b.kind == "node"
                and (b.op, "name", b.name) not in other
                and not any((b.op, "out", o) in other for o in b.outputs if o)}

    return marks(before, keys(after), "removed"), marks(after, keys(before), "created")


_CSS = """
body{font-family:system-ui,sans-serif;margin:16px 24px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 8px}
.summary{color:#444;margin-bottom:8px}
table{border-collapse:collapse;background:#fff;font-size:13px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left} td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.changed td{background:#fff8e1}
.bar{display:inline-block;height:10px;background:#2f6aa8;vertical-align:middle}
.cols{display:flex;gap:16px;align-items:flex-start;flex-wrap:wrap}
.pane{flex:1 1 420px;min-width:320px;background:#fff;border:1px solid #ddd}
.pane h3{font-size:14px;margin:0;padding:6px 8px;border-bottom:1px solid #eee;display:flex;justify-content:space-between}
.scroll{overflow:auto;max-height:85vh}
.pane.fit svg.graph{width:100%;height:auto}
.legend span{display:inline-block;margin:0 10px 4px 0;font-size:12px}
.legend i{display:inline-block;width:14px;height:10px;border:1px solid;margin-right:4px;vertical-align:middle}
g.box.highlight rect{stroke:#000;stroke-width:3}
button{font-size:12px}
"""

# Zoom: a pane starts at natural size; the button fits the whole graph to the pane's width.
# Clicking a box outlines the boxes of the same name in both pictures.
_JS = """
document.querySelectorAll('.pane button.zoom').forEach(function(b){
  b.addEventListener('click',function(){var p=b.closest('.pane');p.classList.toggle('fit');
    b.textContent=p.classList.contains('fit')?'actual size':'fit width';});});
document.querySelectorAll('svg.graph g.box').forEach(function(g){
  g.addEventListener('click',function(){var n=g.getAttribute('data-name');
    document.querySelectorAll('svg.graph g.box').forEach(function(o){
      o.classList.toggle('highlight',o.getAttribute('data-name')===n);});});});
document.body.setAttribute('data-ready','1');
"""


def report_html(before: Graph, after: Graph, report: Any, title: str = "", engine: str | None = None) -> str:
    """The page: op counts, stage times, e-graph size per iteration, the rules that fired with
    their file:line, and the graph before and after with removed and created nodes marked."""
    data = report.to_json()
    d_before, d_after = draw(before, engine), draw(after, engine)
    removed, created = changes(d_before, d_after)
    ops_b, ops_a = data["ops_before"], data["ops_after"]
    n_b, n_a = sum(ops_b.values()), sum(ops_a.values())
    stop = f"{data['stop_reason']} after {data['iterations']} iterations"
    if report.run.hit_limit:
        stop += " (best graph found so far)"
    total = sum(data["times"].values())
    title = title or before.name
    p = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>saturate: {escape(title)}</title>",
         f"<style>{_CSS}</style></head><body>",
         f"<h1>saturate optimize: {escape(title)}</h1>",
         f'<div class="summary" id="summary">{n_b} &rarr; {n_a} nodes; {escape(stop)}; '
         f"cost {_num(data['cost_before'])} &rarr; {_num(data['cost_after'])}"
         + (f" ({escape(data['extract_cut'])})" if data.get("extract_cut")
            else " (no cheaper graph: original kept)" if data["kept_original"] else "")
         + f"; {total:.2f} s in all; {data['rules_loaded']} rules loaded; layout by {escape(d_before.engine)}</div>"]
    p.append('<h2>Op counts</h2><table id="ops"><tr><th>op</th><th>before</th><th>after</th><th>change</th></tr>')
    for op in sorted(set(ops_b) | set(ops_a), key=lambda o: (-max(ops_b.get(o, 0), ops_a.get(o, 0)), o)):
        b, a = ops_b.get(op, 0), ops_a.get(op, 0)
        change = (' class="changed"', f"{a - b:+d}") if a != b else ("", "")
        p.append(f"<tr{change[0]}><td>{escape(op)}</td><td class=n>{b}</td><td class=n>{a}</td>"
                 f"<td class=n>{change[1]}</td></tr>")
    p.append(f"<tr><th>all</th><th class=n>{n_b}</th><th class=n>{n_a}</th><th class=n>{n_a - n_b:+d}</th></tr></table>")
    p.append('<h2>Time per stage</h2><table id="times"><tr><th>stage</th><th>seconds</th><th></th></tr>')
    longest = max(data["times"].values(), default=0) or 1
    for stage, sec in data["times"].items():
        p.append(f"<tr><td>{escape(stage)}</td><td class=n>{sec:.3f}</td>"
                 f'<td><span class="bar" style="width:{240 * sec / longest:.0f}px"></span></td></tr>')
    p.append(f"<tr><th>all</th><th class=n>{total:.3f}</th><th></th></tr></table>")
    p.append("<h2>E-graph size per iteration</h2>")
    p.append(line_chart(data["egraph_sizes"], "egraph-plot", "iteration", "e-nodes"))
    fired = sorted((m for m in data["matches"] if m["matches"]), key=lambda m: (-m["matches"], m["rule"]))
    p.append(f"<h2>Rules that fired ({len(fired)} of {len(data['matches'])})</h2>"
             '<table id="rules"><tr><th>rule</th><th>matches</th><th>defined at</th></tr>')
    for m in fired:
        p.append(f"<tr><td>{escape(m['rule'])}</td><td class=n>{m['matches']}</td><td><code>{escape(m['at'])}"
                 "</code></td></tr>")
    if not fired:
        p.append('<tr><td colspan="3">no rule matched</td></tr>')
    p.append("</table>")
    p.append("<h2>Graph before and after</h2>" + _legend())
    p.append('<div class="cols">')
    for label, d, marks, svg_id, count in (("before", d_before, removed, "graph-before", len(removed)),
                                           ("after", d_after, created, "graph-after", len(created))):
        what = "removed" if label == "before" else "created"
        nodes = sum(1 for b in d.boxes if b.kind == "node")
        p.append(f'<div class="pane"><h3><span>{label}: {nodes} nodes, {count} {what}</span>'
                 '<button class="zoom" type="button">fit width</button></h3>'
                 f'<div class="scroll">{graph_svg(d, marks, svg_id)}</div></div>')
    p.append("</div>")
    p.append(f"<script>{_JS}</script></body></html>\n")
    return "\n".join(p)


def _num(x: float | None) -> str:
    return "∞" if x is None else f"{x:,.0f}"


def _legend() -> str:
    items = [f'<span><i style="background:{COLORS[k][0]};border-color:{COLORS[k][1]}"></i>{k}</span>'
             for k in (*KINDS, "other")]
    items.append(f'<span><i style="border:2px dashed {MARK_STROKE["removed"]}"></i>removed (before)</span>')
    items.append(f'<span><i style="border:2px solid {MARK_STROKE["created"]}"></i>created (after)</span>')
    items.append("<span>badge: shapes of the constants a node reads</span>")
    return f'<div class="legend">{"".join(items)}</div>'


def write_html(path: str, before: Graph, after: Graph, report: Any, title: str = "",
               engine: str | None = None) -> None:
    """Write the page to `path` atomically."""
    text = report_html(before, after, report, title, engine).encode("utf-8")
    write_atomic(path, lambda f: f.write(text))
