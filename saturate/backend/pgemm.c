/* The kernel library's half of pgemm.h: compiled once per instruction set (build.py), linked into every model. */
#include "kernels.h"

float *sat_pk_buf[SAT_MAX_THREADS];

size_t sat_pk_cap[SAT_MAX_THREADS];

/* Row r = (c, kh, kw) of the column matrix of output rows [oh0, oh1) (image plane x of C x H x W) into
 * d[0 .. (oh1-oh0) OW), pads read as zero. */
void sat_im2col_row(const float *x, float *d, int r, int H, int W, int KH, int KW, int oh0, int oh1, int OW,
                           int sh, int sw, int ph, int pw, int dh, int dw) {
    const int c = r / (KH * KW), kh = (r / KW) % KH, kw = r % KW;
    const float *src = x + (int64_t)c * H * W;
    const int iw0 = kw * dw - pw;
    int lo, hi;
    sat_valid_cols_s(iw0, sw, W, OW, &lo, &hi);
    for (int oh = oh0; oh < oh1; oh++, d += OW) {
        const int ih = oh * sh - ph + kh * dh;
        if (ih < 0 || ih >= H) {
            memset(d, 0, sizeof(float) * (size_t)OW);
            continue;
        }
        const float *s = src + (int64_t)ih * W + iw0;
        for (int ow = 0; ow < lo; ow++) d[ow] = 0.0f;
        if (sw == 1) {
            if (hi > lo) memcpy(d + lo, s + lo, sizeof(float) * (size_t)(hi - lo));
        } else {
            for (int ow = lo; ow < hi; ow++) d[ow] = s[ow * sw];
        }
        for (int ow = hi; ow < OW; ow++) d[ow] = 0.0f;
    }
}

void sat_pconv_unit(void *ctx, int64_t u, int tid) { sat_pconv_run(ctx, u, tid, NULL); }

/* Grouped 2-D convolution on weights packed by the emitter (`wp_group` floats per group). Work units are
 * (image, group, row tile); when they are too few to share evenly, each is split by channel chunks whose
 * starts are panel starts, so every thread gets as much work as the others. `body` is the emitter's
 * instantiation of sat_pconv_run with its 8-channel epilogue, or NULL. */
void sat_conv_packed(const float *x, const float *wp, int64_t wp_group, float *y, int N, int C, int H, int W,
                            int M, int KH, int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw,
                            int G, int trans, int acc, sat_epi epi, sat_body body) {
    const int Cg = C / G, Mg = M / G, K = Cg * KH * KW;
    if ((int64_t)OH * OW <= 0 || Mg <= 0) return;
    /* tiles of equal rows (12 rows in tiles of 8 gave one thread 8 and the other 4) */
    const int rows = sat_tile_rows(K, OH, OW), tiles = (OH + rows - 1) / rows, tile = (OH + tiles - 1) / tiles;
    const int64_t units = (int64_t)N * G * tiles;
    const int small = (int64_t)N * OH * OW * M * K < SAT_CONV_PAR_MACS;
    int split = sat_threads > 1 && !small && units % sat_threads != 0 && units < 8 * sat_threads ? sat_threads : 1;
    const int unit = trans ? SAT_PN : SAT_PR;
    int chunk = ((Mg + split - 1) / split + unit - 1) / unit * unit;
    split = (Mg + chunk - 1) / chunk;
    sat_pconv_args a = {x, wp, wp_group, y, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, G, trans, tile,
                        tiles, split, chunk, acc && !trans, epi};
    sat_parallel(units * split, body ? body : sat_pconv_unit, &a);
}

void sat_sconv_item(void *ctx, int64_t item, int tid) { sat_sconv_run(ctx, item, tid, NULL); }

float *sat_sconv_buf;

size_t sat_sconv_cap;

/* 2-D convolution (one group) of at most SAT_SP output pixels on weights packed by the emitter in
 * SAT_VL-channel panels; `body` is the emitter's instantiation of sat_sconv_run with its 8-channel
 * epilogue, or NULL (then `epi` runs on each plane). Threads take runs of channel panels, about four per
 * thread so one descheduled thread holds up little. */
