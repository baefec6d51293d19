# cython: language_level=3, boundscheck=False, wraparound=False
"""A model compiled by saturate's C backend, as a Python extension module.

`saturate compile MODEL -o DIR` writes this module into DIR (saturate_model.<python tag>.so) with the
model's code linked in, so `import saturate_model` with DIR on sys.path needs nothing but numpy:

    m = saturate_model.Model()          # reads DIR/weights.bin
    outs = m(x)                         # {output name: float32 array}; m.run([x]) gives a list

Inputs are read through the buffer protocol without copies (float32, C-contiguous, the compiled
shape); the GIL is released while the C runs, and calls from several threads take turns.
"""

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc

import os

import numpy as np


cdef extern from "binding.h" nogil:
    int sat_init(const char *weights_path)
    int64_t sat_workspace_bytes()
    void sat_free()
    int sat_num_inputs()
    int sat_num_outputs()
    const char *sat_input_name(int i)
    const char *sat_output_name(int i)
    const char *sat_input_dtype(int i)
    const char *sat_output_dtype(int i)
    int sat_input_rank(int i)
    int sat_output_rank(int i)
    const int64_t *sat_input_shape(int i)
    const int64_t *sat_output_shape(int i)
    int satb_run(void **inputs, void **outputs, void *workspace, int threads)
    double satb_time_runs(void **inputs, void **outputs, void *workspace, int threads, int64_t calls, int cpu_clock)
    double *satb_profile()
    void *satb_alloc(int64_t nbytes)
    int64_t sat_heap_bytes()
    int64_t sat_heap_peak_bytes()
    void sat_heap_reset_peak()


cdef list _describe(bint outputs):
    out = []
    cdef const int64_t *dims
    for i in range(sat_num_outputs() if outputs else sat_num_inputs()):
        dims = sat_output_shape(i) if outputs else sat_input_shape(i)
        rank = sat_output_rank(i) if outputs else sat_input_rank(i)
        name = sat_output_name(i) if outputs else sat_input_name(i)
        dtype = sat_output_dtype(i) if outputs else sat_input_dtype(i)
        out.append((name.decode("utf-8"), tuple(int(dims[d]) for d in range(rank)), dtype.decode()))
    return out


# What the compiled library takes and returns: [(name, shape, dtype)] in sat_run's order.
INPUTS = _describe(False)
OUTPUTS = _describe(True)
WORKSPACE_BYTES = int(sat_workspace_bytes())
_OUTPUT_NAMES = [name for name, _, _ in OUTPUTS]

# The weights file the library holds (the C keeps one set per loaded library), and the heap held once
# they were read: what the kernels hold beyond it is their scratch.
_weights = None
_heap_base = 0


