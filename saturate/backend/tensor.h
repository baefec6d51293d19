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

/* Rows of ~4K floats per work item: big enough to amortize the pool, small enough to balance. */
static int64_t sat_rows_per_item(int64_t rows, int64_t row_len) {
    int64_t per = 4096 / (row_len > 0 ? row_len : 1);
    return per < 1 ? 1 : (per > rows ? (rows > 0 ? rows : 1) : per);
}

/* erf for epilogues (Erf, Gelu), call-free like sat_expf so the loop vectorizes: below |x| = 1 the Taylor
 * series to x^21 (remainder under 2e-9), above it Abramowitz & Stegun 7.1.26 (absolute error 1.5e-7, where
 * |erf| > 0.84); within 2.2e-7 relative everywhere, both computed and one selected. */
static inline float sat_erff(float x) {
    const float a = fabsf(x), z = x * x;
    float s = 1.4807192805e-08f;
    s = s * z - 1.6365844147e-07f;
    s = s * z + 1.6462114445e-06f;
    s = s * z - 1.4925650248e-05f;
    s = s * z + 1.2055332627e-04f;
    s = s * z - 8.5483270232e-04f;
    s = s * z + 5.2239778452e-03f;
    s = s * z - 2.6866171509e-02f;
    s = s * z + 1.1283791810e-01f;
    s = s * z - 3.7612637878e-01f;
    s = s * z + 1.1283792257e+00f;
    const float t = 1.0f / (1.0f + 0.3275911f * a);
    const float p = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
    const float r = 1.0f - p * sat_expf(-z);
    const float big = x < 0.0f ? -r : r;
    return a < 1.0f ? x * s : big;
}

/* ---- strided copy ------------------------------------------------------------------------------ */
typedef struct {
    const float *x;
    float *y;
    int rank;
    const int64_t *oshape, *istride;
    int64_t rows, per;
} sat_strided_args;

/* Rows [r0, r1) of y (row = last axis), reading x at sum(idx[d] * istride[d]). */
static void sat_strided_item(void *ctx, int64_t item, int tid) {
    const sat_strided_args *a = ctx;
    const int rank = a->rank;
    const int64_t inner = a->oshape[rank - 1], is = a->istride[rank - 1];
    const int64_t r0 = item * a->per, r1 = r0 + a->per < a->rows ? r0 + a->per : a->rows;
    int64_t idx[SAT_MAX_RANK] = {0};
    int64_t rest = r0;
    for (int d = rank - 2; d >= 0; d--) {
        idx[d] = rest % a->oshape[d];
        rest /= a->oshape[d];
    }
    (void)tid;
    for (int64_t r = r0; r < r1; r++) {
        int64_t base = 0;
        for (int d = 0; d < rank - 1; d++) base += idx[d] * a->istride[d];
        float *y = a->y + r * inner;
        const float *x = a->x + base;
        if (is == 1)
            memcpy(y, x, sizeof(float) * (size_t)inner);
        else if (is == 0)
            for (int64_t i = 0; i < inner; i++) y[i] = x[0];
        else
            for (int64_t i = 0; i < inner; i++) y[i] = x[i * is];
        for (int d = rank - 2; d >= 0; d--) {
            if (++idx[d] < a->oshape[d]) break;
            idx[d] = 0;
        }
    }
}

/* y (row-major, shape oshape) = x at sum(idx[d] * istride[d]); strides may be 0 (broadcast) or
 * negative (reversed slices), x may point into the middle of a buffer. */
static void sat_strided(const float *x, float *y, int rank, const int64_t *oshape, const int64_t *istride) {
    int64_t rows = 1;
    for (int d = 0; d < rank - 1; d++) rows *= oshape[d];
    if (rank < 1 || oshape[rank - 1] == 0 || rows == 0) return;
    sat_strided_args a = {x, y, rank, oshape, istride, rows, sat_rows_per_item(rows, oshape[rank - 1])};
    sat_parallel((rows + a.per - 1) / a.per, sat_strided_item, &a);
}

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

