/* C backend portable SIMD: GCC vector extensions, so one source compiles to AVX-512 (16 lanes), AVX2
 * (8 lanes) or narrower targets, and the non-AVX-512 path runs and is tested on every machine.
 * Kernels here: depthwise convolution and matrix products with few rows (classifier heads). */
#ifndef SATURATE_VEC_H
#define SATURATE_VEC_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

/* Lanes of a vector: one register's worth. Where the target has no 256-bit registers (the portable
 * build: SSE2), 8-lane vectors took two registers each, so the conv tile's twelve accumulators spilled
 * to memory and ran about 13x slower than the AVX2 build instead of 2-4x. */
#if defined(__AVX512F__)
#define SAT_VL 16
#elif defined(__AVX__)
#define SAT_VL 8
#else
#define SAT_VL 4
#endif

typedef float sat_vf __attribute__((vector_size(SAT_VL * sizeof(float))));

/* Unaligned load and store through memcpy: one vmovups, and no aliasing question. */
static inline sat_vf sat_vload(const float *p) {
    sat_vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void sat_vstore(float *p, sat_vf v) { memcpy(p, &v, sizeof v); }

/* Lanes by constant index only: a variable index would make gcc keep every vector of the caller in memory. */
static inline float sat_vsum(sat_vf v) {
    float s = (v[0] + v[1]) + (v[2] + v[3]);
#if SAT_VL >= 8
    s += (v[4] + v[5]) + (v[6] + v[7]);
#endif
#if SAT_VL == 16
    s += ((v[8] + v[9]) + (v[10] + v[11])) + ((v[12] + v[13]) + (v[14] + v[15]));
#endif
    return s;
}

/* A per-thread buffer of at least `floats` floats, grown on demand and kept for the next call. */
static float *sat_thread_buf(float **buf, size_t *cap, size_t floats) {
    if (*cap < floats) {
        free(*buf);
        *buf = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        *cap = *buf ? floats : 0;
    }
    return *buf;
}

/* ---- depthwise convolution ---------------------------------------------------------------------
 * Each output channel m reads input channel m / mult (mult = M / C). Per input channel, the rows the
 * window touches are copied once into a zero-padded plane, split by column phase when the stride sw
 * exceeds 1 (phase p holds padded columns p, p + sw, p + 2 sw, ...). Output column ow of tap (kh, kw)
 * then reads phase (kw dw) % sw at index ow + (kw dw) / sw of padded row oh sh + kh dh, so a run of
 * SAT_VL outputs is one unaligned load per tap, for any stride, dilation and padding, with no bounds
 * tests in the loop. Phase rows carry SAT_VL spare columns, so the last run's load stays inside. */
typedef struct {
    const float *x, *w;
    float *y;
    int C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw;
    int Hp, Wp, Wq;      /* padded rows and columns, floats per phase row */
    const int64_t *toff; /* per tap (kh, kw): its offset into the padded plane */
    sat_epi epi;
} sat_dw_args;

static float *sat_dw_buf[SAT_MAX_THREADS];
static size_t sat_dw_cap[SAT_MAX_THREADS];

/* Loops gcc would otherwise turn into memset and memcpy calls, which cost more than they save on the
 * short rows of small planes. */
#if defined(__GNUC__) && !defined(__clang__)
#define SAT_NO_LIBCALLS __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define SAT_NO_LIBCALLS
#endif

/* Copy input plane xi (H x W) into the phase-split padded plane xs (Wp padded columns are read). Input
 * column iw is padded column iw + pw: phase (iw + pw) % sw, index (iw + pw) / sw. */
SAT_NO_LIBCALLS static void sat_dw_pad(const float *restrict xi, float *restrict xs, int H, int W, int Hp, int Wp,
                                       int Wq, int sw, int ph, int pw) {
    const int n = W < Wp - pw ? W : Wp - pw; /* input columns the window reaches */
    for (int r = 0; r < Hp; r++) {
        const int ih = r - ph;
        const float *s = xi + (int64_t)ih * W;
        float *d = xs + (int64_t)r * Wq; /* phase 0; phase p is p * Hp * Wq further */
        const int64_t ps = (int64_t)Hp * Wq;
        if (ih < 0 || ih >= H || n <= 0) {
            for (int p = 0; p < sw; p++)
                for (int j = 0; j < Wq; j++) d[p * ps + j] = 0.0f;
            continue;
        }
        if (sw == 1) {
            for (int j = 0; j < pw; j++) d[j] = 0.0f;
            for (int j = 0; j < n; j++) d[pw + j] = s[j];
            for (int j = pw + n; j < Wq; j++) d[j] = 0.0f;
            continue;
        }
        for (int p = 0; p < sw; p++)
            for (int j = 0; j < Wq; j++) d[p * ps + j] = 0.0f;
        if (sw == 2) {
            /* even input columns land in one phase, odd ones in the other: two unit-stride runs */
            float *d0 = d + (pw & 1) * ps + (pw >> 1), *d1 = d + ((pw + 1) & 1) * ps + ((pw + 1) >> 1);
            for (int i = 0; i < n / 2; i++) {
                d0[i] = s[2 * i];
                d1[i] = s[2 * i + 1];
            }
            if (n & 1) d0[n / 2] = s[n - 1];
            continue;
        }
        for (int iw = 0; iw < n; iw++) d[(iw + pw) % sw * ps + (iw + pw) / sw] = s[iw];
    }
}

/* Stores a run of SAT_VL outputs, or its first `len` when the row ends inside it. */
static inline void sat_vstore_part(float *p, sat_vf v, int len) {
    if (len >= SAT_VL) {
        sat_vstore(p, v);
        return;
    }
    float tail[SAT_VL];
    sat_vstore(tail, v);
    memcpy(p, tail, sizeof(float) * (size_t)len);
}

/* One output plane: y[oh][ow] = sum_t wk[t] * xs[oh rs + toff[t] + ow], rs the padded floats between
 * output rows. Each weight broadcast feeds four independent accumulators (a row's four runs where the
 * row is wide, else one run of four rows), which also hides the add latency of each chain. */
static inline void sat_dw_plane(const float *xs, int64_t rs, const int64_t *toff, const float *wk, int T, float *y,
                                int OH, int OW) {
    const int wide = OW / (4 * SAT_VL) * (4 * SAT_VL);
    for (int oh = 0; oh < OH && wide; oh++)
        for (int ow = 0; ow < wide; ow += 4 * SAT_VL) {
            const float *base = xs + oh * rs + ow;
            sat_vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int t = 0; t < T; t++) {
                const float *s = base + toff[t];
                const float wv = wk[t];
                a0 += wv * sat_vload(s);
                a1 += wv * sat_vload(s + SAT_VL);
                a2 += wv * sat_vload(s + 2 * SAT_VL);
                a3 += wv * sat_vload(s + 3 * SAT_VL);
            }
            float *yr = y + (int64_t)oh * OW + ow;
            sat_vstore(yr, a0);
            sat_vstore(yr + SAT_VL, a1);
            sat_vstore(yr + 2 * SAT_VL, a2);
            sat_vstore(yr + 3 * SAT_VL, a3);
        }
    for (int ow = wide; ow < OW; ow += SAT_VL)
        for (int oh = 0; oh < OH; oh += 4) {
            const int nr = OH - oh < 4 ? OH - oh : 4;
            /* rows past the last repeat it, so every load stays inside the padded plane */
            const float *b0 = xs + oh * rs + ow, *b1 = nr > 1 ? b0 + rs : b0, *b2 = nr > 2 ? b0 + 2 * rs : b0,
                        *b3 = nr > 3 ? b0 + 3 * rs : b0;
            sat_vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int t = 0; t < T; t++) {
                const int64_t o = toff[t];
                const float wv = wk[t];
                a0 += wv * sat_vload(b0 + o);
                a1 += wv * sat_vload(b1 + o);
                a2 += wv * sat_vload(b2 + o);
                a3 += wv * sat_vload(b3 + o);
            }
            float *yr = y + (int64_t)oh * OW + ow;
            const int len = OW - ow;
            sat_vstore_part(yr, a0, len);
            if (nr > 1) sat_vstore_part(yr + OW, a1, len);
            if (nr > 2) sat_vstore_part(yr + 2 * OW, a2, len);
            if (nr > 3) sat_vstore_part(yr + 3 * OW, a3, len);
        }
}

