/* C backend packed convolution for builds without the AVX-512 micro-kernel (AVX2, portable): every conv
 * with constant weights (not depthwise) is one product on operands packed for a register tile of SAT_PR
 * rows by SAT_PN = 2 SAT_VL columns (6 x 16 on AVX2: twelve accumulators, two loads of B and six
 * broadcasts of A per reduction step). The emitter packs the weights once, so no call repacks them (a
 * general sgemm packs its A on every call, which on the deep layers' few pixels costs as much as the
 * product); the unit packs its input tile (im2col) straight into panels.
 *
 * Two orientations, chosen by the emitter (emit.conv_layout) from how well the output fills the tile:
 *  - usual, Y = W X: weights in SAT_PR-channel panels take the tile's rows, pixels its SAT_PN columns;
 *  - transposed, Y^T = X^T W^T: pixels take the rows, channels in SAT_PN-channel panels the columns, for
 *    outputs of few pixels (a 3x3 or 6x6 map fills 6 rows far better than 16 columns).
 * Weights of one group: panel p holds its rows (channels) p*w .. p*w+w-1 k-major, element (k, r) at
 * [p*K*w + k*w + r], w the panel width (SAT_PR or SAT_PN), rows past the group's channels zero. */
#ifndef SATURATE_PGEMM_H
#define SATURATE_PGEMM_H

#define SAT_PR 6
#define SAT_PN (2 * SAT_VL)

/* Reduction steps per pass over a tile: a 16-channel (or 16-pixel) panel's slice, kc x SAT_PN floats
 * (16 KB on AVX2), stays in L1 while the other side's panels pass it, so a long reduction (4608 for a
 * 3x3 conv of 512 channels) reads each weight from memory once and from L1 after. */
#define SAT_PKC 256
/* Weights of a usual conv product's channel block (sat_pconv_run), bytes: the block stays in L2 while the tile's
 * pixel panels pass it. */
#define SAT_PMB_BYTES (512 * 1024)
/* B panels per block of a product with B packed (sat_gemm_packed): for each SAT_PKC-step slice, a row tile's
 * six rows of A (6 KB) stay in L1 while the block's panels (128 KB on AVX2) pass them from L2, each row tile
 * in turn. One panel against every row tile before the next panel (the order before) read all of A from L2
 * for every panel. 512 x 1536 x 384 (a BERT feed-forward's second product), 1 thread, medians of 3 runs
 * interleaved on a Xeon (family 6 model 167): AVX2 build 9.03 -> 7.60 ms (ONNX Runtime's AVX2 kernels 7.41),
 * AVX-512 build 6.41 -> 5.38 (ORT 5.18); 512 x 384 x 1536 8.47 -> 8.13 and 6.18 -> 5.70; products of 128
 * rows or of 384 columns level. Only the first row tile fetches B into L2 ahead (`far`, SAT_PANEL_LOAD):
 * the others find the block there, and the fetches cost them 2-10% (same runs: 7.86 -> 7.07 ms on AVX2,
 * 5.61 -> 5.23 on AVX-512; 512 x 384 x 1536 8.03 -> 7.45 and 5.94 -> 5.80). A product of fewer rows than
 * SAT_PNB_FAR_ROWS streams its B from memory (a 16-token encoder's 57 MB of weights): there every tile
 * fetches, as the lines in flight set its pace (encoder-ts, AVX-512 build, 1 thread: 7.1-7.4 ms with the
 * first tile alone fetching, 6.6-7.0 with all). */
#define SAT_PNB 8
#define SAT_PNB_FAR_ROWS 32
/* Reduction steps the B panel is fetched ahead (one 64-byte line per step on AVX2): a transposed product's
 * weight panel streams from memory once, and the prefetcher alone left the 3x3 convs of 512 channels
 * about 20% slower than the dot products. */
#define SAT_PK_AHEAD 16

/* Row r of the tile's accumulators (c<r>0, c<r>1) to dst + r * pitch, added to what is there
 * when acc; SAT_TILE_STORE writes all six rows. Both micro-kernels end with it. */
