/* C backend Winograd convolution F(2x2, 3x3) for 3x3 convs with unit strides and dilations, one group,
 * on builds without the AVX-512 micro-kernel. Each 2x2 output tile is A^T [(G g G^T) . (B^T d B)] A of
 * its 4x4 input window d (stride 2 between tiles): per transform position xi (16 of them) one product
 * Y_xi (tiles x M) = V_xi (tiles x C) U_xi (C x M), so 16 C M multiplies give 4 M outputs where the
 * direct products take 36 C M: 2.25x fewer, for 16/9 the weight bytes (U, packed by the emitter) and
 * the two transforms. The rounding error stays near the direct sum's: every transform coefficient is
 * 0, +-1 or +-1/2.
 *
 * Products run on pgemm.h's 6x16 tile in its transposed orientation: tiles take the tile's rows (panels
 * of SAT_PR tiles), channels its columns (U_xi in SAT_PN-channel panels over the whole reduction, a
 * panel's 16 slices side by side, as emit.wino_weights packs them). The sums of one channel panel are then SAT_PN channels of a tile side by
 * side, so the output transform and the 8-channel epilogue run on whole vectors, as sat_pconv_run's do.
 *
 * A work unit is (image, range of its tiles in raster order, block of the range, channel chunk): the block's transformed input
 * (16 x tiles x C floats) and one channel panel's sums (16 x tiles x SAT_PN), together about half the L2,
 * stay there while each channel panel's 16 products pass them, and the sums go through the output
 * transform straight after. Each weight read from beyond L2 serves the block's tiles, so the block is as
 * large as the L2 allows. */
#ifndef SATURATE_WINO_H
#define SATURATE_WINO_H

/* Floats of one block's transformed input and sums when the core's L2 size is unknown: 192 KB, under half
 * of a Zen 3 core's L2, so the weights streaming past it do not evict it. Where the size is known the block
 * takes half the L2 (sat_wino_block_floats). */
#ifndef SAT_WINO_VFLOATS
#define SAT_WINO_VFLOATS (48 * 1024)
#endif

typedef struct {
    const float *x, *u; /* input N x C x H x W; transformed weights: per SAT_PN-channel panel, 16 slices of C x SAT_PN */
    float *y;
    int C, H, W, M, OH, OW, ph, pw, TW, tiles, tb, blocks, split, chunk;
    sat_epi epi;
} sat_wino_args;

extern float *sat_wino_buf[SAT_MAX_THREADS];
extern size_t sat_wino_cap[SAT_MAX_THREADS];

void sat_wino_in(const sat_wino_args *a, const float *xc, float *v, int64_t vs, int64_t ps, int c, int t0,
                        int nt, float *tmp);

/* A^T m A: the 2 x 2 outputs o00 o01 / o10 o11 of a tile from the 16 sums m[xi] (vectors of any type) of its
 * transform positions xi = 4 i + j. */
#define SAT_WINO_AT_M_A(m, o00, o01, o10, o11)                                                               \
    do {                                                                                                    \
        __typeof__((m)[0]) r0_[4], r1_[4];                                                                  \
        for (int q_ = 0; q_ < 4; q_++) {                                                                    \
            r0_[q_] = (m)[q_] + (m)[4 + q_] + (m)[8 + q_];                                                  \
            r1_[q_] = (m)[4 + q_] - (m)[8 + q_] - (m)[12 + q_];                                             \
        }                                                                                                   \
        o00 = r0_[0] + r0_[1] + r0_[2], o01 = r0_[1] - r0_[2] - r0_[3];                                     \
        o10 = r1_[0] + r1_[1] + r1_[2], o11 = r1_[1] - r1_[2] - r1_[3];                                     \
    } while (0)

/* Sums of one channel panel (16 slices, tiles x SAT_PN each, `as` floats apart) through A^T . A into the
 * output planes of channels [j, j + nr); with `epc` (AVX2 and AVX-512 builds, an epilogue whose every step
 * is per channel) the epilogue runs on 8 channels at a time before they are scattered. */
