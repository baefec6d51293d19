/* The kernel library's half of kernels.h: compiled once per instruction set (build.py), linked into every model. */
#include "kernels.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Unfold output rows [oh0, oh1) of one image (C x H x W) into the (C*KH*KW) x ((oh1-oh0)*OW) column
 * matrix, pads read as zero. Row-major when `packed` is 0; else written straight into the micro-kernel's
 * panels `packed` columns wide (block k0 at col + k0*panels*packed, panel q at + q*kc*packed, zero-padded):
 * B panels (SAT_NR) for the usual product, A panels (SAT_MR) for the transposed one. */
void sat_im2col(const float *x, float *col, int C, int H, int W, int KH, int KW, int oh0, int oh1, int OW,
                       int sh, int sw, int ph, int pw, int dh, int dw, int packed) {
    const int K = C * KH * KW;
    const int64_t cols = (int64_t)(oh1 - oh0) * OW;
    /* The staging row is padded with zeros to whole panels, so each panel is one fixed-width copy. */
    const int64_t padded = packed ? (cols + packed - 1) / packed * packed : 0;
    float *tmp = packed ? calloc((size_t)padded, sizeof(float)) : NULL;
    for (int r = 0; r < K; r++) {
        const int c = r / (KH * KW), kh = (r / KW) % KH, kw = r % KW;
        float *dst = packed ? tmp : col + (int64_t)r * cols;
        const float *src = x + (int64_t)c * H * W;
        const int iw0 = kw * dw - pw;
        int lo, hi;
        sat_valid_cols_s(iw0, sw, W, OW, &lo, &hi);
        for (int oh = oh0; oh < oh1; oh++) {
            const int ih = oh * sh - ph + kh * dh;
            float *d = dst + (int64_t)(oh - oh0) * OW;
            if (ih < 0 || ih >= H) {
                memset(d, 0, sizeof(float) * OW);
                continue;
            }
            const float *s = src + (int64_t)ih * W + iw0;
            for (int ow = 0; ow < lo; ow++) d[ow] = 0.0f;
            if (sw == 1) {
                if (hi > lo) memcpy(d + lo, s + lo, sizeof(float) * (hi - lo));
            } else {
                for (int ow = lo; ow < hi; ow++) d[ow] = s[ow * sw];
            }
            for (int ow = hi; ow < OW; ow++) d[ow] = 0.0f;
        }
#ifdef SAT_HAVE_PACKED_GEMM
        if (packed) {
            const int pw_ = packed;
            const int64_t panels = (cols + pw_ - 1) / pw_;
            const int k0 = r / SAT_KC * SAT_KC, kc = K - k0 < SAT_KC ? K - k0 : SAT_KC;
            float *blk = col + (int64_t)k0 * panels * pw_ + (int64_t)(r - k0) * pw_;
            if (pw_ == 32)
                for (int64_t q = 0; q < panels; q++) {
                    _mm512_storeu_ps(blk + q * kc * 32, _mm512_loadu_ps(tmp + q * 32));
                    _mm512_storeu_ps(blk + q * kc * 32 + 16, _mm512_loadu_ps(tmp + q * 32 + 16));
                }
            else if (pw_ == 8)
                for (int64_t q = 0; q < panels; q++) _mm256_storeu_ps(blk + q * kc * 8, _mm256_loadu_ps(tmp + q * 8));
            else
                for (int64_t q = 0; q < panels; q++) memcpy(blk + q * kc * pw_, tmp + q * pw_, sizeof(float) * pw_);
        }
#endif
    }
    free(tmp);
}

#ifdef SAT_HAVE_PACKED_GEMM
/* sat_im2col of a 1x1 window without padding (any strides) from one image stored in pixel panels (pixel p,
 * channel c at (p / 32 * C + c) * 32 + p % 32; plan.panel_roots), into the micro-kernel's panels `packed`
 * (SAT_NR or SAT_MR) columns wide, as sat_im2col writes them. */
void sat_im2col_panels(const float *x, float *col, int C, int W, int oh0, int oh1, int OW, int sh, int sw, int packed) {
    const int64_t cols = (int64_t)(oh1 - oh0) * OW, panels = (cols + packed - 1) / packed;
    for (int64_t q = 0; q < panels; q++) {
        int32_t idx[SAT_NR] = {0};
        const int64_t left = cols - q * packed;
        for (int j = 0; j < packed && j < left; j++) {
            const int64_t p = q * packed + j, ip = (oh0 + p / OW) * sh * W + p % OW * sw;
            idx[j] = (int32_t)sat_panel_at(ip, C, SAT_NR);
        }
        const __m512i i0 = _mm512_loadu_si512(idx), i1 = _mm512_loadu_si512(idx + 16);
        const __mmask16 m0 = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
        const __mmask16 m1 = left >= 32 ? 0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
        for (int k0 = 0; k0 < C; k0 += SAT_KC) {
            const int kc = C - k0 < SAT_KC ? C - k0 : SAT_KC;
            float *d = col + (int64_t)k0 * panels * packed + q * kc * packed;
            for (int k = 0; k < kc; k++) {
                const float *src = x + (int64_t)(k0 + k) * SAT_NR;
                const __m512 v0 = _mm512_maskz_mov_ps(m0, _mm512_i32gather_ps(i0, src, 4));
                if (packed == SAT_NR) {
                    _mm512_storeu_ps(d + k * SAT_NR, v0);
                    _mm512_storeu_ps(d + k * SAT_NR + 16, _mm512_maskz_mov_ps(m1, _mm512_i32gather_ps(i1, src, 4)));
                } else {
                    _mm256_storeu_ps(d + k * SAT_MR, _mm512_castps512_ps256(v0));
                }
            }
        }
    }
}
#endif

