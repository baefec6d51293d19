/* C backend Winograd convolution F(2x2, 3x3) for 3x3 convs with unit strides and dilations, one group,
 * on builds without the AVX-512 micro-kernel. Each 2x2 output tile is A^T [(G g G^T) . (B^T d B)] A of
 * its 4x4 input window d (stride 2 between tiles): per transform position xi (16 of them) one product
 * Y_xi (tiles x M) = V_xi (tiles x C) U_xi (C x M), so 16 C M multiplies give 4 M outputs where the
 * direct products take 36 C M: 2.25x fewer, for 16/9 the weight bytes (U, packed by the emitter) and
 * the two transforms. The rounding error stays near the direct sum's: every transform coefficient is
 * 0, +-1 or +-1/2.
 *
 * Products run on pgemm.h's 6x16 tile in its transposed orientation: tiles take the tile's rows (panels
 * of SAT_PR tiles), channels its columns (U_xi in SAT_PN-channel panels over the whole reduction, as
 * emit.wino_weights packs them). The sums of one channel panel are then SAT_PN channels of a tile side by
 * side, so the output transform and the 8-channel epilogue run on whole vectors, as sat_pconv_run's do.
 *
 * A work unit is (image, block of tiles in raster order, channel chunk): the block's transformed input
 * (16 x tiles x C floats, about SAT_WINO_VFLOATS) stays in L2 while each channel panel's 16 products pass
 * it, and the panel's sums (16 x tiles x SAT_PN) go through the output transform straight after. */
#ifndef SATURATE_WINO_H
#define SATURATE_WINO_H

/* Floats of one block's transformed input: 192 KB, under half of a Zen 3 core's L2, so the weights
 * streaming past it do not evict it. */
#ifndef SAT_WINO_VFLOATS
#define SAT_WINO_VFLOATS (48 * 1024)
#endif

typedef struct {
    const float *x, *u; /* input N x C x H x W; transformed weights, 16 slices of Mp x C in SAT_PN panels */
    float *y;
    int C, H, W, M, Mp, OH, OW, ph, pw, TW, tiles, tb, blocks, split, chunk;
    sat_epi epi;
} sat_wino_args;

static float *sat_wino_buf[SAT_MAX_THREADS];
static size_t sat_wino_cap[SAT_MAX_THREADS];

/* Tiles [t0, t0 + nt) of one image, channel c, into the 16 slices of v (`vs` floats apart): element
 * (c, t) of tile panel q at [q ps + c SAT_PR + t % SAT_PR], ps = C SAT_PR + SAT_VL. Per tile row the 4
 * input rows are combined first (B^T d, whole rows at once), then split into even and odd columns, so the
 * column step (d B) of every tile reads contiguous runs the compiler vectorizes. Channels go in
 * increasing order (the vector stores below rely on it). */