/* Work item: one input channel of one image and its `mult` output channels, epilogue per plane. */
static void sat_dw_channel(void *ctx, int64_t nc, int tid) {
    const sat_dw_args *a = ctx;
    const int C = a->C, T = a->KH * a->KW, Hp = a->Hp, Wq = a->Wq, sw = a->sw, mult = a->M / a->C;
    const int64_t n = nc / C, c = nc % C, P = (int64_t)a->OH * a->OW;
    float *xs = sat_thread_buf(&sat_dw_buf[tid], &sat_dw_cap[tid], (size_t)sw * Hp * Wq);
    if (!xs) abort();
    sat_dw_pad(a->x + nc * a->H * a->W, xs, a->H, a->W, Hp, a->Wp, Wq, sw, a->ph, a->pw);
    for (int k = 0; k < mult; k++) {
        const int64_t m = c * mult + k, plane = (n * a->M + m) * P;
        sat_dw_plane(xs, (int64_t)a->sh * Wq, a->toff, a->w + m * T, T, a->y + plane, a->OH, a->OW);
        if (a->epi) a->epi(a->y, plane, P);
    }
}

/* Small planes (at most SAT_DWC_MAXP outputs, one output per input channel): rows of 3 or 6 outputs would
 * fill few lanes and each channel's fixed costs would dominate, so lanes run across SAT_VL channels instead.
 * A group's padded planes are interleaved channel-minor (pixel (r, c) of lane l at (r Wp + c) SAT_VL + l), its
 * weights likewise per tap; each output pixel is then T full-vector FMAs at offsets fixed per tap, four
 * pixels at a time, and the results go back to the channels' planes, epilogue per plane. */
#define SAT_DWC_MAXP 64

static float *sat_dwc_buf[SAT_MAX_THREADS];
static size_t sat_dwc_cap[SAT_MAX_THREADS];

static void sat_dwc_group(void *ctx, int64_t item, int tid) {
    const sat_dw_args *a = ctx;
    const int C = a->C, H = a->H, W = a->W, Hp = a->Hp, Wp = a->Wp, OH = a->OH, OW = a->OW, sh = a->sh, sw = a->sw;
    const int T = a->KH * a->KW, P = OH * OW, groups = (C + SAT_VL - 1) / SAT_VL;
    const int64_t n = item / groups;
    const int c0 = (int)(item % groups) * SAT_VL, nc = C - c0 < SAT_VL ? C - c0 : SAT_VL;
    const size_t plane = (size_t)Hp * Wp * SAT_VL;
    float *xt = sat_thread_buf(&sat_dwc_buf[tid], &sat_dwc_cap[tid], plane + (size_t)(T + P) * SAT_VL);
    if (!xt) abort();
    float *wt = xt + plane, *yt = wt + (size_t)T * SAT_VL;
    const sat_vf zero = {0};
    for (size_t i = 0; i < plane; i += SAT_VL) sat_vstore(xt + i, zero);
    for (int t = 0; t < T; t++) sat_vstore(wt + (size_t)t * SAT_VL, zero);
    /* input rows r - ph and columns c - pw of padded pixel (r, c); only those the windows reach are read */
    const int r0 = a->ph > 0 ? 0 : -a->ph, r1 = H + a->ph < Hp ? H : Hp - a->ph;
    const int q0 = a->pw > 0 ? 0 : -a->pw, q1 = W + a->pw < Wp ? W : Wp - a->pw;
    for (int l = 0; l < nc; l++) {
        const float *xi = a->x + ((int64_t)n * C + c0 + l) * H * W;
        for (int ih = r0; ih < r1; ih++)
            for (int iw = q0; iw < q1; iw++)
                xt[((int64_t)(ih + a->ph) * Wp + iw + a->pw) * SAT_VL + l] = xi[(int64_t)ih * W + iw];
        const float *wk = a->w + (int64_t)(c0 + l) * T;
        for (int t = 0; t < T; t++) wt[t * SAT_VL + l] = wk[t];
    }
    const int64_t *toff = a->toff;
    for (int p = 0; p < P; p += 4) {
        const int np = P - p < 4 ? P - p : 4;
        int64_t base[4];
        for (int q = 0; q < 4; q++) {
            const int pp = p + (q < np ? q : 0), oh = pp / OW, ow = pp % OW;
            base[q] = ((int64_t)oh * sh * Wp + (int64_t)ow * sw) * SAT_VL;
        }
        const float *b0 = xt + base[0], *b1 = xt + base[1], *b2 = xt + base[2], *b3 = xt + base[3];
        sat_vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int t = 0; t < T; t++) {
            const sat_vf wv = sat_vload(wt + t * SAT_VL);
            const int64_t o = toff[t];
            a0 += wv * sat_vload(b0 + o);
            a1 += wv * sat_vload(b1 + o);
            a2 += wv * sat_vload(b2 + o);
            a3 += wv * sat_vload(b3 + o);
        }
        float *yp = yt + (int64_t)p * SAT_VL;
        sat_vstore(yp, a0);
        if (np > 1) sat_vstore(yp + SAT_VL, a1);
        if (np > 2) sat_vstore(yp + 2 * SAT_VL, a2);
        if (np > 3) sat_vstore(yp + 3 * SAT_VL, a3);
    }
    for (int l = 0; l < nc; l++) {
        const int64_t off = ((int64_t)n * a->M + c0 + l) * P;
        float *yo = a->y + off;
        for (int p = 0; p < P; p++) yo[p] = yt[(int64_t)p * SAT_VL + l];
        if (a->epi) a->epi(a->y, off, P);
    }
}

