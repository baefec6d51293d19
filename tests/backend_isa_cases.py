"""Run with SATURATE_ISA set (see test_backend_binding.py): the backend's checks built for that instruction set.

python backend_isa_cases.py ISA [corpus:NAME ...]: the kernel cases of backend_asan_cases.py, then each
corpus model optimized and compiled, all against the reference (the corpus ones against ONNX Runtime on
the original model, as test_corpus.py does); the built libraries must hold no instruction wider
than the ISA allows. An avx512 build on a CPU without AVX-512 is only built (warning-free, and holding
AVX-512 code). Prints 'isa cases ok' when all pass.
"""

from __future__ import annotations

import subprocess
import sys

from backend_asan_cases import cases
from backend_util import corpus_reference, feed_for, rel_error
from saturate.backend import compile_graph
from saturate.backend.build import avx512_build, build, cpu_has_avx512, isa
from saturate.backend.capi import api_source, header
from saturate.backend.emit import emit
from saturate.backend.segments import partition
from saturate.interp.interpreter import run_graph

# Registers an instruction set may not use: AVX-512's zmm and mask registers, and AVX's ymm for the baseline.
FORBIDDEN = {"avx2": ("%zmm", "%k1"), "portable": ("%zmm", "%ymm")}


def wide_instructions(library: str, which: str) -> list[str]:
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", library], capture_output=True, text=True,
                          check=True).stdout
    return [line.strip() for line in dump.splitlines() if any(r in line for r in FORBIDDEN.get(which, ()))][:3]


def check(model, got: dict, want: dict, label: str, which: str) -> list[str]:
    problems = [f"{label}: {name}: relative error {rel_error(got[name], want[name]):.2e}"
                for name in want if rel_error(got[name], want[name]) > 1e-4]
    for seg in model.segments:
        wide = wide_instructions(str(seg.directory / "model.so"), which)
        if wide:
            problems.append(f"{label}: {which} build uses wider instructions: {wide}")
    return problems


def corpus_case(name: str):
    """test_corpus' C check: the optimized model compiled, against ORT on the original."""
    feeds, want, optimized = corpus_reference(name)
    compiled = compile_graph(optimized, input_shapes={k: v.shape for k, v in feeds.items()})
    return compiled, compiled(**feeds), want


def build_only() -> int:
    """Build every case for AVX-512 without running it: the kernels must compile and be there."""
    zmm = 0
    for graph in cases():
        for piece in partition(graph).pieces:
            if piece.kind == "c":
                e = emit(piece.graph)
                where = build(e.source + api_source(e), e.weights, header(e, piece.graph.name))
                dump = subprocess.run(["objdump", "-d", str(where / "model.so")], capture_output=True, text=True,
                                      check=True).stdout
                zmm += dump.count("%zmm")
    print("isa cases ok" if zmm else "the AVX-512 build holds no AVX-512 instruction")
    return 0 if zmm else 1


def main() -> int:
    which, corpus_names = sys.argv[1], [a.removeprefix("corpus:") for a in sys.argv[2:]]
    if isa() != which or avx512_build() != (which == "avx512"):
        print(f"SATURATE_ISA is {isa()}, AVX-512 kernels {'on' if avx512_build() else 'off'}; expected {which}")
        return 1
    if which == "avx512" and not cpu_has_avx512():
        return build_only()
    problems = []
    for k, graph in enumerate(cases()):
        feed = feed_for(graph)
        model = compile_graph(graph, threads=1 + k % 2)
        reference = graph.copy()
        reference.opset = max(graph.opset, 17)  # the tensor case's LayerNormalization is an opset-17 op
        problems += check(model, model(feed), run_graph(reference, feed), f"case {k} ({graph.name})", which)
    for name in corpus_names:
        model, got, want = corpus_case(name)
        problems += check(model, got, want, name, which)
    print("\n".join(problems) or "isa cases ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