void sat_conv_stream(const float *x, const float *wp, float *y, int N, int C, int H, int W, int M, int KH,
                            int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw, sat_epi epi,
                            sat_body body) {
    const int K = C * KH * KW, R = OH * OW, panels = (M + SAT_VL - 1) / SAT_VL;
    if (R <= 0 || M <= 0) return;
    const int unfold = !(KH == 1 && KW == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && OH == H && OW == W);
    float *xt = NULL;
    if (unfold) {
        xt = sat_thread_buf(&sat_sconv_buf, &sat_sconv_cap, (size_t)K * R);
        if (!xt) abort();
    }
    int per = (panels + 4 * sat_threads - 1) / (4 * sat_threads);
    if (sat_threads == 1 || sat_in_parallel || (int64_t)K * M * R < SAT_CONV_PAR_MACS) per = panels;
    for (int n = 0; n < N; n++) {
        const float *xn = x + (int64_t)n * C * H * W;
        if (unfold)
            for (int r = 0; r < K; r++)
                sat_im2col_row(xn, xt + (int64_t)r * R, r, H, W, KH, KW, 0, OH, OW, sh, sw, ph, pw, dh, dw);
        sat_sconv_args a = {unfold ? xt : xn, wp, y + (int64_t)n * M * R, (int64_t)n * M, K, M, R, per, epi};
        sat_parallel((panels + per - 1) / per, body ? body : sat_sconv_item, &a);
    }
}

/* One work unit: output rows [oh0, oh1) of one (image, group), channels of one chunk. */
void sat_xconv_unit(void *ctx, int64_t u, int tid) {
    const sat_xconv_args *a = ctx;
    const int s = (int)(u % a->split), tr = (int)(u / a->split % a->tiles);
    const int64_t pair = u / a->split / a->tiles; /* n * G + g */
    const int g = (int)(pair % a->G), Mg = a->M / a->G, OW = a->OW, Wp = a->Wp;
    const int m0 = s * a->chunk, m1 = m0 + a->chunk < Mg ? m0 + a->chunk : Mg;
    const int oh0 = tr * a->rows, oh1 = oh0 + a->rows < a->OH ? oh0 + a->rows : a->OH;
    const int64_t P = (int64_t)a->OH * OW;
    const int v0 = oh0 * Wp, v1 = (oh1 - 1) * Wp + OW; /* virtual pixels covering the rows */
    const float *xb = a->xp + pair * a->xp_pair, *wg = a->wp + g * a->wp_group;
    float *yb = a->y + (pair / a->G * a->M + (int64_t)g * Mg) * P;
    /* per run of SAT_PN virtual pixels, the whole reduction of each channel panel in registers: the run's
     * input lines stay in cache across the chunk's panels, and the emitter takes this layout only where the
     * group's weights fit in L2 (emit.conv_layout), since every run passes all of them */
    float t[SAT_PR * SAT_PN];
    (void)tid;
    for (int v = v0; v < v1; v += SAT_PN) {
        const int oh = v / Wp, ow = v % Wp;
        for (int i = m0; i < m1; i += SAT_PR) {
            const int mr = m1 - i < SAT_PR ? m1 - i : SAT_PR;
            sat_ukr_x(a->K, wg + (int64_t)i * a->K, xb + v, a->koff, t, 0);
            for (int r = 0; r < mr; r++) {
                const float *tr = t + r * SAT_PN;
                float *yc = yb + (int64_t)(i + r) * P;
                /* a run inside one output row, or any whole run where no column is padding (1x1 convs):
                 * the outputs are contiguous */
                if (ow + SAT_PN <= OW || (Wp == OW && v + SAT_PN <= v1)) {
                    memcpy(yc + (int64_t)oh * OW + ow, tr, sizeof(float) * SAT_PN);
                    continue;
                }
                /* else piece by piece: the run's stretches inside output rows, the pad columns skipped */
                for (int h = oh, w = ow, p = 0; p < SAT_PN && h < oh1;) {
                    const int left = SAT_PN - p, end = w < OW ? OW : Wp, n = end - w < left ? end - w : left;
                    if (w < OW)
                        for (int i = 0; i < n; i++) yc[(int64_t)h * OW + w + i] = tr[p + i];
                    p += n, w += n;
                    if (w == Wp) w = 0, h++;
                }
            }
        }
    }
    if (a->epi)
        for (int m = m0; m < m1; m++) a->epi(a->y, (yb - a->y) + (int64_t)m * P + (int64_t)oh0 * OW, (int64_t)(oh1 - oh0) * OW);
}