int sat_tile_rows(int K, int OH, int OW) {
    int64_t rows = SAT_TILE_BYTES / ((int64_t)K * OW * 4);
    if (rows * OW < 256) rows = (256 + OW - 1) / OW; /* keep sgemm's N wide enough to run at speed */
    return (int)sat_clamp(rows, 1, OH);
}

/* Floats per unfolded row: packed columns are padded to whole NR-wide panels. */
int64_t sat_col_width(int64_t cols, int packed) {
#ifdef SAT_HAVE_PACKED_GEMM
    if (packed) return (cols + SAT_NR - 1) / SAT_NR * SAT_NR;
#endif
    (void)packed;
    return cols;
}

#if (defined(SAT_HAVE_PACKED_GEMM))
float *sat_trans_buf[SAT_MAX_THREADS];

size_t sat_trans_cap[SAT_MAX_THREADS];

/* Output channels [m0, m1) of a tile of `cols` pixels computed as Y^T = X^T W^T, for small outputs whose
 * pixel count wastes much of a 32-wide panel: pixels take the kernel's 8 rows (A panels, unfolded by
 * sat_im2col at width SAT_MR) and channels its 32 columns (weights packed in 32-channel panels by the
 * emitter, `Mg` rounded up to 32 per k-block); the result is transposed into y (pitch P). */
void sat_conv_trans(const float *wg, const float *ap, float *yt, int64_t P, int K, int cols, int Mg,
                           int m0, int m1, int tid) {
    const int64_t Mq = (Mg + SAT_NR - 1) / SAT_NR * SAT_NR, Pp = (cols + SAT_MR - 1) / SAT_MR * SAT_MR;
    const int ldt = (m1 - m0 + SAT_NR - 1) / SAT_NR * SAT_NR;
    const size_t need = sizeof(float) * (size_t)Pp * ldt;
    if (sat_trans_cap[tid] < need) {
        free(sat_trans_buf[tid]);
        sat_trans_buf[tid] = aligned_alloc(64, (need + 63) / 64 * 64);
        sat_trans_cap[tid] = need;
    }
    float *t = sat_trans_buf[tid];
    for (int k0 = 0; k0 < K; k0 += SAT_KC) {
        const int kc = K - k0 < SAT_KC ? K - k0 : SAT_KC;
        for (int j = m0; j < m1; j += SAT_NR) {
            const int nr = m1 - j < SAT_NR ? m1 - j : SAT_NR;
            const float *b = wg + (int64_t)k0 * Mq + (int64_t)j * kc;
            for (int i = 0; i < cols; i += SAT_MR) {
                const int mr = cols - i < SAT_MR ? cols - i : SAT_MR;
                sat_kernel_8x32(kc, ap + (int64_t)k0 * Pp + (int64_t)i * kc, b, t + (int64_t)i * ldt + (j - m0), ldt,
                                k0 > 0, mr, nr);
            }
        }
    }
    /* Transpose 16 x 16 blocks so both sides stay in cache lines. */
    for (int m = 0; m < m1 - m0; m += 16)
        for (int p = 0; p < cols; p += 16) {
            const int me = m + 16 < m1 - m0 ? m + 16 : m1 - m0, pe = p + 16 < cols ? p + 16 : cols;
            for (int mm = m; mm < me; mm++)
                for (int pp = p; pp < pe; pp++) yt[(int64_t)mm * P + pp] = t[(int64_t)pp * ldt + mm];
        }
}

#endif

/* One tile of a grouped 2-D convolution: output rows [oh0, oh1) and channels [m0, m1) of group g of
 * image n, as W_g[m0:m1] (K wide) times the tile's columns, then the epilogue on those rows. */