static inline __attribute__((always_inline)) void sat_wino_out(const sat_wino_args *a, const float *acc, int64_t as,
                                                                float *yn, int64_t plane0, int j, int nr, int t0,
                                                                int nt, sat_epc8 epc) {
    const int OH = a->OH, OW = a->OW, TW = a->TW;
    const int64_t P = (int64_t)OH * OW;
    for (int t = 0; t < nt; t++) {
        const int oh = (t0 + t) / TW * 2, ow = (t0 + t) % TW * 2;
        const int two_rows = oh + 1 < OH, two_cols = ow + 1 < OW;
        for (int h = 0; h < nr; h += SAT_VL) {
            const float *s = acc + (int64_t)t * SAT_PN + h;
            sat_vf m[16];
            for (int xi = 0; xi < 16; xi++) m[xi] = sat_vload(s + xi * as);
            sat_vf out[4];
            SAT_WINO_AT_M_A(m, out[0], out[1], out[2], out[3]);
#if defined(SAT_HAVE_DWT) && SAT_VL == 8
            if (epc) {
                const __m256i mk = sat_mask8(nr - h);
                for (int p = 0; p < 4; p++) out[p] = epc(out[p], plane0 + j + h, mk);
            }
#endif
            float o[4][SAT_VL];
            for (int p = 0; p < 4; p++) sat_vstore(o[p], out[p]);
#if defined(SAT_HAVE_DWT) && SAT_VL > 8
            /* wider vectors take the 8-channel epilogue half by half */
            if (epc)
                for (int p = 0; p < 4; p++) sat_epc8_span(epc, o[p], nr - h, plane0 + j + h, SAT_VL);
#endif
#ifndef SAT_HAVE_DWT
            (void)epc;
            (void)plane0;
#endif
            const int nc = nr - h < SAT_VL ? nr - h : SAT_VL;
            for (int c = 0; c < nc; c++) {
                float *yc = yn + (int64_t)(j + h + c) * P + (int64_t)oh * OW + ow;
                yc[0] = o[0][c];
                if (two_cols) yc[1] = o[1][c];
                if (two_rows) {
                    yc[OW] = o[2][c];
                    if (two_cols) yc[OW + 1] = o[3][c];
                }
            }
        }
    }
}

