/* C backend direct convolution: no im2col. Output pixels take the micro-kernel's rows (8 or 7), output
 * channels its 32 columns; every reduction index k = (c, kh, kw) is one offset into a zero-padded copy
 * of the input, so each row's operand is a broadcast from `x_r + koff[k]` for any stride or dilation.
 * Weights are packed by the emitter in 32-channel panels, k-major over the whole K (panel j of group g
 * at wp + g*wp_group + j*K*32, element (k, c) at [k*32 + c]). Results are transposed in registers and
 * stored channel-major with the fused epilogue applied as vector code on the way out. Convs onto small
 * maps whose groups have a multiple of 64 channels take 6 pixel x 64 channel tiles on 64-channel panels
 * instead (sat_dconv_tile64; the emitter chooses, plan.direct_width). */
#ifndef SATURATE_DCONV_H
#define SATURATE_DCONV_H

#if defined(__AVX512F__) || defined(__AVX2__)
/* The driver (sat_conv_direct) and its work units' arguments, shared with the AVX2 builds' 6 pixel x 16
 * channel tiles (dconv8.h). */
typedef struct {
    const float *x;       /* padded input of one (image, group), pitch Wp, plane Hp*Wp */
    const float *wp;      /* packed weights of the group */
    const int32_t *koff;  /* K offsets into x */
    float *y;             /* the whole output tensor (epilogue offsets are relative to it) */
    int64_t ybase;        /* flat index of channel 0, pixel 0 of this (image, group) in y */
    int64_t P;            /* output pixels per channel */
    int K, Mg, OW, Wp, sh, sw, rows, chunk, panels, jpanels;
    int stage;            /* outputs pass through the thread's stage, two panels at a time (sat_dconv_flush) */
    int kc;               /* reduction indices per block of the AVX2 tiles (dconv8.h) */
    int wide;             /* 6 pixel x 64 channel tiles on 64-channel panels (AVX-512) */
    sat_epi epi;          /* scalar epilogue when no vector one exists */
} sat_dconv_args;

/* Reduction indices per block, and the most pixel panels a unit takes (its partial sums' buffer). A block
 * of 128 weight rows (16 KB) leaves room in L1 for the rows' input lines beside it; 256 (32 KB) did not on a
 * Xeon's 48 KB L1 (VGG-11's direct 3x3 convs of 64-512 channels at 1 thread, per-step medians, 3-9% faster
 * with 128; 192 level with 128, 64 slower). */
#define SAT_DKC 128
#define SAT_DCHUNK 40
/* The 6 x 64 tiles' reduction block, at most: its weights (64 floats a step, 20 KB) stay in L1 across the
 * panels. ResNet-50's 3x3 conv of 64 channels on 56x56 at 1 thread: blocks of at most 40 ran 3-5% slower than
 * 80, 150 level with 80. */
#define SAT_DKC64 80

/* Rows [band * Hq / bands, ...) of every input channel's zero-padded plane; only the pad border is
 * zeroed, the interior is overwritten by the copy. Bands of rows, not channels: thread t then copies the
 * pixels it wrote the step before, into the rows its own items of the conv read (see pool.h). */
typedef struct {
    const float *x;
    float *xpad;
    int C, H, W, Hq, Wp, ph, pw, bands;
} sat_dconv_pad_args;

void sat_pad_rows(void *ctx, int64_t band, int tid);

/* The pixels a strided 1x1 conv reads, one channel, gathered into a dense OH x OW plane (zero where a pad
 * falls): the tiles then run it at unit stride. In place, a stride-2 conv's reduction block of 256 channels
 * touches their whole planes (a 6x6 map's three cache lines each, 36 KB), which with the weight block's
 * 32 KB no longer fits in L1. */
#define SAT_GATHER_MAXP 64 /* plan.GATHER_MAXP */
typedef struct {
    const float *x;
    float *xs;
    int H, W, OH, OW, sh, sw, ph, pw;
    int xpan; /* 0: x is N x C x H x W; else x is in pixel panels (see sat_conv_direct) of this many channels */
} sat_dconv_gather_args;

void sat_gather_plane(void *ctx, int64_t c, int tid);

void sat_conv_direct(const float *x, const float *wp, int64_t wp_group, float *y, float *scratch, int N,
                            int C, int H, int W, int M, int KH, int KW, int OH, int OW, int sh, int sw, int ph,
                            int pw, int dh, int dw, int G, int width, int xpan, sat_epi epi, sat_body unit);