cdef class Model:
    """The compiled model with its weights read and a workspace of its own.

    Model(weights=None, threads=1): `weights` defaults to weights.bin beside this module; `threads` is
    the default thread count of a call."""

    cdef void *_ws
    cdef public int threads
    cdef readonly list inputs, outputs
    cdef readonly int64_t workspace_bytes
    cdef int _nin, _nout

    def __cinit__(self, weights=None, int threads=1):
        global _weights, _heap_base
        self._ws = NULL
        path = os.path.abspath(weights if weights is not None else
                               os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights.bin"))
        if _weights is not None and _weights != path:
            raise ValueError(f"this library already holds the weights of {_weights}; a second set needs its own copy "
                             f"of the module")
        if sat_init(os.fsencode(path)) != 0:
            raise OSError(f"cannot load weights from {path}: missing, unreadable or not the size this model was "
                          f"compiled with")
        if _weights is None:
            _heap_base = sat_heap_bytes()
        _weights = path
        if threads < 1:
            raise ValueError(f"thread count must be at least 1, got {threads}")
        self.threads = threads
        self.inputs, self.outputs = INPUTS, OUTPUTS
        self._nin, self._nout = len(INPUTS), len(OUTPUTS)
        self.workspace_bytes = WORKSPACE_BYTES
        self._ws = satb_alloc(WORKSPACE_BYTES)
        if self._ws == NULL:
            raise MemoryError(f"cannot allocate the {WORKSPACE_BYTES}-byte workspace")

    def __dealloc__(self):
        free(self._ws)

    def run(self, arrays, int threads=0, outputs=None):
        """Run on a sequence of float32, C-contiguous arrays (or any buffers) of the input shapes, in order;
        returns the outputs as a list of new float32 arrays (or fills `outputs`, buffers of the output
        shapes, and returns them)."""
        cdef int n = threads if threads > 0 else self.threads
        cdef int k, total = self._nin + self._nout, acquired = 0, rc
        cdef Py_buffer *views
        cdef void **ptrs
        if len(arrays) != self._nin:
            raise ValueError(f"the model takes {self._nin} input(s), got {len(arrays)}")
        if outputs is None:
            outputs = [np.empty(shape, np.float32) for _, shape, _ in OUTPUTS]
        elif len(outputs) != self._nout:
            raise ValueError(f"the model has {self._nout} output(s), got {len(outputs)} buffers")
        views = <Py_buffer *>malloc(sizeof(Py_buffer) * (total + 1))
        ptrs = <void **>malloc(sizeof(void *) * (total + 1))
        if views == NULL or ptrs == NULL:
            free(views)
            free(ptrs)
            raise MemoryError()
        try:
            for k in range(total):
                obj = arrays[k] if k < self._nin else outputs[k - self._nin]
                name, shape, _ = INPUTS[k] if k < self._nin else OUTPUTS[k - self._nin]
                flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (PyBUF_WRITABLE if k >= self._nin else 0)
                try:
                    PyObject_GetBuffer(obj, &views[k], flags)
                except (TypeError, BufferError, ValueError):
                    what = "input" if k < self._nin else "output buffer"
                    raise TypeError(f"{what} '{name}' must be a C-contiguous float32 array{'' if k < self._nin else ' that can be written'}, "
                                    f"got {type(obj).__name__}") from None
                acquired += 1
                _check(&views[k], name, shape, k < self._nin)
                ptrs[k] = views[k].buf
            with nogil:
                rc = satb_run(ptrs, ptrs + self._nin, self._ws, n)
            if rc != 0:
                raise RuntimeError("compiled model failed to run (weights not loaded)")
        finally:
            for k in range(acquired):
                PyBuffer_Release(&views[k])
            free(views)
            free(ptrs)
        return outputs

    def __call__(self, *args, int threads=0, **kwargs):
        """Inputs by position, by name, or as one dict; returns {output name: array}."""
        if not kwargs and len(args) == self._nin and (self._nin != 1 or not isinstance(args[0], dict)):
            return dict(zip(_OUTPUT_NAMES, self.run(args, threads)))
        if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
            given = dict(args[0])
        else:
            if len(args) > self._nin:
                raise ValueError(f"the model takes {self._nin} input(s), got {len(args)}")
            given = {name: a for (name, _, _), a in zip(INPUTS, args)}
            given.update(kwargs)
        unknown = sorted(set(given) - {name for name, _, _ in INPUTS})
        if unknown:
            raise ValueError(f"unknown input(s) {unknown}; the model takes {[name for name, _, _ in INPUTS]}")
        missing = [name for name, _, _ in INPUTS if name not in given]
        if missing:
            raise ValueError(f"missing input(s) {missing}")
        return dict(zip(_OUTPUT_NAMES, self.run([given[name] for name, _, _ in INPUTS], threads)))

    def scratch_bytes(self, int threads=0):
        """Heap the kernels hold at the peak of one call on `threads` threads (run on zeros): each extra
        thread's convolution scratch and the per-thread buffers kernels grow and keep. The workspace
        (workspace_bytes) comes on top."""
        sat_heap_reset_peak()
        self.run([np.zeros(shape, np.float32) for _, shape, _ in INPUTS], threads)
        return int(sat_heap_peak_bytes() - _heap_base)

    def time_sat_run(self, arrays, int64_t calls, int threads=0, bint cpu_clock=True):
        """Seconds `calls` back-to-back sat_run calls on `arrays` take, timed in C around the loop (the
        calling thread's CPU time with `cpu_clock`, else wall time): the time inside sat_run, against which
        the bench measures what a call from Python adds."""
        cdef int n = threads if threads > 0 else self.threads
        cdef int k, total = self._nin + self._nout
        cdef void **ptrs
        cdef double seconds
        arrays = [np.ascontiguousarray(a, np.float32) for a in arrays]
        outputs = [np.empty(shape, np.float32) for _, shape, _ in OUTPUTS]
        if [a.shape for a in arrays] != [shape for _, shape, _ in INPUTS]:
            raise ValueError(f"expected arrays of shapes {[shape for _, shape, _ in INPUTS]}")
        ptrs = <void **>malloc(sizeof(void *) * (total + 1))
        if ptrs == NULL:
            raise MemoryError()
        for k in range(total):
            a = arrays[k] if k < self._nin else outputs[k - self._nin]
            ptrs[k] = <void *><size_t>a.ctypes.data
        with nogil:
            seconds = satb_time_runs(ptrs, ptrs + self._nin, self._ws, n, calls, cpu_clock)
        free(ptrs)
        return seconds

    def step_seconds(self, int steps):
        """Accumulated seconds of each of the first `steps` kernel steps (profiling builds), else None."""
        cdef double *t = satb_profile()
        return None if t == NULL else [t[k] for k in range(steps)]


cdef _check(Py_buffer *view, name, shape, bint is_input):
    what = "input" if is_input else "output buffer"
    fmt = view.format.decode() if view.format != NULL else "B"
    if view.itemsize != 4 or fmt.lstrip("@=<") != "f":
        raise TypeError(f"{what} '{name}' has item format '{fmt}'; the compiled model takes float32")
    got = tuple(view.shape[d] for d in range(view.ndim))
    if got != shape:
        raise ValueError(f"{what} '{name}' has shape {got}; the compiled model expects {shape}")


def release():
    """Free the weights the library holds (every Model of this module stops working until a new one loads)."""
    global _weights
    sat_free()
    _weights = None