static void sat_pad_item(void *ctx, int64_t item, int tid) {
    const sat_pad_args *a = ctx;
    const int rank = a->rank, mode = a->mode;
    const int64_t on = a->oshape[rank - 1], in = a->ishape[rank - 1], b = a->begin[rank - 1];
    const int64_t r0 = item * a->per, r1 = r0 + a->per < a->rows ? r0 + a->per : a->rows;
    (void)tid;
    /* The run of output columns that copy the input row straight. */
    const int64_t lo = b < 0 ? 0 : (b < on ? b : on), hi = b + in < lo ? lo : (b + in < on ? b + in : on);
    for (int64_t r = r0; r < r1; r++) {
        float *y = a->y + r * on;
        int64_t rest = r, base = 0, stride = in, fill = 0;
        for (int d = rank - 2; d >= 0; d--) {
            const int64_t o = rest % a->oshape[d];
            rest /= a->oshape[d];
            const int64_t s = sat_pad_src(o, a->begin[d], a->ishape[d], mode);
            if (s < 0) fill = 1;
            base += s * stride;
            stride *= a->ishape[d];
        }
        if (fill) {
            for (int64_t i = 0; i < on; i++) y[i] = a->value;
            continue;
        }
        const float *x = a->x + base;
        for (int64_t i = 0; i < lo; i++) {
            const int64_t s = sat_pad_src(i, b, in, mode);
            y[i] = s < 0 ? a->value : x[s];
        }
        if (hi > lo) memcpy(y + lo, x + (lo - b), sizeof(float) * (size_t)(hi - lo));
        for (int64_t i = hi; i < on; i++) {
            const int64_t s = sat_pad_src(i, b, in, mode);
            y[i] = s < 0 ? a->value : x[s];
        }
    }
}

/* Pad (or crop, for negative pads) x into y; every axis may pad, in constant, reflect or edge mode. */
static void sat_pad(const float *x, float *y, int rank, const int64_t *ishape, const int64_t *oshape,
                    const int64_t *begin, int mode, float value) {
    int64_t rows = 1;
    for (int d = 0; d < rank - 1; d++) rows *= oshape[d];
    if (rows == 0 || oshape[rank - 1] == 0) return;
    sat_pad_args a = {x, y, rank, mode, ishape, oshape, begin, value, rows, sat_rows_per_item(rows, oshape[rank - 1])};
    sat_parallel((rows + a.per - 1) / a.per, sat_pad_item, &a);
}

/* ---- layer normalization ----------------------------------------------------------------------- */
typedef struct {
    const float *x, *scale, *bias;
    float *y;
    int64_t rows, L, per;
    float eps;
    sat_epi epi;
} sat_norm_args;

static void sat_layernorm_item(void *ctx, int64_t item, int tid) {
    const sat_norm_args *a = ctx;
    const int64_t L = a->L, r0 = item * a->per, r1 = r0 + a->per < a->rows ? r0 + a->per : a->rows;
    (void)tid;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = a->x + r * L;
        float *y = a->y + r * L;
        /* Eight partial sums: vectorizable without -ffast-math and more accurate than one. */
        float s[8] = {0}, q[8] = {0};
        int64_t i = 0;
        const int64_t body = L - L % 8;  /* explicit bound: see sat_reduce */
        for (; i < body; i += 8)
            for (int k = 0; k < 8; k++) s[k] += x[i + k];
        double sum = 0.0;
        for (int k = 0; k < 8; k++) sum += s[k];
        for (; i < L; i++) sum += x[i];
        const float mean = (float)(sum / (double)L);
        for (i = 0; i < body; i += 8)
            for (int k = 0; k < 8; k++) {
                const float d = x[i + k] - mean;
                q[k] += d * d;
            }
        double var = 0.0;
        for (int k = 0; k < 8; k++) var += q[k];
        for (; i < L; i++) var += (double)(x[i] - mean) * (x[i] - mean);
        const float inv = (float)(1.0 / sqrt(var / (double)L + (double)a->eps));
        if (a->bias)
            for (i = 0; i < L; i++) y[i] = (x[i] - mean) * inv * a->scale[i] + a->bias[i];
        else
            for (i = 0; i < L; i++) y[i] = (x[i] - mean) * inv * a->scale[i];
        if (a->epi) a->epi(a->y, r * L, L);
    }
}

/* LayerNormalization over the trailing L elements of each of `rows` rows; scale and bias hold L. */
static void sat_layernorm(const float *x, const float *scale, const float *bias, float *y, int64_t rows, int64_t L,
                          float eps, sat_epi epi) {
    sat_norm_args a = {x, scale, bias, y, rows, L, sat_rows_per_item(rows, L), eps, epi};
    if (rows > 0) sat_parallel((rows + a.per - 1) / a.per, sat_layernorm_item, &a);
}

