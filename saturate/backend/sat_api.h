/* The C API of a model compiled by saturate (`saturate compile MODEL -o DIR` writes it as DIR/model.h
 * with the model's inputs and outputs above, next to DIR/model.so and DIR/weights.bin).
 *
 * Every tensor is float32, dense and row-major (C order), of the static shape the queries report.
 *
 *   int sat_init(const char *weights_path)
 *       Map the weights (DIR/weights.bin) read-only, once; 0 on success, 1 if the file is missing,
 *       unreadable or not exactly the size this model was compiled with. Later calls return 0 and keep
 *       the weights already mapped; call sat_free first to map them again. The file must not be
 *       truncated or rewritten in place while mapped.
 *   int64_t sat_workspace_bytes(void)
 *       Bytes of scratch sat_run needs: intermediate values (reused by liveness) and the convolution
 *       scratch of the calling thread. Allocate it 64-byte aligned (aligned_alloc(64, n rounded up to
 *       64)), or take sat_workspace_alloc's; its contents need not be kept between calls.
 *   float *sat_workspace_alloc(void), void sat_workspace_free(float *ws)
 *       A workspace of sat_workspace_bytes, zeroed, on 2 MB pages (Linux transparent huge pages, where the
 *       system allows them) when it is 2 MB or more: a model whose values span tens of MB runs faster on it
 *       than on 4 KB pages. NULL if the memory cannot be mapped. Free it with sat_workspace_free alone.
 *   int sat_run(const float *const *inputs, float *const *outputs, float *workspace, int threads)
 *       inputs[k] points at input k, outputs[k] at a buffer for output k (both in the order of the
 *       queries below); `threads` >= 1 threads compute (the caller plus threads - 1 pool threads,
 *       started on first use and kept). Returns 0, 1 if sat_init has not succeeded, or 2 if an index input
 *       (a Gather's indices given at run time, as floats of their integer values) is outside the axis it
 *       picks from: those rows are zeros, the rest computed. Each thread
 *       past the first allocates its own convolution scratch during a call (at most what
 *       sat_workspace_bytes counts for one thread) and frees it before returning.
 *       One call at a time per process: the library keeps its inputs, workspace and thread pool in
 *       static state, so concurrent callers must serialize (the Python module does).
 *   void sat_free(void)
 *       Release the weights; sat_run fails until sat_init succeeds again.
 *   int64_t sat_heap_bytes(void), sat_heap_peak_bytes(void); void sat_heap_reset_peak(void)
 *       The heap the library holds now (buffers kernels keep between calls; not the mapped weights) and the most
 *       it held at once since sat_heap_reset_peak: a call's peak minus what sat_init left held is the
 *       scratch the kernels allocate beyond the workspace (more with more threads).
 *   int sat_num_inputs(void), sat_num_outputs(void)
 *   const char *sat_input_name(int i), *sat_output_name(int i)      value names in the ONNX graph
 *   const char *sat_input_dtype(int i), *sat_output_dtype(int i)    "float32"
 *   int sat_input_rank(int i), sat_output_rank(int i)
 *   const int64_t *sat_input_shape(int i), *sat_output_shape(int i) rank dimensions
 *       Out-of-range indices give NULL (names, dtypes, shapes) or -1 (ranks).
 *
 * Link with: cc main.c -I DIR DIR/model.so -Wl,-rpath,DIR  (model.so records where its OpenBLAS is).
 */
#ifndef SATURATE_API_H
#define SATURATE_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int sat_init(const char *weights_path);
int64_t sat_workspace_bytes(void);
float *sat_workspace_alloc(void);
void sat_workspace_free(float *ws);
int sat_run(const float *const *inputs, float *const *outputs, float *workspace, int threads);
void sat_free(void);

int64_t sat_heap_bytes(void);
int64_t sat_heap_peak_bytes(void);
void sat_heap_reset_peak(void);

int sat_num_inputs(void);
int sat_num_outputs(void);
const char *sat_input_name(int i);
const char *sat_output_name(int i);
const char *sat_input_dtype(int i);
const char *sat_output_dtype(int i);
int sat_input_rank(int i);
int sat_output_rank(int i);
const int64_t *sat_input_shape(int i);
const int64_t *sat_output_shape(int i);

#ifdef __cplusplus
}
#endif

#endif