#define SAT_TILE_ROW(dst, pitch, acc, r)                                                           \
    do {                                                                                           \
        float *row_ = (dst) + (r) * (pitch);                                                       \
        if (acc) c##r##0 += sat_vload(row_), c##r##1 += sat_vload(row_ + SAT_VL);                  \
        sat_vstore(row_, c##r##0), sat_vstore(row_ + SAT_VL, c##r##1);                             \
    } while (0)
#define SAT_TILE_STORE(dst, pitch, acc)                                                            \
    do {                                                                                           \
        SAT_TILE_ROW(dst, pitch, acc, 0); SAT_TILE_ROW(dst, pitch, acc, 1);                        \
        SAT_TILE_ROW(dst, pitch, acc, 2); SAT_TILE_ROW(dst, pitch, acc, 3);                        \
        SAT_TILE_ROW(dst, pitch, acc, 4); SAT_TILE_ROW(dst, pitch, acc, 5);                        \
    } while (0)

/* The tile's accumulators into the mr x nr corner of y (added to it with acc): whole rows of
 * vectors for a full tile, else through a buffer on the stack. */
#define SAT_TILE_STORE_PART(y, ldy, mr, nr, acc)                                                   \
    do {                                                                                           \
        if ((mr) == SAT_PR && (nr) == SAT_PN) {                                                    \
            SAT_TILE_STORE(y, ldy, acc);                                                           \
            break;                                                                                 \
        }                                                                                          \
        float t_[SAT_PR][SAT_PN];                                                                  \
        sat_vstore(t_[0], c00), sat_vstore(t_[0] + SAT_VL, c01);                                   \
        sat_vstore(t_[1], c10), sat_vstore(t_[1] + SAT_VL, c11);                                   \
        sat_vstore(t_[2], c20), sat_vstore(t_[2] + SAT_VL, c21);                                   \
        sat_vstore(t_[3], c30), sat_vstore(t_[3] + SAT_VL, c31);                                   \
        sat_vstore(t_[4], c40), sat_vstore(t_[4] + SAT_VL, c41);                                   \
        sat_vstore(t_[5], c50), sat_vstore(t_[5] + SAT_VL, c51);                                   \
        for (int r_ = 0; r_ < (mr); r_++) {                                                        \
            float *yr_ = (y) + (int64_t)r_ * (ldy);                                                \
            if (acc)                                                                               \
                for (int c_ = 0; c_ < (nr); c_++) yr_[c_] += t_[r_][c_];                           \
            else                                                                                   \
                memcpy(yr_, t_[r_], sizeof(float) * (size_t)(nr));                                 \
        }                                                                                          \
    } while (0)

/* A reduction step's row of the B panel in b0, b1, and the row SAT_PK_AHEAD steps on fetched ahead (a row
 * of 16-lane vectors spans two cache lines: both are fetched). Every micro-kernel below starts its step so. */
#if SAT_PN > 16
/* and the two lines SAT_PK_FAR floats on into L2, as the AVX2 tile below does: a transformer encoder of 16
 * tokens streams its 57 MB of weights from memory every inference (1 thread, interleaved with ONNX Runtime,
 * two pairs of runs under load: C/ORT 1.02, 0.96 -> 0.92, 0.93 and 1.01, 1.05 -> 0.99, 0.90 on a Xeon). */
#define SAT_PK_FAR 16384
#define SAT_PANEL_PREFETCH(b) (__builtin_prefetch((b) + SAT_PK_AHEAD * SAT_PN), \
                               __builtin_prefetch((b) + SAT_PK_AHEAD * SAT_PN + 16))
#define SAT_PANEL_PREFETCH_FAR(b) (__builtin_prefetch((b) + SAT_PK_FAR, 0, 2), \
                                   __builtin_prefetch((b) + SAT_PK_FAR + 16, 0, 2))
#else
/* and a line SAT_PK_FAR floats on into L2 (prefetcht1): a weight panel read once per run comes from DRAM, and
 * the fetch 16 steps ahead into L1 alone kept too few lines in flight (see SAT_SP_AHEAD). ResNet-50 at 96x96,
 * avx2 build on the Zen 4, 1 thread, per-step medians: its 1x1 convs of 256 -> 1024 channels on 6x6 maps
 * (transposed tile) 1.45 -> 1.26 ms in all, the Winograd convs of 128 channels on 12x12 maps 0.99 -> 0.82.
 * Products whose B is in cache gain too, or lose nothing: GPT-2-style at 512 tokens, attention's batched
 * MatMuls (B packed per head) 5.0 -> 4.3 and 4.7 -> 4.2 ms, the projections 1-2%; fetching only on the first
 * pass over a B (or not at all for the per-head ones) kept them at the old times. */
#define SAT_PK_FAR 16384
#define SAT_PANEL_PREFETCH(b) __builtin_prefetch((b) + SAT_PK_AHEAD * SAT_PN)
#define SAT_PANEL_PREFETCH_FAR(b) __builtin_prefetch((b) + SAT_PK_FAR, 0, 2)
#endif
/* A conv's packed weights (the usual product's A) come from memory on the first pixel panel that passes them
 * and from L2 on the others: kernels given `far` & 2 fetch the A panel SAT_PA_FAR floats on into L2. ResNet-50
 * at 96x96, avx2 build, 1 thread, per-step medians on the Xeon (family 6 model 167): its stride-2 1x1 conv of
 * 256 -> 512 channels (im2col packed) 0.51 -> 0.455 ms, the 512 -> 128 convs read in place on 12x12 maps
 * 0.24 -> 0.21-0.22. */
#define SAT_PA_FAR 2048
/* `far` & 1: fetch B into L2 too; a kernel whose B panel another row tile has just read (in L2 now: the packed
 * products' blocks, sat_pmm_item) leaves it out, a load-port slot and a line fill a step. */
#define SAT_PANEL_LOAD(b, b0, b1, far)                                                             \
    const sat_vf b0 = sat_vload(b), b1 = sat_vload((b) + SAT_VL);                                  \
    SAT_PANEL_PREFETCH(b);                                                                         \
    if ((far) & 1) SAT_PANEL_PREFETCH_FAR(b)

/* One reduction step of the 6x16 tile: row r of the accumulators c<r>0, c<r>1 gains a[r] times
 * the 16 floats b0, b1. Both micro-kernels below run it; they differ only in where b comes from. */