#endif

#if defined(__AVX512F__)

/* Vector epilogue: v holds 8 consecutive outputs starting at flat index `off` (lanes in `mk`). */
typedef __m256 (*sat_epv)(__m256 v, int64_t off, __mmask8 mk);
/* Per-channel part of an epilogue: v holds 16 channels (planes q .. q+15, lanes `mc`) of one pixel. */
typedef __m512 (*sat_epc)(__m512 v, int64_t q, __mmask16 mc);

/* Transpose the 8 x 16 block r0..r7 (pixel rows) into 8 vectors of two channels' 8 pixels each:
 * out[i] lower half = channel i, upper half = channel i + 4 (i < 4: channels 0-7; i >= 4: 8-15). */
#define SAT_T8x16(r0, r1, r2, r3, r4, r5, r6, r7, out)                                                      \
    do {                                                                                                  \
        const __m512 t0 = _mm512_unpacklo_ps(r0, r1), t1 = _mm512_unpackhi_ps(r0, r1);                   \
        const __m512 t2 = _mm512_unpacklo_ps(r2, r3), t3 = _mm512_unpackhi_ps(r2, r3);                   \
        const __m512 t4 = _mm512_unpacklo_ps(r4, r5), t5 = _mm512_unpackhi_ps(r4, r5);                   \
        const __m512 t6 = _mm512_unpacklo_ps(r6, r7), t7 = _mm512_unpackhi_ps(r6, r7);                   \
        const __m512 s0 = _mm512_shuffle_ps(t0, t2, 0x44), s1 = _mm512_shuffle_ps(t0, t2, 0xEE);         \
        const __m512 s2 = _mm512_shuffle_ps(t1, t3, 0x44), s3 = _mm512_shuffle_ps(t1, t3, 0xEE);         \
        const __m512 s4 = _mm512_shuffle_ps(t4, t6, 0x44), s5 = _mm512_shuffle_ps(t4, t6, 0xEE);         \
        const __m512 s6 = _mm512_shuffle_ps(t5, t7, 0x44), s7 = _mm512_shuffle_ps(t5, t7, 0xEE);         \
        /* s_i lane L: channel 4L+i, pixels 0-3; s_{4+i} lane L: the same channel, pixels 4-7. */        \
        const __m512 lo0 = _mm512_shuffle_f32x4(s0, s4, 0x44), hi0 = _mm512_shuffle_f32x4(s0, s4, 0xEE); \
        const __m512 lo1 = _mm512_shuffle_f32x4(s1, s5, 0x44), hi1 = _mm512_shuffle_f32x4(s1, s5, 0xEE); \
        const __m512 lo2 = _mm512_shuffle_f32x4(s2, s6, 0x44), hi2 = _mm512_shuffle_f32x4(s2, s6, 0xEE); \
        const __m512 lo3 = _mm512_shuffle_f32x4(s3, s7, 0x44), hi3 = _mm512_shuffle_f32x4(s3, s7, 0xEE); \
        out[0] = _mm512_shuffle_f32x4(lo0, lo0, 0xD8);                                                    \
        out[1] = _mm512_shuffle_f32x4(lo1, lo1, 0xD8);                                                    \
        out[2] = _mm512_shuffle_f32x4(lo2, lo2, 0xD8);                                                    \
        out[3] = _mm512_shuffle_f32x4(lo3, lo3, 0xD8);                                                    \
        out[4] = _mm512_shuffle_f32x4(hi0, hi0, 0xD8);                                                    \
        out[5] = _mm512_shuffle_f32x4(hi1, hi1, 0xD8);                                                    \
        out[6] = _mm512_shuffle_f32x4(hi2, hi2, 0xD8);                                                    \
        out[7] = _mm512_shuffle_f32x4(hi3, hi3, 0xD8);                                                    \
    } while (0)

/* Store channel `ch` (of 32, relative to the panel) from the transposed vectors, epilogue applied. */
static inline __attribute__((always_inline)) void sat_dconv_put(__m256 v, float *y, int64_t off, __mmask8 mk,
                                                                sat_epv epv) {
    if (epv) v = epv(v, off, mk);
    _mm256_mask_storeu_ps(y + off, mk, v);
}

