/* C backend direct convolution on AVX2 (builds without AVX-512): dconv.h's im2col-free conv on a tile sized
 * for 16 ymm registers. Output pixels take the tile's 6 rows, output channels its 16 columns (twelve
 * accumulators, two weight loads and six broadcasts per reduction step); each reduction index k = (c, kh, kw)
 * is one offset into the (zero-padded) input, so a row's operand is a broadcast from `x_r + koff[k]` for any
 * stride or dilation, and no unit unfolds or packs an input tile (im2col and pgemm.h's packing write K floats
 * per pixel before any product; plan.direct_avx2 says which convs gain). Weights are packed by the emitter
 * in 16-channel panels, k-major over the whole K (panel j of group g at wp + g*wp_group +
 * j*K*16, element (k, c) at [k*16 + c]). The driver is dconv.c's sat_conv_direct; a unit's sums are
 * transposed in registers and stored 6 pixels of a channel at a time, the 8-channel epilogue (vec.h's
 * sat_epc8) applied before the transpose. */
#ifndef SATURATE_DCONV8_H
#define SATURATE_DCONV8_H

#if defined(__AVX2__) && !defined(__AVX512F__)

/* Pixels and channels of the tile. */
#define SAT_D8R 6
#define SAT_D8N 16

extern float sat_dconv8_acc[SAT_MAX_THREADS][SAT_DCHUNK * SAT_D8R * SAT_D8N] __attribute__((aligned(64)));

