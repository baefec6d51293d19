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

float *sat_thread_buf(float **buf, size_t *cap, size_t floats);

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

extern float *sat_dw_buf[SAT_MAX_THREADS];
extern size_t sat_dw_cap[SAT_MAX_THREADS];

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

void sat_dw_channel(void *ctx, int64_t nc, int tid);

/* Small planes (at most SAT_DWC_MAXP outputs, one output per input channel): rows of 3 or 6 outputs would
 * fill few lanes and each channel's fixed costs would dominate, so lanes run across SAT_VL channels instead.
 * A group's padded planes are interleaved channel-minor (pixel (r, c) of lane l at (r Wp + c) SAT_VL + l), its
 * weights likewise per tap; each output pixel is then T full-vector FMAs at offsets fixed per tap, four
 * pixels at a time, and the results go back to the channels' planes, epilogue per plane. */
#define SAT_DWC_MAXP 64

extern float *sat_dwc_buf[SAT_MAX_THREADS];
extern size_t sat_dwc_cap[SAT_MAX_THREADS];

void sat_dwc_group(void *ctx, int64_t item, int tid);

void sat_conv_depthwise(const float *x, const float *w, float *y, int N, int C, int H, int W, int M,
                               int KH, int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw,
                               sat_epi epi);

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

/* exp on 8 lanes of x within [-87.3, 88.3] (sat_exp8 clamps to it; a caller that masks the lanes below and has
 * none above may call this alone): sat_expf's reduction and polynomial, the polynomial evaluated in pairs of
 * terms (Estrin) rather than in one chain of six, and 2^n read off the rounding sum's low bits. Its chain of
 * dependent instructions is about 40 cycles instead of 50: in a loop of exps (a softmax row) the out-of-order
 * window holds only a few iterations, so the chain, not the instruction count, set the pace (softmax rows of
 * 512 on a Zen 4: 0.52 -> 0.47 ns per element, 0.38 with the clamp left out and two vectors a step). */
static inline __m256 sat_exp8_in(__m256 x) {
    const __m256 big = _mm256_set1_ps(12582912.0f);
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), big);
    const __m256 n = _mm256_sub_ps(t, big);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    const __m256 r2 = _mm256_mul_ps(r, r);
    const __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(1.6666665459e-1f), r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 b = _mm256_fmadd_ps(_mm256_set1_ps(8.3334519073e-3f), r, _mm256_set1_ps(4.1665795894e-2f));
    const __m256 c = _mm256_fmadd_ps(_mm256_set1_ps(1.9875691500e-4f), r, _mm256_set1_ps(1.3981999507e-3f));
    const __m256 p = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_fmadd_ps(c, r2, b), r2, a), r2,
                                     _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* t is 1.5 * 2^23 + n, so its low bits hold n: 2^n's bits are (n + 127) << 23 */
    const __m256i e = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B400000 - 127));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
}

/* sat_expf (tensor.h) on 8 lanes, the same clamp: the Swish (x sigmoid x) of a depthwise conv's fused
 * epilogue in the 8-channel kernel. */
static inline __m256 sat_exp8(__m256 x) {
    return sat_exp8_in(_mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f)));
}

#if defined(__AVX512F__)
/* sat_rcp8 and sat_exp8 on 16 lanes, for the per-channel epilogues of AVX-512 kernels (dconv.h), which run
 * before the tile is transposed: a Swish there costs half what it does on 8-lane runs of the output. */
static inline __m512 sat_rcp16(__m512 d) {
    const __m512 r = _mm512_rcp14_ps(d);
    return _mm512_mul_ps(r, _mm512_sub_ps(_mm512_set1_ps(2.0f), _mm512_mul_ps(d, r)));
}

/* expf on 16 lanes (Cephes polynomial after n = round(x log2 e), 2^n applied by scalef): within 2 ulp,
 * subnormal from -87.3 down and 0 below -103, clamped to FLT_MAX's range above; libm's expf does not
 * vectorize without -ffast-math. The polynomial is evaluated in pairs of terms (Estrin), as sat_exp8_in
 * does, for a shorter dependent chain. A caller whose lanes may fall below -87.3 masks them (softmax does,
 * see sat_softmax_floor): on Intel cores a subnormal result costs a microcode assist. */