#define SAT_DROW(r)                                                  \
    do {                                                             \
        const __m512 a_ = _mm512_set1_ps(x##r[o]);                   \
        c##r##0 = _mm512_fmadd_ps(a_, b0, c##r##0);                  \
        c##r##1 = _mm512_fmadd_ps(a_, b1, c##r##1);                  \
    } while (0)

/* One 8 (or 7) pixel x 32 channel tile over K (a block of it); `pf` is a weight block two ahead, fetched
 * into cache meanwhile (weights of late layers come from memory each inference). `xr` are the rows' input origins, `mr` the
 * pixels stored, `nr` the channels stored; `off0` the flat output index of (channel 0, first pixel). */
static inline __attribute__((always_inline)) void sat_dconv_tile(int rows, int K, const int32_t *restrict koff,
                                                                 const float *const *xr, const float *restrict w,
                                                                 float *y, int64_t off0, int64_t P, int mr, int nr,
                                                                 const float *cin, float *cout, const float *pf,
                                                                 int pfr, int64_t plane, sat_epc epc, sat_epv epv) {
    const float *x0 = xr[0], *x1 = xr[1], *x2 = xr[2], *x3 = xr[3], *x4 = xr[4], *x5 = xr[5], *x6 = xr[6],
                *x7 = xr[7];
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
           c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    /* Partial sums of earlier k-blocks come from `cin`; all but the last block leave theirs in `cout`. */
#define SAT_DLOAD(r) c##r##0 = _mm512_load_ps(cin + r * 32), c##r##1 = _mm512_load_ps(cin + r * 32 + 16)
#define SAT_DSAVE(r) _mm512_store_ps(cout + r * 32, c##r##0), _mm512_store_ps(cout + r * 32 + 16, c##r##1)
    if (cin) {
        SAT_DLOAD(0); SAT_DLOAD(1); SAT_DLOAD(2); SAT_DLOAD(3);
        SAT_DLOAD(4); SAT_DLOAD(5); SAT_DLOAD(6); SAT_DLOAD(7);
    }
#define SAT_DLOOP(ROWS, PF)                                                        \
    for (int k = 0; k < K; k++) {                                                  \
        const int64_t o = koff[k];                                                 \
        const __m512 b0 = _mm512_loadu_ps(w), b1 = _mm512_loadu_ps(w + 16);        \
        ROWS;                                                                      \
        PF;                                                                        \
        w += 32;                                                                   \
    }
/* SAT_DROW(r) on the panel's first 16 channels only (a panel of at most 16: MobileNetV2's 32 -> 16 conv,
 * the last panel of 40, 80, 112 or 144 channels). */
#define SAT_DROWH(r)                                                 \
    do {                                                             \
        const __m512 a_ = _mm512_set1_ps(x##r[o]);                   \
        c##r##0 = _mm512_fmadd_ps(a_, b0, c##r##0);                  \
        (void)b1; /* loaded by SAT_DLOOP, not needed: the compiler drops the load */ \
    } while (0)
#define SAT_ROWS8 SAT_DROW(0); SAT_DROW(1); SAT_DROW(2); SAT_DROW(3); SAT_DROW(4); SAT_DROW(5); SAT_DROW(6); SAT_DROW(7)
#define SAT_ROWS7 SAT_DROW(0); SAT_DROW(1); SAT_DROW(2); SAT_DROW(3); SAT_DROW(4); SAT_DROW(5); SAT_DROW(6)
#define SAT_ROWS4 SAT_DROW(0); SAT_DROW(1); SAT_DROW(2); SAT_DROW(3)
#define SAT_ROWS2 SAT_DROW(0); SAT_DROW(1)
#define SAT_ROWS1 SAT_DROW(0)
#define SAT_ROWS8H SAT_DROWH(0); SAT_DROWH(1); SAT_DROWH(2); SAT_DROWH(3); SAT_DROWH(4); SAT_DROWH(5); SAT_DROWH(6); SAT_DROWH(7)
#define SAT_ROWS7H SAT_DROWH(0); SAT_DROWH(1); SAT_DROWH(2); SAT_DROWH(3); SAT_DROWH(4); SAT_DROWH(5); SAT_DROWH(6)
#define SAT_ROWS4H SAT_DROWH(0); SAT_DROWH(1); SAT_DROWH(2); SAT_DROWH(3)
#define SAT_ROWS2H SAT_DROWH(0); SAT_DROWH(1)
#define SAT_ROWS1H SAT_DROWH(0)
    /* Iteration k fetches weight row (k * pfr) >> 16 of this tile's slice of a block two ahead (see
     * sat_dconv_unit); two blocks, not one: ResNet-50's convs at 1 thread on a Zen 5 core took 8.18 -> 7.91
     * ms in all (three: 7.98). Into L2 (prefetcht1): into L1 kept too few lines in flight for weights that
     * come from DRAM (see pgemm.h's SAT_SP_AHEAD); ResNet-50 at 96x96, avx512 build on the Zen 4, 1 thread,
     * per-step medians: its layer-4 convs 0.48-0.69 -> 0.38-0.54 ms each, the model 17.4 -> 16.4 ms, the
     * rest level. */
#define SAT_PF _mm_prefetch((const char *)(pf + 32 * ((k * pfr) >> 16)), _MM_HINT_T1), \
               _mm_prefetch((const char *)(pf + 32 * ((k * pfr) >> 16) + 16), _MM_HINT_T1)
#define SAT_DRUN(ROWS) if (pf) { SAT_DLOOP(ROWS, SAT_PF) } else { SAT_DLOOP(ROWS, (void)0) }
#define SAT_DRUN_ROWS(S)                          \
    if (rows == 8) {                              \
        SAT_DRUN(SAT_ROWS8##S)                    \
    } else if (rows == 7) {                       \
        SAT_DRUN(SAT_ROWS7##S)                    \
    } else if (rows == 4) {                       \
        SAT_DRUN(SAT_ROWS4##S)                    \
    } else if (rows == 2) {                       \
        SAT_DRUN(SAT_ROWS2##S)                    \
    } else {                                      \
        SAT_DRUN(SAT_ROWS1##S)                    \
    }
    if (nr > 16) {
        SAT_DRUN_ROWS()
    } else {
        SAT_DRUN_ROWS(H)
    }
    if (cout) {
        SAT_DSAVE(0); SAT_DSAVE(1); SAT_DSAVE(2); SAT_DSAVE(3);
        SAT_DSAVE(4); SAT_DSAVE(5); SAT_DSAVE(6); SAT_DSAVE(7);
        return;
    }
    if (epc) {
        /* Channel-wise steps (bias, batch norm, relu...) run here, before the transpose, one vector
         * operand load per 16 channels for all the tile's pixels. */
        const __mmask16 m0 = nr >= 16 ? 0xFFFF : (__mmask16)((1u << nr) - 1);
        const __mmask16 m1 = nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : 0;
#define SAT_DEPC(r) c##r##0 = epc(c##r##0, plane, m0), c##r##1 = epc(c##r##1, plane + 16, m1)
        SAT_DEPC(0); SAT_DEPC(1); SAT_DEPC(2); SAT_DEPC(3);
        SAT_DEPC(4); SAT_DEPC(5); SAT_DEPC(6); SAT_DEPC(7);
    }
    const __mmask8 mk = (__mmask8)((1u << mr) - 1);
    __m512 t[8];
    SAT_T8x16(c00, c10, c20, c30, c40, c50, c60, c70, t);
    for (int i = 0; i < 8; i++) {
        /* t[i]: channel (i & 3) + 8 * (i >> 2) in the lower half, 4 more in the upper half. */
        const int ch = (i & 3) + 8 * (i >> 2);
        if (ch < nr) sat_dconv_put(_mm512_castps512_ps256(t[i]), y, off0 + ch * P, mk, epv);
        if (ch + 4 < nr) sat_dconv_put(_mm512_extractf32x8_ps(t[i], 1), y, off0 + (ch + 4) * P, mk, epv);
    }
    if (nr > 16) {
        SAT_T8x16(c01, c11, c21, c31, c41, c51, c61, c71, t);
        for (int i = 0; i < 8; i++) {
            const int ch = 16 + (i & 3) + 8 * (i >> 2);
            if (ch < nr) sat_dconv_put(_mm512_castps512_ps256(t[i]), y, off0 + ch * P, mk, epv);
            if (ch + 4 < nr) sat_dconv_put(_mm512_extractf32x8_ps(t[i], 1), y, off0 + (ch + 4) * P, mk, epv);
        }
    }
}

/* The size of K's blocks when it is cut into equal blocks of at most `most` reduction indices (the last may be
 * shorter by the rounding alone). */
static inline int sat_dconv_kblock(int K, int most) {
    const int blocks = (K + most - 1) / most;
    return (K + blocks - 1) / blocks;
}

/* Rows a tile runs for `mr` pixels: all of a full panel's `R`, else the next of 1, 2, 4, 7. */
static inline int sat_dconv_run_rows(int mr, int R) { return mr == R ? R : mr <= 1 ? 1 : mr <= 2 ? 2 : mr <= 4 ? 4 : 7; }
extern float sat_dconv_acc[SAT_MAX_THREADS][SAT_DCHUNK * 384] __attribute__((aligned(64)));
extern float sat_dconv_stage[SAT_MAX_THREADS][32 * 16] __attribute__((aligned(64)));

/* Output planes whose size is a multiple of 2 KB (a 224x224 map's is 196 KB) start at addresses equal modulo
 * 4 KB, so a tile's 32 channel stores all fall in one or two sets of L1 (12 ways): each line, written half
 * at a time by two tiles, was evicted between its halves (VGG-11's 3 -> 64 conv on 224x224 took 2.45 ms, on
 * 226x226 1.44). Such convs store two 8-row panels' outputs to a stage first and write each channel's 16
 * pixels, a whole line, at once; the vector epilogue runs here, on the outputs' own offsets. */
static inline __attribute__((always_inline)) void sat_dconv_flush(const float *st, float *y, int64_t off0, int64_t P,
                                                                  int nr, int np, sat_epv epv) {
    const __mmask8 m0 = np >= 8 ? 0xFF : (__mmask8)((1u << np) - 1);
    const __mmask8 m1 = np >= 16 ? 0xFF : np > 8 ? (__mmask8)((1u << (np - 8)) - 1) : 0;
    for (int ch = 0; ch < nr; ch++) {
        sat_dconv_put(_mm256_load_ps(st + ch * 16), y, off0 + ch * P, m0, epv);
        if (m1) sat_dconv_put(_mm256_load_ps(st + ch * 16 + 8), y, off0 + ch * P + 8, m1, epv);
    }
}

/* The input origins of a tile's `mr` pixels from flat output index p0 (one division per tile: the pixels
 * advance along the output row, then wrap); rows past `mr` up to `n` repeat the first. */
static inline __attribute__((always_inline)) void sat_dconv_origins(const sat_dconv_args *a, int64_t p0, int mr,
                                                                    const float **xr, int n) {
    int64_t oh = p0 / a->OW, ow = p0 - oh * a->OW;
    for (int r = 0; r < mr; r++) {
        xr[r] = a->x + oh * a->sh * a->Wp + ow * a->sw;
        if (++ow == a->OW) ow = 0, oh++;
    }
    for (int r = mr; r < n; r++) xr[r] = xr[0];
}

/* The panels of a run share the fetching of the weight block two ahead, each a slice spread over its whole k
 * loop: when the first panel fetched it all, its loop ran at the speed of memory and the others' at none
 * (ResNet-50's 3x3 convs on 6x6 maps, weights from memory: 20% over their time with the weights in cache).
 * The run's first (up to) four panels divide the block's `n` fetch units (weight rows or half-rows) by their
 * pixels; the tile at flat pixel p0 (mr pixels) of the run of panels [q0, q1) takes units [*s0, *s1). */
static inline __attribute__((always_inline)) void sat_dconv_pf_share(const sat_dconv_args *a, int q0, int q1,
                                                                     int64_t p0, int mr, int n, int *s0, int *s1) {
    const int R = a->rows;
    const int64_t pf4 = (int64_t)(q1 - q0 < 4 ? q1 - q0 : 4) * R, rest = a->P - (int64_t)q0 * R;
    const int64_t pn = rest < pf4 ? rest : pf4, e0 = p0 - (int64_t)q0 * R, e1 = e0 + mr;
    *s0 = e0 < pn ? (int)(e0 * n / pn) : n;
    *s1 = e1 < pn ? (int)(e1 * n / pn) : n;
}

/* The output lines 16 pixels past a tile's own (flat pixel p0) in channels [m0, m0 + nr), fetched for writing
 * while the tile runs (see dconv8.h): ResNet-50's stem on AVX-512, per-step medians of three rounds, 1.86 ->
 * 1.77 ms. */
static inline __attribute__((always_inline)) void sat_dconv_pf_out(const sat_dconv_args *a, int m0, int nr,
                                                                   int64_t p0) {
    if (p0 + 16 < a->P)
        for (int ch = 0; ch < nr; ch++) __builtin_prefetch(a->y + a->ybase + (int64_t)(m0 + ch) * a->P + p0 + 16, 1, 3);
}

#define SAT_DROW64(r)                                                \
    do {                                                             \
        const __m512 a_ = _mm512_set1_ps(x##r[o]);                   \
        c##r##0 = _mm512_fmadd_ps(a_, b0, c##r##0);                  \
        c##r##1 = _mm512_fmadd_ps(a_, b1, c##r##1);                  \
        c##r##2 = _mm512_fmadd_ps(a_, b2, c##r##2);                  \
        c##r##3 = _mm512_fmadd_ps(a_, b3, c##r##3);                  \
    } while (0)

/* One 6 pixel x 64 channel tile over a block of K: 24 sums, and four weight vectors and six broadcasts a
 * step, where the 8 x 32 tile has 16 sums for two and eight. Arguments as sat_dconv_tile's; all 64 channels
 * are stored. `pf` is the tile's slice of the block two ahead, `pfr` its half-rows (32 floats) per step,
 * times 65536. */
static inline __attribute__((always_inline)) void sat_dconv_tile64(int rows, int K, const int32_t *restrict koff,
                                                                   const float *const *xr, const float *restrict w,
                                                                   float *y, int64_t off0, int64_t P, int mr,
                                                                   const float *cin, float *cout, const float *pf,
                                                                   int pfr, int64_t plane, sat_epc epc, sat_epv epv) {
    const float *x0 = xr[0], *x1 = xr[1], *x2 = xr[2], *x3 = xr[3], *x4 = xr[4], *x5 = xr[5];
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00, c13 = c00,
           c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00, c32 = c00, c33 = c00, c40 = c00,
           c41 = c00, c42 = c00, c43 = c00, c50 = c00, c51 = c00, c52 = c00, c53 = c00;
#define SAT_W64(OP, r) OP(r, 0); OP(r, 1); OP(r, 2); OP(r, 3)
#define SAT_W64ALL(OP) SAT_W64(OP, 0); SAT_W64(OP, 1); SAT_W64(OP, 2); SAT_W64(OP, 3); SAT_W64(OP, 4); SAT_W64(OP, 5)
#define SAT_WLOAD(r, g) c##r##g = _mm512_load_ps(cin + r * 64 + g * 16)
#define SAT_WSAVE(r, g) _mm512_store_ps(cout + r * 64 + g * 16, c##r##g)
#define SAT_WEPC(r, g) c##r##g = epc(c##r##g, plane + g * 16, 0xFFFF)
    if (cin) {
        SAT_W64ALL(SAT_WLOAD);
    }
#define SAT_WLOOP(ROWS, PF)                                                         \
    for (int k = 0; k < K; k++) {                                                   \
        const int64_t o = koff[k];                                                  \
        const __m512 b0 = _mm512_loadu_ps(w), b1 = _mm512_loadu_ps(w + 16);         \
        const __m512 b2 = _mm512_loadu_ps(w + 32), b3 = _mm512_loadu_ps(w + 48);    \
        ROWS;                                                                       \
        PF;                                                                         \
        w += 64;                                                                    \
    }
#define SAT_WROWS6 SAT_DROW64(0); SAT_DROW64(1); SAT_DROW64(2); SAT_DROW64(3); SAT_DROW64(4); SAT_DROW64(5)
#define SAT_WROWS4 SAT_DROW64(0); SAT_DROW64(1); SAT_DROW64(2); SAT_DROW64(3)
#define SAT_WROWS2 SAT_DROW64(0); SAT_DROW64(1)
#define SAT_WROWS1 SAT_DROW64(0)
#define SAT_WRUN(ROWS) if (pf) { SAT_WLOOP(ROWS, SAT_PF) } else { SAT_WLOOP(ROWS, (void)0) }
    if (rows == 6) {
        SAT_WRUN(SAT_WROWS6)
    } else if (rows == 4) {
        SAT_WRUN(SAT_WROWS4)
    } else if (rows == 2) {
        SAT_WRUN(SAT_WROWS2)
    } else {
        SAT_WRUN(SAT_WROWS1)
    }
    if (cout) {
        SAT_W64ALL(SAT_WSAVE);
        return;
    }
    if (epc) {
        SAT_W64ALL(SAT_WEPC);
    }
    /* each 16 channels' six pixels through the 8-row transpose, two zero rows that the stores mask off */
    const __mmask8 mk = (__mmask8)((1u << mr) - 1);
    const __m512 z = _mm512_setzero_ps();
    __m512 t[8];
#define SAT_WPUT(g)                                                                          \
    do {                                                                                     \
        SAT_T8x16(c0##g, c1##g, c2##g, c3##g, c4##g, c5##g, z, z, t);                        \
        for (int i = 0; i < 8; i++) {                                                        \
            const int ch = g * 16 + (i & 3) + 8 * (i >> 2);                                  \
            sat_dconv_put(_mm512_castps512_ps256(t[i]), y, off0 + ch * P, mk, epv);          \
            sat_dconv_put(_mm512_extractf32x8_ps(t[i], 1), y, off0 + (ch + 4) * P, mk, epv); \
        }                                                                                    \
    } while (0)
    SAT_WPUT(0); SAT_WPUT(1); SAT_WPUT(2); SAT_WPUT(3);
}

/* Work unit u of one (image, group) on the 6 x 64 tiles (see sat_dconv_unit): a chunk of 6-pixel panels
 * times one 64-channel panel, K in equal blocks of at most SAT_DKC64. */
static inline __attribute__((always_inline)) void sat_dconv_unit64(const sat_dconv_args *a, int64_t u, int tid,
                                                                   sat_epc epc, sat_epv epv) {
    const int j = (int)(u % a->jpanels), c = (int)(u / a->jpanels);
    const int R = a->rows;
    const int64_t P = a->P;
    const float *w = a->wp + (int64_t)j * a->K * 64;
    const int q0 = c * a->chunk, q1 = q0 + a->chunk < a->panels ? q0 + a->chunk : a->panels;
    float *acc = sat_dconv_acc[tid];
    const int kb = sat_dconv_kblock(a->K, SAT_DKC64);
    for (int k0 = 0, kc; k0 < a->K; k0 += kc) {
        kc = a->K - k0 < kb ? a->K - k0 : kb;
        const int last = k0 + kc >= a->K;
        for (int q = q0; q < q1; q++) {
            const int64_t p0 = (int64_t)q * R;
            const int mr = P - p0 < R ? (int)(P - p0) : R;
            const float *xr[6] = {a->x};
            sat_dconv_origins(a, p0, mr, xr, 6);
            const int rows = mr == R ? R : mr <= 1 ? 1 : mr <= 2 ? 2 : mr <= 4 ? 4 : 6;
            float *buf = acc + (int64_t)(q - q0) * 6 * 64;
            int s0, s1; /* in half-rows of 32 floats */
            sat_dconv_pf_share(a, q0, q1, p0, mr, 2 * kc, &s0, &s1);
            const float *pfw = s1 > s0 ? w + (int64_t)(k0 + kc + kb) * 64 + (int64_t)s0 * 32 : NULL;
            if (last) sat_dconv_pf_out(a, j * 64, 64, p0);
            sat_dconv_tile64(rows, kc, a->koff + k0, xr, w + (int64_t)k0 * 64, a->y,
                             a->ybase + (int64_t)j * 64 * P + p0, P, mr, k0 ? buf : NULL, last ? NULL : buf, pfw,
                             ((s1 - s0) << 16) / kc, a->ybase / P + j * 64, epc, epv);
        }
    }
    if (!epc && !epv && a->epi) {
        const int64_t p0 = (int64_t)q0 * R, p1 = (int64_t)q1 * R < P ? (int64_t)q1 * R : P;
        for (int m = 0; m < 64; m++) a->epi(a->y, a->ybase + (int64_t)(j * 64 + m) * P + p0, p1 - p0);
    }
}

/* Work unit u of one (image, group): a chunk of pixel panels times one 32-channel panel (or 64: a->wide).
 * Instantiated per conv by the emitter with its vector epilogue, so the epilogue inlines into the store. */
static inline __attribute__((always_inline)) void sat_dconv_unit(void *ctx, int64_t u, int tid, sat_epc epc,
                                                                 sat_epv epv) {
    const sat_dconv_args *a = ctx;
    if (a->wide) {
        sat_dconv_unit64(a, u, tid, epc, epv);
        return;
    }
    const int j = (int)(u % a->jpanels), c = (int)(u / a->jpanels);
    const int R = a->rows;
    const int64_t P = a->P;
    const int nr = a->Mg - j * 32 < 32 ? a->Mg - j * 32 : 32;
    const float *w = a->wp + (int64_t)j * a->K * 32;
    const int q0 = c * a->chunk, q1 = q0 + a->chunk < a->panels ? q0 + a->chunk : a->panels;
    /* K in blocks of equal size, at most SAT_DKC * 5 / 4 (20 KB of the weight panel), so a block stays in L1 across
     * the panels; 8 x 32 partial sums per panel wait in this thread's buffer between blocks. Blocks of SAT_DKC and
     * a short last one had stored and reloaded those sums for a stem's last 19 of K = 147, a 3x3 conv of 64
     * channels' last 64 of 576. ResNet-50 at 224x224, 1 thread, per-step medians of three rounds on the Xeon
     * (family 6 model 167): the stem 1.77 -> 1.67 ms, the 3x3 convs of 64 channels on 56x56 1.56-1.60 -> 1.53-1.56,
     * the stride-2 one of 128 1.71 -> 1.66. */
    float *acc = sat_dconv_acc[tid];
    const int kb = sat_dconv_kblock(a->K, SAT_DKC + SAT_DKC / 4);
    for (int k0 = 0, kc; k0 < a->K; k0 += kc) {
        kc = a->K - k0 < kb ? a->K - k0 : kb;
        const int last = k0 + kc >= a->K;
        for (int q = q0; q < q1; q++) {
            const int64_t p0 = (int64_t)q * R;
            const int mr = P - p0 < R ? (int)(P - p0) : R;
            const float *xr[8] = {a->x}; /* mr >= 1 always; the initializer says so to the compiler */
            sat_dconv_origins(a, p0, mr, xr, 8);
            /* A last, short panel runs only the rows it needs (of 1, 2, 4, 7): a 3x3 map's 9 pixels are
             * 8 + 1 rows, not 7 + 7. Rows not run keep zero sums, which the masked stores skip. */
            const int rows = sat_dconv_run_rows(mr, R);
            float *buf = acc + (int64_t)(q - q0) * 256;
            int s0, s1;
            sat_dconv_pf_share(a, q0, q1, p0, mr, kc, &s0, &s1);
            const int staged = a->stage && last, odd = (q - q0) & 1;
            float *st = sat_dconv_stage[tid];
            /* (two calls, so each sees its epilogue as a constant and inlines it: a pointer chosen by `staged`
             * stayed an indirect call per 8 outputs) */
            const float *pfw = s1 > s0 ? w + (int64_t)(k0 + kc + kb + s0) * 32 : NULL;
            if (last) sat_dconv_pf_out(a, j * 32, nr, p0);
            if (staged)
                sat_dconv_tile(rows, kc, a->koff + k0, xr, w + (int64_t)k0 * 32, st, odd * 8, 16, mr, nr,
                               k0 ? buf : NULL, NULL, pfw, ((s1 - s0) << 16) / kc, a->ybase / P + j * 32, epc, NULL);
            else
                sat_dconv_tile(rows, kc, a->koff + k0, xr, w + (int64_t)k0 * 32, a->y,
                               a->ybase + (int64_t)j * 32 * P + p0, P, mr, nr, k0 ? buf : NULL, last ? NULL : buf,
                               pfw, ((s1 - s0) << 16) / kc, a->ybase / P + j * 32, epc, epv);
            if (staged && (odd || q + 1 == q1))
                sat_dconv_flush(st, a->y, a->ybase + (int64_t)j * 32 * P + p0 - odd * 8, P, nr, odd * 8 + mr, epv);
        }
    }
    if (!epc && !epv && a->epi) {
        const int64_t p0 = (int64_t)q0 * R, p1 = (int64_t)q1 * R < P ? (int64_t)q1 * R : P;
        for (int m = 0; m < nr; m++) a->epi(a->y, a->ybase + (int64_t)(j * 32 + m) * P + p0, p1 - p0);
    }
}


/* Pixels per kernel tile: 7 when its panels run fewer rows in all than 8-row panels would (8 on a tie:
 * the wider tile loads each weight vector for more rows). */
static inline int sat_dconv_rows(int64_t P) {
    const int64_t by7 = P / 7 * 7 + (P % 7 ? sat_dconv_run_rows((int)(P % 7), 7) : 0);
    const int64_t by8 = P / 8 * 8 + (P % 8 ? sat_dconv_run_rows((int)(P % 8), 8) : 0);
    return by7 < by8 ? 7 : 8;
}

#endif

#endif