void sat_conv_tile(const float *x, const float *w, const float *wp, int64_t wp_group, float *y, float *col,
                          int n, int g, int oh0, int oh1, int m0, int m1, int C, int H, int W, int M, int KH, int KW,
                          int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw, int G, int direct,
                          int trans, int acc, int xpan, int tid, sat_epi epi) {
    const int Cg = C / G, Mg = M / G, K = Cg * KH * KW;
    const int64_t P = (int64_t)OH * OW, cols = (int64_t)(oh1 - oh0) * OW;
    /* (an input in pixel panels: one group, a 1x1 window without padding, not transposed; plan.panel_roots) */
    const float *xg = xpan ? x + (int64_t)n * C * (((int64_t)H * W + SAT_NR - 1) / SAT_NR * SAT_NR)
                           : x + ((int64_t)n * C + (int64_t)g * Cg) * H * W;
    float *yt = y + ((int64_t)n * M + (int64_t)g * Mg + m0) * P + (int64_t)oh0 * OW;
#ifdef SAT_HAVE_PACKED_GEMM
    if (trans) {
        if (xpan)
            sat_im2col_panels(xg, col, Cg, W, oh0, oh1, OW, sh, sw, SAT_MR);
        else
            sat_im2col(xg, col, Cg, H, W, KH, KW, oh0, oh1, OW, sh, sw, ph, pw, dh, dw, SAT_MR);
        sat_conv_trans(wp + g * wp_group, col, yt, P, K, (int)cols, Mg, m0, m1, tid);
        if (epi)
            for (int m = 0; m < m1 - m0; m++) epi(y, (yt - y) + (int64_t)m * P, cols);
        return;
    }
#endif
    (void)trans;
    (void)tid;
    const float *b = xg + (int64_t)oh0 * OW;
    int64_t ldb = P;
    if (!direct) {
#ifdef SAT_HAVE_PACKED_GEMM
        if (xpan)
            sat_im2col_panels(xg, col, Cg, W, oh0, oh1, OW, sh, sw, SAT_NR);
        else
#endif
            sat_im2col(xg, col, Cg, H, W, KH, KW, oh0, oh1, OW, sh, sw, ph, pw, dh, dw, wp != NULL ? SAT_NR : 0);
        b = col;
        ldb = cols;
    }
#ifdef SAT_HAVE_PACKED_GEMM
    if (wp) {
        /* Packed blocks are Mp x kc; a channel range starting at a multiple of 8 is a contiguous slice. */
        const int64_t Mp = (Mg + SAT_MR - 1) / SAT_MR * SAT_MR;
        const float *wg = wp + g * wp_group;
        /* Unfolded columns arrive packed; a direct conv's input is packed here, block by block. */
        const int64_t panels = (cols + SAT_NR - 1) / SAT_NR;
        float *bp = direct ? aligned_alloc(64, sizeof(float) * (size_t)SAT_KC * SAT_NR * panels + 64) : NULL;
        /* Channel panels outer, pixel panels inner, where the reduction is one block (each panel's 8 output rows
           are then written front to back, 8 streams the prefetcher follows, and the epilogue finds them in L1)
           or the weights are larger than L2 (they are then read once a tile, not once a pixel panel). Else the
           pixel panel stays in L1 and the weights stream past it. At 1 thread on the Xeon (family 6 model 167),
           per-step medians: ResNet-50's 64 -> 256 on 56x56 maps 0.86 -> 0.77 ms alone, 1.10 -> 0.93 in the
           model at 224x224 (1.24-1.74 -> 1.10-1.19 with the residual Add), its 2048 -> 512 on 7x7 maps 1.33 ->
           1.08 in the model; with longer reductions and smaller weights (512 -> 256 on 28x28, 1024 -> 256 on
           14x14) the other order ran 5% faster. */
        const int rows_outer = K <= SAT_KC || (int64_t)Mg * K > (1 << 18);
        const int rpanels = (m1 - m0 + SAT_MR - 1) / SAT_MR;
        for (int k0 = 0; k0 < K; k0 += SAT_KC) {
            const int kc = K - k0 < SAT_KC ? K - k0 : SAT_KC;
            if (direct)
                sat_pack_b(b, ldb, k0, kc, 0, (int)cols, bp);
            else
                bp = col + (int64_t)k0 * panels * SAT_NR;
            for (int64_t t = 0; t < (int64_t)panels * rpanels; t++) {
                const int q = (int)(rows_outer ? t % panels : t / rpanels);
                const int i = m0 + (int)(rows_outer ? t / panels : t % rpanels) * SAT_MR;
                const int mr = m1 - i < SAT_MR ? m1 - i : SAT_MR;
                const int nr = cols - q * SAT_NR < SAT_NR ? (int)cols - q * SAT_NR : SAT_NR;
                const float *ai = wg + (int64_t)k0 * Mp + (int64_t)i * kc;
                /* a weight panel's first use fetches the panel two on into L2: the weights come from memory once
                   an inference (ResNet-50's 1024 -> 256 convs on 14x14, 1 MB each, ran 0.71 ms alone with them in
                   cache, 0.83-0.86 in the model). At 224x224, 1 thread, per-step medians of three rounds on the
                   Xeon (family 6 model 167): those convs 0.82-0.86 -> 0.77-0.79 ms (x5), 1024 -> 512 1.59 -> 1.54;
                   2 threads 0.47-0.48 -> 0.45-0.46 */
                if (q == 0)
                    sat_kernel_8x32_pf(kc, ai, bp, yt + (int64_t)(i - m0) * P, P, k0 > 0 || acc, mr, nr,
                                       ai + 2 * SAT_MR * kc);
                else
                    sat_kernel_8x32(kc, ai, bp + (int64_t)q * kc * SAT_NR, yt + (int64_t)(i - m0) * P + q * SAT_NR, P,
                                    k0 > 0 || acc, mr, nr);
                if (rows_outer && epi && k0 + kc == K && q == panels - 1)
                    for (int m = i; m < i + mr; m++) epi(y, (yt - y) + (int64_t)(m - m0) * P, cols);
            }
        }
        if (direct) free(bp);
        if (epi && !rows_outer)
            for (int m = 0; m < m1 - m0; m++) epi(y, (yt - y) + (int64_t)m * P, cols);
        return;
    } else
#endif
    if (K <= SAT_SHORT_K)
        sat_gemm_nn(m1 - m0, (int)cols, K, w + ((int64_t)g * Mg + m0) * K, K, b, ldb, yt, P, acc);
    else
        scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m1 - m0, (int)cols, K, 1.0f,
                          w + ((int64_t)g * Mg + m0) * K, K, b, (int)ldb, acc ? 1.0f : 0.0f, yt, (int)P);
    if (epi)
        for (int m = 0; m < m1 - m0; m++) epi(y, (yt - y) + (int64_t)m * P, cols);
}