#define SAT_PANEL_STEP(a, b0, b1)                                                                  \
    do {                                                                                           \
        float s_ = (a)[0];                                                                         \
        c00 += s_ * (b0), c01 += s_ * (b1);                                                        \
        s_ = (a)[1];                                                                               \
        c10 += s_ * (b0), c11 += s_ * (b1);                                                        \
        s_ = (a)[2];                                                                               \
        c20 += s_ * (b0), c21 += s_ * (b1);                                                        \
        s_ = (a)[3];                                                                               \
        c30 += s_ * (b0), c31 += s_ * (b1);                                                        \
        s_ = (a)[4];                                                                               \
        c40 += s_ * (b0), c41 += s_ * (b1);                                                        \
        s_ = (a)[5];                                                                               \
        c50 += s_ * (b0), c51 += s_ * (b1);                                                        \
    } while (0)

/* y = (acc ? y : 0) + a (kc x SAT_PR panel) * b (kc rows of SAT_PN floats, ldb apart: SAT_PN for a packed panel,
 * a 1x1 conv's pixels for its input planes read in place), its first mr rows and nr columns, row-major at pitch
 * ldy. The accumulators stay in registers through the reduction; each step fetches B's row SAT_PK_AHEAD steps
 * on, with `far` & 1 B into L2 further on, with `far` & 2 the weights SAT_PA_FAR floats on. */
static inline void sat_ukr_ld(int kc, const float *restrict a, const float *restrict b, int64_t ldb,
                              float *restrict y, int64_t ldy, int mr, int nr, int acc, int far) {
    sat_vf c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0}, c40 = {0},
           c41 = {0}, c50 = {0}, c51 = {0};
    for (int k = 0; k < kc; k++) {
        const sat_vf b0 = sat_vload(b), b1 = sat_vload(b + SAT_VL);
        __builtin_prefetch(b + SAT_PK_AHEAD * ldb);
#if SAT_PN > 16
        __builtin_prefetch(b + SAT_PK_AHEAD * ldb + 16);
#endif
        if (far & 1) SAT_PANEL_PREFETCH_FAR(b);
        if (far & 2) __builtin_prefetch(a + SAT_PA_FAR, 0, 2);
        SAT_PANEL_STEP(a, b0, b1);
        a += SAT_PR;
        b += ldb;
    }
    SAT_TILE_STORE_PART(y, ldy, mr, nr, acc);
}

/* sat_ukr_ld on a packed B panel. */
static inline void sat_ukr(int kc, const float *restrict a, const float *restrict b, float *restrict y, int64_t ldy,
                           int mr, int nr, int acc, int far) {
    sat_ukr_ld(kc, a, b, SAT_PN, y, ldy, mr, nr, acc, far);
}

/* sat_ukr with A read in place: row r of the tile at ar[r] (k-contiguous, any pitch), so a product whose A is
 * a fresh activation (attention's batched MatMuls) packs none of it; rows past mr may repeat any row. */
static inline void sat_ukr_rows(int kc, const float *const *ar, const float *restrict b, float *restrict y,
                                int64_t ldy, int mr, int nr, int acc, int far) {
    const float *a0 = ar[0], *a1 = ar[1], *a2 = ar[2], *a3 = ar[3], *a4 = ar[4], *a5 = ar[5];
    sat_vf c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0}, c40 = {0},
           c41 = {0}, c50 = {0}, c51 = {0};
    for (int k = 0; k < kc; k++) {
        SAT_PANEL_LOAD(b, b0, b1, far);
        const float a[SAT_PR] = {a0[k], a1[k], a2[k], a3[k], a4[k], a5[k]};
        SAT_PANEL_STEP(a, b0, b1);
        b += SAT_PN;
    }
    SAT_TILE_STORE_PART(y, ldy, mr, nr, acc);
}

/* sat_ukr_rows on at most 4 rows (mr <= 4; rows past mr may repeat any row): the last row tile of a product
 * whose rows are not a multiple of 6 (16 tokens: 6 + 6 + 4) computes 4 rows, not 6 of which 2 are thrown
 * away. Eight accumulators; two loads of B and four broadcasts a step. */
static inline void sat_ukr_rows4(int kc, const float *const *ar, const float *restrict b, float *restrict y,
                                 int64_t ldy, int mr, int nr, int acc, int far) {
    const float *a0 = ar[0], *a1 = ar[1], *a2 = ar[2], *a3 = ar[3];
    sat_vf c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0};
    for (int k = 0; k < kc; k++) {
        SAT_PANEL_LOAD(b, b0, b1, far);
        float s = a0[k];
        c00 += s * b0, c01 += s * b1;
        s = a1[k];
        c10 += s * b0, c11 += s * b1;
        s = a2[k];
        c20 += s * b0, c21 += s * b1;
        s = a3[k];
        c30 += s * b0, c31 += s * b1;
        b += SAT_PN;
    }
    float t[4][SAT_PN];
    sat_vstore(t[0], c00), sat_vstore(t[0] + SAT_VL, c01);
    sat_vstore(t[1], c10), sat_vstore(t[1] + SAT_VL, c11);
    sat_vstore(t[2], c20), sat_vstore(t[2] + SAT_VL, c21);
    sat_vstore(t[3], c30), sat_vstore(t[3] + SAT_VL, c31);
    for (int r = 0; r < mr; r++) {
        float *yr = y + (int64_t)r * ldy;
        if (acc)
            for (int c = 0; c < nr; c++) yr[c] += t[r][c];
        else
            memcpy(yr, t[r], sizeof(float) * (size_t)nr);
    }
}

