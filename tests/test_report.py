"""Tests for the report stage: graph drawings, the HTML page of an optimize run, and its rendering."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
import zlib
from collections import Counter
from html.parser import HTMLParser

import numpy as np
import pytest

from saturate.cli import main
from saturate.core.ir import Graph, Node
from saturate.frontend import examples
from saturate.pipeline import optimize
from saturate.report.html import changes, draw, report_html
from saturate.report.layout import engine_available

ENGINES = ["grandalf", pytest.param("dot", marks=pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz dot is not installed"))]


class _Page(HTMLParser):
    """What the page holds: each graph SVG's boxes, the chart's points, table rows, every URL-ish
    attribute, and whether a script or stylesheet is pulled from elsewhere."""

    def __init__(self) -> None:
        super().__init__()
        self.svgs: list[str] = []
        self.boxes: dict[str, list[dict[str, str]]] = {}
        self.points: dict[str, int] = {}
        self.tables: dict[str, int] = {}
        self.rows: dict[str, list[list[str]]] = {}
        self.external: list[str] = []
        self._svg = self._table = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("src", "href", "xlink:href"):
            if key in a and not a[key].startswith("#"):
                self.external.append(a[key])
        if tag == "link":
            self.external.append(str(a))
        if tag == "svg":
            self._svg = a.get("id")
            self.svgs.append(self._svg)
        elif tag == "g" and self._svg and "box" in a.get("class", "").split():
            self.boxes.setdefault(self._svg, []).append(a)
        elif tag == "circle" and self._svg and "point" in a.get("class", ""):
            self.points[self._svg] = self.points.get(self._svg, 0) + 1
        elif tag == "table":
            self._table = a.get("id")
            self.rows[self._table] = []
        elif tag == "tr" and self._table:
            self._row = []
            self.rows[self._table].append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "svg":
            self._svg = None
        elif tag == "table":
            self._table = None
        elif tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _marked(boxes: list[dict[str, str]], mark: str) -> Counter:
    return Counter(b["data-op"] for b in boxes if mark in b["class"].split())


@pytest.fixture(scope="module")
def vgg_page():
    before = examples.build("vgg")
    after, report = optimize(before)
    page = _Page()
    text = report_html(before, after, report, "vgg", engine="grandalf")
    page.feed(text)
    return before, after, report, text, page


def test_page_draws_every_node_of_both_graphs(vgg_page):
    before, after, report, _, page = vgg_page
    assert page.svgs.count("graph-before") == 1 and page.svgs.count("graph-after") == 1
    for svg, graph, ops in (("graph-before", before, report.ops_before), ("graph-after", after, report.ops_after)):
        nodes = [b for b in page.boxes[svg] if "node" in b["class"].split()]
        assert Counter(b["data-op"] for b in nodes) == Counter(ops) == graph.op_counts()
        # The input x and the output are drawn as well; the constants are not boxes.
        assert len(page.boxes[svg]) == len(graph.nodes) + len(graph.inputs) + len(graph.outputs)


def test_folded_batchnorms_are_marked_removed_and_their_convs_created(vgg_page):
    before, after, _, _, page = vgg_page
    # Each Conv+BatchNormalization pair became one new Conv (with folded weights, named after the
    # batch-norm): both old nodes are gone, the Conv is new; Relu, MaxPool and the head are kept.
    assert _marked(page.boxes["graph-before"], "removed") == {"BatchNormalization": 5, "Conv": 5}
    assert _marked(page.boxes["graph-after"], "created") == {"Conv": 5}
    assert not _marked(page.boxes["graph-before"], "created") and not _marked(page.boxes["graph-after"], "removed")
    assert "BatchNormalization" not in {b["data-op"] for b in page.boxes["graph-after"]}


def test_constants_are_badges_with_their_shapes(vgg_page):
    _, after, _, _, page = vgg_page
    for node, box in zip(after.nodes, [b for b in page.boxes["graph-after"] if "node" in b["class"]]):
        assert box["data-name"] == node.name
        want = [after.constants[v].shape for v in node.inputs if v in after.constants]
        got = [tuple(int(d) for d in s.split("×")) for s in box.get("data-badge", "").split(" · ") if s]
        assert got == want


def test_plot_rules_times_and_op_counts_match_the_report(vgg_page):
    _, _, report, _, page = vgg_page
    data = report.to_json()
    assert page.points["egraph-plot"] == len(data["egraph_sizes"]) >= 2
    fired = {m["rule"]: m for m in data["matches"] if m["matches"]}
    rows = page.rows["rules"][1:]
    assert {r[0]: (int(r[1]), r[2]) for r in rows} == {k: (m["matches"], m["at"]) for k, m in fired.items()}
    assert all(re.fullmatch(r"rules/\w+\.rules:\d+:\d+", r[2]) for r in rows)
    assert int(dict((r[0], r[1]) for r in rows)["batchnorm"]) == 5
    assert [r[0] for r in page.rows["times"][1:-1]] == list(data["times"])
    ops = {r[0]: (int(r[1]), int(r[2])) for r in page.rows["ops"][1:-1]}
    assert ops["BatchNormalization"] == (5, 0) and ops["Conv"] == (5, 5)


def test_page_is_self_contained(vgg_page):
    text, page = vgg_page[3], vgg_page[4]
    assert not re.search(r"https?:", text), re.search(r".{40}https?:.{40}", text)
    assert not page.external and "@import" not in text and "url(http" not in text


def test_matching_needs_the_same_op():
    g = Graph(nodes=[Node("Relu", ["x"], ["a"], name="a"), Node("Neg", ["a"], ["y"], name="n")],
              inputs=["x"], outputs=["y"])
    h = Graph(nodes=[Node("Relu", ["x"], ["a"], name="a"), Node("Abs", ["a"], ["y"], name="n")],
              inputs=["x"], outputs=["y"])
    removed, created = changes(draw(g, "grandalf"), draw(h, "grandalf"))
    assert list(removed.values()) == ["removed"] and list(created.values()) == ["created"]
    assert [b.op for b in draw(g, "grandalf").boxes if b.key in removed] == ["Neg"]


def test_constant_nodes_are_not_drawn_but_listed_on_their_consumer():
    g = Graph(nodes=[Node("Constant", [], ["c"], {"value": np.ones((3, 1), np.float32)}, name="c"),
                     Node("Add", ["x", "c"], ["y"], name="add")],
              inputs=["x"], outputs=["y"])
    d = draw(g, "grandalf")
    assert [(b.op, b.badge) for b in d.boxes if b.kind == "node"] == [("Add", "3×1")]
    assert len(d.edges) == 2          # x -> Add -> y; no edge from the constant


@pytest.mark.parametrize("engine", ENGINES)
def test_layout_is_layered_without_overlaps(engine):
    graph = examples.build("resnet18")
    d = draw(graph, engine)
    assert d.engine == engine
    boxes = {b.key: b for b in d.boxes}
    assert sum(b.kind == "node" for b in d.boxes) == len(graph.nodes)
    spans = sorted((b.y - b.h / 2, b.y + b.h / 2, b.x - b.w / 2, b.x + b.w / 2) for b in d.boxes)
    for i, (top, bottom, left, right) in enumerate(spans):
        assert 0 <= left and right <= d.width and 0 <= top and bottom <= d.height
        for top2, bottom2, left2, right2 in spans[i + 1:]:
            if top2 >= bottom:
                break
            assert right <= left2 or right2 <= left, "two boxes overlap"
    for e in d.edges:                 # dataflow points down, and edges stay on the canvas
        assert boxes[e.tail].y < boxes[e.head].y
        assert all(0 <= x <= d.width and 0 <= y <= d.height for x, y in e.points)


def test_a_chain_is_one_straight_column():
    d = draw(examples.build("chain-40"), "grandalf")
    assert len({round(b.x, 3) for b in d.boxes}) == 1
    assert len(d.boxes) == 120 + 2


def test_show_svg_and_optimize_html_from_the_cli(tmp_path):
    svg = tmp_path / "g.svg"
    assert main(["show", "example:mlp", "--svg", str(svg)]) == 0
    root = ET.parse(svg).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    boxes = [g for g in root.iter(ns + "g") if "node" in g.get("class", "").split()]
    assert root.tag == ns + "svg" and root.get("data-engine") == engine_available()
    assert Counter(g.get("data-op") for g in boxes) == examples.build("mlp").op_counts()
    out, page = tmp_path / "o.onnx", tmp_path / "r.html"
    # The page may not overwrite the model just written: refused before any work.
    assert main(["optimize", "example:vgg", "-o", str(out), "--html", str(out)]) == 2 and not out.exists()
    assert main(["optimize", "example:vgg", "-o", str(out), "--html", str(page)]) == 0
    parsed = _Page()
    parsed.feed(page.read_text(encoding="utf-8"))
    assert _marked(parsed.boxes["graph-before"], "removed")["BatchNormalization"] == 5
    # The stage times include the CLI's own import and export.
    stages = [r[0] for r in parsed.rows["times"][1:-1]]
    assert stages[0] == "import" and stages[-1] == "export" and "saturate" in stages


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _png_rows(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the filtered scanlines of an 8-bit, non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        size = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + size]
        if kind == b"IHDR":
            width, height = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big")
            assert body[8] == 8 and body[12] == 0, "8-bit, non-interlaced"
            channels = {0: 1, 2: 3, 4: 2, 6: 4}[body[9]]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + size
    raw = zlib.decompress(idat)
    stride = 1 + width * channels
    assert len(raw) == stride * height
    return width, height, [raw[i:i + stride] for i in range(0, len(raw), stride)]


@pytest.mark.slow
def test_report_renders_in_headless_chromium(tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (CI installs it: apt-get install chromium)")
    before = examples.build("resnet18")
    after, report = optimize(before)
    page = tmp_path / "report.html"
    page.write_text(report_html(before, after, report, "resnet18"), encoding="utf-8")
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1600"]
    env = {**os.environ, "HOME": str(tmp_path)}
    shot = tmp_path / "shot.png"
    subprocess.run(flags + [f"--screenshot={shot}", page.as_uri()], env=env, capture_output=True,
                   timeout=180, check=True)
    width, height, rows = _png_rows(shot.read_bytes())
    assert (width, height) == (1280, 1600)
    # A blank page encodes as one scanline repeated; a drawn one has thousands of distinct lines.
    assert len(set(rows)) > height // 4, f"{len(set(rows))} distinct scanlines of {height}"
    dom = subprocess.run(flags + ["--dump-dom", page.as_uri()], env=env, capture_output=True, text=True,
                         timeout=180, check=True).stdout
    assert 'data-ready="1"' in dom, "the page's script did not run to its end"
    parsed = _Page()
    parsed.feed(dom)
    assert {"graph-before", "graph-after", "egraph-plot"} <= set(parsed.svgs)
    assert len(parsed.rows["rules"]) > 1 and parsed.points["egraph-plot"] == len(report.run.sizes)
    for svg, graph in (("graph-before", before), ("graph-after", after)):
        assert sum("node" in b["class"].split() for b in parsed.boxes[svg]) == len(graph.nodes)


# ---- the README's picture --------------------------------------------------------------------------

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def test_every_image_the_readme_shows_is_a_small_png_in_the_repository():
    text = open(README, encoding="utf-8").read()
    links = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)
    assert "saturate/report/report.png" in links, "the README shows a picture of a report"
    for link in links:
        assert "://" not in link, f"{link}: the README's pictures live in the repository"
        path = os.path.join(os.path.dirname(README), link)
        assert os.path.isfile(path), f"{link}: no such file"
        data = open(path, "rb").read()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 300_000, f"{link}: not a PNG under 300 KB"


def test_the_picture_is_cropped_to_the_page_and_stored_with_a_palette(tmp_path):
    from PIL import Image, ImageDraw

    from saturate.report.picture import BACKGROUND_MARGIN, trim_and_pack

    shot = Image.new("RGB", (300, 900), (250, 250, 250))
    ImageDraw.Draw(shot).rectangle((20, 30, 200, 400), fill=(212, 240, 208), outline=(60, 140, 60))
    shot.save(tmp_path / "shot.png")
    trim_and_pack(tmp_path / "shot.png", tmp_path / "out.png")
    packed = Image.open(tmp_path / "out.png")
    assert packed.mode == "P" and packed.size == (300, 401 + BACKGROUND_MARGIN)
    assert packed.convert("RGB").getpixel((100, 200)) == (212, 240, 208)
    Image.new("RGB", (50, 50), (250, 250, 250)).save(tmp_path / "blank.png")
    with pytest.raises(Exception, match="drew nothing"):
        trim_and_pack(tmp_path / "blank.png", tmp_path / "out.png")


@pytest.mark.slow
def test_the_picture_command_draws_a_report(tmp_path, capsys):
    if _chromium() is None:
        pytest.skip("chromium is not installed (CI installs it: apt-get install chromium)")
    from PIL import Image

    from saturate.report.picture import run

    assert run(["--model", "example:mlp", "-o", str(tmp_path / "mlp.png"), "--width", "900"]) == 0
    picture = Image.open(tmp_path / "mlp.png")
    assert picture.width == 900 and 400 < picture.height < 4000
    assert len(picture.getcolors(256)) > 8, "a drawn page, not a blank one"
    assert "wrote" in capsys.readouterr().out