static void sat_wino_in(const sat_wino_args *a, const float *xc, float *v, int64_t vs, int64_t ps, int c, int t0,
                        int nt, float *tmp) {
    const int TW = a->TW, H = a->H, W = a->W;
    float *d = tmp, *e = d + 4 * (2 * TW + 2), *o = e + 4 * (TW + 1), *out = o + 4 * (TW + 1);
    const int th0 = t0 / TW, th1 = (t0 + nt - 1) / TW;
    for (int th = th0; th <= th1; th++) {
        const int tw0 = th == th0 ? t0 % TW : 0, tw1 = th == th1 ? (t0 + nt - 1) % TW + 1 : TW, len = tw1 - tw0;
        const int n = 2 * len + 2, iw0 = 2 * tw0 - a->pw;
        int lo, hi;
        sat_valid_cols(iw0, W, n, &lo, &hi);
        for (int r = 0; r < 4; r++) {
            const int ih = 2 * th - a->ph + r;
            float *dr = d + r * n;
            if (ih < 0 || ih >= H) {
                memset(dr, 0, sizeof(float) * (size_t)n);
                continue;
            }
            memset(dr, 0, sizeof(float) * (size_t)lo);
            memcpy(dr + lo, xc + (int64_t)ih * W + iw0 + lo, sizeof(float) * (size_t)(hi - lo));
            memset(dr + hi, 0, sizeof(float) * (size_t)(n - hi));
        }
        const float *d0 = d, *d1 = d + n, *d2 = d + 2 * n, *d3 = d + 3 * n;
        float *e0 = e, *e1 = e + (TW + 1), *e2 = e + 2 * (TW + 1), *e3 = e + 3 * (TW + 1);
        float *o0 = o, *o1 = o + (TW + 1), *o2 = o + 2 * (TW + 1), *o3 = o + 3 * (TW + 1);
        for (int s = 0; s <= len; s++) {
            e0[s] = d0[2 * s] - d2[2 * s], e1[s] = d1[2 * s] + d2[2 * s];
            e2[s] = d2[2 * s] - d1[2 * s], e3[s] = d1[2 * s] - d3[2 * s];
            o0[s] = d0[2 * s + 1] - d2[2 * s + 1], o1[s] = d1[2 * s + 1] + d2[2 * s + 1];
            o2[s] = d2[2 * s + 1] - d1[2 * s + 1], o3[s] = d1[2 * s + 1] - d3[2 * s + 1];
        }
        for (int i = 0; i < 4; i++) {
            const float *ei = e + i * (TW + 1), *oi = o + i * (TW + 1);
            float *r0 = out + (4 * i) * (TW + SAT_VL), *r1 = r0 + TW + SAT_VL, *r2 = r1 + TW + SAT_VL,
                  *r3 = r2 + TW + SAT_VL;
            for (int s = 0; s < len; s++) {
                r0[s] = ei[s] - ei[s + 1];
                r1[s] = oi[s] + ei[s + 1];
                r2[s] = ei[s + 1] - oi[s];
                r3[s] = oi[s] - oi[s + 1];
            }
        }
        /* each run of the row's tiles inside one panel goes to all 16 slices as one vector of SAT_VL
         * floats: the lanes past the run land on positions a later run or channel writes again (or on
         * the panel's SAT_VL spare floats), zeros past the row's end (the slack cleared here) on the
         * last panel's padding tiles, whose sums are never read */
        for (int xi = 0; xi < 16; xi++) memset(out + xi * (TW + SAT_VL) + len, 0, sizeof(float) * SAT_VL);
        const int base = th * TW + tw0 - t0; /* block index of the row's first tile */
        for (int s = 0; s < len;) {
            const int t = base + s, r = t % SAT_PR, run = SAT_PR - r < len - s ? SAT_PR - r : len - s;
            float *dst = v + (int64_t)(t / SAT_PR) * ps + (int64_t)c * SAT_PR + r;
            for (int xi = 0; xi < 16; xi++) sat_vstore(dst + xi * vs, sat_vload(out + xi * (TW + SAT_VL) + s));
            s += run;
        }
    }
}

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
    for (int c = 0; c < C; c++) sat_wino_in(a, xn + (int64_t)c * a->H * a->W, v, vs, ps, c, t0, nt, tmp);
    float *yn = a->y + (int64_t)n * M * P;
    for (int j = m0; j < m1; j += SAT_PN) {
        const int nr = m1 - j < SAT_PN ? m1 - j : SAT_PN;
        for (int xi = 0; xi < 16; xi++) {
            const float *uj = a->u + (int64_t)xi * a->Mp * C + (int64_t)j * C;
            for (int k0 = 0; k0 < C; k0 += SAT_PKC) {
                const int kc = C - k0 < SAT_PKC ? C - k0 : SAT_PKC;
                for (int q = 0; q < panels; q++)
                    sat_ukr(kc, v + xi * vs + q * ps + (int64_t)k0 * SAT_PR, uj + (int64_t)k0 * SAT_PN,
                            acc + xi * as + q * SAT_PR * SAT_PN, SAT_PN, SAT_PR, SAT_PN, k0 > 0);
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

static void sat_wino_unit(void *ctx, int64_t u, int tid) { sat_wino_run(ctx, u, tid, NULL); }

/* 3x3 convolution, unit strides and dilations, one group, begin pads ph, pw (any end pads: OH, OW say
 * where the output ends), on weights transformed and packed by the emitter (emit.wino_weights: 16 slices
 * of Mp x C, Mp = M rounded up to SAT_PN). `body` is the emitter's instantiation of sat_wino_run with
 * its 8-channel epilogue, or NULL (then `epi` runs on the output rows). Blocks hold about
 * SAT_WINO_VFLOATS floats of transformed input, evened out over an image's tiles; when the units are too
 * few to share evenly, each is split by channel chunks (each chunk transforms its block's input again,
 * a small cost beside its products). */
static void sat_conv_wino(const float *x, const float *u, float *y, int N, int C, int H, int W, int M, int OH,
                          int OW, int ph, int pw, sat_epi epi, sat_body body) {
    if ((int64_t)OH * OW <= 0 || M <= 0) return;
    const int TH = (OH + 1) / 2, TW = (OW + 1) / 2, tiles = TH * TW;
    int tb = SAT_WINO_VFLOATS / (16 * C) / SAT_PR * SAT_PR;
    if (tb < SAT_PR) tb = SAT_PR;
    int blocks = (tiles + tb - 1) / tb;
    /* as many blocks as a multiple of the threads where that leaves blocks of at least 2 panels: smaller
     * blocks cost less than channel chunks, each of which transforms its block's input again */
    const int even = (blocks + sat_threads - 1) / sat_threads * sat_threads;
    if (sat_threads > 1 && !sat_in_parallel && N % sat_threads != 0 && tiles / even >= 2 * SAT_PR) blocks = even;
    tb = (tiles + blocks - 1) / blocks;
    blocks = (tiles + tb - 1) / tb;
    const int64_t units = (int64_t)N * blocks;
    int split = sat_threads > 1 && units % sat_threads != 0 && units < 8 * sat_threads ? sat_threads : 1;
    int chunk = ((M + split - 1) / split + SAT_PN - 1) / SAT_PN * SAT_PN;
    split = (M + chunk - 1) / chunk;
    const int Mp = (M + SAT_PN - 1) / SAT_PN * SAT_PN;
    sat_wino_args a = {x, u, y, C, H, W, M, Mp, OH, OW, ph, pw, TW, tiles, tb, blocks, split, chunk, epi};
    sat_parallel(units * split, body ? body : sat_wino_unit, &a);
}

#endif
