/* The kernel library's half of tensor.h: compiled once per instruction set (build.py), linked into every model. */
#include "kernels.h"

/* Rows of ~4K floats per work item: big enough to amortize the pool, small enough to balance. */
int64_t sat_rows_per_item(int64_t rows, int64_t row_len) {
    int64_t per = 4096 / (row_len > 0 ? row_len : 1);
    return per < 1 ? 1 : (per > rows ? (rows > 0 ? rows : 1) : per);
}

/* Rows [r0, r1) of y (row = last axis), reading x at sum(idx[d] * istride[d]). */
void sat_strided_item(void *ctx, int64_t item, int tid) {
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
void sat_strided(const float *x, float *y, int rank, const int64_t *oshape, const int64_t *istride) {
    int64_t rows = 1;
    for (int d = 0; d < rank - 1; d++) rows *= oshape[d];
    if (rank < 1 || oshape[rank - 1] == 0 || rows == 0) return;
    sat_strided_args a = {x, y, rank, oshape, istride, rows, sat_rows_per_item(rows, oshape[rank - 1])};
    sat_parallel((rows + a.per - 1) / a.per, sat_strided_item, &a);
}

/* Output rows [r0, r1) of a gather: row r = (o, j) is x's row (o, idx[j]) of `inner` floats. */
void sat_gather_item(void *ctx, int64_t item, int tid) {
    sat_gather_args *a = ctx;
    const int64_t r0 = item * a->per, r1 = r0 + a->per < a->rows ? r0 + a->per : a->rows, n = a->n;
    (void)tid;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t o = r / a->count;
        /* indices are floats of their integer values (exact: the axis has at most 2^24 entries, and any larger
         * value, rounded or not, stays out of range); NaN fails both comparisons */
        const float f = a->idx[r % a->count];
        float *y = a->y + r * a->inner;
        if (!(f >= (float)-n && f < (float)n)) {
            memset(y, 0, sizeof(float) * (size_t)a->inner);
            __atomic_store_n(&a->bad, 1, __ATOMIC_RELAXED);
            continue;
        }
        const int64_t i = (int64_t)f < 0 ? (int64_t)f + n : (int64_t)f;
        memcpy(y, a->x + (o * n + i) * a->inner, sizeof(float) * (size_t)a->inner);
    }
}

/* y (outer x count x inner) = rows of x (outer x n x inner) picked by idx (count floats of integer values,
 * negative ones from the end); 2 if an index is out of range (its row then zeros), else 0. */
int sat_gather_rows(const float *x, const float *idx, float *y, int64_t outer, int64_t n, int64_t count,
                    int64_t inner) {
    const int64_t rows = outer * count;
    if (rows == 0 || inner == 0) return 0;
    sat_gather_args a = {x, idx, y, n, count, inner, rows, sat_rows_per_item(rows, inner), 0};
    sat_parallel((rows + a.per - 1) / a.per, sat_gather_item, &a);
    return a.bad ? 2 : 0;
}

