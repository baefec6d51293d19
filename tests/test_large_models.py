"""Models with external data: weights mapped from their file on import (never read into memory),
large folded weights computed block by block into files, weights written back file to file."""

from __future__ import annotations

import hashlib
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from saturate import frontend
from saturate.cli import main
from saturate.core import mapped
from saturate.engine.facts import evaluate_fn
from saturate.frontend import load_graph, save_graph

DIM = 512          # a 1 MiB weight per block: past the skeleton's size, so it is mapped


def _external(name: str, arr: np.ndarray, location: str, offset: int) -> TensorProto:
    t = TensorProto()
    t.name, t.data_type = name, helper.np_dtype_to_tensor_dtype(arr.dtype)
    t.dims.extend(arr.shape)
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(arr.nbytes))):
        t.external_data.add(key=key, value=value)
    return t


def _mlp(folder: Path, blocks: int = 3, dim: int = DIM, pad: int = 0) -> Path:
    """blocks x (MatMul, per-column Mul, Add, Relu), weights in mlp.onnx.data after `pad` bytes."""
    rng = np.random.default_rng(0)
    inits, nodes, x, offset = [], [], "x", pad
    with open(folder / "mlp.onnx.data", "wb") as f:
        f.write(b"\7" * pad)
        for b in range(blocks):
            for name, arr in ((f"w{b}", rng.standard_normal((dim, dim), np.float32) / np.float32(dim ** 0.5)),
                              (f"s{b}", rng.uniform(0.5, 2, dim).astype(np.float32)),
                              (f"c{b}", rng.standard_normal(dim).astype(np.float32))):
                f.write(arr.tobytes())
                inits.append(_external(name, arr, "mlp.onnx.data", offset))
                offset += arr.nbytes
            nodes += [helper.make_node("MatMul", [x, f"w{b}"], [f"m{b}"]),
                      helper.make_node("Mul", [f"m{b}", f"s{b}"], [f"s{b}o"]),
                      helper.make_node("Add", [f"s{b}o", f"c{b}"], [f"a{b}"]),
                      helper.make_node("Relu", [f"a{b}"], [f"r{b}"])]
            x = f"r{b}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, dim])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2, dim])], initializer=inits)
    path = folder / "mlp.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _run(path: Path, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_import_maps_external_weights_instead_of_reading_them(tmp_path):
    path = _mlp(tmp_path, blocks=4)
    data_bytes = (tmp_path / "mlp.onnx.data").stat().st_size
    load_graph(str(path))      # modules imported and caches filled before memory is counted
    tracemalloc.start()
    try:
        graph = load_graph(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < data_bytes / 4, (peak, data_bytes)
    for b in range(4):
        w = graph.constants[f"w{b}"]
        assert mapped.is_mapped(w) and not w.flags.writeable
    # The bytes are the file's, at each weight's offset.
    want = np.fromfile(tmp_path / "mlp.onnx.data", np.float32, count=DIM * DIM).reshape(DIM, DIM)
    np.testing.assert_array_equal(graph.constants["w0"], want)


@pytest.mark.parametrize("pad,check", [(0, "1"), (12, "1"), (0, "0")])   # 12: weights off the page boundaries
def test_an_optimized_external_model_reads_back_equal(tmp_path, monkeypatch, pad, check):
    monkeypatch.setattr(frontend, "EXTERNAL_DATA_BYTES", 1000)
    monkeypatch.setattr(mapped, "SPILL_BYTES", 64 << 10)    # the folded weights go through files
    monkeypatch.setattr(mapped, "BLOCK_BYTES", 100 << 10)   # in blocks of rows
    src = tmp_path / "in"
    src.mkdir()
    path = _mlp(src, pad=pad)
    before = _digests(src)
    out = tmp_path / "out.onnx"
    written = []
    monkeypatch.setattr(frontend, "write_pieces", lambda f, pieces: (
        written.extend(np.asarray(p).nbytes for p in pieces), mapped.write_pieces(f, pieces)))
    assert main(["optimize", str(path), "-o", str(out), "--quiet", "--check", check]) == 0
    # The folded weights were computed into the file that became the data file: not written again.
    assert written and max(written) < DIM * DIM * 4
    assert _digests(src) == before                                   # inputs untouched
    skeleton = onnx.load(str(out), load_external_data=False)
    assert {n.op_type for n in skeleton.graph.node} == {"Gemm", "Relu"}
    weights = [t for t in skeleton.graph.initializer if len(t.dims) == 2]
    assert len(weights) == 3 and all(t.data_location == TensorProto.EXTERNAL for t in weights)
    model = onnx.load(str(out))                                      # with its data, as onnx reads it
    onnx.checker.check_model(model, full_check=True)
    feeds = {"x": np.random.default_rng(1).standard_normal((2, DIM)).astype(np.float32)}
    np.testing.assert_allclose(_run(out, feeds)[0], _run(path, feeds)[0], rtol=1e-4, atol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out.onnx", "out.onnx.data"]


def test_unchanged_mapped_weights_are_written_back_as_they_are(tmp_path):
    path = _mlp(tmp_path, blocks=1, pad=12)
    graph = load_graph(str(path))
    save_graph(graph, str(tmp_path / "copy.onnx"))
    again = onnx.load(str(tmp_path / "copy.onnx"))
    w = next(t for t in again.graph.initializer if t.name == "w0")
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(w), graph.constants["w0"])


def test_a_large_elementwise_fold_is_computed_in_blocks_into_a_file(monkeypatch):
    monkeypatch.setattr(mapped, "SPILL_BYTES", 64 << 10)
    monkeypatch.setattr(mapped, "BLOCK_BYTES", 10 << 10)
    monkeypatch.setattr(mapped, "CACHE_BYTES", 3 << 10)     # each block written in pieces of rows
    rng = np.random.default_rng(2)
    w = rng.standard_normal((300, 200)).astype(np.float32)
    for s in (rng.standard_normal(200).astype(np.float32), rng.standard_normal((300, 1)).astype(np.float32),
              np.float32(3)):
        got = evaluate_fn("mul", [w, s])
        assert mapped.is_mapped(got)
        np.testing.assert_array_equal(got, w * s)
        np.testing.assert_array_equal(evaluate_fn("div", [w, s]), w / s)     # not a ufunc: blocks alone
    # Any other large result is computed whole, then moved to a file; a view of a mapped weight
    # (a reshape) stays the view.
    # Half floats are computed in float32 and rounded once: the same bytes as numpy's float16 loops.
    h = w.astype(np.float16)
    for s in (rng.standard_normal((300, 1)).astype(np.float16), np.float16(0.1)):
        got = evaluate_fn("mul", [h, s])
        assert mapped.is_mapped(got) and got.dtype == np.float16
        np.testing.assert_array_equal(got.view(np.uint16), (h * s).view(np.uint16))
    assert "Mul" in mapped._HALF_SESSIONS            # through ONNX Runtime's vectorized casts
    got = evaluate_fn("transpose", [w, (1, 0)])
    assert mapped.is_mapped(got)
    np.testing.assert_array_equal(got, w.T)
    assert np.shares_memory(evaluate_fn("reshape", [got, (-1,)]), got)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_fold_of_mapped_weights_reads_them_from_their_file(tmp_path, monkeypatch, dtype):
    monkeypatch.setattr(mapped, "SPILL_BYTES", 64 << 10)
    monkeypatch.setattr(mapped, "BLOCK_BYTES", 10 << 10)
    monkeypatch.setattr(mapped, "CACHE_BYTES", 3 << 10)     # pieces of rows that end mid-block
    rng = np.random.default_rng(3)
    w = rng.standard_normal((301, 200)).astype(dtype)
    s = rng.standard_normal(200).astype(dtype)
    (tmp_path / "w.data").write_bytes(b"\7" * 12 + w.tobytes())     # off the page boundaries
    mw = mapped.DataFiles().array(tmp_path / "w.data", 12, w.nbytes, w.dtype, w.shape)
    reads = []
    preadv = mapped.os.preadv
    monkeypatch.setattr(mapped.os, "preadv", lambda fd, bufs, offset: reads.append(offset) or preadv(fd, bufs, offset))
    got = evaluate_fn("mul", [mw, s])
    assert mapped.is_mapped(got) and reads
    np.testing.assert_array_equal(got.view(np.uint8), (w * s).view(np.uint8))
    # A fold of a folded weight reads the temp file the first one went to.
    reads.clear()
    again = evaluate_fn("add", [got, s])
    assert mapped.is_mapped(again) and reads
    np.testing.assert_array_equal(again.view(np.uint8), (w * s + s).view(np.uint8))


@pytest.mark.parametrize("refuse", [False, True])
def test_a_fold_into_an_output_data_file_nothing_checks_is_written_straight_to_the_disk(tmp_path, monkeypatch, refuse):
    import errno
    import os

    monkeypatch.setattr(mapped, "SPILL_BYTES", 64 << 10)
    monkeypatch.setattr(mapped, "BLOCK_BYTES", 64 << 10)
    monkeypatch.setattr(mapped, "CACHE_BYTES", 8 << 10)
    monkeypatch.setattr(mapped, "DIRECT_BYTES", 16 << 10)
    rng = np.random.default_rng(4)
    w = rng.standard_normal((301, 512)).astype(np.float32)     # rows of half DIRECT_ALIGN; the last piece short
    s = rng.standard_normal(512).astype(np.float32)
    (tmp_path / "w.data").write_bytes(b"\7" * 12 + w.tobytes())
    mw = mapped.DataFiles().array(tmp_path / "w.data", 12, w.nbytes, w.dtype, w.shape)
    probe = os.open(tmp_path / "probe", os.O_RDWR | os.O_CREAT)
    direct_fd = mapped._open_direct(probe)
    os.close(probe)
    if direct_fd is None:
        pytest.skip("no direct writes on this file system")
    os.close(direct_fd)
    opened, direct_writes = [], []
    real_open, real_pwrite = mapped.os.open, mapped.os.pwrite

    def open_(path, flags, *rest):
        fd = real_open(path, flags, *rest)
        if flags & os.O_DIRECT:
            opened.append(fd)
        return fd

    def pwrite(fd, data, offset):
        if fd in opened:
            if refuse:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            direct_writes.append((offset, len(data)))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(mapped.os, "open", open_)
    monkeypatch.setattr(mapped.os, "pwrite", pwrite)
    with mapped.folds_beside(tmp_path / "o.onnx") as arena:      # read back before saved: not direct
        np.testing.assert_array_equal(evaluate_fn("mul", [mw, s]), w * s)
        assert not opened
    with mapped.folds_beside(tmp_path / "o.onnx", direct=True) as arena:
        got = evaluate_fn("mul", [mw, s])
        assert mapped.is_mapped(got) and opened
        np.testing.assert_array_equal(got.view(np.uint8), (w * s).view(np.uint8))
        assert arena.regions and arena.regions[0][1] == w.nbytes
    assert all(o % mapped.DIRECT_ALIGN == 0 and n % mapped.DIRECT_ALIGN == 0 for o, n in direct_writes)
    # Everything but the last 2 KiB went straight to the disk, unless refused: the first block too,
    # wherever the allocator put it.
    direct_bytes = sum(n for _, n in direct_writes)
    assert direct_bytes == (0 if refuse else w.nbytes - 2048)


@pytest.mark.parametrize("case,words", [
    ("truncated", ["external data of tensor 'w0'", "holds"]),
    ("offset-past-the-end", ["external data of tensor 'w0'", "offset 99999999", "holds"]),
])
def test_a_mapped_weight_past_its_file_is_one_line(case, words, tmp_path, capsys):
    path = _mlp(tmp_path, blocks=1, dim=128)
    data = tmp_path / "mlp.onnx.data"
    if case == "truncated":
        data.write_bytes(data.read_bytes()[:1000])
    else:
        model = onnx.load(str(path), load_external_data=False)
        w0 = next(t for t in model.graph.initializer if t.name == "w0")
        next(e for e in w0.external_data if e.key == "offset").value = "99999999"
        onnx.save_model(model, str(path))
    assert main(["optimize", str(path), "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert all(w in err for w in words), err
    assert not (tmp_path / "o.onnx").exists()


def test_keep_data_file_refers_to_the_input_weights_no_rule_changed(tmp_path):
    path = _mlp(tmp_path, blocks=2, pad=12)
    before = _digests(tmp_path)
    out = tmp_path / "out.onnx"
    # Without the scale fold each weight reaches the result unchanged (as Gemm's B).
    assert main(["optimize", str(path), "-o", str(out), "--keep-data-file", "--skip", "matmul-scale-out",
                 "--quiet"]) == 0
    assert {k: v for k, v in _digests(tmp_path).items() if k in before} == before
    skeleton = onnx.load(str(out), load_external_data=False)
    where = {t.name: {e.key: e.value for e in t.external_data} for t in skeleton.graph.initializer}
    assert where["w0"] == {"location": "mlp.onnx.data", "offset": "12", "length": str(DIM * DIM * 4)}
    assert where["w1"]["location"] == "mlp.onnx.data"
    assert (tmp_path / "out.onnx.data").stat().st_size < DIM * DIM * 4     # the small weights only
    feeds = {"x": np.random.default_rng(3).standard_normal((2, DIM)).astype(np.float32)}
    np.testing.assert_allclose(_run(out, feeds)[0], _run(path, feeds)[0], rtol=1e-4, atol=1e-5)


def test_weights_folded_beside_a_result_never_written_leave_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(mapped, "SPILL_BYTES", 64 << 10)
    path = _mlp(tmp_path, blocks=1)
    before = sorted(p.name for p in tmp_path.iterdir())
    folded = []

    def refuse(graph, output, **_):
        folded.extend(name for name, arr in graph.constants.items() if mapped.file_slice(arr) is not None
                      and mapped.input_slice(arr) is None)
        folded.extend(p.name for p in tmp_path.iterdir() if p.name.startswith(".o.onnx.data."))
        raise frontend.SaturateError("disk full")

    monkeypatch.setattr(frontend, "save_graph", refuse)
    assert main(["optimize", str(path), "-o", str(tmp_path / "o.onnx"), "--quiet"]) == 2
    assert len(folded) == 2               # a weight was folded into a temp file beside the output
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def _anon_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(ln for ln in status.splitlines() if ln.startswith("RssAnon:")).split()[1]) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the process's memory from /proc")
def test_the_check_runs_onnx_runtime_on_mapped_weights_without_copying_them(tmp_path):
    from saturate import simplifier

    small = load_graph(str(_mlp(tmp_path, blocks=1, dim=128)))
    assert simplifier.check_outputs(small, small, 1) is None          # ONNX Runtime loaded
    (tmp_path / "big").mkdir()
    path = _mlp(tmp_path / "big", blocks=4, dim=2048)          # 4 x 16 MiB of weights
    graph = load_graph(str(path))
    before = _anon_bytes()
    session = simplifier._session(graph)
    assert set(session.saturate_feed) == {f"w{b}" for b in range(4)}
    feed = {"x": np.ones((2, 2048), np.float32), **session.saturate_feed}
    got = session.run(None, feed)[0]
    # ONNX Runtime runs on the mapped pages: no copy of the 64 MiB in the process's own memory.
    assert _anon_bytes() - before < 16 << 20
    want = _run(path, {"x": feed["x"]})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_full_disk_while_folding_is_one_line_and_leaves_no_file(tmp_path, monkeypatch, capsys):
    import errno
    import os

    monkeypatch.setattr(mapped, "SPILL_BYTES", 64 << 10)
    path = _mlp(tmp_path, blocks=1)
    before = sorted(p.name for p in tmp_path.iterdir())

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(mapped.os, "posix_fallocate", full)
    assert main(["optimize", str(path), "-o", str(tmp_path / "o.onnx"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert os.strerror(errno.ENOSPC) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.compiler
def test_compile_keeps_the_weights_on_disk_not_in_memory(monkeypatch):
    # weights.bin is written from a temp file the emitter fills as it goes: compiling holds no
    # copy of the weights (before, every weight was copied, then all joined into one bytes object).
    from saturate import compile_graph
    from saturate.backend import weights as blob
    from saturate.core.ir import Graph, Node, ValueInfo
    from saturate.interp.interpreter import run_graph

    monkeypatch.setattr(blob, "SPILL_BYTES", 1 << 20)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((1024, 6144)).astype(np.float32)      # 24 MiB
    g = Graph(inputs=["x"], outputs=["y"], values={"x": ValueInfo("float32", (2, 1024)),
                                                    "w": ValueInfo("float32", w.shape)},
              nodes=[Node("MatMul", ["x", "w"], ["h"]), Node("Relu", ["h"], ["y"])])
    g.constants["w"] = w
    tracemalloc.start()
    try:
        compiled = compile_graph(g)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 0.75 * w.nbytes, f"compiling held {peak / 2**20:.1f} MiB for a weight of {w.nbytes / 2**20:.0f} MiB"
    x = rng.standard_normal((2, 1024)).astype(np.float32)
    got = compiled(x)
    got = got["y"] if isinstance(got, dict) else got[0] if isinstance(got, (list, tuple)) else got
    want = run_graph(g, {"x": x})["y"]
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())
    assert (compiled.segments[0].directory / "weights.bin").stat().st_size >= w.nbytes