#if defined(SAT_HAVE_DWT) && SAT_VL == 8
/* A 1x1 conv's epilogue on 8 outputs of one channel: plane q (image * channels + channel), flat output index
 * `off` of the first lane, lanes `mk` (vector_form's AVX2 row form, instantiated per conv by the emitter). */
typedef __m256 (*sat_epr8)(__m256 v, int64_t q, int64_t off, __m256i mk);

#define SAT_STORE_EPR8(r)                                                                                  \
    if (r < mr) {                                                                                          \
        float *cr = y + (int64_t)r * ldy;                                                                  \
        __m256 v0 = c##r##0, v1 = c##r##1;                                                                 \
        if (acc) {                                                                                         \
            v0 = _mm256_add_ps(v0, full ? _mm256_loadu_ps(cr) : _mm256_maskload_ps(cr, m0));               \
            v1 = _mm256_add_ps(v1, full ? _mm256_loadu_ps(cr + 8) : _mm256_maskload_ps(cr + 8, m1));       \
        }                                                                                                  \
        if (epr) {                                                                                         \
            v0 = epr(v0, q + r, off + (int64_t)r * ldy, m0);                                               \
            v1 = epr(v1, q + r, off + (int64_t)r * ldy + 8, m1);                                           \
        }                                                                                                  \
        if (full)                                                                                          \
            _mm256_storeu_ps(cr, v0), _mm256_storeu_ps(cr + 8, v1);                                        \
        else                                                                                               \
            _mm256_maskstore_ps(cr, m0, v0), _mm256_maskstore_ps(cr + 8, m1, v1);                          \
    }

/* y (mr x nr of the 6 x 16 tile, pitch ldy) = epr((acc ? y : 0) + a (kc x 6 panel) * b (kc x 16 panel)): rows are
 * channels q .. q+5, y is the output at flat index `off`; no epilogue where `epr` is NULL. */
static inline __attribute__((always_inline)) void sat_ukr_epr(int kc, const float *restrict a, const float *restrict b,
                                                              float *y, int64_t ldy, int acc, int mr, int nr,
                                                              sat_epr8 epr, int64_t q, int64_t off) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
           c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        __m256 s = _mm256_broadcast_ss(a);
        c00 = _mm256_fmadd_ps(s, b0, c00), c01 = _mm256_fmadd_ps(s, b1, c01);
        s = _mm256_broadcast_ss(a + 1);
        c10 = _mm256_fmadd_ps(s, b0, c10), c11 = _mm256_fmadd_ps(s, b1, c11);
        s = _mm256_broadcast_ss(a + 2);
        c20 = _mm256_fmadd_ps(s, b0, c20), c21 = _mm256_fmadd_ps(s, b1, c21);
        s = _mm256_broadcast_ss(a + 3);
        c30 = _mm256_fmadd_ps(s, b0, c30), c31 = _mm256_fmadd_ps(s, b1, c31);
        s = _mm256_broadcast_ss(a + 4);
        c40 = _mm256_fmadd_ps(s, b0, c40), c41 = _mm256_fmadd_ps(s, b1, c41);
        s = _mm256_broadcast_ss(a + 5);
        c50 = _mm256_fmadd_ps(s, b0, c50), c51 = _mm256_fmadd_ps(s, b1, c51);
        a += SAT_PR;
        b += 16;
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), lane);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr - 8), lane);
    const int full = nr == 16;
    SAT_STORE_EPR8(0) SAT_STORE_EPR8(1) SAT_STORE_EPR8(2) SAT_STORE_EPR8(3) SAT_STORE_EPR8(4) SAT_STORE_EPR8(5)
}
#endif

typedef struct {
    const float *x, *wp;
    int64_t wp_group;
    float *y;
    int C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, G, trans, tile, tiles, split, chunk;
    int acc; /* the usual product adds its sums onto y as it is (a residual, in place) */
    sat_epi epi;
} sat_pconv_args;

extern float *sat_pk_buf[SAT_MAX_THREADS];
extern size_t sat_pk_cap[SAT_MAX_THREADS];

void sat_im2col_row(const float *x, float *d, int r, int H, int W, int KH, int KW, int oh0, int oh1, int OW,
                           int sh, int sw, int ph, int pw, int dh, int dw);

#ifndef SAT_HAVE_DWT
typedef void *sat_epc8; /* (no 8-channel epilogues without AVX2) */
#endif