#define SAT_D8ROW(r)                                             \
    do {                                                         \
        const __m256 a_ = _mm256_broadcast_ss(x##r + o);         \
        c##r##0 = _mm256_fmadd_ps(a_, b0, c##r##0);              \
        c##r##1 = _mm256_fmadd_ps(a_, b1, c##r##1);              \
    } while (0)
/* A panel of at most 8 channels (the last of 40, 72 or 120): the upper half's products are not needed. */
#define SAT_D8ROWH(r)                                            \
    do {                                                         \
        const __m256 a_ = _mm256_broadcast_ss(x##r + o);         \
        c##r##0 = _mm256_fmadd_ps(a_, b0, c##r##0);              \
        (void)b1;                                                \
    } while (0)
#define SAT_D8ROWS6 SAT_D8ROW(0); SAT_D8ROW(1); SAT_D8ROW(2); SAT_D8ROW(3); SAT_D8ROW(4); SAT_D8ROW(5)
#define SAT_D8ROWS4 SAT_D8ROW(0); SAT_D8ROW(1); SAT_D8ROW(2); SAT_D8ROW(3)
#define SAT_D8ROWS2 SAT_D8ROW(0); SAT_D8ROW(1)
#define SAT_D8ROWS1 SAT_D8ROW(0)
#define SAT_D8ROWS6H SAT_D8ROWH(0); SAT_D8ROWH(1); SAT_D8ROWH(2); SAT_D8ROWH(3); SAT_D8ROWH(4); SAT_D8ROWH(5)
#define SAT_D8ROWS4H SAT_D8ROWH(0); SAT_D8ROWH(1); SAT_D8ROWH(2); SAT_D8ROWH(3)
#define SAT_D8ROWS2H SAT_D8ROWH(0); SAT_D8ROWH(1)
#define SAT_D8ROWS1H SAT_D8ROWH(0)
#define SAT_D8LOOP(ROWS, PF)                                                       \
    for (int k = 0; k < K; k++) {                                                  \
        const int64_t o = koff[k];                                                 \
        const __m256 b0 = _mm256_loadu_ps(w), b1 = _mm256_loadu_ps(w + 8);         \
        ROWS;                                                                      \
        PF;                                                                        \
        w += SAT_D8N;                                                              \
    }
/* Iteration k fetches weight row (k * pfr) >> 16 of this tile's slice of a block two ahead (one 64-byte
 * line: a row is 16 floats), as dconv.h's tiles do, but into L2 (prefetcht1): into L1 kept too few lines in
 * flight for weights that come from DRAM (see pgemm.h's SAT_SP_AHEAD). ResNet-50's 3x3 convs of 512 channels
 * on 3x3 maps (9.4 MB each), avx2 build on the Zen 4, 1 thread: 0.65 -> 0.51 ms each. */
#define SAT_D8PF _mm_prefetch((const char *)(pf + SAT_D8N * ((k * pfr) >> 16)), _MM_HINT_T1)
#define SAT_D8RUN(ROWS) if (pf) { SAT_D8LOOP(ROWS, SAT_D8PF) } else { SAT_D8LOOP(ROWS, (void)0) }
#define SAT_D8RUN_ROWS(S)                         \
    if (rows == 6) {                              \
        SAT_D8RUN(SAT_D8ROWS6##S)                 \
    } else if (rows == 4) {                       \
        SAT_D8RUN(SAT_D8ROWS4##S)                 \
    } else if (rows == 2) {                       \
        SAT_D8RUN(SAT_D8ROWS2##S)                 \
    } else {                                      \
        SAT_D8RUN(SAT_D8ROWS1##S)                 \
    }

/* Channels ch0 .. ch0+7 of the tile (rows r0..r5: its pixels) to their planes: transposed in registers (two
 * zero rows pad the 8 x 8 transpose), then `mr` consecutive pixels of each of the first `nc` channels. */
static inline __attribute__((always_inline)) void sat_d8_put(__m256 r0, __m256 r1, __m256 r2, __m256 r3, __m256 r4,
                                                             __m256 r5, float *y, int64_t off0, int64_t P, int mr,
                                                             int nc) {
    __m256 r6 = _mm256_setzero_ps(), r7 = r6;
    SAT_T8x8(r0, r1, r2, r3, r4, r5, r6, r7);
    const __m256 t[8] = {r0, r1, r2, r3, r4, r5, r6, r7};
    if (mr == SAT_D8R) {
        for (int c = 0; c < 8 && c < nc; c++) {
            float *d = y + off0 + c * P;
            _mm_storeu_ps(d, _mm256_castps256_ps128(t[c]));
            _mm_storel_pi((__m64 *)(d + 4), _mm256_extractf128_ps(t[c], 1));
        }
        return;
    }
    const __m256i m = sat_mask8(mr);
    for (int c = 0; c < 8 && c < nc; c++) _mm256_maskstore_ps(y + off0 + c * P, m, t[c]);
}

/* One 6 (or fewer) pixel x 16 channel tile over a block of K; `cin` / `cout` carry the partial sums of the
 * blocks before and after (NULL at the first and last), `pf` is a weight block two ahead, fetched meanwhile.
 * `xr` are the rows' input origins, `mr` the pixels stored, `nr` the channels stored, `off0` the flat output
 * index of (channel 0, first pixel), `plane` the plane of channel 0 (the epilogue's q). */
static inline __attribute__((always_inline)) void sat_dconv8_tile(int rows, int K, const int32_t *restrict koff,
                                                                  const float *const *xr, const float *restrict w,
                                                                  float *y, int64_t off0, int64_t P, int mr, int nr,
                                                                  const float *cin, float *cout, const float *pf,
                                                                  int pfr, int64_t plane, sat_epc8 epc) {
    const float *x0 = xr[0], *x1 = xr[1], *x2 = xr[2], *x3 = xr[3], *x4 = xr[4], *x5 = xr[5];
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
           c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#define SAT_D8LOAD(r) c##r##0 = _mm256_load_ps(cin + r * 16), c##r##1 = _mm256_load_ps(cin + r * 16 + 8)
#define SAT_D8SAVE(r) _mm256_store_ps(cout + r * 16, c##r##0), _mm256_store_ps(cout + r * 16 + 8, c##r##1)
    if (cin) {
        SAT_D8LOAD(0); SAT_D8LOAD(1); SAT_D8LOAD(2); SAT_D8LOAD(3); SAT_D8LOAD(4); SAT_D8LOAD(5);
    }
    if (nr > 8) {
        SAT_D8RUN_ROWS()
    } else {
        SAT_D8RUN_ROWS(H)
    }
    if (cout) {
        SAT_D8SAVE(0); SAT_D8SAVE(1); SAT_D8SAVE(2); SAT_D8SAVE(3); SAT_D8SAVE(4); SAT_D8SAVE(5);
        return;
    }
    if (epc) {
        /* per-channel steps (bias, batch norm, relu...) before the transpose: one operand load per 8
         * channels for all the tile's pixels */
        const __m256i m0 = sat_mask8(nr), m1 = sat_mask8(nr - 8);
#define SAT_D8EPC(r) c##r##0 = epc(c##r##0, plane, m0), c##r##1 = epc(c##r##1, plane + 8, m1)
        SAT_D8EPC(0); SAT_D8EPC(1); SAT_D8EPC(2); SAT_D8EPC(3); SAT_D8EPC(4); SAT_D8EPC(5);
    }
    sat_d8_put(c00, c10, c20, c30, c40, c50, y, off0, P, mr, nr);
    if (nr > 8) sat_d8_put(c01, c11, c21, c31, c41, c51, y, off0 + 8 * P, P, mr, nr - 8);
}

/* Work unit u of one (image, group): a chunk of 6-pixel panels times one 16-channel weight panel, K in
 * blocks of a->kc (a block of the weight panel, 16 KB at 256, stays in L1 across the chunk's panels; each panel's
 * partial sums wait in this thread's buffer between blocks). Instantiated per conv by the emitter with its
 * 8-channel epilogue (or NULL: then the scalar one runs on the unit's outputs at its end). */
static inline __attribute__((always_inline)) void sat_dconv8_unit(void *ctx, int64_t u, int tid, sat_epc8 epc) {
    const sat_dconv_args *a = ctx;
    const int j = (int)(u % a->jpanels), c = (int)(u / a->jpanels);
    const int R = SAT_D8R, OW = a->OW;
    const int64_t P = a->P;
    const int nr = a->Mg - j * SAT_D8N < SAT_D8N ? a->Mg - j * SAT_D8N : SAT_D8N;
    const float *w = a->wp + (int64_t)j * a->K * SAT_D8N;
    const int q0 = c * a->chunk, q1 = q0 + a->chunk < a->panels ? q0 + a->chunk : a->panels;
    float *acc = sat_dconv8_acc[tid];
    const int DKC = a->kc;
    for (int k0 = 0; k0 < a->K; k0 += DKC) {
        const int kc = a->K - k0 < DKC ? a->K - k0 : DKC;
        const int last = k0 + kc >= a->K;
        for (int q = q0; q < q1; q++) {
            const int64_t p0 = (int64_t)q * R;
            const int mr = P - p0 < R ? (int)(P - p0) : R;
            const float *xr[SAT_D8R] = {a->x};
            int64_t oh = p0 / OW, ow = p0 - oh * OW;
            for (int r = 0; r < mr; r++) {
                xr[r] = a->x + oh * a->sh * a->Wp + ow * a->sw;
                if (++ow == OW) ow = 0, oh++;
            }
            for (int r = mr; r < SAT_D8R; r++) xr[r] = xr[0];
            /* a last, short panel runs only the rows it needs (of 1, 2, 4): rows not run keep zero sums,
             * which the stores skip */
            const int rows = mr == R ? R : mr <= 1 ? 1 : mr <= 2 ? 2 : mr <= 4 ? 4 : R;
            float *buf = acc + (int64_t)(q - q0) * SAT_D8R * SAT_D8N;
            /* the chunk's panels share the fetching of the block two ahead, each a slice over its k loop */
            const int64_t pf4 = (int64_t)(q1 - q0 < 4 ? q1 - q0 : 4) * R, rest = P - (int64_t)q0 * R;
            const int64_t pn = rest < pf4 ? rest : pf4, e0 = p0 - (int64_t)q0 * R, e1 = e0 + mr;
            const int s0 = e0 < pn ? (int)(e0 * kc / pn) : kc, s1 = e1 < pn ? (int)(e1 * kc / pn) : kc;
            /* the output lines after this tile's (16 pixels on) fetched while it runs, as pgemm.h's in-place
             * tiles do: ResNet-50's stem (3.2 MB of output, written an inference ago), AVX2 build on the Xeon
             * (family 6 model 167), 1 thread, per-step medians of three rounds: 2.87 -> 2.77 ms */
            if (last && p0 + 16 < P)
                for (int ch = 0; ch < nr; ch++)
                    __builtin_prefetch(a->y + a->ybase + (int64_t)(j * SAT_D8N + ch) * P + p0 + 16, 1, 3);
            sat_dconv8_tile(rows, kc, a->koff + k0, xr, w + (int64_t)k0 * SAT_D8N, a->y,
                            a->ybase + (int64_t)j * SAT_D8N * P + p0, P, mr, nr, k0 ? buf : NULL, last ? NULL : buf,
                            s1 > s0 ? w + (int64_t)(k0 + kc + DKC + s0) * SAT_D8N : NULL, ((s1 - s0) << 16) / kc,
                            a->ybase / P + j * SAT_D8N, epc);
        }
    }
    if (!epc && a->epi) {
        const int64_t p0 = (int64_t)q0 * R, p1 = (int64_t)q1 * R < P ? (int64_t)q1 * R : P;
        for (int m = 0; m < nr; m++) a->epi(a->y, a->ybase + (int64_t)(j * SAT_D8N + m) * P + p0, p1 - p0);
    }
}

void sat_dconv8_plain(void *ctx, int64_t u, int tid);

#endif

#endif
