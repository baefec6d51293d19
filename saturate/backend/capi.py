"""C backend, API stage: the model-description functions appended to an emitted program, and the header
(`model.h`) a C program includes to call the compiled library."""

from __future__ import annotations

import math

from saturate.backend.emit import Emitted, comment_text
from saturate.core.errors import SaturateError

# The functions every compiled model exports; sat_api.h (beside this file) declares them for the Cython glue.
API_HEADER = "sat_api.h"


def c_string(text: str) -> str:
    """A C string literal holding `text` (UTF-8), every byte that is not plain ASCII escaped in octal."""
    out = []
    for b in text.encode("utf-8"):
        c = chr(b)
        out.append(c if (c.isalnum() or c in " _-.:/+()[]") and b < 128 else f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def _check_name(side: str, name: str) -> None:
    """A name the C API can hand back whole: C strings end at a NUL, and names travel as UTF-8."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise SaturateError(f"{side} '{comment_text(name)}': not valid Unicode text; the compiled model's C API "
                            "gives names as UTF-8") from None
    if "\0" in name:
        raise SaturateError(f"{side} '{comment_text(name)}': holds a NUL character, which would cut the name the "
                            "compiled model's C API gives (a C string)")


def _table(prefix: str, values: list[tuple[str, tuple[int, ...]]]) -> str:
    """Static tables of names, ranks and shapes for one side (inputs or outputs), and its query functions."""
    n = len(values)
    for name, _ in values:
        _check_name(f"{prefix} name", name)
    names = ", ".join(c_string(name) for name, _ in values) or "0"
    ranks = ", ".join(str(len(shape)) for _, shape in values) or "0"
    dims = [d for _, shape in values for d in shape]
    starts, at = [], 0
    for _, shape in values:
        starts.append(at)
        at += len(shape)
    return (
        f"static const char *const SAT_{prefix.upper()}_NAMES[] = {{{names}}};\n"
        f"static const int SAT_{prefix.upper()}_RANKS[] = {{{ranks}}};\n"
        f"static const int64_t SAT_{prefix.upper()}_DIMS[] = {{{', '.join(map(str, dims)) or '0'}}};\n"
        f"static const int SAT_{prefix.upper()}_START[] = {{{', '.join(map(str, starts)) or '0'}}};\n"
        f"int sat_num_{prefix}s(void) {{ return {n}; }}\n"
        f"const char *sat_{prefix}_name(int i) {{ return i >= 0 && i < {n} ? SAT_{prefix.upper()}_NAMES[i] : NULL; }}\n"
        f"const char *sat_{prefix}_dtype(int i) {{ return i >= 0 && i < {n} ? \"float32\" : NULL; }}\n"
        f"int sat_{prefix}_rank(int i) {{ return i >= 0 && i < {n} ? SAT_{prefix.upper()}_RANKS[i] : -1; }}\n"
        f"const int64_t *sat_{prefix}_shape(int i) {{\n"
        f"    return i >= 0 && i < {n} ? SAT_{prefix.upper()}_DIMS + SAT_{prefix.upper()}_START[i] : NULL;\n}}\n")


def api_source(emitted: Emitted) -> str:
    """C appended to the emitted program: what it takes and returns, and sat_free. It shares the program's
    translation unit, so sat_free can release the weights the program's sat_init read."""
    return ("\n/* Model description and release (saturate.backend.capi); the header checks every definition. */\n"
            f"#include \"{API_HEADER}\"\n"
            + _table("input", emitted.inputs) + _table("output", emitted.outputs)
            + "void sat_free(void) {\n    sat_release_weights(WT, NWT);\n    WT = NULL;\n}\n")


def header(emitted: Emitted, graph_name: str) -> str:
    """model.h: this model's inputs and outputs in a comment and macros, then the documented API."""
    from pathlib import Path

    def rows(values):
        return "".join(f" *   {k}  '{comment_text(name)}'  float32{list(shape)}  ({math.prod(shape)} floats)\n"
                       for k, (name, shape) in enumerate(values)) or " *   (none)\n"

    # Names are escaped here (comment_text); sat_input_name and sat_output_name give them as they are.
    describe = (f"/* model.h: C interface of graph '{comment_text(graph_name)}', compiled by saturate.\n *\n"
                f" * inputs (in the order sat_run takes them):\n{rows(emitted.inputs)} *\n"
                f" * outputs (in the order sat_run writes them):\n{rows(emitted.outputs)} */\n"
                "#ifndef SATURATE_MODEL_H\n#define SATURATE_MODEL_H\n\n"
                f"#define SAT_NUM_INPUTS {len(emitted.inputs)}\n#define SAT_NUM_OUTPUTS {len(emitted.outputs)}\n"
                f"#define SAT_WORKSPACE_BYTES {emitted.plan.peak_bytes}\n\n")
    api = (Path(__file__).resolve().parent / API_HEADER).read_text(encoding="utf-8")
    return describe + api + "\n#endif\n"