static inline __m512 sat_exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.72f)), _mm512_set1_ps(-103.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    const __m512 r2 = _mm512_mul_ps(r, r);
    const __m512 a = _mm512_fmadd_ps(_mm512_set1_ps(1.6666665459e-1f), r, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 b = _mm512_fmadd_ps(_mm512_set1_ps(8.3334519073e-3f), r, _mm512_set1_ps(4.1665795894e-2f));
    const __m512 c = _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500e-4f), r, _mm512_set1_ps(1.3981999507e-3f));
    const __m512 p = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_fmadd_ps(c, r2, b), r2, a), r2,
                                     _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* sat_exp8's clamp on 16 lanes: no lane below -87.3, so no subnormal result (a microcode assist on Intel). */
static inline __m512 sat_exp16(__m512 x) { return sat_exp512(_mm512_max_ps(x, _mm512_set1_ps(-87.3f))); }
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

extern float *sat_dwt_buf[SAT_MAX_THREADS];
extern size_t sat_dwt_cap[SAT_MAX_THREADS];

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

void sat_dwt_item(void *ctx, int64_t item, int tid);

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

void sat_dwz_item(void *ctx, int64_t item, int tid);
#endif

#ifdef SAT_HAVE_DWT
#define SAT_DWT_STRIP 24576
void sat_conv_dwt(const float *x, const float *w, float *y, int N, int C, int H, int W, int KH, int KW,
                         int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw, sat_epi epi, sat_body item,
                         int lanes);
#endif

void sat_conv_dw_lanes(const float *x, const float *w, float *y, int N, int C, int H, int W, int M, int KH,
                              int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw, sat_epi epi,
                              sat_body item, sat_body wide);

void sat_dot_rows(const float *A, int64_t lda, int na, const float *B, int64_t ldb, int j0, int j1, int K,
                         float *C, int64_t ci, int64_t cj, float alpha);

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

void sat_dot_item(void *ctx, int64_t item, int tid);

void sat_dot(const float *A, int64_t lda, int na, const float *B, int64_t ldb, int nb, int K, float *C,
                    int64_t ci, int64_t cj, float alpha, sat_epi epi, float *epi_base, int64_t epi_off);

/* Y (M x N) = alpha * A (M x K) * B (K x N) for M <= SAT_SKINNY: runs of 2 SAT_VL columns of B, read once,
 * every row of A at once. */
#define SAT_SKINNY 4

typedef struct {
    const float *A, *B;
    float *Y;
    int M, N, K, lda, ldb, per;
    float alpha;
} sat_skinny_args;

void sat_skinny_item(void *ctx, int64_t item, int tid);

void sat_skinny_nn(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                          float *Y);

/* C (M x N, pitch ldc) = (acc ? C : 0) + A (M x K, pitch lda) * B (K x N, pitch ldb), for convs' short
 * reductions (a 1x1 conv widening 16 channels to 96, a first layer's 27): there a general sgemm spends more
 * time packing than multiplying. Register tile of 4 rows by 3 vectors of columns: per k, three loads of B's
 * row and four broadcasts of A feed twelve FMAs. Column panels go outermost, so a panel of B (K x 3 SAT_VL)
 * stays in cache while every row of A passes it (with acc, row groups: see sat_gemm_nn). */
#define SAT_SHORT_K 64

extern float *sat_tail_buf[SAT_MAX_THREADS];
extern size_t sat_tail_cap[SAT_MAX_THREADS];

void sat_gemm_nn(int M, int N, int K, const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                        int64_t ldc, int acc);

/* Largest pixel count (and least reduction length) of a conv run as dot products of its transposed
 * columns with each channel's weights (sat_conv_dot): past it the sgemm register tile fills. */
#define SAT_DOT_MAXP 16
#define SAT_DOT_MINK 32

void sat_im2row(const float *x, float *xt, int C, int H, int W, int KH, int KW, int OW, int sh, int sw,
                       int ph, int pw, int dh, int dw, int p0, int p1);

void sat_conv_dot(const float *x, const float *w, float *y, float *xt, int N, int C, int H, int W, int M,
                         int KH, int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw, int G,
                         sat_epi epi);

#endif