/* ---- softmax ----------------------------------------------------------------------------------- */
typedef struct {
    const float *x;
    float *y;
    int64_t outer, L, inner;
} sat_softmax_args;

#if defined(__AVX512F__)
/* expf on 16 lanes (Cephes polynomial after n = round(x log2 e), 2^n applied by scalef): within 2 ulp,
 * 0 below -103, clamped to FLT_MAX's range above; libm's expf does not vectorize without -ffast-math. */
static inline __m512 sat_exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.72f)), _mm512_set1_ps(-103.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* Softmax of one contiguous row of L floats, 16 lanes at a time. */
static void sat_softmax_row512(const float *x, float *y, int64_t L) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < L; i += 16) {
        const __mmask16 m = L - i >= 16 ? 0xFFFF : (__mmask16)((1u << (L - i)) - 1);
        mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, x + i));
    }
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < L; i += 16) {
        const __mmask16 m = L - i >= 16 ? 0xFFFF : (__mmask16)((1u << (L - i)) - 1);
        const __m512 e = sat_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), top));
        _mm512_mask_storeu_ps(y + i, m, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int64_t i = 0; i < L; i += 16) {
        const __mmask16 m = L - i >= 16 ? 0xFFFF : (__mmask16)((1u << (L - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + i), inv));
    }
}
#endif

/* One outer block: every (inner) lane of it along the axis. */
static void sat_softmax_item(void *ctx, int64_t o, int tid) {
    const sat_softmax_args *a = ctx;
    const int64_t L = a->L, inner = a->inner;
    (void)tid;
#if defined(__AVX512F__)
    if (inner == 1) {
        sat_softmax_row512(a->x + o * L, a->y + o * L, L);
        return;
    }
#endif
    for (int64_t j = 0; j < inner; j++) {
        const float *xi = a->x + o * L * inner + j;
        float *yo = a->y + o * L * inner + j;
        float mx = -INFINITY;
        for (int64_t i = 0; i < L; i++) mx = xi[i * inner] > mx ? xi[i * inner] : mx;
        double sum = 0.0;
        for (int64_t i = 0; i < L; i++) {
            const float e = expf(xi[i * inner] - mx);
            yo[i * inner] = e;
            sum += e;
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < L; i++) yo[i * inner] *= inv;
    }
}

/* Numerically stable softmax along an axis of length L, between `outer` and `inner` blocks. */
static void sat_softmax(const float *x, float *y, int64_t outer, int64_t L, int64_t inner) {
    sat_softmax_args a = {x, y, outer, L, inner};
    sat_parallel(outer, sat_softmax_item, &a);
}

/* ---- reductions -------------------------------------------------------------------------------- */
/* Reduce x (shape `shape`) into y: ystride[d] is y's stride along kept axes and 0 along reduced ones.
 * mode 0 sum, 1 mean (sum times `scale`), 2 max, 3 min. One pass over x, in order. */
static void sat_reduce(const float *x, float *y, int rank, const int64_t *shape, const int64_t *ystride,
                       int64_t ysize, int mode, float scale) {
    const float init = mode == 2 ? -INFINITY : (mode == 3 ? INFINITY : 0.0f);
    for (int64_t i = 0; i < ysize; i++) y[i] = init;
    const int64_t inner = shape[rank - 1], ys = ystride[rank - 1];
    int64_t rows = 1;
    for (int d = 0; d < rank - 1; d++) rows *= shape[d];
    int64_t idx[SAT_MAX_RANK] = {0};
    for (int64_t r = 0; r < rows && inner > 0; r++) {
        int64_t o = 0;
        for (int d = 0; d < rank - 1; d++) o += idx[d] * ystride[d];
        const float *xr = x + r * inner;
        if (ys == 0) {
            float acc[8];
            for (int k = 0; k < 8; k++) acc[k] = init;
            int64_t i = 0;
            if (mode < 2) {
                /* The 8-wide part ends at an explicit bound: with `i + 8 <= inner` as the test, gcc (12, once
                   the shape is a constant) cannot bound where the tail loop starts and warns that its
                   iteration 2^62 would overflow the pointer (-Werror=aggressive-loop-optimizations). */
                const int64_t body = inner - inner % 8;
                for (; i < body; i += 8)
                    for (int k = 0; k < 8; k++) acc[k] += xr[i + k];
                float t = 0.0f;
                for (int k = 0; k < 8; k++) t += acc[k];
                for (; i < inner; i++) t += xr[i];
                y[o] += t;
            } else {
                float t = y[o];
                for (; i < inner; i++) t = mode == 2 ? (xr[i] > t ? xr[i] : t) : (xr[i] < t ? xr[i] : t);
                y[o] = t;
            }
        } else {
            float *yr = y + o;
            if (mode < 2)
                for (int64_t i = 0; i < inner; i++) yr[i] += xr[i];
            else if (mode == 2)
                for (int64_t i = 0; i < inner; i++) yr[i] = xr[i] > yr[i] ? xr[i] : yr[i];
            else
                for (int64_t i = 0; i < inner; i++) yr[i] = xr[i] < yr[i] ? xr[i] : yr[i];
        }
        for (int d = rank - 2; d >= 0; d--) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
        }
    }
    if (mode == 1)
        for (int64_t i = 0; i < ysize; i++) y[i] *= scale;
}