/* One work unit: (image, group, row tile, channel chunk). Its column matrix is packed into the thread's
 * buffer (SAT_PN-pixel panels for the usual product, SAT_PR-pixel panels for the transposed one), then
 * the tiles run over the chunk's channels and the epilogue over each channel's run of the tile. A
 * transposed product's sums are pixel rows of 16 channels: with `epc` (AVX2 builds, an epilogue whose every
 * step is per channel) the epilogue runs on them 8 channels at a time before they are scattered, where
 * per-plane calls on 9 or 36 pixels ran mostly scalar (SiLU's exp above all). */
static inline __attribute__((always_inline)) void sat_pconv_run(void *ctx, int64_t u, int tid, sat_epc8 epc) {
    const sat_pconv_args *a = ctx;
    const int s = (int)(u % a->split), t = (int)(u / a->split % a->tiles);
    const int g = (int)(u / a->split / a->tiles % a->G), n = (int)(u / a->split / a->tiles / a->G);
    const int Cg = a->C / a->G, Mg = a->M / a->G, K = Cg * a->KH * a->KW;
    const int m0 = s * a->chunk, m1 = m0 + a->chunk < Mg ? m0 + a->chunk : Mg;
    const int oh0 = t * a->tile, oh1 = oh0 + a->tile < a->OH ? oh0 + a->tile : a->OH;
    const int64_t P = (int64_t)a->OH * a->OW;
    const int cols = (oh1 - oh0) * a->OW, width = a->trans ? SAT_PR : SAT_PN;
    const int panels = (cols + width - 1) / width, padded = panels * width;
    const float *xg = a->x + ((int64_t)n * a->C + (int64_t)g * Cg) * a->H * a->W;
    /* A plain 1x1 conv's usual product reads its whole panels from the input planes in place (row r of the
     * column matrix is input plane r): only a last, partial panel is packed, as loads past a plane's end
     * would leave the input at its last plane. */
    const int inplace = !a->trans && a->KH == 1 && a->KW == 1 && a->sh == 1 && a->sw == 1 && a->ph == 0 &&
                        a->pw == 0 && a->OH == a->H && a->OW == a->W;
    const int first = inplace ? cols / SAT_PN : 0, pk = padded - first * width; /* packed panels' columns */
    /* the packed panels, one unfolded row, and (transposed product) one channel panel's sums */
    float *buf = sat_thread_buf(&sat_pk_buf[tid], &sat_pk_cap[tid], (size_t)pk * (K + 1 + SAT_PN) + SAT_PN);
    if (!buf) abort();
    float *row = buf + (int64_t)pk * K; /* one unfolded row, zero past `cols` so panels pad with zeros */
    for (int c = cols - first * width; c < pk; c++) row[c] = 0.0f;
    if (inplace && pk > 0)
        for (int r = 0; r < K; r++) {
            float *d = buf + (int64_t)r * SAT_PN;
            const int tail = cols - first * SAT_PN;
            memcpy(d, xg + (int64_t)r * P + (int64_t)oh0 * a->OW + first * SAT_PN, sizeof(float) * (size_t)tail);
            for (int c = tail; c < SAT_PN; c++) d[c] = 0.0f;
        }
    for (int r = 0; r < K && !inplace; r++) {
        sat_im2col_row(xg, row, r, a->H, a->W, a->KH, a->KW, oh0, oh1, a->OW, a->sh, a->sw, a->ph, a->pw, a->dh,
                       a->dw);
        if (!a->trans)
            for (int q = 0; q < panels; q++)
                memcpy(buf + (int64_t)q * K * SAT_PN + (int64_t)r * SAT_PN, row + q * SAT_PN, sizeof(float) * SAT_PN);
        else
            for (int q = 0; q < panels; q++) {
                float *d = buf + (int64_t)q * K * SAT_PR + (int64_t)r * SAT_PR;
                const float *sr = row + q * SAT_PR;
                for (int i = 0; i < SAT_PR; i++) d[i] = sr[i];
            }
    }
    const float *wg = a->wp + g * a->wp_group;
    float *yb = a->y + ((int64_t)n * a->M + (int64_t)g * Mg) * P + (int64_t)oh0 * a->OW;
    if (!a->trans) {
        /* channel blocks whose weights stay in L2 while every pixel panel passes them (1024 -> 512 on a 14x14
         * map, 2 MB of weights, from L3 once a pixel panel before: 2.66 -> 2.37 ms, avx2 build on the Xeon) */
        int mstep = SAT_PMB_BYTES / ((int)sizeof(float) * K) / SAT_PR * SAT_PR;
        if (mstep < SAT_PR) mstep = SAT_PR;
        for (int mb0 = m0; mb0 < m1; mb0 += mstep) {
            const int mb1 = mb0 + mstep < m1 ? mb0 + mstep : m1;
            /* in place, per pixel panel and reduction block: the panel's slice of the input planes stays in L1
             * while the block's weight panels pass it, and the panel's sums of the first block are still there
             * for the next */
            for (int q = 0; q < first; q++)
                for (int k0 = 0; k0 < K; k0 += SAT_PKC) {
                    const int kc = K - k0 < SAT_PKC ? K - k0 : SAT_PKC;
                    const float *xq = xg + (int64_t)k0 * P + (int64_t)oh0 * a->OW + q * SAT_PN;
                    for (int i = mb0; i < mb1; i += SAT_PR) {
                        /* the next tile's output lines, asked for while this one runs: a tile writes 16 pixels into
                         * each of 6 channel planes, and on lines not in cache (the map's last write was an
                         * inference ago) its stores had waited on 12 reads that no hardware prefetcher foresaw.
                         * ResNet-50 at 224, AVX2 build, 1 thread, per-step medians on the Xeon (family 6 model
                         * 167), three rounds: the 14x14 256 -> 1024 convs 1.24-1.26 -> 1.12-1.16 ms (ORT
                         * 1.06-1.20), 64 -> 256 on 56x56 1.22 -> 1.09 */
                        if (k0 == 0 && i + 2 * SAT_PR <= mb1)
                            for (int r = 0; r < SAT_PR; r++) {
                                float *yn = yb + (int64_t)(i + SAT_PR + r) * P + q * SAT_PN;
                                __builtin_prefetch(yn, 1, 3);
                                __builtin_prefetch(yn + SAT_PN - 1, 1, 3);
                            }
                        sat_ukr_ld(kc, wg + (int64_t)i * K + (int64_t)k0 * SAT_PR, xq, P,
                                   yb + (int64_t)i * P + q * SAT_PN, P, mb1 - i < SAT_PR ? mb1 - i : SAT_PR, SAT_PN,
                                   k0 > 0 || a->acc, q == 0 ? 2 : 0);
                    }
                }
            /* per reduction block, each packed pixel panel's slice stays in L1 while the block's weight panels
             * pass it */
            for (int k0 = 0; k0 < K; k0 += SAT_PKC) {
                const int kc = K - k0 < SAT_PKC ? K - k0 : SAT_PKC;
                for (int q = first; q < panels; q++) {
                    const int nr = cols - q * SAT_PN < SAT_PN ? cols - q * SAT_PN : SAT_PN;
                    const float *bq = buf + (int64_t)(q - first) * K * SAT_PN + (int64_t)k0 * SAT_PN;
                    for (int i = mb0; i < mb1; i += SAT_PR)
                        sat_ukr(kc, wg + (int64_t)i * K + (int64_t)k0 * SAT_PR, bq, yb + (int64_t)i * P + q * SAT_PN, P,
                                mb1 - i < SAT_PR ? mb1 - i : SAT_PR, nr, k0 > 0 || a->acc, q == first ? 2 : 0);
                }
            }
        }
    } else {
        /* per channel panel: its sums over the tile's pixels gather in `acc` (pixels x SAT_PN), each weight
         * block staying in L1 while the pixel panels pass it, then go to the channels' planes */
        float *acc = row + pk;
        for (int j = m0; j < m1; j += SAT_PN) {
            const int nr = m1 - j < SAT_PN ? m1 - j : SAT_PN;
            for (int k0 = 0; k0 < K; k0 += SAT_PKC) {
                const int kc = K - k0 < SAT_PKC ? K - k0 : SAT_PKC;
                const float *bj = wg + (int64_t)j * K + (int64_t)k0 * SAT_PN;
                for (int q = 0; q < panels; q++)
                    sat_ukr(kc, buf + (int64_t)q * K * SAT_PR + (int64_t)k0 * SAT_PR, bj, acc + q * SAT_PR * SAT_PN,
                            SAT_PN, SAT_PR, SAT_PN, k0 > 0, 1);
            }
#ifdef SAT_HAVE_DWT
            if (epc) {
                const int64_t q = (int64_t)n * a->M + (int64_t)g * Mg + j; /* plane of the panel's first channel */
                for (int p = 0; p < cols; p++) sat_epc8_span(epc, acc + p * SAT_PN, nr, q, SAT_PN);
            }
#endif
            for (int c = 0; c < nr; c++) {
                float *yc = yb + (int64_t)(j + c) * P;
                for (int p = 0; p < cols; p++) yc[p] = acc[p * SAT_PN + c];
            }
        }
    }
    if (a->epi && !(epc && a->trans))
        for (int m = m0; m < m1; m++) a->epi(a->y, (yb - a->y) + (int64_t)m * P, cols);
}