static void sat_conv_depthwise(const float *x, const float *w, float *y, int N, int C, int H, int W, int M,
                               int KH, int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw,
                               sat_epi epi) {
    const int Hp = (OH - 1) * sh + (KH - 1) * dh + 1, Wp = (OW - 1) * sw + (KW - 1) * dw + 1;
    if ((int64_t)OH * OW <= 0) return;
    int64_t toff[KH * KW];
    if (M == C && (int64_t)OH * OW <= SAT_DWC_MAXP) {
        for (int kh = 0; kh < KH; kh++)
            for (int kw = 0; kw < KW; kw++) toff[kh * KW + kw] = ((int64_t)kh * dh * Wp + (int64_t)kw * dw) * SAT_VL;
        sat_dw_args a = {x, w, y, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, Hp, Wp, 0, toff, epi};
        sat_parallel((int64_t)N * ((C + SAT_VL - 1) / SAT_VL), sat_dwc_group, &a);
        return;
    }
    const int Wq = (Wp + sw - 1) / sw + SAT_VL;
    for (int kh = 0; kh < KH; kh++)
        for (int kw = 0; kw < KW; kw++) {
            const int cc = kw * dw;
            toff[kh * KW + kw] = ((int64_t)(cc % sw) * Hp + (int64_t)kh * dh) * Wq + cc / sw;
        }
    sat_dw_args a = {x, w, y, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, Hp, Wp, Wq, toff, epi};
    sat_parallel((int64_t)N * C, sat_dw_channel, &a);
}

/* ---- depthwise convolution, channels in the lanes (AVX2, and AVX-512 builds) -----------------------------
 * The kernels above vectorize along a plane's rows, and a plane of 12, 6 or 3 columns leaves lanes idle
 * and pays per-row costs many times over. Here the 8 lanes are 8 channels instead: a group's planes are
 * transposed, 8 x 8 blocks at a time in registers, into one zero-padded plane of 8-channel pixels (pixel (r, c)
 * at (r Wp + c) 8); an output pixel is then one aligned load and FMA per tap against the tap's 8 weights, for
 * any stride, width or padding, 8 output pixels at a time; the 8 accumulators are transposed back into 8
 * consecutive outputs of each channel and stored. The zero border is written once per work item: every
 * group of the item overwrites the same interior. AVX-512 builds run its 16-lane form (sat_dwz_run, below):
 * their row kernels (16 lanes) were 2-8x slower than ONNX Runtime on MobileNetV2's depthwise convs. */
#if defined(__AVX2__)
#define SAT_HAVE_DWT 1

#define SAT_T8x8(r0, r1, r2, r3, r4, r5, r6, r7)                                                           \
    do {                                                                                                \
        const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);                 \
        const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);                 \
        const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);                 \
        const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);                 \
        const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);       \
        const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);       \
        const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);       \
        const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);       \
        r0 = _mm256_permute2f128_ps(s0, s4, 0x20), r1 = _mm256_permute2f128_ps(s1, s5, 0x20);          \
        r2 = _mm256_permute2f128_ps(s2, s6, 0x20), r3 = _mm256_permute2f128_ps(s3, s7, 0x20);          \
        r4 = _mm256_permute2f128_ps(s0, s4, 0x31), r5 = _mm256_permute2f128_ps(s1, s5, 0x31);          \
        r6 = _mm256_permute2f128_ps(s2, s6, 0x31), r7 = _mm256_permute2f128_ps(s3, s7, 0x31);          \
    } while (0)

/* 1 / d on 8 lanes without a divide (see sat_rcpf): the 12-bit estimate and one Newton step (within 1.5e-7
 * relative for normal results; 0 past about 1e38, where x / d is as good as 0 for a SiLU or sigmoid). */
static inline __m256 sat_rcp8(__m256 d) {
    const __m256 r = _mm256_rcp_ps(d);
    return _mm256_mul_ps(r, _mm256_sub_ps(_mm256_set1_ps(2.0f), _mm256_mul_ps(d, r)));
}

/* sat_expf (tensor.h) on 8 lanes, the same clamp, reduction and polynomial: the Swish (x sigmoid x) of a
 * depthwise conv's fused epilogue in the 8-channel kernel. */
static inline __m256 sat_exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    const __m256 big = _mm256_set1_ps(12582912.0f);
    const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), big), big);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

#if defined(__AVX512F__)
/* sat_rcp8 and sat_exp8 on 16 lanes, for the per-channel epilogues of AVX-512 kernels (dconv.h), which run
 * before the tile is transposed: a Swish there costs half what it does on 8-lane runs of the output. */
static inline __m512 sat_rcp16(__m512 d) {
    const __m512 r = _mm512_rcp14_ps(d);
    return _mm512_mul_ps(r, _mm512_sub_ps(_mm512_set1_ps(2.0f), _mm512_mul_ps(d, r)));
}

static inline __m512 sat_exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    const __m512 big = _mm512_set1_ps(12582912.0f);
    const __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), big), big);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r), _mm512_set1_ps(1.0f));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}
#endif

