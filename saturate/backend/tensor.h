/* C backend tensor kernels: strided views (slice, expand, transpose), pad, normalization, reductions,
 * resize and batched matmul; included by kernels.h after the thread pool and sat_gemm. */
#ifndef SATURATE_TENSOR_H
#define SATURATE_TENSOR_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define SAT_MAX_RANK 8

/* expf for pointwise epilogues (sigmoid, swish, elu): branch-free and call-free, so gcc vectorizes the
 * epilogue loop, which libm's expf prevents without -ffast-math. Cephes polynomial, within 2 ulp on
 * [-87.3, 88.3]; inputs are clamped to that range (results stay finite and normal). */
static inline float sat_expf(float x) {
    x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
    /* round(x log2 e) by the 1.5 * 2^23 trick: exact for |n| < 2^22 in round-to-nearest. */
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* 1 / d for d >= 1 (the 1 + exp(-x) of a sigmoid) without a division: the vectorized divide was the
 * slowest instruction of a SiLU epilogue (a bias + SiLU pass over 96 x 48 x 48 floats: 0.38-0.42 ms with
 * the divide, 0.25 ms with this). The exponent-negating guess (within 12%) and three Newton steps come
 * within 2.1e-7 relative of x / (1 + exp(-x)) over [-100, 100]; d is capped at 1e30 so the guess stays
 * a normal float (a NaN passes through). */
static inline float sat_rcpf(float d) {
    d = d > 1e30f ? 1e30f : d;
    int32_t i;
    memcpy(&i, &d, sizeof i);
    i = 0x7EF311C3 - i;
    float r;
    memcpy(&r, &i, sizeof r);
    r = r * (2.0f - d * r);
    r = r * (2.0f - d * r);
    return r * (2.0f - d * r);
}

/* Clamp to [lo, hi] as fminf(fmaxf(v, lo), hi) does (NaN gives lo), written as selects: x86's max and min
 * instructions compute exactly these, so epilogue loops vectorize where the libm calls stopped them. */
static inline float sat_clampf(float v, float lo, float hi) {
    v = v > lo ? v : lo;
    return v < hi ? v : hi;
}

int64_t sat_rows_per_item(int64_t rows, int64_t row_len);

/* erf for epilogues (Erf, Gelu), call-free like sat_expf so the loop vectorizes: x P(t) with t = x^2 2/c^2 - 1
 * in [-1, 1] and P of degree 16 (a Chebyshev fit of erf(x) / x weighted by x, in monomials of t), x clamped to
 * +-3.92 where erf reaches 1 in float and the result to [-1, 1]. One form for every lane, with no exp and no
 * divide: the Taylor series below |x| = 1 and Abramowitz & Stegun 7.1.26 above, both computed and one
 * selected, made a Gelu over 512 x 1536 floats cost 1.5 times as much on AVX2. Within 1.71e-7 of erf over
 * [-10, 10] with FMA (those two: 1.82e-7), 2.2e-7 without (1.92e-7); a NaN passes through. P runs as two
 * Horner chains, coefficients 10-16 beside 0-9, joined by t^9: one chain of 16 was latency-bound, and
 * Estrin's scheme or an even/odd split lost accuracy (2.6e-7, 3.8e-7). */
static inline float sat_erff(float x) {
    const float c = 3.92f;
    float v = -c > x ? -c : x;
    v = c < v ? c : v;
    const float t = v * v * (2.0f / (c * c)) - 1.0f, t2 = t * t, t4 = t2 * t2, t9 = t4 * t4 * t;
    float h = 3.2803891931e-04f, l = -1.9722084097e-02f;
    h = h * t - 9.0960773396e-04f;
    l = l * t + 3.0491381055e-02f;
    h = h * t + 8.0185868726e-04f;
    l = l * t - 4.3546142152e-02f;
    h = h * t - 1.1499431356e-03f;
    l = l * t + 5.8198867181e-02f;
    h = h * t + 3.9978763018e-03f;
    l = l * t - 7.3997524297e-02f;
    h = h * t - 8.0234622736e-03f;
    l = l * t + 9.0620888583e-02f;
    h = h * t + 1.2481400143e-02f;
    l = l * t - 1.0918121136e-01f;
    l = l * t + 1.3408345651e-01f;
    l = l * t - 1.8010857766e-01f;
    l = h * t9 + l;
    l = l * t + 3.6073681954e-01f;
    float r = v * l;
    r = -1.0f > r ? -1.0f : r;
    return 1.0f < r ? 1.0f : r;
}

/* tanh for epilogues (Tanh, Gelu's tanh form), call-free like sat_erff so the loop vectorizes (libm's tanhf
 * is one call a float). Eigen's rational approximation x P(x^2) / Q(x^2) on x clamped to +-7.905, where it
 * reaches 1 in float, and x itself below |x| = 0.0004: within 2.9e-7 relative of tanh over every float (a
 * sweep of every 97th bit pattern against double tanh); a NaN passes through. */
static inline float sat_tanhf(float x) {
    const float c = 7.90531110763549805f;
    const float v = x < -c ? -c : (x > c ? c : x), z = v * v;
    float p = -2.76076847742355e-16f;
    p = p * z + 2.00018790482477e-13f;
    p = p * z - 8.60467152213735e-11f;
    p = p * z + 5.12229709037114e-08f;
    p = p * z + 1.48572235717979e-05f;
    p = p * z + 6.37261928875436e-04f;
    p = p * z + 4.89352455891786e-03f;
    float q = 1.19825839466702e-06f;
    q = q * z + 1.18534705686654e-04f;
    q = q * z + 2.26843463243900e-03f;
    q = q * z + 4.89352518554385e-03f;
    const float r = v * p / q;
    return fabsf(x) < 0.0004f ? x : r;
}

/* ---- strided copy ------------------------------------------------------------------------------ */
typedef struct {
    const float *x;
    float *y;
    int rank;
    const int64_t *oshape, *istride;
    int64_t rows, per;
} sat_strided_args;

void sat_strided_item(void *ctx, int64_t item, int tid);

void sat_strided(const float *x, float *y, int rank, const int64_t *oshape, const int64_t *istride);

/* ---- gather by run-time indices ---------------------------------------------------------------- */
typedef struct {
    const float *x, *idx;
    float *y;
    int64_t n, count, inner, rows, per;
    int bad; /* set when an index is out of range */
} sat_gather_args;

void sat_gather_item(void *ctx, int64_t item, int tid);

int sat_gather_rows(const float *x, const float *idx, float *y, int64_t outer, int64_t n, int64_t count,
                    int64_t inner);

/* ---- pad --------------------------------------------------------------------------------------- */
typedef struct {
    const float *x;
    float *y;
    int rank, mode; /* mode 0 constant, 1 reflect, 2 edge */
    const int64_t *ishape, *oshape, *begin;
    float value;
    int64_t rows, per;
} sat_pad_args;

/* Source index of output index o along an axis of n elements padded by b in front; -1 for the fill. */
static inline int64_t sat_pad_src(int64_t o, int64_t b, int64_t n, int mode) {
    int64_t i = o - b;
    if (i >= 0 && i < n) return i;
    if (mode == 0) return -1;
    if (mode == 2 || n == 1) return i < 0 ? 0 : n - 1;
    const int64_t period = 2 * (n - 1);
    i %= period;
    if (i < 0) i += period;
    return i < n ? i : period - i;
}

void sat_pad_item(void *ctx, int64_t item, int tid);

void sat_pad(const float *x, float *y, int rank, const int64_t *ishape, const int64_t *oshape,
                    const int64_t *begin, int mode, float value);

/* ---- layer normalization ----------------------------------------------------------------------- */
typedef struct {
    const float *x, *scale, *bias;
    float *y;
    int64_t rows, L, per;
    float eps;
    sat_epi epi;
} sat_norm_args;

void sat_layernorm_item(void *ctx, int64_t item, int tid);

void sat_layernorm(const float *x, const float *scale, const float *bias, float *y, int64_t rows, int64_t L,
                          float eps, sat_epi epi);

/* RMSNorm: y = x / sqrt(mean(x^2) + eps) over rows of L (Pow, ReduceMean, Add, Sqrt and Div in one pass). */
void sat_rmsnorm_item(void *ctx, int64_t item, int tid);

void sat_rmsnorm(const float *x, float *y, int64_t rows, int64_t L, float eps, sat_epi epi);

/* ---- softmax ----------------------------------------------------------------------------------- */
typedef struct {
    const float *x;
    float *y;
    int64_t outer, L, inner, per;
} sat_softmax_args;

/* Below this x - max a softmax lane is 0, not exp(x - max) / sum: every lane above it, divided by a sum of
 * at most L, stays a normal float. Subnormal floats cost a microcode assist per instruction on Intel cores
 * (a causal mask's -3.4e38 made a Sapphire Rapids' rows of 512 take 4.1 ns per element instead of 0.45,
 * random scores in [-100, 100] 7.7 ns), and ONNX Runtime's softmax pays it; what the floor drops is below
 * 2^-126 of the row's largest output, under float's precision beside it. ln L is bounded by the bit
 * length of L times ln 2. */
static inline float sat_softmax_floor(int64_t L) {
    return -87.3f + 0.6931472f * (float)(64 - __builtin_clzll((unsigned long long)(L > 1 ? L : 1)));
}

#if defined(__AVX512F__)
/* (sat_exp512, expf on 16 lanes, is in vec.h beside sat_exp16) */

void sat_softmax_row512(const float *x, float *y, int64_t L);
#elif defined(__AVX2__) && defined(__FMA__)
void sat_softmax_row8(const float *x, float *y, int64_t L);
#endif

/* Softmax of one contiguous row of L floats (x and y may be the same row). */
void sat_softmax_row(const float *x, float *y, int64_t L);

void sat_softmax_item(void *ctx, int64_t item, int tid);

void sat_softmax(const float *x, float *y, int64_t outer, int64_t L, int64_t inner);

/* ---- rotary position embedding ------------------------------------------------------------------ */
/* y = x * cs + rotate_half(x) * sn on rows of D (rotate_half(x) = [-x[D/2:], x[:D/2]]), row r reading
 * table row r % period: the Slice, Neg, Concat, Mul, Mul and Add an exported Llama writes, in one pass.
 * With `nd` > 0, y's rows run over dims[0 .. nd) (row-major) and x's row at index (i_0 .. i_nd-1) starts at
 * sum(i_k xstride[k]): a transposed x read in place; else x's rows are contiguous like y's. */
typedef struct {
    const float *x, *cs, *sn;
    float *y;
    int64_t rows, period, D, per;
    int nd;
    const int64_t *dims, *xstride;
    sat_epi epi;
} sat_rotary_args;

void sat_rotary_item(void *ctx, int64_t item, int tid);

void sat_rotary(const float *x, const float *cs, const float *sn, float *y, int64_t rows, int64_t period,
                int64_t D, int nd, const int64_t *dims, const int64_t *xstride, sat_epi epi);

/* ---- reductions -------------------------------------------------------------------------------- */
/* Rows [item * per, ...) of a reduction over the last axis alone (an RMSNorm's mean of squares). */
typedef struct {
    const float *x;
    float *y;
    int64_t rows, inner, per;
    int mode;
    float scale;
} sat_reduce_args;

void sat_reduce_rows(void *ctx, int64_t item, int tid);

void sat_reduce(const float *x, float *y, int rank, const int64_t *shape, const int64_t *ystride,
                       int64_t ysize, int mode, float scale);

/* ---- resize ------------------------------------------------------------------------------------ */
typedef struct {
    const float *x;
    float *y;
    int64_t H, W, OH, OW;
    const int32_t *h0, *h1, *w0, *w1;
    const float *hw, *ww;
    int nearest;
} sat_resize_args;

void sat_resize_plane(void *ctx, int64_t p, int tid);

void sat_resize2d(const float *x, float *y, int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW,
                         const int32_t *h0, const int32_t *h1, const float *hw, const int32_t *w0,
                         const int32_t *w1, const float *ww, int nearest);

/* ---- batched matmul ---------------------------------------------------------------------------- */
typedef struct {
    const float *A, *B;
    float *Y;
    const int64_t (*offs)[2];
    int64_t lda, ldb;
    int M, N, K, tb, packed;
    int softmax;      /* a softmax over each row of the output, after the epilogue */
    int groups, per;  /* packed products: work items per product, columns (rows, with softmax) per item */
    sat_epi epi;
} sat_bmm_args;

/* Floats of the scores a packed product with a softmax makes before it runs the softmax on them: a block
 * that stays in L2 beside B's packed panels. */
#define SAT_BMM_SOFTMAX_FLOATS 16384

/* Rows of such a block for rows of N floats: whole row tiles, at least one. */
static inline int sat_bmm_softmax_rows(int N) {
    const int rows = SAT_BMM_SOFTMAX_FLOATS / (N > 0 ? N : 1) / SAT_PR * SAT_PR;
    return rows > SAT_PR ? rows : SAT_PR;
}

extern float *sat_bmm_buf[SAT_MAX_THREADS];

extern size_t sat_bmm_cap[SAT_MAX_THREADS];

void sat_bmm_item(void *ctx, int64_t bi, int tid);

void sat_matmul_batched(const float *A, const float *B, float *Y, int64_t batch, const int64_t (*offs)[2],
                               int M, int N, int K, int64_t lda, int64_t ldb, int tb, int packed, sat_epi epi,
                               int softmax);

#endif