/* Padded copy of one input channel, in its phases: item (n G + g) Cg + c. Phase q (padded rows pa[q] + sh i,
 * columns pb[q] + sw j) is plane q of the channel's `phases` planes of Hp x Wp; pads read as zero. */
void sat_xpad_plane(void *ctx, int64_t item, int tid) {
    const sat_xpad_args *a = ctx;
    const int64_t pair = item / a->Cg, c = item % a->Cg;
    const float *xi = a->x + (pair * a->Cg + c) * a->H * a->W; /* (n, g) pairs are consecutive Cg-channel runs */
    const int Hp = a->Hp, Wp = a->Wp, H = a->H, W = a->W, sh = a->sh, sw = a->sw;
    (void)tid;
    for (int q = 0; q < a->phases; q++) {
        float *d = a->xp + pair * a->pair + (c * a->phases + q) * (int64_t)Hp * Wp;
        /* phase column j reads input column iw0 + sw j: the valid j are [lo, hi) */
        const int iw0 = a->pb[q] - a->pw;
        int lo, hi;
        sat_valid_cols_s(iw0, sw, W, Wp, &lo, &hi);
        for (int i = 0; i < Hp; i++, d += Wp) {
            const int ih = a->pa[q] + sh * i - a->ph;
            if (ih < 0 || ih >= H) {
                memset(d, 0, sizeof(float) * (size_t)Wp);
                continue;
            }
            const float *s = xi + (int64_t)ih * W + iw0;
            memset(d, 0, sizeof(float) * (size_t)lo);
            if (sw == 1)
                memcpy(d + lo, s + lo, sizeof(float) * (size_t)(hi - lo));
            else
                for (int j = lo; j < hi; j++) d[j] = s[j * sw];
            memset(d + hi, 0, sizeof(float) * (size_t)(Wp - hi));
        }
    }
}

float *sat_xp_buf;

size_t sat_xp_cap;

/* Grouped 2-D convolution on weights packed in SAT_PR-channel panels (as the usual product's), on the padded
 * grid of the input's phases (see pgemm.h). */
void sat_conv_xdirect(const float *x, const float *wp, int64_t wp_group, float *y, int N, int C, int H, int W,
                             int M, int KH, int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw,
                             int G, sat_epi epi) {
    const int Cg = C / G, Mg = M / G, K = Cg * KH * KW;
    if ((int64_t)OH * OW <= 0 || Mg <= 0) return;
    const int Hp = OH + (KH - 1) * dh / sh, Wp = OW + (KW - 1) * dw / sw;
    /* the phases the taps read, numbered in order of first use */
    sat_xpad_args pa = {x, NULL, C, Cg, G, H, W, Hp, Wp, ph, pw, sh, sw, 0, 0, {0}, {0}};
    int phase_of[SAT_XPHASES];
    for (int q = 0; q < SAT_XPHASES; q++) phase_of[q] = -1;
    for (int kh = 0; kh < KH; kh++)
        for (int kw = 0; kw < KW; kw++) {
            const int r = kh * dh % sh, s = kw * dw % sw, q = r * sw + s;
            if (phase_of[q] < 0) pa.pa[pa.phases] = r, pa.pb[pa.phases] = s, phase_of[q] = pa.phases++;
        }
    /* each pair's copy is followed by 2 SAT_PN spare floats: a run's loads may pass its last row's end */
    const int64_t plane = (int64_t)Hp * Wp, pair = (int64_t)Cg * pa.phases * plane + 2 * SAT_PN, pairs = (int64_t)N * G;
    float *xp = sat_thread_buf(&sat_xp_buf, &sat_xp_cap, (size_t)(pair * pairs + K));
    if (!xp) abort();
    int32_t *koff = (int32_t *)(xp + pair * pairs);
    for (int k = 0; k < K; k++) {
        const int c = k / (KH * KW), kh = k / KW % KH, kw = k % KW;
        const int q = phase_of[kh * dh % sh * sw + kw * dw % sw];
        koff[k] = (int32_t)(((int64_t)c * pa.phases + q) * plane + (int64_t)(kh * dh / sh) * Wp + kw * dw / sw);
    }
    pa.xp = xp, pa.pair = pair;
    sat_parallel(pairs * Cg, sat_xpad_plane, &pa);
    for (int64_t q = 0; q < pairs; q++) memset(xp + q * pair + pair - 2 * SAT_PN, 0, sizeof(float) * 2 * SAT_PN);
    /* row tiles of about 256 virtual pixels: a tile's input rows stay in cache across its channel panels */
    const int rows = (int)sat_clamp((256 + Wp - 1) / Wp, 1, OH), tiles = (OH + rows - 1) / rows;
    const int64_t units = pairs * tiles;
    int split = sat_threads > 1 && units % sat_threads != 0 && units < 8 * sat_threads ? sat_threads : 1;
    int chunk = ((Mg + split - 1) / split + SAT_PR - 1) / SAT_PR * SAT_PR;
    split = (Mg + chunk - 1) / chunk;
    sat_xconv_args a = {xp, wp, koff, wp_group, pair, y, M, G, OH, OW, Wp, K, rows, tiles, split, chunk, epi};
    sat_parallel(units * split, sat_xconv_unit, &a);
}