/* ---- resize ------------------------------------------------------------------------------------ */
typedef struct {
    const float *x;
    float *y;
    int64_t H, W, OH, OW;
    const int32_t *h0, *h1, *w0, *w1;
    const float *hw, *ww;
    int nearest;
} sat_resize_args;

/* One plane: bilinear blend of the tabled source pixels, or a gather for nearest. */
static void sat_resize_plane(void *ctx, int64_t p, int tid) {
    const sat_resize_args *a = ctx;
    const float *x = a->x + p * a->H * a->W;
    float *y = a->y + p * a->OH * a->OW;
    (void)tid;
    for (int64_t oh = 0; oh < a->OH; oh++) {
        const float *r0 = x + a->h0[oh] * a->W, *r1 = x + a->h1[oh] * a->W;
        float *yr = y + oh * a->OW;
        if (a->nearest) {
            for (int64_t ow = 0; ow < a->OW; ow++) yr[ow] = r0[a->w0[ow]];
            continue;
        }
        const float fh = a->hw[oh];
        for (int64_t ow = 0; ow < a->OW; ow++) {
            const float fw = a->ww[ow];
            const float top = r0[a->w0[ow]] + fw * (r0[a->w1[ow]] - r0[a->w0[ow]]);
            const float bot = r1[a->w0[ow]] + fw * (r1[a->w1[ow]] - r1[a->w0[ow]]);
            yr[ow] = top + fh * (bot - top);
        }
    }
}

/* Resize the last two axes of `planes` H x W planes to OH x OW from per-axis source tables. */
static void sat_resize2d(const float *x, float *y, int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW,
                         const int32_t *h0, const int32_t *h1, const float *hw, const int32_t *w0,
                         const int32_t *w1, const float *ww, int nearest) {
    sat_resize_args a = {x, y, H, W, OH, OW, h0, h1, w0, w1, hw, ww, nearest};
    sat_parallel(planes, sat_resize_plane, &a);
}

/* ---- batched matmul ---------------------------------------------------------------------------- */
typedef struct {
    const float *A, *B;
    float *Y;
    const int64_t (*offs)[2];
    int M, N, K;
    sat_epi epi;
} sat_bmm_args;

static void sat_bmm_item(void *ctx, int64_t bi, int tid) {
    const sat_bmm_args *a = ctx;
    (void)tid;
    sat_gemm(0, 0, a->M, a->N, a->K, 1.0f, a->A + a->offs[bi][0], a->K, a->B + a->offs[bi][1], a->N, a->Y,
             bi * (int64_t)a->M * a->N, a->epi);
}

/* `batch` products Y[bi] = A[offs[bi][0]..] B[offs[bi][1]..] (broadcast batch dims resolved in the
 * offsets table), one product per work item on single-threaded OpenBLAS. */
static void sat_matmul_batched(const float *A, const float *B, float *Y, int64_t batch, const int64_t (*offs)[2],
                               int M, int N, int K, sat_epi epi) {
    sat_bmm_args a = {A, B, Y, offs, M, N, K, epi};
    sat_parallel(batch, sat_bmm_item, &a);
}

#endif