#ifdef SAT_HAVE_PW
float sat_pw_pack[SAT_MAX_THREADS][SAT_PW_KC * SAT_PW_NR] __attribute__((aligned(64)));

/* Units of 256 pixels (whole panels) of one image, fewer where that leaves fewer than 4 per thread, split by
 * channels too where even single panels do, or where the weights are more than SAT_PW_MAXW floats (a panel's
 * packing is then done once per channel part). */
void sat_conv_pw(const float *x, const float *wp, float *y, int N, int K, int M, int H, int W, int OH, int OW, int sh,
                 int sw, int acc, int xpan, int ypan, sat_body unit) {
    const int64_t P = (int64_t)OH * OW, Q = (P + SAT_PW_NR - 1) / SAT_PW_NR, want = 4 * (int64_t)sat_threads;
    int64_t chunk = 256 / SAT_PW_NR;
    if (sat_threads > 1 && N * ((Q + chunk - 1) / chunk) < want) {
        chunk = (N * Q + want - 1) / want;
        if (chunk < 1) chunk = 1;
    }
    const int64_t pchunks = (Q + chunk - 1) / chunk;
    int mparts = 1;
    if (sat_threads > 1 && N * pchunks < 2 * sat_threads) mparts = (int)((2 * sat_threads + N * pchunks - 1) / (N * pchunks));
    int mchunk = ((M + mparts - 1) / mparts + SAT_PW_MR - 1) / SAT_PW_MR * SAT_PW_MR;
    int mblock = SAT_PW_MAXW / K / SAT_PW_MR * SAT_PW_MR;
    if (mblock < SAT_PW_MR) mblock = SAT_PW_MR;
    if (mchunk > mblock) { /* blocks of even size */
        const int blocks = (M + mblock - 1) / mblock;
        mchunk = ((M + blocks - 1) / blocks + SAT_PW_MR - 1) / SAT_PW_MR * SAT_PW_MR;
    }
    mparts = (M + mchunk - 1) / mchunk;
    sat_pw_args a = {x, wp, y, P, N, K, M, (M + SAT_PW_MR - 1) / SAT_PW_MR * SAT_PW_MR, acc, (int)chunk, (int)pchunks,
                     mchunk, mparts, H, W, OW, sh, sw, xpan, ypan};
    sat_parallel((int64_t)N * pchunks * mparts, unit, &a);
}
#endif

/* One work unit of a threaded conv: a (image, group, row tile, channel chunk), on its thread's columns. */
void sat_conv_unit(void *ctx, int64_t u, int tid) {
    const sat_conv_args *a = ctx;
    const int s = (int)(u % a->split), t = (int)(u / a->split % a->tiles);
    const int g = (int)(u / a->split / a->tiles % a->G), n = (int)(u / a->split / a->tiles / a->G);
    const int Mg = a->M / a->G, m0 = s * a->chunk, m1 = m0 + a->chunk < Mg ? m0 + a->chunk : Mg;
    const int oh0 = t * a->tile, oh1 = oh0 + a->tile < a->OH ? oh0 + a->tile : a->OH;
    sat_conv_tile(a->x, a->w, a->wp, a->wp_group, a->y, a->cols[tid], n, g, oh0, oh1, m0, m1, a->C, a->H, a->W,
                  a->M, a->KH, a->KW, a->OH, a->OW, a->sh, a->sw, a->ph, a->pw, a->dh, a->dw, a->G, a->direct,
                  a->trans, a->acc, a->xpan, tid, a->epi);
}