void sat_pmm_item(void *ctx, int64_t item, int tid) {
    const sat_pmm_args *a = ctx;
    const int N = a->N, K = a->K, M = a->M, j0 = (int)item * a->per, j1 = j0 + a->per < N ? j0 + a->per : N;
    float *Y = a->Y + a->yoff;
    (void)tid;
    for (int jb = j0; jb < j1; jb += SAT_PNB * SAT_PN) {
        const int jb1 = jb + SAT_PNB * SAT_PN < j1 ? jb + SAT_PNB * SAT_PN : j1;
        for (int k0 = 0; k0 < K; k0 += SAT_PKC) {
            const int kc = K - k0 < SAT_PKC ? K - k0 : SAT_PKC;
            for (int i = 0; i < M; i += SAT_PR) {
                const int mr = M - i < SAT_PR ? M - i : SAT_PR, far = i == 0 || M < SAT_PNB_FAR_ROWS;
                /* A read in place (rows past M repeat row i), or its packed panel: the six rows' kc floats
                   stay in L1 while the block's B panels pass them (SAT_PNB); a last tile of at most 4 rows
                   runs on the 4-row kernel */
                const float *ar[SAT_PR] = {0};
                if (!a->ap)
                    for (int r = 0; r < SAT_PR; r++) ar[r] = a->A + (int64_t)(i + (r < mr ? r : 0)) * a->lda + k0;
                for (int j = jb; j < jb1; j += SAT_PN) {
                    const int nr = N - j < SAT_PN ? N - j : SAT_PN;
                    const float *bj = a->bp + (int64_t)j * K + (int64_t)k0 * SAT_PN;
                    float *yij = Y + (int64_t)i * N + j;
                    if (a->ap)
                        sat_ukr(kc, a->ap + (int64_t)i * K + (int64_t)k0 * SAT_PR, bj, yij, N, mr, nr, k0 > 0, far);
                    else if (mr <= 4)
                        sat_ukr_rows4(kc, ar, bj, yij, N, mr, nr, k0 > 0, far);
                    else
                        sat_ukr_rows(kc, ar, bj, yij, N, mr, nr, k0 > 0, far);
                }
            }
        }
    }
    /* the epilogue on the item's columns, while they are in cache and on every thread (an epilogue reads
       its operands at any offset within a row) */
    if (a->epi)
        for (int m = 0; m < M; m++) a->epi(a->Y, a->yoff + (int64_t)m * N + j0, j1 - j0);
}

float *sat_pmm_buf[SAT_MAX_THREADS];

