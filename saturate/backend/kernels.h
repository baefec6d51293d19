/* C backend kernels: conv, pooling, gemm and layout ops. Each header declares its kernels and holds what a
 * model's own translation unit inlines (vector helpers, and the work-item templates its fused epilogues are
 * instantiated into); the kernels' bodies are in the .c file of the same name, compiled once per compiler,
 * flags and instruction set into a static library (build.py) that every model links. */
#ifndef SATURATE_KERNELS_H
#define SATURATE_KERNELS_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <stdatomic.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <cblas.h>

/* Nothing of the library is exported from a model's shared library: each model.so holds its own copy, with
 * its own pool and buffers, whatever else the process loads. (The system headers come first, above: their
 * functions are the C library's, not hidden ones.) */
#pragma GCC visibility push(hidden)

#include "gemm.h"
#include "pool.h"

#ifndef SAT_MR
#define SAT_MR 8 /* panel widths named by the scalar build too */
#define SAT_NR 32
#endif

/* Pixel panels (plan.panel_roots): an image of C channels in panels of `nr` pixels holds channel c of pixel ip
 * at sat_panel_at(ip, C, nr) + c * nr; an image takes C * ceil(pixels / nr) * nr floats. */
static inline int64_t sat_panel_at(int64_t ip, int64_t C, int nr) { return ip / nr * C * nr + ip % nr; }


/* Per-step time, compiled in only with -DSAT_PROFILE (saturate.backend profiling builds): wall time, or at
 * one thread the caller's CPU time, which time slices lost to other processes on a shared machine do not
 * inflate. */
#ifdef SAT_PROFILE
static double sat_step_seconds[1 << 16];
static inline double sat_now(void) {
    struct timespec t;
    clock_gettime(sat_threads == 1 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
#define SAT_TIC double sat_t0 = sat_now();
#define SAT_TOC(k) sat_step_seconds[k] += sat_now() - sat_t0;
double *sat_profile(void) { return sat_step_seconds; }
#else
#define SAT_TIC
#define SAT_TOC(k)
#endif

/* A fused epilogue rewrites y[off .. off+len) in place; runs never cross the kernel's row. */
typedef void (*sat_epi)(float *y, int64_t off, int64_t len);

#include "dconv.h"
#include "vec.h"


static inline int64_t sat_clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* Range of ow in [0, OW) whose input column iw0 + ow * sw lies in [0, W). */
static inline void sat_valid_cols_s(int iw0, int sw, int W, int OW, int *lo, int *hi) {
    const int first = iw0 >= 0 ? 0 : (-iw0 + sw - 1) / sw;
    const int end = W - iw0 <= 0 ? 0 : (W - iw0 + sw - 1) / sw;
    *lo = (int)sat_clamp(first, 0, OW);
    *hi = (int)sat_clamp(end, *lo, OW);
}

static inline void sat_valid_cols(int iw0, int W, int OW, int *lo, int *hi) { sat_valid_cols_s(iw0, 1, W, OW, lo, hi); }

void sat_im2col(const float *x, float *col, int C, int H, int W, int KH, int KW, int oh0, int oh1, int OW,
                       int sh, int sw, int ph, int pw, int dh, int dw, int packed);

void sat_im2col_panels(const float *x, float *col, int C, int W, int oh0, int oh1, int OW, int sh, int sw, int packed);

/* Output rows per im2col tile: the column tile stays near SAT_TILE_BYTES so it is still in
 * cache when sgemm packs it and the output tile is still in cache for the epilogue. */
#define SAT_TILE_BYTES 196608 /* 192 KB */

int sat_tile_rows(int K, int OH, int OW);

int64_t sat_col_width(int64_t cols, int packed);

#ifdef SAT_HAVE_PACKED_GEMM
/* Per-thread buffer for a transposed product (pixels x channels), grown on demand and kept. */
extern float *sat_trans_buf[SAT_MAX_THREADS];
extern size_t sat_trans_cap[SAT_MAX_THREADS];

void sat_conv_trans(const float *wg, const float *ap, float *yt, int64_t P, int K, int cols, int Mg,
                           int m0, int m1, int tid);
#endif

void sat_conv_tile(const float *x, const float *w, const float *wp, int64_t wp_group, float *y, float *col,
                          int n, int g, int oh0, int oh1, int m0, int m1, int C, int H, int W, int M, int KH, int KW,
                          int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw, int G, int direct,
                          int trans, int acc, int xpan, int tid, sat_epi epi);

typedef struct {
    const float *x, *w, *wp;
    int64_t wp_group;
    float *y, **cols;
    int C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, G, direct, trans, acc, xpan, tile, tiles, split, chunk;
    sat_epi epi;
} sat_conv_args;

void sat_conv_unit(void *ctx, int64_t u, int tid);

void sat_conv2d(const float *x, const float *w, const float *wp, int64_t wp_group, float *y, float *col,
                       int N, int C, int H, int W, int M, int KH, int KW, int OH, int OW, int sh, int sw, int ph,
                       int pw, int dh, int dw, int G, int trans, int acc, int xpan, sat_epi epi);


/* Columns [j0, j0 + per) of an sgemm and their epilogue, one work item of a threaded product (OpenBLAS runs
 * on one thread inside the model, so threads split the product between them). */
typedef struct {
    const float *A, *B;
    float *Y;
    int64_t yoff;
    int ta, tb, M, N, K, lda, ldb, per;
    float alpha;
    sat_epi epi;
} sat_gemm_args;

void sat_gemm_cols(void *ctx, int64_t item, int tid);

void sat_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                     int ldb, float *Y, int64_t yoff, sat_epi epi);

typedef struct {
    const float *x;
    float *y;
    int H, W, OH, OW, KH, KW, sh, sw, ph, pw, pe_h, pe_w, dh, dw, mode;
    const int *wcount;
    sat_epi epi;
} sat_pool_args;

extern float *sat_poolrow_buf[SAT_MAX_THREADS];
extern size_t sat_poolrow_cap[SAT_MAX_THREADS];

#if defined(__AVX512F__)
/* Max over windows of KW adjacent columns at stride 2 of the row pr (its pw pad columns and the row between
 * -inf pads, 2 OW + KW + 32 floats in all): for 16 outputs at a time each window column is the even lanes
 * of two loads (one permute). gcc's code for the general loops below ran ResNet-50's 3x3 stride-2 MaxPool
 * at 5x ONNX Runtime's time, mostly in scalar remainders of 24-wide rows. */
static inline void sat_pool_max_s2(const float *pr, int KW, int OW, float *row) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    for (int ow = 0; ow < OW; ow += 16) {
        const float *s = pr + 2 * ow;
        __m512 m = _mm512_permutex2var_ps(_mm512_loadu_ps(s), even, _mm512_loadu_ps(s + 16));
        for (int kw = 1; kw < KW; kw++)
            m = _mm512_max_ps(m, _mm512_permutex2var_ps(_mm512_loadu_ps(s + kw), even, _mm512_loadu_ps(s + kw + 16)));
        const int n = OW - ow < 16 ? OW - ow : 16;
        _mm512_mask_storeu_ps(row + ow, (__mmask16)((1u << n) - 1), m);
    }
}
#elif defined(__AVX2__)
/* sat_pool_max_s2 on 8 outputs at a time: a window column's even lanes of two loads are one shuffle and
 * one cross-lane permute. gcc's general loops ran ResNet-50's 3x3 stride-2 MaxPool (64 planes of 48 x 48)
 * at 2.6-4x ONNX Runtime's time on an AVX2 build. */