void sat_pad_item(void *ctx, int64_t item, int tid) {
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
void sat_pad(const float *x, float *y, int rank, const int64_t *ishape, const int64_t *oshape,
                    const int64_t *begin, int mode, float value) {
    int64_t rows = 1;
    for (int d = 0; d < rank - 1; d++) rows *= oshape[d];
    if (rows == 0 || oshape[rank - 1] == 0) return;
    sat_pad_args a = {x, y, rank, mode, ishape, oshape, begin, value, rows, sat_rows_per_item(rows, oshape[rank - 1])};
    sat_parallel((rows + a.per - 1) / a.per, sat_pad_item, &a);
}

void sat_layernorm_item(void *ctx, int64_t item, int tid) {
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

void sat_rmsnorm_item(void *ctx, int64_t item, int tid) {
    const sat_norm_args *a = ctx;
    const int64_t L = a->L, r1 = (item + 1) * a->per < a->rows ? (item + 1) * a->per : a->rows;
    const int64_t body = L - L % 8; /* explicit bound: see sat_reduce */
    (void)tid;
    for (int64_t r = item * a->per; r < r1; r++) {
        const float *x = a->x + r * L;
        float *y = a->y + r * L;
        float q[8] = {0};
        int64_t i = 0;
        for (; i < body; i += 8)
            for (int k = 0; k < 8; k++) q[k] += x[i + k] * x[i + k];
        double sum = 0.0;
        for (int k = 0; k < 8; k++) sum += q[k];
        for (; i < L; i++) sum += (double)x[i] * x[i];
        /* the nodes' own steps in float (mean, plus eps, square root), then a product by the reciprocal: a
         * division per element (vdivps) took as long as the rest of the row */
        const float inv = 1.0f / sqrtf((float)(sum / (double)L) + a->eps);
        for (i = 0; i < L; i++) y[i] = x[i] * inv;
        if (a->epi) a->epi(a->y, r * L, L);
    }
}

void sat_rmsnorm(const float *x, float *y, int64_t rows, int64_t L, float eps, sat_epi epi) {
    sat_norm_args a = {x, NULL, NULL, y, rows, L, sat_rows_per_item(rows, L), eps, epi};
    if (rows > 0) sat_parallel((rows + a.per - 1) / a.per, sat_rmsnorm_item, &a);
}

/* LayerNormalization over the trailing L elements of each of `rows` rows; scale and bias hold L. */
void sat_layernorm(const float *x, const float *scale, const float *bias, float *y, int64_t rows, int64_t L,
                          float eps, sat_epi epi) {
    sat_norm_args a = {x, scale, bias, y, rows, L, sat_rows_per_item(rows, L), eps, epi};
    if (rows > 0) sat_parallel((rows + a.per - 1) / a.per, sat_layernorm_item, &a);
}

#if (defined(__AVX512F__))
/* Softmax of one contiguous row of L floats, 16 lanes at a time, two vectors a step with a sum each (rows of
 * 512 on a Zen 4: 0.43 -> 0.35 ns per element with sat_exp512's shorter chain), the last partial ones masked;
 * lanes below sat_softmax_floor are 0. */
void sat_softmax_row512(const float *x, float *y, int64_t L) {
    const int64_t pairs = L - L % 32;
    __m512 mx = _mm512_set1_ps(-INFINITY), mx2 = mx;
    for (int64_t i = 0; i < pairs; i += 32) {
        mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + i));
        mx2 = _mm512_max_ps(mx2, _mm512_loadu_ps(x + i + 16));
    }
    for (int64_t i = pairs; i < L; i += 16) {
        const __mmask16 m = L - i >= 16 ? 0xFFFF : (__mmask16)((1u << (L - i)) - 1);
        mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, x + i));
    }
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_max_ps(mx, mx2)));
    const __m512 lo = _mm512_set1_ps(sat_softmax_floor(L));
    __m512 sum = _mm512_setzero_ps(), sum2 = sum;
    for (int64_t i = 0; i < pairs; i += 32) {
        const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), top);
        const __m512 d2 = _mm512_sub_ps(_mm512_loadu_ps(x + i + 16), top);
        const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(d, lo, _CMP_GE_OQ), sat_exp512(d));
        const __m512 e2 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(d2, lo, _CMP_GE_OQ), sat_exp512(d2));
        _mm512_storeu_ps(y + i, e);
        _mm512_storeu_ps(y + i + 16, e2);
        sum = _mm512_add_ps(sum, e);
        sum2 = _mm512_add_ps(sum2, e2);
    }
    for (int64_t i = pairs; i < L; i += 16) {
        const __mmask16 m = L - i >= 16 ? 0xFFFF : (__mmask16)((1u << (L - i)) - 1);
        const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), top);
        const __m512 e = _mm512_maskz_mov_ps(m & _mm512_cmp_ps_mask(d, lo, _CMP_GE_OQ), sat_exp512(d));
        _mm512_mask_storeu_ps(y + i, m, e);
        sum = _mm512_add_ps(sum, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(_mm512_add_ps(sum, sum2)));
    for (int64_t i = 0; i < L; i += 16) {
        const __mmask16 m = L - i >= 16 ? 0xFFFF : (__mmask16)((1u << (L - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + i), inv));
    }
}

#elif defined(__AVX2__) && defined(__FMA__)
/* Softmax of one contiguous row of L floats, 8 lanes at a time: libm's expf is one call a float, which
 * left an AVX2 build's attention softmax scalar (as costly as a long sequence's products). x - max is at
 * most 0, and below sat_softmax_floor (above -87.3) the mask makes the lane 0 (as the AVX-512 row does, so
 * masked-out positions, a causal mask's -3.4e38, weigh nothing and no lane is subnormal), so the exp needs
 * no clamp (sat_exp8_in); two vectors a step, each with its own sum. */
