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
 * A work unit is (image, block of tiles in raster order, channel chunk): the block's transformed input
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
            sat_vf r0[4], r1[4];
            for (int q = 0; q < 4; q++) {
                r0[q] = m[q] + m[4 + q] + m[8 + q];
                r1[q] = m[4 + q] - m[8 + q] - m[12 + q];
            }
            sat_vf out[4] = {r0[0] + r0[1] + r0[2], r0[1] - r0[2] - r0[3], r1[0] + r1[1] + r1[2],
                             r1[1] - r1[2] - r1[3]};
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

#endif