/* One work unit: (image n, block b, channel chunk s). */
static inline __attribute__((always_inline)) void sat_wino_run(void *ctx, int64_t u, int tid, sat_epc8 epc) {
    const sat_wino_args *a = ctx;
    const int s = (int)(u % a->split), b = (int)(u / a->split % a->blocks), n = (int)(u / a->split / a->blocks);
    const int C = a->C, M = a->M, TW = a->TW;
    const int t0 = b * a->tb, nt = a->tiles - t0 < a->tb ? a->tiles - t0 : a->tb;
    const int panels = (nt + SAT_PR - 1) / SAT_PR, tbp = panels * SAT_PR;
    const int m0 = s * a->chunk, m1 = m0 + a->chunk < M ? m0 + a->chunk : M;
    /* a tile panel is followed by SAT_VL spare floats (sat_wino_in stores whole vectors) */
    const int64_t ps = (int64_t)C * SAT_PR + SAT_VL, vs = panels * ps, as = (int64_t)tbp * SAT_PN;
    const int64_t P = (int64_t)a->OH * a->OW;
    float *buf = sat_thread_buf(&sat_wino_buf[tid], &sat_wino_cap[tid],
                                (size_t)(16 * vs + 16 * as + 16 * (TW + SAT_VL) + 16 * (TW + 1)));
    if (!buf) abort();
    float *v = buf, *acc = v + 16 * vs, *tmp = acc + 16 * as;
    const float *xn = a->x + (int64_t)n * C * a->H * a->W;
    /* V's lines fetched in address order before the transform writes them: it writes each channel's 6
     * floats into every panel of all 16 slices, hundreds of lines 1.5 KB apart at once, which no hardware
     * prefetcher follows, so a V evicted since the last call (by the model's other steps) was fetched a line
     * at a time. ResNet-50's 3x3 convs of 64 channels on 24x24 maps in the model, avx2 build, 1 thread:
     * 0.49-0.91 -> 0.40-0.43 ms (ORT 0.41-0.42); alone with the cache flushed 0.91 -> 0.46, warm level. */
    for (const char *p = (const char *)v, *e = (const char *)(v + 16 * vs); p < e; p += 64) __builtin_prefetch(p, 1, 2);
    for (int c = 0; c < C; c++) sat_wino_in(a, xn + (int64_t)c * a->H * a->W, v, vs, ps, c, t0, nt, tmp);
    float *yn = a->y + (int64_t)n * M * P;
    for (int j = m0; j < m1; j += SAT_PN) {
        const int nr = m1 - j < SAT_PN ? m1 - j : SAT_PN;
        for (int xi = 0; xi < 16; xi++) {
            const float *uj = a->u + ((int64_t)j * 16 + xi * SAT_PN) * C;
            for (int k0 = 0; k0 < C; k0 += SAT_PKC) {
                const int kc = C - k0 < SAT_PKC ? C - k0 : SAT_PKC;
                for (int q = 0; q < panels; q++)
                    sat_ukr(kc, v + xi * vs + q * ps + (int64_t)k0 * SAT_PR, uj + (int64_t)k0 * SAT_PN,
                            acc + xi * as + q * SAT_PR * SAT_PN, SAT_PN, SAT_PR, SAT_PN, k0 > 0, 1);
            }
        }
        sat_wino_out(a, acc, as, yn, (int64_t)n * M, j, nr, t0, nt, epc);
        if (a->epi && !epc) {
            /* the plane epilogue on the block's runs of each output row */
            const int th0 = t0 / TW, th1 = (t0 + nt - 1) / TW;
            for (int m = j; m < j + nr; m++)
                for (int th = th0; th <= th1; th++) {
                    const int ow0 = 2 * (th == th0 ? t0 % TW : 0);
                    const int ow1 = th == th1 ? 2 * ((t0 + nt - 1) % TW + 1) : a->OW;
                    const int len = (ow1 < a->OW ? ow1 : a->OW) - ow0;
                    for (int oh = 2 * th; oh < 2 * th + 2 && oh < a->OH; oh++)
                        a->epi(a->y, (yn - a->y) + m * P + (int64_t)oh * a->OW + ow0, len);
                }
        }
    }
}

void sat_wino_unit(void *ctx, int64_t u, int tid);

int64_t sat_wino_block_floats(void);

void sat_conv_wino(const float *x, const float *u, float *y, int N, int C, int H, int W, int M, int OH,
                          int OW, int ph, int pw, sat_epi epi, sat_body body);

#if defined(SAT_HAVE_PACKED_GEMM) || (defined(SAT_HAVE_DWT) && SAT_VL == 8)
/* Winograd F(2x2, 3x3) on the builds' products tiles (sat_conv_wino16): the transforms above, each vectorized
 * across a vector of tiles of a tile row (16 on AVX-512, 8 on AVX2), and the 16 products Y_xi (M x tiles) =
 * U_xi (M x C) V_xi (C x tiles) with channels on the tile's rows (U_xi packed as its A, emit.wino16_weights)
 * and tiles on its columns (V_xi in panels of SAT_WZ_NR tiles, each C x SAT_WZ_NR k-major as the tile's B reads
 * them): gemm.h's 8 x 32 tile on AVX-512, pgemm.h's 6 x 16 on AVX2. The sums of a channel are then runs of
 * tiles, which the output transform turns into whole runs of output rows, the epilogue's row form applied as
 * they are stored. A work unit is (image, range of its tiles in raster order, block of the range, channel
 * chunk): the block's V (16 slices of panels x C x SAT_WZ_NR) and the sums of SAT_WZ_MPASS channels at a time
 * (16 x channels x tiles) share a quarter of the L2 (sat_conv_wino16); each B panel stays in L1 while the
 * pass's channels go by it, each U_xi block in L1 across the block's panels. The first form (6 x 16 tiles,
 * scalar transforms and stores) ran ResNet-50's 3x3 convs of 64 channels on 56x56 maps at 1.25x the AVX-512
 * direct conv's time. */