void sat_softmax_row8(const float *x, float *y, int64_t L) {
    const int64_t body = L - L % 8, pairs = L - L % 16;
    __m256 mx = _mm256_set1_ps(-INFINITY), mx2 = mx;
    for (int64_t i = 0; i < pairs; i += 16) {
        mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
        mx2 = _mm256_max_ps(mx2, _mm256_loadu_ps(x + i + 8));
    }
    if (body > pairs) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + pairs));
    mx = _mm256_max_ps(mx, mx2);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    float top = _mm_cvtss_f32(m4);
    for (int64_t i = body; i < L; i++) top = x[i] > top ? x[i] : top;
    const float floor_ = sat_softmax_floor(L);
    const __m256 t = _mm256_set1_ps(top), lo = _mm256_set1_ps(floor_);
    __m256 sum = _mm256_setzero_ps(), sum2 = sum;
    for (int64_t i = 0; i < pairs; i += 16) {
        const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), t), d2 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 8), t);
        const __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(d, lo, _CMP_LT_OQ), sat_exp8_in(d));
        const __m256 e2 = _mm256_andnot_ps(_mm256_cmp_ps(d2, lo, _CMP_LT_OQ), sat_exp8_in(d2));
        _mm256_storeu_ps(y + i, e);
        _mm256_storeu_ps(y + i + 8, e2);
        sum = _mm256_add_ps(sum, e);
        sum2 = _mm256_add_ps(sum2, e2);
    }
    if (body > pairs) {
        const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + pairs), t);
        const __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(d, lo, _CMP_LT_OQ), sat_exp8_in(d));
        _mm256_storeu_ps(y + pairs, e);
        sum = _mm256_add_ps(sum, e);
    }
    sum = _mm256_add_ps(sum, sum2);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
    float total = _mm_cvtss_f32(s4);
    for (int64_t i = body; i < L; i++) {
        const float d = x[i] - top, e = d < floor_ ? 0.0f : sat_expf(d);
        y[i] = e;
        total += e;
    }
    const float inv = 1.0f / total;
    const __m256 iv = _mm256_set1_ps(inv);
    for (int64_t i = 0; i < body; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), iv));
    for (int64_t i = body; i < L; i++) y[i] *= inv;
}
#endif

/* Softmax of L floats `stride` apart, scalar (x and y may be the same floats). */
static void sat_softmax_strided(const float *x, float *y, int64_t L, int64_t stride) {
    const float floor_ = sat_softmax_floor(L);
    float mx = -INFINITY;
    for (int64_t i = 0; i < L; i++) mx = x[i * stride] > mx ? x[i * stride] : mx;
    double sum = 0.0;
    for (int64_t i = 0; i < L; i++) {
        const float d = x[i * stride] - mx, e = d < floor_ ? 0.0f : expf(d);
        y[i * stride] = e;
        sum += e;
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < L; i++) y[i * stride] *= inv;
}

/* Softmax of one contiguous row of L floats (x and y may be the same row). */
void sat_softmax_row(const float *x, float *y, int64_t L) {
#if defined(__AVX512F__)
    sat_softmax_row512(x, y, L);
#elif defined(__AVX2__) && defined(__FMA__)
    sat_softmax_row8(x, y, L);
#else
    sat_softmax_strided(x, y, L, 1);
#endif
}

/* One outer block: every (inner) lane of it along the axis. */
static void sat_softmax_block(const sat_softmax_args *a, int64_t o) {
    const int64_t L = a->L, inner = a->inner;
    if (inner == 1) {
        sat_softmax_row(a->x + o * L, a->y + o * L, L);
        return;
    }
    for (int64_t j = 0; j < inner; j++) sat_softmax_strided(a->x + o * L * inner + j, a->y + o * L * inner + j, L, inner);
}

/* Blocks [item * per, ...) of ~4K floats: an attention's rows of 128 are too short to claim one by one (each
 * claim is an atomic compare-exchange, and a thread taking from another's range moves its line over). */
