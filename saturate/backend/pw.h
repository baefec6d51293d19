/* C backend 1x1 convs with pixel panels outer (sat_conv_pw): the AVX-512 build on gemm.h's 8 x 32 tile, the AVX2
 * build on pgemm.h's 6 x 16 tile. */
#ifndef SATURATE_PW_H
#define SATURATE_PW_H

#if defined(SAT_HAVE_PACKED_GEMM)
#define SAT_HAVE_PW 1
/* a tile's rows (channels), its columns (a pixel panel), the reduction block */
#define SAT_PW_MR SAT_MR
#define SAT_PW_NR SAT_NR
#define SAT_PW_KC SAT_KC
typedef sat_epr sat_pw_epi;
#define SAT_PW_KERNEL sat_kernel_8x32_epr
/* weight panel i's block k0 (kc deep): gemm.h's blocks of 8-row panels */
#define SAT_PW_WEIGHTS(a, i, k0, kc) ((a)->wp + (int64_t)(k0) * (a)->Mp + (int64_t)(i) * (kc))
#elif defined(SAT_HAVE_DWT) && SAT_VL == 8
#define SAT_HAVE_PW 1
#define SAT_PW_MR SAT_PR
#define SAT_PW_NR 16
#define SAT_PW_KC SAT_PKC
typedef sat_epr8 sat_pw_epi;
#define SAT_PW_KERNEL sat_ukr_epr
/* weight panel i's block k0: pgemm.h's panels over all K */
#define SAT_PW_WEIGHTS(a, i, k0, kc) ((a)->wp + (int64_t)(i) * (a)->K + (int64_t)(k0) * SAT_PR)
#endif

#ifdef SAT_HAVE_PW
/* Most packed weight floats a unit runs (Mp x K): pixel panels outer read all of its weights from L2 for every
 * pixel panel. Larger weights are split into channel blocks of at most this many, blocks outermost. */
#define SAT_PW_MAXW 131072

/* A 1x1 conv without padding (N x K x H x W input, M x K weights packed for the build's tile: gemm.h's A, or
 * pgemm.h's SAT_PR-row panels) on the tile, pixel panels outer: each SAT_PW_NR-pixel panel of the output takes
 * its input panel a reduction block at a time, read in place from an input stored in pixel panels (`xpan`:
 * image n's pixel p, channel k at ((n * Qin + p / NR) * K + k) * NR + p % NR, see plan.panel_roots) or packed
 * into the thread's buffer from N x K x H x W planes, or gathered (a strided conv, from pixel panels). The panel
 * stays in L1 while every channel panel of the weights passes it, and each tile takes the epilogue in registers
 * as it is stored, into N x M x OH x OW or pixel panels (`ypan`). A unit is a run of `chunk` pixel panels of
 * one image times the channels [mpart * mchunk, ...), the channel parts outermost (so a thread's run of units keeps
 * one block of weights in L2). */
typedef struct {
    const float *x, *wp;
    float *y;
    int64_t P; /* output pixels */
    int N, K, M, Mp, acc, chunk, pchunks, mchunk, mparts, H, W, OW, sh, sw, xpan, ypan;
} sat_pw_args;

extern float sat_pw_pack[SAT_MAX_THREADS][SAT_PW_KC * SAT_PW_NR] __attribute__((aligned(64)));

/* Rows [k0, k0 + kc) of output panel q's input pixels gathered from pixel panels (a strided conv's). */
static inline void sat_pw_gather(const sat_pw_args *a, const float *xn, int64_t q, int nr, int k0, int kc, float *bp) {
    int32_t idx[SAT_PW_NR];
    for (int c = 0; c < SAT_PW_NR; c++) {
        const int64_t p = q * SAT_PW_NR + (c < nr ? c : 0), ip = p / a->OW * a->sh * a->W + p % a->OW * a->sw;
        idx[c] = (int32_t)sat_panel_at(ip, a->K, SAT_PW_NR);
    }
    const float *src = xn + (int64_t)k0 * SAT_PW_NR;
#ifdef SAT_HAVE_PACKED_GEMM
    const __m512i i0 = _mm512_loadu_si512(idx), i1 = _mm512_loadu_si512(idx + 16);
    for (int k = 0; k < kc; k++, src += SAT_PW_NR) {
        _mm512_store_ps(bp + k * SAT_PW_NR, _mm512_i32gather_ps(i0, src, 4));
        _mm512_store_ps(bp + k * SAT_PW_NR + 16, _mm512_i32gather_ps(i1, src, 4));
    }
#else
    const __m256i i0 = _mm256_loadu_si256((const __m256i *)idx), i1 = _mm256_loadu_si256((const __m256i *)(idx + 8));
    for (int k = 0; k < kc; k++, src += SAT_PW_NR) {
        _mm256_store_ps(bp + k * SAT_PW_NR, _mm256_i32gather_ps(src, i0, 4));
        _mm256_store_ps(bp + k * SAT_PW_NR + 8, _mm256_i32gather_ps(src, i1, 4));
    }
#endif
}