#define SAT_HAVE_WINO16 1
#if defined(SAT_HAVE_PACKED_GEMM)
#define SAT_WZ_MR SAT_MR /* channels: the tile's rows */
#define SAT_WZ_NR SAT_NR /* tiles: its columns */
#define SAT_WZ_KC SAT_KC
#define SAT_WZ_VL 16
typedef __m512 sat_wz_v;
typedef __mmask16 sat_wz_m;
typedef sat_epr sat_wz_epr;
/* slice xi's rows [i, i + SAT_WZ_MR) over reduction block k0 (kc deep): gemm.h's blocks of 8-row panels */
#define SAT_WZ_A(ux, Mp, C, i, k0, kc) ((ux) + (int64_t)(k0) * (Mp) + (int64_t)(i) * (kc))
#define SAT_WZ_KERNEL(kc, a, b, y, ldy, acc, mr) sat_kernel_8x32(kc, a, b, y, ldy, acc, mr, SAT_NR)
/* the kernel fetching the kc x 8 floats at pf into L2 meanwhile */
#define SAT_WZ_KERNEL_PF(kc, a, b, y, ldy, acc, mr, pf) sat_kernel_8x32_pf(kc, a, b, y, ldy, acc, mr, SAT_NR, pf)
static inline sat_wz_m sat_wz_lanes(int lo, int hi) {
    hi = hi < 16 ? hi : 16;
    lo = lo > 0 ? lo : 0;
    return hi <= lo ? 0 : (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
}
static inline int sat_wz_any(sat_wz_m m) { return m != 0; }
static inline sat_wz_m sat_wz_andnot(sat_wz_m a, sat_wz_m b) { return (sat_wz_m)(b & ~a); }
static inline sat_wz_v sat_wz_load(sat_wz_m m, const float *p) { return _mm512_maskz_loadu_ps(m, p); }
static inline sat_wz_v sat_wz_loadu(const float *p) { return _mm512_loadu_ps(p); }
static inline void sat_wz_store(float *p, sat_wz_m m, sat_wz_v v) { _mm512_mask_storeu_ps(p, m, v); }
static inline sat_wz_v sat_wz_zero(void) { return _mm512_setzero_ps(); }
/* lanes 0, 2, 4, ... (odd: 1, 3, ...) of the 32 floats a, b */
static inline sat_wz_v sat_wz_even(sat_wz_v a, sat_wz_v b) {
    return _mm512_permutex2var_ps(a, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), b);
}
static inline sat_wz_v sat_wz_odd(sat_wz_v a, sat_wz_v b) {
    return _mm512_permutex2var_ps(a, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), b);
}
/* a0 b0 a1 b1 ... (lanes 0 .. 7 of each), and the same of lanes 8 .. 15 */
static inline sat_wz_v sat_wz_zip_lo(sat_wz_v a, sat_wz_v b) {
    return _mm512_permutex2var_ps(a, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), b);
}
static inline sat_wz_v sat_wz_zip_hi(sat_wz_v a, sat_wz_v b) {
    return _mm512_permutex2var_ps(a, _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31), b);
}
#else
#define SAT_WZ_MR SAT_PR
#define SAT_WZ_NR SAT_PN
#define SAT_WZ_KC SAT_PKC
#define SAT_WZ_VL 8
typedef __m256 sat_wz_v;
typedef __m256i sat_wz_m;
typedef sat_epr8 sat_wz_epr;
/* slice xi's rows [i, i + SAT_PR) over reduction block k0: pgemm.h's 6-row panels over the whole reduction */
#define SAT_WZ_A(ux, Mp, C, i, k0, kc) ((ux) + (int64_t)(i) * (C) + (int64_t)(k0) * SAT_PR)
#define SAT_WZ_KERNEL(kc, a, b, y, ldy, acc, mr) sat_ukr_epr(kc, a, b, y, ldy, acc, mr, SAT_PN, NULL, 0, 0)
static inline void sat_wz_kernel_pf(int kc, const float *a, const float *b, float *y, int64_t ldy, int acc, int mr,
                                    const float *pf) {
    for (int l = 0; l < kc * SAT_PR; l += 16) _mm_prefetch((const char *)(pf + l), _MM_HINT_T1);
    SAT_WZ_KERNEL(kc, a, b, y, ldy, acc, mr);
}
#define SAT_WZ_KERNEL_PF sat_wz_kernel_pf
static inline sat_wz_m sat_wz_lanes(int lo, int hi) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(lo), idx), _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), idx));
}
static inline int sat_wz_any(sat_wz_m m) { return !_mm256_testz_si256(m, m); }
static inline sat_wz_m sat_wz_andnot(sat_wz_m a, sat_wz_m b) { return _mm256_andnot_si256(a, b); }
static inline sat_wz_v sat_wz_load(sat_wz_m m, const float *p) { return _mm256_maskload_ps(p, m); }
static inline sat_wz_v sat_wz_loadu(const float *p) { return _mm256_loadu_ps(p); }
static inline void sat_wz_store(float *p, sat_wz_m m, sat_wz_v v) { _mm256_maskstore_ps(p, m, v); }
static inline sat_wz_v sat_wz_zero(void) { return _mm256_setzero_ps(); }
static inline sat_wz_v sat_wz_even(sat_wz_v a, sat_wz_v b) {
    const __m256 e = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
}
static inline sat_wz_v sat_wz_odd(sat_wz_v a, sat_wz_v b) {
    const __m256 o = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
}
static inline sat_wz_v sat_wz_zip_lo(sat_wz_v a, sat_wz_v b) {
    return _mm256_permute2f128_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b), 0x20);
}
static inline sat_wz_v sat_wz_zip_hi(sat_wz_v a, sat_wz_v b) {
    return _mm256_permute2f128_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b), 0x31);
}
#endif
/* channels of one product pass: a whole number of the tile's rows */
#define SAT_WZ_MPASS (8 * SAT_WZ_MR)