void sat_softmax_item(void *ctx, int64_t item, int tid) {
    const sat_softmax_args *a = ctx;
    const int64_t o1 = (item + 1) * a->per < a->outer ? (item + 1) * a->per : a->outer;
    (void)tid;
    for (int64_t o = item * a->per; o < o1; o++) sat_softmax_block(a, o);
}

/* Numerically stable softmax along an axis of length L, between `outer` and `inner` blocks. */
void sat_softmax(const float *x, float *y, int64_t outer, int64_t L, int64_t inner) {
    sat_softmax_args a = {x, y, outer, L, inner, sat_rows_per_item(outer, L * inner)};
    sat_parallel((outer + a.per - 1) / a.per, sat_softmax_item, &a);
}

void sat_rotary_item(void *ctx, int64_t item, int tid) {
    const sat_rotary_args *a = ctx;
    const int64_t D = a->D, h = D / 2, r1 = (item + 1) * a->per < a->rows ? (item + 1) * a->per : a->rows;
    (void)tid;
    for (int64_t r = item * a->per; r < r1; r++) {
        int64_t at = r * D;
        if (a->nd > 0) {
            at = 0;
            for (int64_t k = a->nd - 1, rest = r; k >= 0; k--) {
                at += rest % a->dims[k] * a->xstride[k];
                rest /= a->dims[k];
            }
        }
        const float *x = a->x + at, *c = a->cs + r % a->period * D, *s = a->sn + r % a->period * D;
        float *y = a->y + r * D;
        for (int64_t d = 0; d < h; d++) y[d] = x[d] * c[d] - x[d + h] * s[d];
        for (int64_t d = h; d < D; d++) y[d] = x[d] * c[d] + x[d - h] * s[d];
        if (a->epi) a->epi(a->y, r * D, D);
    }
}

void sat_rotary(const float *x, const float *cs, const float *sn, float *y, int64_t rows, int64_t period,
                int64_t D, int nd, const int64_t *dims, const int64_t *xstride, sat_epi epi) {
    sat_rotary_args a = {x, cs, sn, y, rows, period, D, sat_rows_per_item(rows, D), nd, dims, xstride, epi};
    sat_parallel((rows + a.per - 1) / a.per, sat_rotary_item, &a);
}

/* One row's sum (mode 0, 1) or sum of squares (4, 5) from `init` in 8 lanes, or its max (2) or min (3) from
 * `init`. */
static float sat_reduce_row(const float *xr, int64_t inner, int mode, float init) {
    int64_t i = 0;
    if (mode < 2 || mode >= 4) {
        const int sq = mode >= 4;
        float acc[8];
        for (int k = 0; k < 8; k++) acc[k] = 0.0f;
        /* The 8-wide part ends at an explicit bound: with `i + 8 <= inner` as the test, gcc (12, once the shape
           is a constant) cannot bound where the tail loop starts and warns that its iteration 2^62 would
           overflow the pointer (-Werror=aggressive-loop-optimizations). */
        const int64_t body = inner - inner % 8;
        for (; i < body; i += 8)
            for (int k = 0; k < 8; k++) acc[k] += sq ? xr[i + k] * xr[i + k] : xr[i + k];
        float t = 0.0f;
        for (int k = 0; k < 8; k++) t += acc[k];
        for (; i < inner; i++) t += sq ? xr[i] * xr[i] : xr[i];
        return init + t;
    }
    float t = init;
    for (; i < inner; i++) t = mode == 2 ? (xr[i] > t ? xr[i] : t) : (xr[i] < t ? xr[i] : t);
    return t;
}

void sat_reduce_rows(void *ctx, int64_t item, int tid) {
    const sat_reduce_args *a = ctx;
    const float init = a->mode == 2 ? -INFINITY : (a->mode == 3 ? INFINITY : 0.0f);
    const int64_t r1 = (item + 1) * a->per < a->rows ? (item + 1) * a->per : a->rows;
    (void)tid;
    for (int64_t r = item * a->per; r < r1; r++) {
        const float t = sat_reduce_row(a->x + r * a->inner, a->inner, a->mode, init);
        a->y[r] = a->mode == 1 ? t * a->scale : a->mode == 5 ? sqrtf(t) : t;
    }
}

