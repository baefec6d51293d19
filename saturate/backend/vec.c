/* The kernel library's half of vec.h: compiled once per instruction set (build.py), linked into every model. */
#include "kernels.h"

/* A per-thread buffer of at least `floats` floats, grown on demand and kept for the next call. */
float *sat_thread_buf(float **buf, size_t *cap, size_t floats) {
    if (*cap < floats) {
        free(*buf);
        *buf = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        *cap = *buf ? floats : 0;
    }
    return *buf;
}

float *sat_dw_buf[SAT_MAX_THREADS];

size_t sat_dw_cap[SAT_MAX_THREADS];

/* Work item: one input channel of one image and its `mult` output channels, epilogue per plane. */
void sat_dw_channel(void *ctx, int64_t nc, int tid) {
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

float *sat_dwc_buf[SAT_MAX_THREADS];

size_t sat_dwc_cap[SAT_MAX_THREADS];

void sat_dwc_group(void *ctx, int64_t item, int tid) {
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

void sat_conv_depthwise(const float *x, const float *w, float *y, int N, int C, int H, int W, int M,
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

#if (defined(__AVX2__))
float *sat_dwt_buf[SAT_MAX_THREADS];

size_t sat_dwt_cap[SAT_MAX_THREADS];

void sat_dwt_item(void *ctx, int64_t item, int tid) { sat_dwt_run(ctx, item, tid, NULL); }

#endif

#if (defined(__AVX512F__))
void sat_dwz_item(void *ctx, int64_t item, int tid) { sat_dwz_run(ctx, item, tid, NULL, NULL); }

#endif

#if (defined(SAT_HAVE_DWT))
/* Depthwise convolution with channels in the lanes (one output channel per input channel), `lanes` (8 or
 * 16) at a time; `item` is the emitter's instantiation of sat_dwt_run or sat_dwz_run with its vector
 * epilogue, or NULL (then `epi` runs per plane). */
void sat_conv_dwt(const float *x, const float *w, float *y, int N, int C, int H, int W, int KH, int KW,
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
void sat_conv_dw_lanes(const float *x, const float *w, float *y, int N, int C, int H, int W, int M, int KH,
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
void sat_dot_rows(const float *A, int64_t lda, int na, const float *B, int64_t ldb, int j0, int j1, int K,
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

void sat_dot_item(void *ctx, int64_t item, int tid) {
    const sat_dot_args *a = ctx;
    const int j0 = (int)item * a->per, j1 = j0 + a->per < a->nb ? j0 + a->per : a->nb;
    (void)tid;
    sat_dot_rows(a->A, a->lda, a->na, a->B, a->ldb, j0, j1, a->K, a->C, a->ci, a->cj, a->alpha);
    if (a->epi)
        for (int j = j0; j < j1; j++) a->epi(a->epi_base, a->epi_off + (int64_t)j * a->cj, a->na);
}

/* Threads split B's rows, in items of about 64 KB of B. */
void sat_dot(const float *A, int64_t lda, int na, const float *B, int64_t ldb, int nb, int K, float *C,
                    int64_t ci, int64_t cj, float alpha, sat_epi epi, float *epi_base, int64_t epi_off) {
    int per = (int)(16384 / (K > 0 ? K : 1));
    per = per < 4 ? 4 : (per + 3) / 4 * 4;
    sat_dot_args a = {A, B, C, lda, ldb, ci, cj, na, nb, K, per, alpha, epi, epi_off, epi_base};
    sat_parallel((nb + per - 1) / per, sat_dot_item, &a);
}

void sat_skinny_item(void *ctx, int64_t item, int tid) {
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

void sat_skinny_nn(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                          float *Y) {
    int per = (int)(16384 / (K > 0 ? K : 1));
    per = (per + 2 * SAT_VL - 1) / (2 * SAT_VL) * (2 * SAT_VL);
    if (per < 2 * SAT_VL) per = 2 * SAT_VL;
    sat_skinny_args a = {A, B, Y, M, N, K, lda, ldb, per, alpha};
    sat_parallel((N + per - 1) / per, sat_skinny_item, &a);
}

float *sat_tail_buf[SAT_MAX_THREADS];

size_t sat_tail_cap[SAT_MAX_THREADS];

void sat_gemm_nn(int M, int N, int K, const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                        int64_t ldc, int acc) {
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
    /* Adding onto C, row groups go outermost instead: C's 4 rows are then read front to back, streams the
       prefetcher follows, where a panel's tiles read a line of every row (ResNet-50's 64 -> 256 + residual on
       56x56 maps, in the model, avx2 build: 1.59-1.80 -> 1.41-1.48 ms; without a residual that order was no
       faster). */
    const int panels = (N + NB - 1) / NB, groups = (M + 3) / 4;
    for (int64_t t = 0; t < (int64_t)panels * groups; t++) {
        const int j = (int)(acc ? t % panels : t / groups) * NB, i = (int)(acc ? t / panels : t % groups) * 4;
        const int nj = N - j < NB ? N - j : NB;
        const float *bp = nj < NB ? tail : B + j;
        const int64_t bs = nj < NB ? NB : ldb;
        {
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
            if (nj == NB && acc) {
                /* onto C as it is (a residual the conv adds onto in place) */
                c00 += sat_vload(y), c01 += sat_vload(y + SAT_VL), c02 += sat_vload(y + 2 * SAT_VL);
                if (mi > 1)
                    c10 += sat_vload(y + ldc), c11 += sat_vload(y + ldc + SAT_VL),
                        c12 += sat_vload(y + ldc + 2 * SAT_VL);
                if (mi > 2)
                    c20 += sat_vload(y + 2 * ldc), c21 += sat_vload(y + 2 * ldc + SAT_VL),
                        c22 += sat_vload(y + 2 * ldc + 2 * SAT_VL);
                if (mi > 3)
                    c30 += sat_vload(y + 3 * ldc), c31 += sat_vload(y + 3 * ldc + SAT_VL),
                        c32 += sat_vload(y + 3 * ldc + 2 * SAT_VL);
            }
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
            for (int r = 0; r < mi; r++)
                if (acc)
                    for (int c = 0; c < nj; c++) y[(int64_t)r * ldc + c] += out[r][c];
                else
                    memcpy(y + (int64_t)r * ldc, out[r], sizeof(float) * (size_t)nj);
        }
    }
}

/* Output pixels [p0, p1) of one image (C x H x W) unfolded transposed: xt[(p - p0) K + (c KH + kh) KW + kw]. */
void sat_im2row(const float *x, float *xt, int C, int H, int W, int KH, int KW, int OW, int sh, int sw,
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
void sat_conv_dot(const float *x, const float *w, float *y, float *xt, int N, int C, int H, int W, int M,
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