void sat_pconv_unit(void *ctx, int64_t u, int tid);

void sat_conv_packed(const float *x, const float *wp, int64_t wp_group, float *y, int N, int C, int H, int W,
                            int M, int KH, int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw,
                            int G, int trans, int acc, sat_epi epi, sat_body body);

/* ---- convolution of few output pixels on streamed weights ------------------------------------------
 * A conv whose output has at most SAT_SP pixels (the 3x3 maps ending ResNets and MobileNets) reads each
 * weight once for a handful of products, so it runs at the speed weights come from memory (4 MB for a
 * 1x1 conv of 2048 to 512 channels). The tiles above pass a weight block from L1 once per 6-pixel panel,
 * and memory sits idle during every pass after the first: they ran at about half the bandwidth. Here one
 * pass over the weights does all of it: weights in SAT_VL-channel panels over the whole reduction
 * (k-major: element (k, r) of panel p at [p K SAT_VL + k SAT_VL + r]), all R <= SAT_SP pixels in registers
 * (R accumulators of SAT_VL channels), one weight vector and R broadcasts per step, the stream prefetched
 * SAT_SP_AHEAD floats ahead. The unfolded input (K x R, pixel-minor) is built once per image by the caller
 * (or is the input itself for a 1x1 conv with unit strides and no padding). */