/* Grouped 2-D convolution. With `wp` (weights packed by the emitter, `wp_group` floats per group) the
 * AVX-512 micro-kernel runs the products and threads take whole tiles (split by channels when there
 * are too few tiles), so one parallel region covers the conv; else OpenBLAS sgemm, tile by tile. With `acc` the
 * products add onto y as it stands (a residual the output's storage holds; not with `trans`, whose tiles are
 * written whole). */
void sat_conv2d(const float *x, const float *w, const float *wp, int64_t wp_group, float *y, float *col,
                       int N, int C, int H, int W, int M, int KH, int KW, int OH, int OW, int sh, int sw, int ph,
                       int pw, int dh, int dw, int G, int trans, int acc, int xpan, sat_epi epi) {
    const int Cg = C / G, Mg = M / G, K = Cg * KH * KW;
    const int direct = !trans && !xpan && KH == 1 && KW == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && OH == H &&
                       OW == W;
    const int tile = sat_tile_rows(K, OH, OW);
    const int tiles = (OH + tile - 1) / tile;
    const int64_t col_floats = direct ? 0 : (int64_t)K * sat_col_width((int64_t)tile * OW, wp != NULL);
#ifndef SAT_HAVE_PACKED_GEMM
    wp = NULL;
#endif
    if (!wp && !acc && (int64_t)OH * OW <= SAT_DOT_MAXP && K >= SAT_DOT_MINK) {
        sat_conv_dot(x, w, y, col, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, G, epi);
        return;
    }
    if (sat_threads == 1) {
        for (int n = 0; n < N; n++)
            for (int g = 0; g < G; g++)
                for (int t = 0; t < tiles; t++)
                    sat_conv_tile(x, w, wp, wp_group, y, col, n, g, t * tile, (t + 1) * tile < OH ? (t + 1) * tile : OH,
                                  0, Mg, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, G, direct, trans, acc, xpan,
                                  0, epi);
        return;
    }
    /* Channel chunks are multiples of 8 so each starts a packed panel. */
    const int64_t units = (int64_t)N * G * tiles;
    int split = units >= 2 * sat_threads ? 1 : sat_threads;
    /* A transposed product's chunks start a 32-channel panel instead. */
    const int unit = trans ? SAT_NR : SAT_MR;
    int chunk = ((Mg + split - 1) / split + unit - 1) / unit * unit;
    if (chunk < unit) chunk = unit;
    split = (Mg + chunk - 1) / chunk;
    float *cols[SAT_MAX_THREADS] = {col};
    for (int t = 1; t < sat_threads && col_floats; t++) cols[t] = aligned_alloc(64, sizeof(float) * (size_t)col_floats + 64);
    sat_conv_args a = {x, w, wp, wp_group, y, cols, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, G,
                       direct, trans, acc, xpan, tile, tiles, split, chunk, epi};
    sat_parallel(units * split, sat_conv_unit, &a);
    for (int t = 1; t < sat_threads && col_floats; t++) free(cols[t]);
}

void sat_gemm_cols(void *ctx, int64_t item, int tid) {
    const sat_gemm_args *a = ctx;
    const int j0 = (int)item * a->per, nj = a->N - j0 < a->per ? a->N - j0 : a->per;
    (void)tid;
    scipy_cblas_sgemm(CblasRowMajor, a->ta ? CblasTrans : CblasNoTrans, a->tb ? CblasTrans : CblasNoTrans, a->M, nj,
                      a->K, a->alpha, a->A, a->lda, a->tb ? a->B + (int64_t)j0 * a->ldb : a->B + j0, a->ldb, 0.0f,
                      a->Y + a->yoff + j0, a->N);
    /* the epilogue on the item's columns, while they are in cache and on every thread (an epilogue reads
       its operands at any offset within a row) */
    if (a->epi)
        for (int m = 0; m < a->M; m++) a->epi(a->Y, a->yoff + (int64_t)m * a->N + j0, nj);
}

/* C[yoff ..] (M x N) = alpha * op(A) op(B), then the epilogue row by row. */
void sat_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                     int ldb, float *Y, int64_t yoff, sat_epi epi) {
    if (!ta && tb && M <= SAT_DOT_MAXP && K >= SAT_DOT_MINK)
        sat_dot(A, lda, M, B, ldb, N, K, Y + yoff, N, 1, alpha, NULL, NULL, 0);
    else if (!ta && !tb && M <= SAT_SKINNY)
        sat_skinny_nn(M, N, K, alpha, A, lda, B, ldb, Y + yoff);
    else if (sat_threads > 1 && !sat_in_parallel && N >= 64 && (int64_t)M * N * K >= (1 << 18)) {
        /* column blocks of 16, two items per thread so a late thread does not hold the others up */
        const int per = ((N + 2 * sat_threads - 1) / (2 * sat_threads) + 15) / 16 * 16;
        sat_gemm_args a = {A, B, Y, yoff, ta, tb, M, N, K, lda, ldb, per, alpha, epi};
        sat_parallel((N + per - 1) / per, sat_gemm_cols, &a);
        return;
    } else
        scipy_cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
                          alpha, A, lda, B, ldb, 0.0f, Y + yoff, N);
    if (epi)
        for (int m = 0; m < M; m++) epi(Y, yoff + (int64_t)m * N, N);
}