/* Rows [k0, k0 + kc) of pixels [j0, j0 + nr) of N x K x H x W planes P apart, as a panel zero past nr. */
static inline void sat_pw_pack_planes(const float *xn, int64_t P, int k0, int kc, int64_t j0, int nr, float *bp) {
#ifdef SAT_HAVE_PACKED_GEMM
    sat_pack_b(xn, P, k0, kc, j0, nr, bp);
#else
    const float *src = xn + (int64_t)k0 * P + j0;
    if (nr == SAT_PW_NR)
        for (int k = 0; k < kc; k++, src += P) {
            _mm256_store_ps(bp + k * SAT_PW_NR, _mm256_loadu_ps(src));
            _mm256_store_ps(bp + k * SAT_PW_NR + 8, _mm256_loadu_ps(src + 8));
        }
    else
        for (int k = 0; k < kc; k++, src += P)
            for (int c = 0; c < SAT_PW_NR; c++) bp[k * SAT_PW_NR + c] = c < nr ? src[c] : 0.0f;
#endif
}

static inline __attribute__((always_inline)) void sat_pw_unit(void *ctx, int64_t u, int tid, sat_pw_epi epr) {
    const sat_pw_args *a = ctx;
    const int64_t P = a->P, Q = (P + SAT_PW_NR - 1) / SAT_PW_NR, Pin = (int64_t)a->H * a->W;
    const int64_t Qin = (Pin + SAT_PW_NR - 1) / SAT_PW_NR;
    const int64_t images = (int64_t)a->N * a->pchunks, n = u % images / a->pchunks;
    const int mpart = (int)(u / images), pc = (int)(u % a->pchunks);
    const int m0 = mpart * a->mchunk, m1 = m0 + a->mchunk < a->M ? m0 + a->mchunk : a->M;
    const int64_t q0 = (int64_t)pc * a->chunk, q1 = q0 + a->chunk < Q ? q0 + a->chunk : Q;
    const int strided = a->sh != 1 || a->sw != 1;
    const float *xn = a->x + n * a->K * (a->xpan ? Qin * SAT_PW_NR : Pin);
    const int64_t ldc = a->ypan ? SAT_PW_NR : P;
    float *bp = sat_pw_pack[tid];
    for (int64_t q = q0; q < q1; q++) {
        const int nr = P - q * SAT_PW_NR < SAT_PW_NR ? (int)(P - q * SAT_PW_NR) : SAT_PW_NR;
        for (int k0 = 0; k0 < a->K; k0 += SAT_PW_KC) {
            const int kc = a->K - k0 < SAT_PW_KC ? a->K - k0 : SAT_PW_KC;
            const float *b = bp;
            if (strided)
                sat_pw_gather(a, xn, q, nr, k0, kc, bp);
            else if (a->xpan)
                b = xn + (q * a->K + k0) * SAT_PW_NR;
            else
                sat_pw_pack_planes(xn, P, k0, kc, q * SAT_PW_NR, nr, bp);
            for (int i = m0; i < m1; i += SAT_PW_MR) {
                const int mr = m1 - i < SAT_PW_MR ? m1 - i : SAT_PW_MR, acc = k0 > 0 || a->acc;
                const int64_t off = a->ypan ? ((n * Q + q) * a->M + i) * SAT_PW_NR : (n * a->M + i) * P + q * SAT_PW_NR;
                const float *w = SAT_PW_WEIGHTS(a, i, k0, kc);
                /* (two calls, so the last block's sees its epilogue as a constant and inlines it) */
                if (k0 + kc == a->K)
                    SAT_PW_KERNEL(kc, w, b, a->y + off, ldc, acc, mr, nr, epr, n * a->M + i, off);
                else
                    SAT_PW_KERNEL(kc, w, b, a->y + off, ldc, acc, mr, nr, NULL, 0, 0);
            }
        }
    }
}

void sat_conv_pw(const float *x, const float *wp, float *y, int N, int K, int M, int H, int W, int OH, int OW, int sh,
                 int sw, int acc, int xpan, int ypan, sat_body unit);
#endif

#endif