/* Lanes below n set: the mask of maskload and maskstore. */
static inline __m256i sat_mask8(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

typedef struct {
    const float *x, *w;
    float *y;
    int C, H, W, OH, OW, ph, pw, Hp, Wp, T, per; /* per: channel groups per work item */
    int sh, kext, S; /* row stride, padded rows one output row's windows span, output rows per strip */
    const int32_t *toff; /* per tap: its offset (kh dh Wp + kw dw) 8 into the interleaved plane */
    const int32_t *pix;  /* per output pixel: its window's origin (oh sh Wp + ow sw) 8 */
    sat_epi epi;
} sat_dwt_args;

static float *sat_dwt_buf[SAT_MAX_THREADS];
static size_t sat_dwt_cap[SAT_MAX_THREADS];

/* A fused epilogue whose every step is per channel, on 8 channels' values at one pixel: lanes m of the
 * planes q .. q + 7 (emitted per conv as pwc8_K, so it inlines into the kernel below). */
typedef __m256 (*sat_epc8)(__m256 v, int64_t q, __m256i m);

/* `epc` on the values of n consecutive channels (at most `width`) stored at v, the first of plane q: 8
 * channels at a time, for kernels whose vectors are wider than the 8-channel form (or whose sums sit in
 * memory). */
static inline __attribute__((always_inline)) void sat_epc8_span(sat_epc8 epc, float *v, int n, int64_t q, int width) {
    for (int e = 0; e < width && e < n; e += 8)
        _mm256_storeu_ps(v + e, epc(_mm256_loadu_ps(v + e), q + e, sat_mask8(n - e)));
}

/* Input rows [r0, r1) and columns [q0, q1) of 8 channels' planes (`xc`) into the interleaved rows `xt`
 * of `lanes`-float pixels, input (r, c) at pixel (r + ph - prow0, c + pw): 8 columns at a time, transposed 8 x 8 in
 * registers, each pixel's 8 floats stored at its start (the 16-lane kernel calls this again at xt + 8
 * for its other 8 channels). */
static inline __attribute__((always_inline)) void sat_dwt_interleave(float *xt, const float *const *xc, int lanes,
                                                                     int r0, int r1, int q0, int q1, int W,
                                                                     int Wp, int ph, int pw, int prow0) {
    for (int ih = r0; ih < r1; ih++) {
        float *d = xt + ((int64_t)(ih + ph - prow0) * Wp + pw) * lanes;
        const int64_t ro = (int64_t)ih * W;
        for (int iw = q0; iw < q1; iw += 8) {
            const int k = q1 - iw < 8 ? q1 - iw : 8;
            __m256 v0, v1, v2, v3, v4, v5, v6, v7;
            if (k == 8) {
                v0 = _mm256_loadu_ps(xc[0] + ro + iw), v1 = _mm256_loadu_ps(xc[1] + ro + iw);
                v2 = _mm256_loadu_ps(xc[2] + ro + iw), v3 = _mm256_loadu_ps(xc[3] + ro + iw);
                v4 = _mm256_loadu_ps(xc[4] + ro + iw), v5 = _mm256_loadu_ps(xc[5] + ro + iw);
                v6 = _mm256_loadu_ps(xc[6] + ro + iw), v7 = _mm256_loadu_ps(xc[7] + ro + iw);
            } else {
                const __m256i m = sat_mask8(k);
                v0 = _mm256_maskload_ps(xc[0] + ro + iw, m), v1 = _mm256_maskload_ps(xc[1] + ro + iw, m);
                v2 = _mm256_maskload_ps(xc[2] + ro + iw, m), v3 = _mm256_maskload_ps(xc[3] + ro + iw, m);
                v4 = _mm256_maskload_ps(xc[4] + ro + iw, m), v5 = _mm256_maskload_ps(xc[5] + ro + iw, m);
                v6 = _mm256_maskload_ps(xc[6] + ro + iw, m), v7 = _mm256_maskload_ps(xc[7] + ro + iw, m);
            }
            SAT_T8x8(v0, v1, v2, v3, v4, v5, v6, v7);
            float *o = d + (int64_t)iw * lanes;
            _mm256_store_ps(o, v0);
            if (k > 1) _mm256_store_ps(o + lanes, v1);
            if (k > 2) _mm256_store_ps(o + 2 * lanes, v2);
            if (k > 3) _mm256_store_ps(o + 3 * lanes, v3);
            if (k > 4) _mm256_store_ps(o + 4 * lanes, v4);
            if (k > 5) _mm256_store_ps(o + 5 * lanes, v5);
            if (k > 6) _mm256_store_ps(o + 6 * lanes, v6);
            if (k > 7) _mm256_store_ps(o + 7 * lanes, v7);
        }
    }
}

/* Channels [c0, c0 + lanes) of image n (the first nc real: lanes past them read channel c0 again, and
 * their results are not stored): each tap's `lanes` weights at wt + t lanes, each lane's input plane in xc. */
static inline __attribute__((always_inline)) void sat_dwt_group(const sat_dwt_args *a, float *wt, const float **xc,
                                                                int64_t n, int c0, int nc, int lanes) {
    const int T = a->T;
    for (int l = 0; l < lanes; l++) {
        const int c = c0 + (l < nc ? l : 0);
        xc[l] = a->x + ((int64_t)n * a->C + c) * a->H * a->W;
        for (int t = 0; t < T; t++) wt[t * lanes + l] = a->w[(int64_t)c * T + t];
    }
}

/* Padded rows [from, to) of a group's interleaved plane into the strip buffer xt, whose row 0 is padded row
 * prow0: the input rows among them interleaved 8 channels at a time, the pad rows zeroed (the pad columns
 * are zero from the work item's start: nothing writes them). */
static inline __attribute__((always_inline)) void sat_dwt_rows(const sat_dwt_args *a, float *xt, const float *const *xc,
                                                               int lanes, int prow0, int from, int to) {
    const int H = a->H, W = a->W, Wp = a->Wp, ph = a->ph;
    const size_t row = (size_t)Wp * lanes;
    /* input rows and columns the windows reach: padded pixel (r, c) holds input (r - ph, c - pw) */
    const int r0 = ph > 0 ? 0 : -ph, r1 = H + ph < a->Hp ? H : a->Hp - ph;
    const int q0 = a->pw > 0 ? 0 : -a->pw, q1 = W + a->pw < Wp ? W : Wp - a->pw;
    const int i0 = from - ph > r0 ? from - ph : r0, i1 = to - ph < r1 ? to - ph : r1;
    if (a->S < a->OH) /* (with one strip a row's place never holds another row: pad rows stay zero) */
        for (int pr = from; pr < to; pr++)
            if (pr - ph < i0 || pr - ph >= i1) memset(xt + (size_t)(pr - prow0) * row, 0, sizeof(float) * row);
    for (int h = 0; h < lanes; h += 8) sat_dwt_interleave(xt + h, xc + h, lanes, i0, i1, q0, q1, W, Wp, ph, a->pw, prow0);
}

/* The next strip of output rows [s0, s1) of a group: its padded rows [pr0, pr1) into the strip buffer, the
 * rows it shares with the last strip (that strip's rows [*h0, *h1)) moved down rather than interleaved
 * again. A strip's rows fit in L1 (sat_conv_dwt picks S): a whole plane of 16 channels is 150 KB on a
 * 48 x 48 map, and was written to L2 and read back from it. Returns the strip's origin as the whole
 * padded plane's, which the pixel offsets (`pix`) index. */
static inline __attribute__((always_inline)) const float *sat_dwt_strip(const sat_dwt_args *a, float *xt,
                                                                        const float *const *xc, int lanes, int s0,
                                                                        int s1, int *h0, int *h1) {
    const int pr0 = s0 * a->sh, pr1 = (s1 - 1) * a->sh + a->kext;
    const size_t row = (size_t)a->Wp * lanes;
    int from = pr0;
    if (s0 > 0 && *h1 > pr0) {
        memmove(xt, xt + (size_t)(pr0 - *h0) * row, sizeof(float) * row * (size_t)(*h1 - pr0));
        from = *h1;
    }
    sat_dwt_rows(a, xt, xc, lanes, pr0, from, pr1);
    *h0 = pr0, *h1 = pr1;
    return (const float *)((uintptr_t)xt - (uintptr_t)pr0 * row * sizeof(float));
}

/* A work item's image n and channel groups [g0, g1) of `lanes` channels, and its thread's buffers: the strip
 * buffer (returned, zeroed: nothing writes the pad columns after) and the taps' weights (*wt). */
static inline __attribute__((always_inline)) float *sat_dwt_item_start(const sat_dwt_args *a, int64_t item, int tid,
                                                                       int lanes, int64_t *n, int *g0, int *g1,
                                                                       float **wt) {
    const int groups = (a->C + lanes - 1) / lanes, items = (groups + a->per - 1) / a->per;
    *n = item / items;
    *g0 = (int)(item % items) * a->per;
    *g1 = *g0 + a->per < groups ? *g0 + a->per : groups;
    const size_t plane = (size_t)((a->S - 1) * a->sh + a->kext) * a->Wp * lanes;
    float *xt = sat_thread_buf(&sat_dwt_buf[tid], &sat_dwt_cap[tid], plane + (size_t)a->T * lanes);
    if (!xt) abort();
    *wt = xt + plane;
    memset(xt, 0, sizeof(float) * plane);
    return xt;
}

/* Work item: `per` groups of 8 channels of one image. With `epc` the epilogue runs on the accumulators
 * before they are transposed (one operand load per 8 channels for all 8 pixels), else `epi` on each plane. */
static inline __attribute__((always_inline)) void sat_dwt_run(void *ctx, int64_t item, int tid, sat_epc8 epc) {
    const sat_dwt_args *a = ctx;
    const int C = a->C, T = a->T;
    const int64_t P = (int64_t)a->OH * a->OW;
    int64_t n;
    int g0, g1;
    float *wt, *xt = sat_dwt_item_start(a, item, tid, 8, &n, &g0, &g1, &wt);
    const int32_t *toff = a->toff, *pix = a->pix;
    for (int g = g0; g < g1; g++) {
        const int c0 = g * 8, nc = C - c0 < 8 ? C - c0 : 8;
        const float *xc[8];
        sat_dwt_group(a, wt, xc, n, c0, nc, 8);
        float *yc = a->y + ((int64_t)n * C + c0) * P;
        int h0 = 0, h1 = 0;
        for (int s0 = 0; s0 < a->OH; s0 += a->S) {
            const int s1 = s0 + a->S < a->OH ? s0 + a->S : a->OH;
            const float *xs = sat_dwt_strip(a, xt, xc, 8, s0, s1, &h0, &h1);
            const int64_t pend = (int64_t)s1 * a->OW;
            for (int64_t p = (int64_t)s0 * a->OW; p < pend; p += 8) {
                const int np = pend - p < 8 ? (int)(pend - p) : 8;
                /* pixels past the strip's end repeat its last, so every load stays in the strip (the
                 * 16-lane kernel below uses this too) */
#define SAT_DWT_BASE(i) const float *b##i = xs + pix[p + (i < np ? i : np - 1)]
                SAT_DWT_BASE(0); SAT_DWT_BASE(1); SAT_DWT_BASE(2); SAT_DWT_BASE(3);
                SAT_DWT_BASE(4); SAT_DWT_BASE(5); SAT_DWT_BASE(6); SAT_DWT_BASE(7);
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    /* one tap for pixel i: its 8 channels times the tap's 8 weights */
#define SAT_DWT_FMA(i) a##i = _mm256_fmadd_ps(wv, _mm256_load_ps(b##i + o), a##i)
                if (np > 4)
                    for (int t = 0; t < T; t++) {
                        const int64_t o = toff[t];
                        const __m256 wv = _mm256_load_ps(wt + t * 8);
                        SAT_DWT_FMA(0); SAT_DWT_FMA(1); SAT_DWT_FMA(2); SAT_DWT_FMA(3);
                        SAT_DWT_FMA(4); SAT_DWT_FMA(5); SAT_DWT_FMA(6); SAT_DWT_FMA(7);
                    }
                else /* a plane's last 1-4 pixels (3x3 planes are 8 + 1): half the work */
                    for (int t = 0; t < T; t++) {
                        const int64_t o = toff[t];
                        const __m256 wv = _mm256_load_ps(wt + t * 8);
                        SAT_DWT_FMA(0); SAT_DWT_FMA(1); SAT_DWT_FMA(2); SAT_DWT_FMA(3);
                    }
#undef SAT_DWT_FMA
                if (epc) {
                    const __m256i mc = sat_mask8(nc);
                    const int64_t q = (int64_t)n * C + c0;
                    a0 = epc(a0, q, mc), a1 = epc(a1, q, mc), a2 = epc(a2, q, mc), a3 = epc(a3, q, mc);
                    a4 = epc(a4, q, mc), a5 = epc(a5, q, mc), a6 = epc(a6, q, mc), a7 = epc(a7, q, mc);
                }
                /* a_i: pixel p + i of the 8 channels; transposed, a_l: channel l's pixels p .. p + 7 */
                SAT_T8x8(a0, a1, a2, a3, a4, a5, a6, a7);
                __m256 out[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
                if (np == 8)
                    for (int l = 0; l < nc; l++) _mm256_storeu_ps(yc + l * P + p, out[l]);
                else {
                    const __m256i m = sat_mask8(np);
                    for (int l = 0; l < nc; l++) _mm256_maskstore_ps(yc + l * P + p, m, out[l]);
                }
            }
        }
        if (!epc && a->epi)
            for (int l = 0; l < nc; l++) a->epi(a->y, ((int64_t)n * C + c0 + l) * P, P);
    }
}

static void sat_dwt_item(void *ctx, int64_t item, int tid) { sat_dwt_run(ctx, item, tid, NULL); }

#endif

#if defined(__AVX512F__)
/* ---- depthwise convolution, 16 channels in the lanes (AVX-512) ---------------------------------------
 * sat_dwt_run's scheme on 512-bit registers: pixels of 16 channels (pixel (r, c) at (r Wp + c) 16), each
 * built from two 8 x 8 transposes of 8 input channels; an output block is 8 pixels of 16 channels, one
 * FMA per tap and pixel, transposed back as dconv.h's tiles are (SAT_T8x16) and stored 8 outputs of a
 * channel at a time. The epilogue takes dconv.h's vector forms: `epc` on the 16 channels of each pixel
 * before the transpose, `epv` on each run of 8 outputs after it; with neither, `epi` on each plane. */
static inline __attribute__((always_inline)) void sat_dwz_run(void *ctx, int64_t item, int tid, sat_epc epc,
                                                              sat_epv epv) {
    const sat_dwt_args *a = ctx;
    const int C = a->C, T = a->T;
    const int64_t P = (int64_t)a->OH * a->OW;
    int64_t n;
    int g0, g1;
    float *wt, *xt = sat_dwt_item_start(a, item, tid, 16, &n, &g0, &g1, &wt);
    const int32_t *toff = a->toff, *pix = a->pix;
    for (int g = g0; g < g1; g++) {
        const int c0 = g * 16, nc = C - c0 < 16 ? C - c0 : 16;
        const float *xc[16];
        sat_dwt_group(a, wt, xc, n, c0, nc, 16);
        const int64_t q = (int64_t)n * C + c0; /* plane of the group's first channel */
        const __mmask16 mc = (__mmask16)((1u << nc) - 1);
        int h0 = 0, h1 = 0;
        for (int s0 = 0; s0 < a->OH; s0 += a->S) {
            const int s1 = s0 + a->S < a->OH ? s0 + a->S : a->OH;
            const float *xs = sat_dwt_strip(a, xt, xc, 16, s0, s1, &h0, &h1);
            const int64_t pend = (int64_t)s1 * a->OW;
            for (int64_t p = (int64_t)s0 * a->OW; p < pend; p += 8) {
                const int np = pend - p < 8 ? (int)(pend - p) : 8;
                SAT_DWT_BASE(0); SAT_DWT_BASE(1); SAT_DWT_BASE(2); SAT_DWT_BASE(3);
                SAT_DWT_BASE(4); SAT_DWT_BASE(5); SAT_DWT_BASE(6); SAT_DWT_BASE(7);
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
#define SAT_DWZ_FMA(i) a##i = _mm512_fmadd_ps(wv, _mm512_load_ps(b##i + o), a##i)
                if (np > 4)
                    for (int t = 0; t < T; t++) {
                        const int64_t o = toff[t];
                        const __m512 wv = _mm512_load_ps(wt + t * 16);
                        SAT_DWZ_FMA(0); SAT_DWZ_FMA(1); SAT_DWZ_FMA(2); SAT_DWZ_FMA(3);
                        SAT_DWZ_FMA(4); SAT_DWZ_FMA(5); SAT_DWZ_FMA(6); SAT_DWZ_FMA(7);
                    }
                else
                    for (int t = 0; t < T; t++) {
                        const int64_t o = toff[t];
                        const __m512 wv = _mm512_load_ps(wt + t * 16);
                        SAT_DWZ_FMA(0); SAT_DWZ_FMA(1); SAT_DWZ_FMA(2); SAT_DWZ_FMA(3);
                    }
#undef SAT_DWZ_FMA
                if (epc) {
                    a0 = epc(a0, q, mc), a1 = epc(a1, q, mc), a2 = epc(a2, q, mc), a3 = epc(a3, q, mc);
                    a4 = epc(a4, q, mc), a5 = epc(a5, q, mc), a6 = epc(a6, q, mc), a7 = epc(a7, q, mc);
                }
                __m512 t8[8];
                SAT_T8x16(a0, a1, a2, a3, a4, a5, a6, a7, t8);
                const __mmask8 mk = (__mmask8)((1u << np) - 1);
                const int64_t off0 = q * P + p;
                for (int i = 0; i < 8; i++) {
                    /* t8[i]: channel (i & 3) + 8 (i >> 2) in the lower half, 4 more in the upper half */
                    const int ch = (i & 3) + 8 * (i >> 2);
                    if (ch < nc) sat_dconv_put(_mm512_castps512_ps256(t8[i]), a->y, off0 + ch * P, mk, epv);
                    if (ch + 4 < nc) sat_dconv_put(_mm512_extractf32x8_ps(t8[i], 1), a->y, off0 + (ch + 4) * P, mk, epv);
                }
            }
        }
        if (!epc && !epv && a->epi)
            for (int l = 0; l < nc; l++) a->epi(a->y, (q + l) * P, P);
    }
}

static void sat_dwz_item(void *ctx, int64_t item, int tid) { sat_dwz_run(ctx, item, tid, NULL, NULL); }
#endif

#ifdef SAT_HAVE_DWT
#define SAT_DWT_STRIP 24576
/* Depthwise convolution with channels in the lanes (one output channel per input channel), `lanes` (8 or
 * 16) at a time; `item` is the emitter's instantiation of sat_dwt_run or sat_dwz_run with its vector
 * epilogue, or NULL (then `epi` runs per plane). */
static void sat_conv_dwt(const float *x, const float *w, float *y, int N, int C, int H, int W, int KH, int KW,
                         int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw, sat_epi epi, sat_body item,
                         int lanes) {
    const int Hp = (OH - 1) * sh + (KH - 1) * dh + 1, Wp = (OW - 1) * sw + (KW - 1) * dw + 1, T = KH * KW;
    const int64_t P = (int64_t)OH * OW;
    int32_t toff[T];
    int32_t *pix = malloc(sizeof(int32_t) * (size_t)P);
    if (!pix) abort();
    for (int kh = 0; kh < KH; kh++)
        for (int kw = 0; kw < KW; kw++) toff[kh * KW + kw] = (kh * dh * Wp + kw * dw) * lanes;
    for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) pix[oh * OW + ow] = (oh * sh * Wp + ow * sw) * lanes;
    /* about 2K outputs per item, and at least 4 items per thread when the channels allow */
    const int groups = (C + lanes - 1) / lanes;
    int per = (int)((2048 + lanes * P - 1) / (lanes * P));
    const int most = (groups + 4 * sat_threads - 1) / (4 * sat_threads);
    if (sat_threads > 1 && per > most) per = most;
    if (per < 1) per = 1;
    if (per > groups) per = groups;
    /* Output rows per strip: as many as keep the strip's padded rows within SAT_DWT_STRIP bytes, fewer if that
     * makes the strip's pixels a multiple of the kernel's 8 (no partial block at every strip's end). */
    const int kext = (KH - 1) * dh + 1;
    const int64_t fit = SAT_DWT_STRIP / ((int64_t)Wp * lanes * 4);
    int S = fit <= kext ? 1 : (int)((fit - kext) / sh + 1);
    if (S > OH) S = OH;
    for (int s = S; s > 1 && S < OH; s--)
        if ((int64_t)s * OW % 8 == 0) {
            S = s;
            break;
        }
    sat_dwt_args a = {x, w, y, C, H, W, OH, OW, ph, pw, Hp, Wp, T, per, sh, kext, S, toff, pix, epi};
    sat_body fallback = sat_dwt_item;
#if defined(__AVX512F__)
    if (lanes == 16) fallback = sat_dwz_item;
#endif
    sat_parallel((int64_t)N * ((groups + per - 1) / per), item ? item : fallback, &a);
    free(pix);
}
#endif

/* Depthwise convolution: channels in the lanes where the build has that kernel (AVX2: 8, AVX-512: 16) and
 * each output channel reads its own input channel, else the kernels along the rows. `item`: see
 * sat_conv_dwt, its 8-lane form; `wide`, its 16-lane form on AVX-512 builds. */
static void sat_conv_dw_lanes(const float *x, const float *w, float *y, int N, int C, int H, int W, int M, int KH,
                              int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw, sat_epi epi,
                              sat_body item, sat_body wide) {
#ifdef SAT_HAVE_DWT
#if defined(__AVX512F__)
    const int lanes = 16;
    sat_body run = wide;
#else
    const int lanes = 8;
    sat_body run = item;
#endif
    const int64_t Hp = (int64_t)(OH - 1) * sh + (KH - 1) * dh + 1, Wp = (int64_t)(OW - 1) * sw + (KW - 1) * dw + 1;
    if (M == C && (int64_t)OH * OW > 0 && Hp * Wp * lanes < ((int64_t)1 << 31)) {
        sat_conv_dwt(x, w, y, N, C, H, W, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, epi, run, lanes);
        return;
    }
#endif
    (void)item;
    (void)wide;
    sat_conv_depthwise(x, w, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, epi);
}

/* ---- products with few rows ----------------------------------------------------------------------
 * C[i ci + j cj] = alpha * dot(A[i], B[j]) over K: every output is a dot product of two contiguous rows.
 * This serves the products where one side has few rows (a classifier head's one input, the 9 pixels of
 * a 3x3 feature map) and the other, B, is a large weight matrix read once: a general sgemm packs all of
 * it and fills its register tile with few useful columns. Blocks of 4 rows of B by 3 rows of A keep
 * twelve accumulators; A's rows stay in cache while B streams past once. */
static void sat_dot_rows(const float *A, int64_t lda, int na, const float *B, int64_t ldb, int j0, int j1, int K,
                         float *C, int64_t ci, int64_t cj, float alpha) {
    const int kv = K / SAT_VL * SAT_VL;
    if (na == 1) {
        /* One row of A (a classifier's input): 8 rows of B at a time, each with its own accumulator, so one
         * load of A feeds 8 FMAs (the 3-row tile below would repeat that row) and 8 streams of B are in flight. */
        for (int j = j0; j < j1; j += 8) {
            const int nj = j1 - j < 8 ? j1 - j : 8;
            const float *b[8];
            for (int r = 0; r < 8; r++) b[r] = B + (int64_t)(j + (r < nj ? r : 0)) * ldb;
            sat_vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
            for (int k = 0; k < kv; k += SAT_VL) {
                const sat_vf v = sat_vload(A + k);
                s0 += v * sat_vload(b[0] + k), s1 += v * sat_vload(b[1] + k);
                s2 += v * sat_vload(b[2] + k), s3 += v * sat_vload(b[3] + k);
                s4 += v * sat_vload(b[4] + k), s5 += v * sat_vload(b[5] + k);
                s6 += v * sat_vload(b[6] + k), s7 += v * sat_vload(b[7] + k);
            }
            float r[8] = {sat_vsum(s0), sat_vsum(s1), sat_vsum(s2), sat_vsum(s3),
                          sat_vsum(s4), sat_vsum(s5), sat_vsum(s6), sat_vsum(s7)};
            for (int k = kv; k < K; k++)
                for (int jj = 0; jj < 8; jj++) r[jj] += A[k] * b[jj][k];
            for (int jj = 0; jj < nj; jj++) C[(int64_t)(j + jj) * cj] = alpha * r[jj];
        }
        return;
    }
    for (int j = j0; j < j1; j += 4) {
        const int nj = j1 - j < 4 ? j1 - j : 4;
        /* rows past the block's end repeat its first, so every load is a real row */
        const float *b0 = B + (int64_t)j * ldb, *b1 = nj > 1 ? b0 + ldb : b0, *b2 = nj > 2 ? b0 + 2 * ldb : b0,
                    *b3 = nj > 3 ? b0 + 3 * ldb : b0;
        for (int i = 0; i < na; i += 3) {
            const int ni = na - i < 3 ? na - i : 3;
            const float *x0 = A + (int64_t)i * lda, *x1 = ni > 1 ? x0 + lda : x0, *x2 = ni > 2 ? x0 + 2 * lda : x0;
            sat_vf s00 = {0}, s01 = {0}, s02 = {0}, s03 = {0}, s10 = {0}, s11 = {0}, s12 = {0}, s13 = {0},
                   s20 = {0}, s21 = {0}, s22 = {0}, s23 = {0};
            for (int k = 0; k < kv; k += SAT_VL) {
                const sat_vf v0 = sat_vload(x0 + k), v1 = sat_vload(x1 + k), v2 = sat_vload(x2 + k);
                sat_vf w = sat_vload(b0 + k);
                s00 += v0 * w, s10 += v1 * w, s20 += v2 * w;
                w = sat_vload(b1 + k);
                s01 += v0 * w, s11 += v1 * w, s21 += v2 * w;
                w = sat_vload(b2 + k);
                s02 += v0 * w, s12 += v1 * w, s22 += v2 * w;
                w = sat_vload(b3 + k);
                s03 += v0 * w, s13 += v1 * w, s23 += v2 * w;
            }
            float r[3][4] = {{sat_vsum(s00), sat_vsum(s01), sat_vsum(s02), sat_vsum(s03)},
                             {sat_vsum(s10), sat_vsum(s11), sat_vsum(s12), sat_vsum(s13)},
                             {sat_vsum(s20), sat_vsum(s21), sat_vsum(s22), sat_vsum(s23)}};
            const float *xs[3] = {x0, x1, x2}, *bs[4] = {b0, b1, b2, b3};
            for (int k = kv; k < K; k++)
                for (int ii = 0; ii < 3; ii++)
                    for (int jj = 0; jj < 4; jj++) r[ii][jj] += xs[ii][k] * bs[jj][k];
            for (int ii = 0; ii < ni; ii++)
                for (int jj = 0; jj < nj; jj++) C[(int64_t)(i + ii) * ci + (int64_t)(j + jj) * cj] = alpha * r[ii][jj];
        }
    }
}

typedef struct {
    const float *A, *B;
    float *C;
    int64_t lda, ldb, ci, cj;
    int na, nb, K, per;
    float alpha;
    sat_epi epi;     /* applied to rows of B's side: C + j cj, na long (a conv's output channels) */
    int64_t epi_off; /* flat index of C[0] in the epilogue's tensor */
    float *epi_base;
} sat_dot_args;

static void sat_dot_item(void *ctx, int64_t item, int tid) {
    const sat_dot_args *a = ctx;
    const int j0 = (int)item * a->per, j1 = j0 + a->per < a->nb ? j0 + a->per : a->nb;
    (void)tid;
    sat_dot_rows(a->A, a->lda, a->na, a->B, a->ldb, j0, j1, a->K, a->C, a->ci, a->cj, a->alpha);
    if (a->epi)
        for (int j = j0; j < j1; j++) a->epi(a->epi_base, a->epi_off + (int64_t)j * a->cj, a->na);
}

/* Threads split B's rows, in items of about 64 KB of B. */
static void sat_dot(const float *A, int64_t lda, int na, const float *B, int64_t ldb, int nb, int K, float *C,
                    int64_t ci, int64_t cj, float alpha, sat_epi epi, float *epi_base, int64_t epi_off) {
    int per = (int)(16384 / (K > 0 ? K : 1));
    per = per < 4 ? 4 : (per + 3) / 4 * 4;
    sat_dot_args a = {A, B, C, lda, ldb, ci, cj, na, nb, K, per, alpha, epi, epi_off, epi_base};
    sat_parallel((nb + per - 1) / per, sat_dot_item, &a);
}

/* Y (M x N) = alpha * A (M x K) * B (K x N) for M <= SAT_SKINNY: runs of 2 SAT_VL columns of B, read once,
 * every row of A at once. */
#define SAT_SKINNY 4

typedef struct {
    const float *A, *B;
    float *Y;
    int M, N, K, lda, ldb, per;
    float alpha;
} sat_skinny_args;

static void sat_skinny_item(void *ctx, int64_t item, int tid) {
    const sat_skinny_args *a = ctx;
    const int j0 = (int)item * a->per, j1 = j0 + a->per < a->N ? j0 + a->per : a->N;
    const int K = a->K, M = a->M;
    (void)tid;
    for (int j = j0; j < j1; j += 2 * SAT_VL) {
        const int nj = j1 - j < 2 * SAT_VL ? j1 - j : 2 * SAT_VL;
        sat_vf acc[SAT_SKINNY][2];
        memset(acc, 0, sizeof acc);
        float run[2 * SAT_VL];
        memset(run, 0, sizeof run);
        for (int k = 0; k < K; k++) {
            const float *br = a->B + (int64_t)k * a->ldb + j;
            sat_vf b0, b1;
            if (nj == 2 * SAT_VL) {
                b0 = sat_vload(br);
                b1 = sat_vload(br + SAT_VL);
            } else {
                /* the last columns go through a zero-padded run, so no load passes the row's end */
                memcpy(run, br, sizeof(float) * (size_t)nj);
                b0 = sat_vload(run);
                b1 = sat_vload(run + SAT_VL);
            }
            for (int m = 0; m < M; m++) {
                const float xv = a->A[(int64_t)m * a->lda + k];
                acc[m][0] += xv * b0;
                acc[m][1] += xv * b1;
            }
        }
        for (int m = 0; m < M; m++) {
            float out[2 * SAT_VL];
            sat_vstore(out, acc[m][0] * a->alpha);
            sat_vstore(out + SAT_VL, acc[m][1] * a->alpha);
            memcpy(a->Y + (int64_t)m * a->N + j, out, sizeof(float) * (size_t)nj);
        }
    }
}

static void sat_skinny_nn(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                          float *Y) {
    int per = (int)(16384 / (K > 0 ? K : 1));
    per = (per + 2 * SAT_VL - 1) / (2 * SAT_VL) * (2 * SAT_VL);
    if (per < 2 * SAT_VL) per = 2 * SAT_VL;
    sat_skinny_args a = {A, B, Y, M, N, K, lda, ldb, per, alpha};
    sat_parallel((N + per - 1) / per, sat_skinny_item, &a);
}

/* C (M x N, pitch ldc) = A (M x K, pitch lda) * B (K x N, pitch ldb), for convs' short reductions (a 1x1
 * conv widening 16 channels to 96, a first layer's 27): there a general sgemm spends more time packing than
 * multiplying. Register tile of 4 rows by 3 vectors of columns: per k, three loads of B's row and four
 * broadcasts of A feed twelve FMAs. Column panels go outermost, so a panel of B (K x 3 SAT_VL) stays in
 * cache while every row of A passes it. */
#define SAT_SHORT_K 64

static float *sat_tail_buf[SAT_MAX_THREADS];
static size_t sat_tail_cap[SAT_MAX_THREADS];

static void sat_gemm_nn(int M, int N, int K, const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                        int64_t ldc) {
    enum { NB = 3 * SAT_VL };
    /* The last, partial panel is first copied into a zero-padded K x NB block, so its loads never pass the
     * end of B's rows and the loop below reads every panel alike. */
    float *tail = NULL;
    if (N % NB) {
        tail = sat_thread_buf(&sat_tail_buf[sat_pool_tid], &sat_tail_cap[sat_pool_tid], (size_t)K * NB);
        if (!tail) abort();
        const int j = N / NB * NB, nj = N - j;
        for (int k = 0; k < K; k++) {
            memcpy(tail + (int64_t)k * NB, B + (int64_t)k * ldb + j, sizeof(float) * (size_t)nj);
            memset(tail + (int64_t)k * NB + nj, 0, sizeof(float) * (size_t)(NB - nj));
        }
    }
    for (int j = 0; j < N; j += NB) {
        const int nj = N - j < NB ? N - j : NB;
        const float *bp = nj < NB ? tail : B + j;
        const int64_t bs = nj < NB ? NB : ldb;
        for (int i = 0; i < M; i += 4) {
            const int mi = M - i < 4 ? M - i : 4;
            const float *a0 = A + (int64_t)i * lda, *a1 = mi > 1 ? a0 + lda : a0, *a2 = mi > 2 ? a0 + 2 * lda : a0,
                        *a3 = mi > 3 ? a0 + 3 * lda : a0;
            sat_vf c00 = {0}, c01 = {0}, c02 = {0}, c10 = {0}, c11 = {0}, c12 = {0}, c20 = {0}, c21 = {0},
                   c22 = {0}, c30 = {0}, c31 = {0}, c32 = {0};
            for (int k = 0; k < K; k++) {
                const float *b = bp + (int64_t)k * bs;
                const sat_vf v0 = sat_vload(b), v1 = sat_vload(b + SAT_VL), v2 = sat_vload(b + 2 * SAT_VL);
                float w = a0[k];
                c00 += w * v0, c01 += w * v1, c02 += w * v2;
                w = a1[k];
                c10 += w * v0, c11 += w * v1, c12 += w * v2;
                w = a2[k];
                c20 += w * v0, c21 += w * v1, c22 += w * v2;
                w = a3[k];
                c30 += w * v0, c31 += w * v1, c32 += w * v2;
            }
            float *y = C + (int64_t)i * ldc + j;
            if (nj == NB) {
                sat_vstore(y, c00), sat_vstore(y + SAT_VL, c01), sat_vstore(y + 2 * SAT_VL, c02);
                if (mi > 1) sat_vstore(y + ldc, c10), sat_vstore(y + ldc + SAT_VL, c11), sat_vstore(y + ldc + 2 * SAT_VL, c12);
                y += 2 * ldc;
                if (mi > 2) sat_vstore(y, c20), sat_vstore(y + SAT_VL, c21), sat_vstore(y + 2 * SAT_VL, c22);
                if (mi > 3) sat_vstore(y + ldc, c30), sat_vstore(y + ldc + SAT_VL, c31), sat_vstore(y + ldc + 2 * SAT_VL, c32);
                continue;
            }
            float out[4][NB];
            sat_vstore(out[0], c00), sat_vstore(out[0] + SAT_VL, c01), sat_vstore(out[0] + 2 * SAT_VL, c02);
            sat_vstore(out[1], c10), sat_vstore(out[1] + SAT_VL, c11), sat_vstore(out[1] + 2 * SAT_VL, c12);
            sat_vstore(out[2], c20), sat_vstore(out[2] + SAT_VL, c21), sat_vstore(out[2] + 2 * SAT_VL, c22);
            sat_vstore(out[3], c30), sat_vstore(out[3] + SAT_VL, c31), sat_vstore(out[3] + 2 * SAT_VL, c32);
            for (int r = 0; r < mi; r++) memcpy(y + (int64_t)r * ldc, out[r], sizeof(float) * (size_t)nj);
        }
    }
}

/* Largest pixel count (and least reduction length) of a conv run as dot products of its transposed
 * columns with each channel's weights (sat_conv_dot): past it the sgemm register tile fills. */
#define SAT_DOT_MAXP 16
#define SAT_DOT_MINK 32

/* Output pixels [p0, p1) of one image (C x H x W) unfolded transposed: xt[(p - p0) K + (c KH + kh) KW + kw]. */
static void sat_im2row(const float *x, float *xt, int C, int H, int W, int KH, int KW, int OW, int sh, int sw,
                       int ph, int pw, int dh, int dw, int p0, int p1) {
    const int K = C * KH * KW;
    for (int p = p0; p < p1; p++) {
        const int oh = p / OW, ow = p % OW;
        float *d = xt + (int64_t)(p - p0) * K;
        for (int c = 0; c < C; c++)
            for (int kh = 0; kh < KH; kh++) {
                const int ih = oh * sh - ph + kh * dh;
                for (int kw = 0; kw < KW; kw++) {
                    const int iw = ow * sw - pw + kw * dw;
                    *d++ = ih >= 0 && ih < H && iw >= 0 && iw < W ? x[((int64_t)c * H + ih) * W + iw] : 0.0f;
                }
            }
    }
}

/* Grouped conv with at most SAT_DOT_MAXP output pixels: per (image, group) its P x K unfolded rows go to
 * `xt` (scratch), then every output channel is P dot products with its weight row (OIHW rows are
 * contiguous K-long), threads splitting channels; the epilogue runs per channel. */
static void sat_conv_dot(const float *x, const float *w, float *y, float *xt, int N, int C, int H, int W, int M,
                         int KH, int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw, int G,
                         sat_epi epi) {
    const int Cg = C / G, Mg = M / G, K = Cg * KH * KW, P = OH * OW;
    for (int n = 0; n < N; n++)
        for (int g = 0; g < G; g++) {
            sat_im2row(x + ((int64_t)n * C + (int64_t)g * Cg) * H * W, xt, Cg, H, W, KH, KW, OW, sh, sw, ph, pw, dh,
                       dw, 0, P);
            const int64_t off = ((int64_t)n * M + (int64_t)g * Mg) * P;
            sat_dot(xt, K, P, w + (int64_t)g * Mg * K, K, Mg, K, y + off, 1, P, 1.0f, epi, y, off);
        }
}

#endif