float *sat_poolrow_buf[SAT_MAX_THREADS];

size_t sat_poolrow_cap[SAT_MAX_THREADS];

/* One plane, an output row at a time: the window's input rows are first reduced into one row (max or
 * sum, contiguous and vectorized), then the window's columns are taken from that row once, instead of
 * from every input row (a 3x3 window then reads 3 rows and makes one column pass, not three). */
void sat_pool_plane(void *ctx, int64_t p, int tid) {
    const sat_pool_args *a = ctx;
    const int H = a->H, W = a->W, OH = a->OH, OW = a->OW, KH = a->KH, KW = a->KW, sh = a->sh, sw = a->sw;
    const int ph = a->ph, pw = a->pw, pe_h = a->pe_h, dh = a->dh, dw = a->dw, mode = a->mode;
    const int *wcount = a->wcount;
    const float *x = a->x;
    float *y = a->y;
    const int64_t P = (int64_t)OH * OW;
    sat_epi epi = a->epi;
    const float *xi = x + p * H * W;
    float *yo = y + p * P;
    float *vrow = sat_thread_buf(&sat_poolrow_buf[tid], &sat_poolrow_cap[tid],
                                 (size_t)3 * W + 2 * (size_t)OW + KW + pw + 40);
    if (!vrow) abort();
    float *eo = vrow + W; /* the row split in even and odd columns */
#if defined(__AVX512F__) || defined(__AVX2__)
    const int max_s2 = mode == 0 && sw == 2 && dw == 1;
    if (max_s2) {
        /* the rows reduce straight into the middle of their padded copy (see sat_pool_max_s2) */
        const int need = 2 * OW + KW + 32;
        for (int i = 0; i < pw; i++) eo[i] = -INFINITY;
        for (int i = pw + W; i < need; i++) eo[i] = -INFINITY;
        vrow = eo + pw;
    }
#endif
    for (int oh = 0; oh < OH; oh++) {
        float *row = yo + (int64_t)oh * OW;
        int hvalid = 0, hpad = 0;
        for (int kh = 0; kh < KH; kh++) {
            const int ih = oh * sh - ph + kh * dh;
            hpad += ih >= -ph && ih < H + pe_h;
            if (ih < 0 || ih >= H) continue;
            const float *xr = xi + (int64_t)ih * W;
            if (!hvalid++)
                memcpy(vrow, xr, sizeof(float) * (size_t)W);
            else if (mode == 0)
                for (int iw = 0; iw < W; iw++) vrow[iw] = xr[iw] > vrow[iw] ? xr[iw] : vrow[iw];
            else
                for (int iw = 0; iw < W; iw++) vrow[iw] += xr[iw];
        }
#if defined(__AVX512F__) || defined(__AVX2__)
        if (hvalid && max_s2) {
            sat_pool_max_s2(eo, KW, OW, row);
            continue;
        }
#endif
        const float init = mode == 0 ? -INFINITY : 0.0f;
        for (int ow = 0; ow < OW; ow++) row[ow] = init;
        if (hvalid) {
            const float *xr = vrow;
            if (sw == 2) {
                /* Split the row into even and odd columns once, so every kernel column reads a
                 * contiguous run (vector code) instead of a stride-2 one. */
                const int half = (W + 1) / 2;
                for (int i = 0; i < W / 2; i++) {
                    eo[i] = xr[2 * i];
                    eo[half + i] = xr[2 * i + 1];
                }
                if (W & 1) eo[half - 1] = xr[W - 1];
            }
            for (int kw = 0; kw < KW; kw++) {
                const int iw0 = kw * dw - pw;
                int lo, hi;
                sat_valid_cols_s(iw0, sw, W, OW, &lo, &hi);
                if (sw == 2) {
                    /* Column iw0 + 2 ow: even columns at eo[(iw0 >> 1) + ow], odd ones after the evens. */
                    const float *s = eo + (iw0 & 1) * ((W + 1) / 2) + (iw0 >> 1);
                    if (mode == 0)
                        for (int ow = lo; ow < hi; ow++) row[ow] = s[ow] > row[ow] ? s[ow] : row[ow];
                    else
                        for (int ow = lo; ow < hi; ow++) row[ow] += s[ow];
                    continue;
                }
                const float *s = xr + iw0;
                if (mode == 0)
                    for (int ow = lo; ow < hi; ow++) row[ow] = s[ow * sw] > row[ow] ? s[ow * sw] : row[ow];
                else
                    for (int ow = lo; ow < hi; ow++) row[ow] += s[ow * sw];
            }
        }
        if (mode == 1)
            for (int ow = 0; ow < OW; ow++) row[ow] = hvalid * wcount[ow] != 0 ? row[ow] / (hvalid * wcount[ow]) : 0.0f;
        if (mode == 2)
            for (int ow = 0; ow < OW; ow++) row[ow] = hpad * wcount[OW + ow] != 0 ? row[ow] / (hpad * wcount[OW + ow]) : 0.0f;
    }
    if (epi) epi(y, p * P, P);
}