size_t sat_pmm_cap[SAT_MAX_THREADS];

/* Panels [item * per, ...) of A, SAT_PR rows each, k-major with alpha folded in (rows past M are zeros). */
void sat_pmm_pack(void *ctx, int64_t item, int tid) {
    const sat_pmm_args *a = ctx;
    const int K = a->K, M = a->M, lda = a->lda, panels = (M + SAT_PR - 1) / SAT_PR;
    const int p1 = (int)(item + 1) * a->per < panels ? (int)(item + 1) * a->per : panels;
    const float alpha = a->alpha, *A = a->A;
    (void)tid;
    for (int p = (int)item * a->per; p < p1; p++)
        for (int r = 0; r < SAT_PR; r++) {
            const int i = p * SAT_PR + r;
            float *d = a->apw + (int64_t)p * K * SAT_PR + r;
            if (i >= M)
                for (int k = 0; k < K; k++) d[(int64_t)k * SAT_PR] = 0.0f;
            else if (a->ta)
                for (int k = 0; k < K; k++) d[(int64_t)k * SAT_PR] = alpha * A[(int64_t)k * lda + i];
            else
                for (int k = 0; k < K; k++) d[(int64_t)k * SAT_PR] = alpha * A[(int64_t)i * lda + k];
        }
}

/* Panels of B per work item: the count whose busiest thread gets the fewest panels (the pool deals each
 * thread a range of items, so a thread runs up to ceil(items / threads) of them), at least two items per thread where that costs
 * nothing, so a late thread does not hold the others up; at most as many as fit. A K/V projection's 6
 * panels go one per item (3 + 3), not two (4 + 2). */
static int sat_pmm_panels_per_item(int panels, int threads) {
    int best = panels, best_load = panels;
    const int pair = (panels + 2 * threads - 1) / (2 * threads);
    for (int q = 1; q <= panels; q++) {
        const int items = (panels + q - 1) / q, load = (items + threads - 1) / threads * q;
        const int fits = q <= pair, best_fits = best <= pair;
        if (load < best_load || (load == best_load && (fits > best_fits || (fits == best_fits && q > best)))) {
            best = q;
            best_load = load;
        }
    }
    return best;
}

/* Y[yoff ..] (M x N) = alpha * op(A) B, B packed by the emitter (above), each work item's columns then
 * taking the epilogue. */
void sat_gemm_packed(int ta, int M, int N, int K, float alpha, const float *A, int lda, const float *bp,
                            float *Y, int64_t yoff, sat_epi epi) {
    if (M <= 0 || N <= 0) return;
    const int panels = (M + SAT_PR - 1) / SAT_PR, threaded = sat_threads > 1 && !sat_in_parallel;
    sat_pmm_args a = {NULL, bp, A, Y, NULL, yoff, M, N, K, 0, ta, lda, alpha, epi};
    /* A as stored and unscaled is read in place (sat_ukr_rows): packing it cost 5-8% of a 512 x 384 x 1536
       product (AVX2 build, Zen 4) and, threaded, a parallel job of its own. A transposed or scaled A is
       packed in panels with alpha folded in, in items of ~16K floats shared among the threads. */
    if (ta || alpha != 1.0f) {
        float *ap = sat_thread_buf(&sat_pmm_buf[sat_pool_tid], &sat_pmm_cap[sat_pool_tid],
                                   (size_t)panels * SAT_PR * K);
        if (!ap) abort();
        a.ap = a.apw = ap;
        a.per = (int)(16384 / ((int64_t)SAT_PR * K + 1)) + 1;
        if (threaded && panels > a.per)
            sat_parallel((panels + a.per - 1) / a.per, sat_pmm_pack, &a);
        else
            for (int64_t i = 0; i * a.per < panels; i++) sat_pmm_pack(&a, i, sat_pool_tid);
    }
    a.per = N;
    if (threaded) {
        const int bpanels = (N + SAT_PN - 1) / SAT_PN;
        a.per = sat_pmm_panels_per_item(bpanels, sat_threads) * SAT_PN;
    }
    sat_parallel((N + a.per - 1) / a.per, sat_pmm_item, &a);
}