#define SAT_SP 12

/* A conv of fewer multiply-adds than this is not split among threads (sat_conv_stream, and sat_conv_packed's
 * channel chunks): two threads' job costs more than the work it shares. Chains of 20 1x1 convs on one pixel
 * (streamed), avx2 build on the 2-core Zen 4, both threads given their cores (SCHED_FIFO), time per conv at
 * 2 threads over 1: K x M = 384 3.1x, 6144 2.3x, 24576 1.4x (3.8 us at 1 thread), 73728 0.86x (10.5 us);
 * with the host shared (load 4) 1.2x at 384-6144, 1.0x from 24576. EfficientNet-B0's squeeze-and-excitation
 * convs, all but the last blocks', fall below. */
#define SAT_CONV_PAR_MACS 32768
/* The streamed weights are fetched SAT_SP_AHEAD floats (64 KB) ahead into L2 (prefetcht1), not into L1: a
 * model's weights (100 MB for ResNet-50) come from DRAM on every run, and a fetch 4 KB ahead into L1 kept
 * fewer lines in flight than the memory needs. Chains of 1x1 convs 2048 -> 512 -> 2048 on a 3x3 map (96 MB of
 * weights), avx2 build on the Zen 4, 1 thread: 0.31 -> 0.21 ms per conv (19 GB/s, what one core reads alone);
 * 16 KB ahead 0.27, 128 KB 0.23-0.25; into L1 at 32 KB no faster than at 4 KB. The fetches past the last
 * panel go to the next step's weights, which the weights file lays out next. */
#ifndef SAT_SP_AHEAD
#define SAT_SP_AHEAD 16384
#endif

typedef struct {
    const float *xt, *wp; /* unfolded input K x R; packed weights */
    float *y;
    int64_t plane0; /* plane index of the output's first channel (the epilogue's q) */
    int K, M, R, per;
    sat_epi epi;
} sat_sconv_args;

/* Channels [j, j + SAT_VL) of all R pixels: the whole reduction in registers, then the 8-channel epilogue
 * (AVX2 builds) on each pixel's accumulator, then the transposed store into the channels' planes. */
static inline __attribute__((always_inline)) void sat_sconv_panel(const sat_sconv_args *a, int j, sat_epc8 epc,
                                                                   const int R) {
    sat_vf c[SAT_SP];
    for (int r = 0; r < R; r++) c[r] = (sat_vf){0};
    const float *restrict w = a->wp + (int64_t)j * a->K, *restrict x = a->xt;
    for (int k = 0; k < a->K; k++, w += SAT_VL, x += R) {
        const sat_vf b = sat_vload(w);
        __builtin_prefetch(w + SAT_SP_AHEAD, 0, 2);
        for (int r = 0; r < R; r++) c[r] += x[r] * b;
    }
    const int nr = a->M - j < SAT_VL ? a->M - j : SAT_VL;
#if SAT_VL == 8 && defined(SAT_HAVE_DWT)
    if (epc) {
        const __m256i m = sat_mask8(nr);
        for (int r = 0; r < R; r++) c[r] = epc(c[r], a->plane0 + j, m);
    }
#endif
    float t[SAT_SP][SAT_VL];
    for (int r = 0; r < R; r++) sat_vstore(t[r], c[r]);
#if SAT_VL > 8 && defined(SAT_HAVE_DWT)
    /* wider vectors take the 8-channel epilogue half by half */
    if (epc)
        for (int r = 0; r < R; r++) sat_epc8_span(epc, t[r], nr, a->plane0 + j, SAT_VL);
#endif
#ifndef SAT_HAVE_DWT
    (void)epc;
#endif
    for (int ch = 0; ch < nr; ch++) {
        float *yc = a->y + (int64_t)(j + ch) * R;
        for (int r = 0; r < R; r++) yc[r] = t[r][ch];
        if (a->epi && !epc) a->epi(a->y - a->plane0 * R, (a->plane0 + j + ch) * R, R);
    }
}

/* Item: `per` consecutive channel panels. The switch gives every pixel count its own unrolled loop. */
static inline __attribute__((always_inline)) void sat_sconv_run(void *ctx, int64_t item, int tid, sat_epc8 epc) {
    const sat_sconv_args *a = ctx;
    const int j0 = (int)item * a->per * SAT_VL, j1 = j0 + a->per * SAT_VL < a->M ? j0 + a->per * SAT_VL : a->M;
    (void)tid;
    for (int j = j0; j < j1; j += SAT_VL) switch (a->R) {
        case 1: sat_sconv_panel(a, j, epc, 1); break;
        case 2: sat_sconv_panel(a, j, epc, 2); break;
        case 3: sat_sconv_panel(a, j, epc, 3); break;
        case 4: sat_sconv_panel(a, j, epc, 4); break;
        case 5: sat_sconv_panel(a, j, epc, 5); break;
        case 6: sat_sconv_panel(a, j, epc, 6); break;
        case 7: sat_sconv_panel(a, j, epc, 7); break;
        case 8: sat_sconv_panel(a, j, epc, 8); break;
        case 9: sat_sconv_panel(a, j, epc, 9); break;
        case 10: sat_sconv_panel(a, j, epc, 10); break;
        case 11: sat_sconv_panel(a, j, epc, 11); break;
        default: sat_sconv_panel(a, j, epc, 12); break;
        }
}