typedef struct {
    const float *x, *u; /* input N x C x H x W; weights: 16 slices (xi) of Mp x C in the tile's packed A order */
    float *y;
    int C, H, W, M, Mp, OH, OW, ph, pw, TW, tiles, ranges, blocks, split, chunk;
    sat_epi epi; /* where the unit has no row form of the epilogue: on each stored run */
} sat_wino16_args;

void sat_wino16_in(const sat_wino16_args *a, const float *xc, float *v, int64_t slice, int c, int t0, int nt);

/* One work unit: (image n, range r, block b of the range, channel chunk s). */
static inline __attribute__((always_inline)) void sat_wino16_run(void *ctx, int64_t u, int tid, sat_wz_epr epr) {
    const sat_wino16_args *a = ctx;
    const int s = (int)(u % a->split), b = (int)(u / a->split % a->blocks), r = (int)(u / a->split / a->blocks % a->ranges);
    const int n = (int)(u / a->split / a->blocks / a->ranges);
    const int C = a->C, M = a->M, TW = a->TW, OH = a->OH, OW = a->OW, NR = SAT_WZ_NR, VL = SAT_WZ_VL;
    /* block b of range r: whole panels, a short one last */
    const int r0 = (int)((int64_t)a->tiles * r / a->ranges), r1 = (int)((int64_t)a->tiles * (r + 1) / a->ranges);
    const int tb = ((r1 - r0 + a->blocks - 1) / a->blocks + NR - 1) / NR * NR, t0 = r0 + b * tb;
    if (t0 >= r1) return;
    const int nt = r1 - t0 < tb ? r1 - t0 : tb, NP = (nt + NR - 1) / NR;
    /* (slices and their sums one line pair further apart than their sizes: at sizes of a multiple of 4 KB the
     * transforms' 16 streams all fell in one set of L1) */
    const int64_t tbp = (int64_t)NP * NR, slice = tbp * C + 32, as = SAT_WZ_MPASS * tbp + 32;
    const int m0 = s * a->chunk, m1 = m0 + a->chunk < M ? m0 + a->chunk : M;
    /* (the output transform's loads of a last run reach up to VL - 1 floats past the sums) */
    float *buf = sat_thread_buf(&sat_wino_buf[tid], &sat_wino_cap[tid], (size_t)(16 * slice + 16 * as + VL));
    if (!buf) abort();
    float *v = buf, *acc = v + 16 * slice;
    /* tiles past the block in its last panel: zeros, not stale floats (denormals would slow the products) */
    if (nt % NR)
        for (int xi = 0; xi < 16; xi++) memset(v + xi * slice + (int64_t)(NP - 1) * C * NR, 0, sizeof(float) * C * NR);
    const float *xn = a->x + (int64_t)n * C * a->H * a->W;
    for (int c = 0; c < C; c++) sat_wino16_in(a, xn + (int64_t)c * a->H * a->W, v, slice, c, t0, nt);
    const int64_t P = (int64_t)OH * OW, ua = (int64_t)a->Mp * C;
    for (int mp = m0; mp < m1; mp += SAT_WZ_MPASS) {
        const int mq = m1 - mp < SAT_WZ_MPASS ? m1 - mp : SAT_WZ_MPASS;
        for (int xi = 0; xi < 16; xi++) {
            const float *ux = a->u + xi * ua;
            for (int k0 = 0; k0 < C; k0 += SAT_WZ_KC) {
                const int kc = C - k0 < SAT_WZ_KC ? C - k0 : SAT_WZ_KC;
                for (int p = 0; p < NP; p++) {
                    const float *bp = v + xi * slice + ((int64_t)p * C + k0) * NR;
                    for (int i = mp; i < mp + mq; i += SAT_WZ_MR) {
                        const float *w = SAT_WZ_A(ux, a->Mp, C, i, k0, kc);
                        float *cp = acc + xi * as + (int64_t)(i - mp) * tbp + p * NR;
                        const int mr = mp + mq - i < SAT_WZ_MR ? mp + mq - i : SAT_WZ_MR;
                        /* the first tile panel fetches the next slice's weights into L2 as it goes */
                        if (p == 0 && xi < 15)
                            SAT_WZ_KERNEL_PF(kc, w, bp, cp, tbp, k0 > 0, mr, w + ua);
                        else
                            SAT_WZ_KERNEL(kc, w, bp, cp, tbp, k0 > 0, mr);
                    }
                }
            }
        }
        /* A^T m A for a vector of tiles of a row at a time; their 2 x 2 outputs interleaved into two runs of
         * output pixels per row */
        const int th0 = t0 / TW, th1 = (t0 + nt - 1) / TW;
        for (int m = 0; m < mq; m++) {
            const int64_t q = (int64_t)n * M + mp + m;
            const float *am = acc + (int64_t)m * tbp;
            for (int th = th0; th <= th1; th++)
                for (int tw0 = th == th0 ? t0 % TW : 0, tw1 = th == th1 ? (t0 + nt - 1) % TW + 1 : TW; tw0 < tw1; tw0 += VL) {
                    const float *sm = am + (int64_t)th * TW + tw0 - t0;
                    sat_wz_v mx[16];
                    for (int xi = 0; xi < 16; xi++) mx[xi] = sat_wz_loadu(sm + xi * as);
                    sat_wz_v o[2][2];
                    SAT_WINO_AT_M_A(mx, o[0][0], o[0][1], o[1][0], o[1][1]);
                    const int run = 2 * (tw1 - tw0 < VL ? tw1 - tw0 : VL), nv = OW - 2 * tw0 < run ? OW - 2 * tw0 : run;
                    const sat_wz_m k0 = sat_wz_lanes(0, nv), k1 = sat_wz_lanes(0, nv - VL);
                    const int second = nv > VL;
                    for (int h = 0; h < 2 && 2 * th + h < OH; h++) {
                        const int64_t off = q * P + (int64_t)(2 * th + h) * OW + 2 * tw0;
                        sat_wz_v y0 = sat_wz_zip_lo(o[h][0], o[h][1]), y1 = sat_wz_zip_hi(o[h][0], o[h][1]);
                        if (epr) {
                            y0 = epr(y0, q, off, k0);
                            if (second) y1 = epr(y1, q, off + VL, k1);
                        }
                        sat_wz_store(a->y + off, k0, y0);
                        if (second) sat_wz_store(a->y + off + VL, k1, y1);
                        if (!epr && a->epi) a->epi(a->y, off, nv);
                    }
                }
        }
    }
}

void sat_wino16_unit(void *ctx, int64_t u, int tid);

void sat_conv_wino16(const float *x, const float *u, float *y, int N, int C, int H, int W, int M, int OH, int OW,
                     int ph, int pw, sat_epi epi, sat_body body);
#endif

#endif