/* Max or average pooling over (N*C) planes, a row of outputs at a time so the inner loops are
 * branch-free; `mode` 0 max, 1 average over real pixels, 2 average counting pads. */
void sat_pool2d(const float *x, float *y, int64_t NC, int H, int W, int OH, int OW, int KH, int KW,
                       int sh, int sw, int ph, int pw, int pe_h, int pe_w, int dh, int dw, int mode, sat_epi epi) {
    /* Per output column: how many kernel columns fall on real pixels, and on pixels or pads. */
    int *wcount = malloc(sizeof(int) * 2 * (size_t)OW);
    for (int ow = 0; ow < OW; ow++) {
        wcount[ow] = wcount[OW + ow] = 0;
        for (int kw = 0; kw < KW; kw++) {
            const int iw = ow * sw - pw + kw * dw;
            wcount[ow] += iw >= 0 && iw < W;
            wcount[OW + ow] += iw >= -pw && iw < W + pe_w;
        }
    }
    sat_pool_args a = {x, y, H, W, OH, OW, KH, KW, sh, sw, ph, pw, pe_h, pe_w, dh, dw, mode, wcount, epi};
    sat_parallel(NC, sat_pool_plane, &a);
    free(wcount);
}

/* Planes [i per, (i + 1) per): each summed in SAT_VL float lanes, the lanes added in double. */
void sat_gap_item(void *ctx, int64_t item, int tid) {
    const sat_gap_args *a = ctx;
    const int64_t P = a->P, p1 = (item + 1) * a->per < a->planes ? (item + 1) * a->per : a->planes;
    (void)tid;
    for (int64_t p = item * a->per; p < p1; p++) {
        const float *xi = a->x + p * P;
        sat_vf acc = {0};
        int64_t i = 0;
        for (; i + SAT_VL <= P; i += SAT_VL) acc += sat_vload(xi + i);
        double s = 0.0;
        for (int l = 0; l < SAT_VL; l++) s += (double)acc[l];
        for (; i < P; i++) s += xi[i];
        a->y[p] = (float)(s / (double)P);
    }
}

/* Mean over each of N*C planes of P elements; the epilogue runs over the C channels of one image. */
void sat_global_avgpool(const float *x, float *y, int64_t N, int64_t C, int64_t P, sat_epi epi) {
    const int64_t per = P >= 4096 ? 1 : 4096 / (P > 0 ? P : 1);
    sat_gap_args a = {x, y, N * C, P, per};
    sat_parallel((N * C + per - 1) / per, sat_gap_item, &a);
    if (epi)
        for (int64_t n = 0; n < N; n++) epi(y, n * C, C);
}

/* Copy `outer` blocks of `inner` floats from x into y with row pitch `pitch` (one Concat input). */
void sat_copy_blocks(const float *x, float *y, int64_t outer, int64_t inner, int64_t pitch) {
    for (int64_t o = 0; o < outer; o++) memcpy(y + o * pitch, x + o * inner, sizeof(float) * inner);
}

/* Weights of SAT_HUGE_MIN to SAT_HUGE_MAX bytes are copied into memory of 2 MB pages (transparent huge pages,
 * asked for with madvise): a model's weights stream from memory on every run (100 MB for ResNet-50), and on
 * 4 KB pages of the file mapping every 4 KB of that stream took a TLB miss and stopped the hardware
 * prefetcher. `bench/backend_speed.py --avx2-only`, 1 thread, two A/B rounds on the Xeon (family 6 model 167):
 * ResNet-50 21.7, 23.4 -> 20.2, 21.1 ms (C/ORT 0.96, 0.94 -> 0.90, 0.89), ResNet-18 9.5, 9.1 -> 8.1, 8.2 ms, the
 * 16-token encoder 8.0, 8.5 -> 7.5, 7.4 ms; chains of ResNet-50's 3x3 convs of 512 channels on 3x3 maps 0.72-0.79
 * -> 0.67-0.68 ms each. The copy
 * is the process's own; larger weights (models of several GB) stay a shared mapping of the file. The copy
 * starts SAT_HUGE_HEAD bytes into its region, so sat_release_weights tells it from a page-aligned mapping. */