void sat_sconv_item(void *ctx, int64_t item, int tid);

extern float *sat_sconv_buf;
extern size_t sat_sconv_cap;

void sat_conv_stream(const float *x, const float *wp, float *y, int N, int C, int H, int W, int M, int KH,
                            int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw, sat_epi epi,
                            sat_body body);

/* ---- convolution without im2col, on the padded grid ----------------------------------------------------
 * With unit strides, output pixel (oh, ow) of tap (c, kh, kw) reads padded input (c, oh + kh dh, ow + kw dw).
 * Outputs are computed on the padded grid: virtual pixel v = oh Wp + ow (ow < Wp, the columns past OW
 * discarded), so tap k reads xp[koff[k] + v] and a run of SAT_PN virtual pixels is two vector loads for
 * every (c, kh, kw), across row ends too. The tile's B side needs no packing at all; the price is the
 * (Wp - OW) / Wp discarded columns, which the emitter weighs (emit.conv_layout).
 * Strided convs run the same way on the padded input split into phases: phase (a, b) of a channel holds
 * padded pixels (a + sh i, b + sw j), so tap (kh, kw) reads phase (kh dh % sh, kw dw % sw) at (oh + kh dh /
 * sh, ow + kw dw / sw), again unit-stride along the output row. Only the phases some tap reads are made (one
 * for a 1x1 conv): the copy is at most the input's size where im2col writes K x OH x OW floats (12x the
 * input for a 7x7 stem of stride 2), and packs them again for the tile. */
typedef struct {
    const float *xp, *wp; /* padded input of all (image, group) pairs; packed weights (SAT_PR panels) */
    const int32_t *koff;  /* per reduction index: its offset into one (image, group) padded input */
    int64_t wp_group, xp_pair;
    float *y;
    int M, G, OH, OW, Wp, K, rows, tiles, split, chunk;
    sat_epi epi;
} sat_xconv_args;

/* t (SAT_PR x SAT_PN, row-major) = (acc ? t : 0) + a (kc x SAT_PR panel) * (xb + koff[k], SAT_PN floats each). */
static inline void sat_ukr_x(int kc, const float *restrict a, const float *restrict xb, const int32_t *restrict koff,
                             float *restrict t, int acc) {
    sat_vf c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0}, c40 = {0},
           c41 = {0}, c50 = {0}, c51 = {0};
    for (int k = 0; k < kc; k++) {
        const float *b = xb + koff[k];
        const sat_vf b0 = sat_vload(b), b1 = sat_vload(b + SAT_VL);
        SAT_PANEL_STEP(a, b0, b1);
        a += SAT_PR;
    }
    SAT_TILE_STORE(t, SAT_PN, acc);
}

void sat_xconv_unit(void *ctx, int64_t u, int tid);

/* The phases a conv's taps read, at most SAT_XPHASES (strides up to 4 in both directions). */
#define SAT_XPHASES 16
typedef struct {
    const float *x;
    float *xp;
    int C, Cg, G, H, W, Hp, Wp, ph, pw, sh, sw, phases;
    int64_t pair;
    int pa[SAT_XPHASES], pb[SAT_XPHASES]; /* each phase's first padded row and column */
} sat_xpad_args;

void sat_xpad_plane(void *ctx, int64_t item, int tid);

extern float *sat_xp_buf;
extern size_t sat_xp_cap;

void sat_conv_xdirect(const float *x, const float *wp, int64_t wp_group, float *y, int N, int C, int H, int W,
                             int M, int KH, int KW, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw,
                             int G, sat_epi epi);

/* ---- products on constant weights -----------------------------------------------------------------
 * Gemm and MatMul whose B is a constant (a transformer's projections: 37 tokens x 768 times 768 x 192):
 * B is packed by the emitter in SAT_PN-column panels (k-major, element (k, n) of panel p at
 * [p*K*SAT_PN + k*SAT_PN + n - p*SAT_PN]), where a general sgemm packs all of it again on every call;
 * A is read in place, or, transposed or scaled, packed per call in SAT_PR-row panels with alpha folded
 * in (ap, NULL when in place). Threads split B's panels.
 * AVX-512 builds run these too (a 6 x 32 tile), though their convs take gemm.h's kernels. */
typedef struct {
    const float *ap, *bp, *A;
    float *Y, *apw;
    int64_t yoff;
    int M, N, K, per, ta, lda;
    float alpha;
    sat_epi epi;
} sat_pmm_args;

void sat_pmm_item(void *ctx, int64_t item, int tid);

void sat_pmm_pack(void *ctx, int64_t item, int tid);

extern float *sat_pmm_buf[SAT_MAX_THREADS];
extern size_t sat_pmm_cap[SAT_MAX_THREADS];

void sat_gemm_packed(int ta, int M, int N, int K, float alpha, const float *A, int lda, const float *bp,
                            float *Y, int64_t yoff, sat_epi epi);

#endif
