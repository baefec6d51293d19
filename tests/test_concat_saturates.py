"""A batch-norm after Concats (DenseNet's dense blocks) saturates: no rule feeds on its own output."""

from __future__ import annotations

from engine_util import Builder, assert_same

from saturate.pipeline import optimize


def _dense_block():
    """DenseNet's block in small: each layer batch-norms the Concat of every feature map so far,
    the first one a Concat of one input, then convs it to two new channels."""
    b = Builder(shape=(1, 2, 5, 5))
    feats = ["x"]
    for _ in range(3):
        cat = b.op("Concat", *feats, axis=1)
        y = b.op("Relu", b.bn(cat, 2 * len(feats)))
        feats.append(b.conv(y, 2, 2 * len(feats)))
    return b, b.build(b.op("Concat", *feats, axis=1))


def test_dense_block_saturates():
    b, before = _dense_block()
    after, report = optimize(before, max_iterations=30)
    run = report.run
    # A Concat of one input is that input (concat-single): splitting a scale over it built the
    # same Mul over a new slice of the whole constant, matched again every iteration.
    assert run.stop_reason == "saturated", (run.stop_reason, run.sizes)
    assert run.iterations < 30 and run.sizes[-1] == run.sizes[-2]
    assert run.matches["mul-concat"] > 0 and run.matches["add-concat"] > 0
    assert len(after.nodes) <= len(before.nodes)
    assert_same(before, after, b.sample())