/* Reduce x (shape `shape`) into y: ystride[d] is y's stride along kept axes and 0 along reduced ones.
 * mode 0 sum, 1 mean (sum times `scale`), 2 max, 3 min, 4 sum of squares, 5 its square root (ReduceL2). One
 * pass over x, in order; a reduction of the last axis alone shares its rows among the threads. */
void sat_reduce(const float *x, float *y, int rank, const int64_t *shape, const int64_t *ystride,
                       int64_t ysize, int mode, float scale) {
    const float init = mode == 2 ? -INFINITY : (mode == 3 ? INFINITY : 0.0f);
    const int64_t inner = shape[rank - 1], ys = ystride[rank - 1];
    int64_t rows = 1;
    int last_only = ys == 0 && inner > 0;
    for (int d = 0; d < rank - 1; d++) {
        rows *= shape[d];
        last_only &= ystride[d] != 0 || shape[d] == 1;
    }
    if (last_only) { /* y[r] is row r's reduction */
        sat_reduce_args a = {x, y, rows, inner, sat_rows_per_item(rows, inner), mode, scale};
        sat_parallel((rows + a.per - 1) / a.per, sat_reduce_rows, &a);
        return;
    }
    for (int64_t i = 0; i < ysize; i++) y[i] = init;
    int64_t idx[SAT_MAX_RANK] = {0};
    for (int64_t r = 0; r < rows && inner > 0; r++) {
        int64_t o = 0;
        for (int d = 0; d < rank - 1; d++) o += idx[d] * ystride[d];
        const float *xr = x + r * inner;
        if (ys == 0) {
            y[o] = sat_reduce_row(xr, inner, mode, y[o]);
        } else {
            float *yr = y + o;
            if (mode >= 4)
                for (int64_t i = 0; i < inner; i++) yr[i] += xr[i] * xr[i];
            else if (mode < 2)
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
    if (mode == 5)
        for (int64_t i = 0; i < ysize; i++) y[i] = sqrtf(y[i]);
}

/* One plane: bilinear blend of the tabled source pixels, or a gather for nearest. */
void sat_resize_plane(void *ctx, int64_t p, int tid) {
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
void sat_resize2d(const float *x, float *y, int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW,
                         const int32_t *h0, const int32_t *h1, const float *hw, const int32_t *w0,
                         const int32_t *w1, const float *ww, int nearest) {
    sat_resize_args a = {x, y, H, W, OH, OW, h0, h1, w0, w1, hw, ww, nearest};
    sat_parallel(planes, sat_resize_plane, &a);
}

float *sat_bmm_buf[SAT_MAX_THREADS];

size_t sat_bmm_cap[SAT_MAX_THREADS];

/* Columns [j0, j1) of B (K x N: element (k, j) at B[k ldb + j], or at B[j ldb + k] when `tb`) into pgemm.h's
 * SAT_PN-column panels, each k-major over the whole K (panel q at bp + q K SAT_PN), columns past j1 zero. */
static void sat_pack_b_cols(const float *B, int K, int64_t ldb, int tb, int j0, int j1, float *bp) {
    for (int j = j0; j < j1; j += SAT_PN) {
        const int nr = j1 - j < SAT_PN ? j1 - j : SAT_PN;
        float *d = bp + (int64_t)(j - j0) * K;
        if (tb) {
            /* a transposed B (attention's K^T read from K): column j's K floats are contiguous */
            int c = 0;
#if defined(__AVX2__)
            /* 8 columns by 8 steps at a time, transposed in registers */
            for (; c + 8 <= nr; c += 8) {
                const float *s = B + (int64_t)(j + c) * ldb;
                int k = 0;
                for (; k + 8 <= K; k += 8) {
                    __m256 r0 = _mm256_loadu_ps(s + k), r1 = _mm256_loadu_ps(s + ldb + k);
                    __m256 r2 = _mm256_loadu_ps(s + 2 * ldb + k), r3 = _mm256_loadu_ps(s + 3 * ldb + k);
                    __m256 r4 = _mm256_loadu_ps(s + 4 * ldb + k), r5 = _mm256_loadu_ps(s + 5 * ldb + k);
                    __m256 r6 = _mm256_loadu_ps(s + 6 * ldb + k), r7 = _mm256_loadu_ps(s + 7 * ldb + k);
                    SAT_T8x8(r0, r1, r2, r3, r4, r5, r6, r7);
                    float *o = d + (int64_t)k * SAT_PN + c;
                    _mm256_storeu_ps(o, r0), _mm256_storeu_ps(o + SAT_PN, r1);
                    _mm256_storeu_ps(o + 2 * SAT_PN, r2), _mm256_storeu_ps(o + 3 * SAT_PN, r3);
                    _mm256_storeu_ps(o + 4 * SAT_PN, r4), _mm256_storeu_ps(o + 5 * SAT_PN, r5);
                    _mm256_storeu_ps(o + 6 * SAT_PN, r6), _mm256_storeu_ps(o + 7 * SAT_PN, r7);
                }
                for (; k < K; k++)
                    for (int q = 0; q < 8; q++) d[(int64_t)k * SAT_PN + c + q] = s[(int64_t)q * ldb + k];
            }
#endif
            for (; c < nr; c++) {
                const float *s = B + (int64_t)(j + c) * ldb;
                for (int k = 0; k < K; k++) d[(int64_t)k * SAT_PN + c] = s[k];
            }
            if (nr < SAT_PN)
                for (int k = 0; k < K; k++) memset(d + (int64_t)k * SAT_PN + nr, 0, sizeof(float) * (size_t)(SAT_PN - nr));
            continue;
        }
        const float *s = B + j;
        if (nr == SAT_PN)
            for (int k = 0; k < K; k++) memcpy(d + (int64_t)k * SAT_PN, s + (int64_t)k * ldb, sizeof(float) * SAT_PN);
        else
            for (int k = 0; k < K; k++) {
                memcpy(d + (int64_t)k * SAT_PN, s + (int64_t)k * ldb, sizeof(float) * (size_t)nr);
                memset(d + (int64_t)k * SAT_PN + nr, 0, sizeof(float) * (size_t)(SAT_PN - nr));
            }
    }
}

/* Panels of B a packed product's block passes each 6-row slice of A across: their kc x SAT_PN blocks
 * (64 KB at 4 panels of 16 and kc 256) stay in L2 while A's rows, read in place, stay in L1. */
#define SAT_BMM_JC 4

/* Rows [i0, i1) by columns [j0, j1) of a packed batched product: B's panels of those columns packed at bp,
 * A's rows (from `A`) read in place by sat_ukr_rows, Y the product's output. */
static void sat_bmm_block(const sat_bmm_args *a, const float *A, float *Y, const float *bp, int i0, int i1, int j0,
                          int j1) {
    const int N = a->N, K = a->K;
    for (int jc = j0; jc < j1; jc += SAT_BMM_JC * SAT_PN) {
        const int jc1 = jc + SAT_BMM_JC * SAT_PN < j1 ? jc + SAT_BMM_JC * SAT_PN : j1;
        for (int k0 = 0; k0 < K; k0 += SAT_PKC) {
            const int kc = K - k0 < SAT_PKC ? K - k0 : SAT_PKC;
            for (int i = i0; i < i1; i += SAT_PR) {
                const int mr = i1 - i < SAT_PR ? i1 - i : SAT_PR;
                const float *rows[SAT_PR];
                for (int r = 0; r < SAT_PR; r++) rows[r] = A + (int64_t)(i + (r < mr ? r : 0)) * a->lda + k0;
                for (int j = jc; j < jc1; j += SAT_PN) {
                    const float *bj = bp + (int64_t)(j - j0) * K + (int64_t)k0 * SAT_PN;
                    const int nr = jc1 - j < SAT_PN ? jc1 - j : SAT_PN;
                    if (mr <= 4)
                        sat_ukr_rows4(kc, rows, bj, Y + (int64_t)i * N + j, N, mr, nr, k0 > 0, 1);
                    else
                        sat_ukr_rows(kc, rows, bj, Y + (int64_t)i * N + j, N, mr, nr, k0 > 0, 1);
                }
            }
        }
    }
}

/* Work item of a packed batched product (unit u = bi * groups + g): product bi's columns [j0, j1), their B
 * panels packed on this thread, the epilogue on the item's columns at its end. With a softmax after the
 * product, the item is rows [i0, i1) of all its columns instead, made SAT_BMM_SOFTMAX_FLOATS at a time and
 * each block's rows through the epilogue and the softmax while they are still in cache: as steps of their
 * own both passes read a whole attention's scores back from memory (12 MB for 12 heads of 512 tokens). */
static void sat_bmm_packed_item(const sat_bmm_args *a, int64_t u, int tid) {
    const int M = a->M, N = a->N, K = a->K;
    const int64_t bi = u / a->groups;
    const int g = (int)(u % a->groups);
    const int i0 = a->softmax ? g * a->per : 0, i1 = !a->softmax ? M : i0 + a->per < M ? i0 + a->per : M;
    const int j0 = a->softmax ? 0 : g * a->per, j1 = a->softmax ? N : j0 + a->per < N ? j0 + a->per : N;
    if (i0 >= M || j0 >= N) return;
    const float *A = a->A + a->offs[bi][0];
    float *Y = a->Y + bi * (int64_t)M * N;
    const int64_t padded = (int64_t)(j1 - j0 + SAT_PN - 1) / SAT_PN * SAT_PN;
    float *bp = sat_thread_buf(&sat_bmm_buf[tid], &sat_bmm_cap[tid], (size_t)(padded * K));
    if (!bp) abort();
    sat_pack_b_cols(a->B + a->offs[bi][1], K, a->ldb, a->tb, j0, j1, bp);
    if (!a->softmax) {
        sat_bmm_block(a, A, Y, bp, 0, M, j0, j1);
        if (a->epi)
            for (int m = 0; m < M; m++) a->epi(a->Y, bi * (int64_t)M * N + (int64_t)m * N + j0, j1 - j0);
        return;
    }
    const int block = sat_bmm_softmax_rows(N);
    for (int r0 = i0; r0 < i1; r0 += block) {
        const int r1 = r0 + block < i1 ? r0 + block : i1;
        sat_bmm_block(a, A, Y, bp, r0, r1, 0, N);
        for (int m = r0; m < r1; m++) {
            if (a->epi) a->epi(a->Y, bi * (int64_t)M * N + (int64_t)m * N, N);
            sat_softmax_row(Y + (int64_t)m * N, Y + (int64_t)m * N, N);
        }
    }
}

void sat_bmm_item(void *ctx, int64_t u, int tid) {
    const sat_bmm_args *a = ctx;
    if (a->packed) {
        sat_bmm_packed_item(a, u, tid);
        return;
    }
    sat_gemm(0, a->tb, a->M, a->N, a->K, 1.0f, a->A + a->offs[u][0], (int)a->lda, a->B + a->offs[u][1], (int)a->ldb,
             a->Y, u * (int64_t)a->M * a->N, a->epi);
    if (a->softmax)
        for (int m = 0; m < a->M; m++) {
            float *row = a->Y + (u * a->M + m) * (int64_t)a->N;
            sat_softmax_row(row, row, a->N);
        }
}

/* `batch` products Y[bi] = A[offs[bi][0]..] B[offs[bi][1]..] (broadcast batch dims resolved in the
 * offsets table), A's rows `lda` floats apart, B's rows `ldb` apart (its columns, when `tb`: B read as the
 * transpose of a row-major N x K, attention's K^T in place), then the epilogue and, with `softmax`, a softmax
 * over each row of the output. With `packed` (the emitter's choice) on pgemm.h's tile, each product is split
 * when there are fewer products than two per thread: in runs of whole panels of its columns, or with a softmax
 * in runs of whole row tiles; else one product per work item on single-threaded OpenBLAS. */
void sat_matmul_batched(const float *A, const float *B, float *Y, int64_t batch, const int64_t (*offs)[2],
                               int M, int N, int K, int64_t lda, int64_t ldb, int tb, int packed, sat_epi epi,
                               int softmax) {
    sat_bmm_args a = {A, B, Y, offs, lda, ldb, M, N, K, tb, packed, softmax, 1, softmax ? M : N, epi};
    if (packed && sat_threads > 1 && !sat_in_parallel && batch < 2 * sat_threads) {
        const int step = softmax ? SAT_PR : SAT_PN, extent = softmax ? M : N;
        const int runs = (extent + step - 1) / step;
        int groups = (int)((2 * sat_threads + batch - 1) / batch);
        if (groups > runs) groups = runs;
        a.per = (runs + groups - 1) / groups * step;
        a.groups = (extent + a.per - 1) / a.per;
    }
    sat_parallel(batch * a.groups, sat_bmm_item, &a);
}