#define SAT_HUGE_PAGE ((size_t)2 << 20)
#define SAT_HUGE_MIN SAT_HUGE_PAGE
#define SAT_HUGE_MAX ((size_t)1 << 30)
#define SAT_HUGE_HEAD 64

static size_t sat_huge_len(size_t bytes) {
    return (bytes + SAT_HUGE_HEAD + SAT_HUGE_PAGE - 1) / SAT_HUGE_PAGE * SAT_HUGE_PAGE;
}

/* `len` (a multiple of SAT_HUGE_PAGE) bytes of zeros, 2 MB-aligned, asked for on 2 MB pages before their first
 * touch (pages faulted in as 4 KB ones stay so until khugepaged merges them); NULL if the map fails. */
static char *sat_huge_region(size_t len) {
    char *r = mmap(NULL, len + SAT_HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return NULL;
    /* the region's 2 MB-aligned part; the pieces before and after go back */
    char *a = (char *)(((uintptr_t)r + SAT_HUGE_PAGE - 1) / SAT_HUGE_PAGE * SAT_HUGE_PAGE);
    if (a > r) munmap(r, (size_t)(a - r));
    munmap(a + len, (size_t)(r + len + SAT_HUGE_PAGE - (a + len)));
#ifdef MADV_HUGEPAGE
    madvise(a, len, MADV_HUGEPAGE);
#endif
    return a;
}

/* The file's bytes in memory of 2 MB pages (see above), or NULL (then the mapping stays). */
static float *sat_huge_copy(const float *w, size_t bytes) {
    const size_t len = sat_huge_len(bytes);
    char *a = sat_huge_region(len);
    if (!a) return NULL;
    memcpy(a + SAT_HUGE_HEAD, w, bytes);
    mprotect(a, len, PROT_READ);
    return (float *)(a + SAT_HUGE_HEAD);
}

/* A model's workspace (sat_api.h's sat_workspace_alloc): every intermediate value lives in it (6.9 MB for
 * ResNet-50 at 224x224), each tensor written and read once per run, between the weights' 100 MB passing
 * through the caches; on 4 KB pages its large maps ran slower. ResNet-50 at 224x224, AVX2 build (AVX-512 hidden), 1 thread, per-step medians on
 * the Xeon (family 6 model 167), three rounds each: MaxPool 0.39-0.42 -> 0.28-0.30 ms, the stem 3.02-3.34 ->
 * 2.91-3.06; the steps in all moved less than the machine's noise.
 * Below 2 MB the workspace keeps 4 KB pages (a huge page would mostly hold nothing). */
static size_t sat_workspace_len(int64_t bytes) {
    const size_t b = (size_t)(bytes > 64 ? bytes : 64);
    return b >= SAT_HUGE_PAGE ? (b + SAT_HUGE_PAGE - 1) / SAT_HUGE_PAGE * SAT_HUGE_PAGE : (b + 4095) / 4096 * 4096;
}

float *sat_workspace_map(int64_t bytes) {
    const size_t len = sat_workspace_len(bytes);
    if (len >= SAT_HUGE_PAGE) return (float *)sat_huge_region(len);
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return m == MAP_FAILED ? NULL : m;
}

void sat_workspace_unmap(float *ws, int64_t bytes) {
    if (ws) munmap(ws, sat_workspace_len(bytes));
}

/* Map the weights file read-only (page-aligned, so 64-byte aligned) and, within the sizes above, copy it onto
 * huge pages; else no heap copy, and every process running the model shares one copy in the page cache. It
 * must be a regular file of exactly `nfloats` floats. Its pages are faulted in here, so the first run does not
 * pay for them. */
float *sat_read_weights(const char *path, int64_t nfloats) {
    static float none[16] __attribute__((aligned(64)));
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat st;
    float *w = NULL;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (int64_t)st.st_size == nfloats * 4) {
        int flags = MAP_PRIVATE;
#ifdef MAP_POPULATE
        flags |= MAP_POPULATE;
#endif
        void *m = nfloats ? mmap(NULL, (size_t)st.st_size, PROT_READ, flags, fd, 0) : (void *)none;
        w = m == MAP_FAILED ? NULL : m;
        if (w && (size_t)st.st_size >= SAT_HUGE_MIN && (size_t)st.st_size <= SAT_HUGE_MAX) {
            float *h = sat_huge_copy(w, (size_t)st.st_size);
            if (h) munmap(w, (size_t)st.st_size), w = h;
        }
    }
    close(fd);
    return w;
}

/* Unmap what sat_read_weights mapped. */
void sat_release_weights(const float *w, int64_t nfloats) {
    if (!w || !nfloats) return;
    if ((uintptr_t)w % 4096 == SAT_HUGE_HEAD) /* a huge-page copy (sat_huge_copy) */
        munmap((char *)w - SAT_HUGE_HEAD, sat_huge_len((size_t)nfloats * 4));
    else
        munmap((void *)w, (size_t)(nfloats * 4));
}