static inline __m256 sat_even8(const float *s) {
    const __m256 e = _mm256_shuffle_ps(_mm256_loadu_ps(s), _mm256_loadu_ps(s + 8), _MM_SHUFFLE(2, 0, 2, 0));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
}

static inline void sat_pool_max_s2(const float *pr, int KW, int OW, float *row) {
    for (int ow = 0; ow < OW; ow += 8) {
        const float *s = pr + 2 * ow;
        __m256 m = sat_even8(s);
        for (int kw = 1; kw < KW; kw++) m = _mm256_max_ps(m, sat_even8(s + kw));
        if (OW - ow >= 8)
            _mm256_storeu_ps(row + ow, m);
        else
            _mm256_maskstore_ps(row + ow, _mm256_cmpgt_epi32(_mm256_set1_epi32(OW - ow),
                                                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), m);
    }
}
#endif

void sat_pool_plane(void *ctx, int64_t p, int tid);

void sat_pool2d(const float *x, float *y, int64_t NC, int H, int W, int OH, int OW, int KH, int KW,
                       int sh, int sw, int ph, int pw, int pe_h, int pe_w, int dh, int dw, int mode, sat_epi epi);

typedef struct {
    const float *x;
    float *y;
    int64_t planes, P, per;
} sat_gap_args;

void sat_gap_item(void *ctx, int64_t item, int tid);

void sat_global_avgpool(const float *x, float *y, int64_t N, int64_t C, int64_t P, sat_epi epi);

void sat_copy_blocks(const float *x, float *y, int64_t outer, int64_t inner, int64_t pitch);

#include "pgemm.h"
#include "wino.h"
#include "dconv8.h"
#include "pw.h"
#include "tensor.h"
#include "qgemm.h"

float *sat_read_weights(const char *path, int64_t nfloats);

void sat_release_weights(const float *w, int64_t nfloats);

/* A workspace of `bytes` for sat_run, page-aligned, on 2 MB pages from 2 MB up (kernels.c); NULL if none. */
float *sat_workspace_map(int64_t bytes);
void sat_workspace_unmap(float *ws, int64_t bytes);

#pragma GCC visibility pop

#endif
