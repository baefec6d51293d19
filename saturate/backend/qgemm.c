/* The kernel library's half of qgemm.h: compiled once per instruction set (build.py), linked into every model. */
#include "kernels.h"

/* `bytes` of the heap, or the process ends with a message: a kernel has no error path back to sat_run. */
static void *sat_qalloc(size_t bytes) {
    void *m = malloc(bytes);
    if (!m) {
        fprintf(stderr, "saturate: out of memory in a quantized conv\n");
        abort();
    }
    return m;
}

/* Gather pixel p's K taps as bytes into row a (K4 * 4 bytes, zero past K); returns their sum. The fields are
 * read into locals first: stores through a byte pointer may alias anything, so the compiler would reload
 * them after every byte. */
int32_t sat_qgather(const sat_qconv_args *q, int64_t n, int64_t g, int64_t p, uint8_t *restrict a) {
    const int64_t K = q->K, K4 = q->K4, kh = q->kh, kw = q->kw, dh = q->dh, dw = q->dw;
    const int xoff = q->xoff;
    int32_t sum = 0;
    if (q->matmul) {
        const float *restrict xr = q->x + p * K;
        for (int64_t k = 0; k < K; k++) {
            const int v = (int)xr[k] + xoff;
            a[k] = (uint8_t)v;
            sum += v;
        }
    } else {
        /* Taps in (ky, kx, channel) order: each is one run of the group's channels. */
        const int64_t C = q->C, Cg = C / q->group, oy = p / q->ow, ox = p % q->ow, Wp = q->Wp;
        const uint8_t *base = q->xb + ((n * q->Hp + oy * q->sh) * Wp + ox * q->sw) * C + g * Cg;
        int64_t k = 0;
        for (int64_t ky = 0; ky < kh; ky++)
            for (int64_t kx = 0; kx < kw; kx++, k += Cg) memcpy(a + k, base + (ky * dh * Wp + kx * dw) * C, (size_t)Cg);
        for (int64_t j = 0; j < K; j++) sum += a[j];
    }
    for (int64_t k = K; k < 4 * K4; k++) a[k] = 0;
    return sum;
}

/* Depthwise (one input and one output channel per group), per (image, channel) plane: its window sums
 * (x + xoff) * w over at most 64 taps, each product under 2^15 in size, so float32 sums of them are exact
 * integers (under 2^24) and the loop over a row of outputs vectorizes. No byte panels: their 16 lanes would
 * hold one channel. */
void sat_qdw_plane(void *ctx, int64_t item, int tid) {
    const sat_qconv_args *q = ctx;
    (void)tid;
    const int64_t m = item % q->M, H = q->H, W = q->W, kh = q->kh, kw = q->kw, oh = q->oh, ow = q->ow;
    const int64_t sh = q->sh, sw = q->sw, dh = q->dh, dw = q->dw;
    const int64_t hs = (oh - 1) * sh + (kh - 1) * dh + 1, ws = (ow - 1) * sw + (kw - 1) * dw + 1;
    const int64_t Hp = hs > q->ph + H ? hs : q->ph + H, Wp = ws > q->pw + W ? ws : q->pw + W;
    const float *restrict x = q->x + item * H * W;
    float *restrict y = q->y + item * oh * ow;
    const int8_t *w = q->w + m * q->K4 * 64;  /* the plane's panel: tap k is byte 4 * 16 * (k / 4) + k % 4 */
    float wk[64];
    for (int64_t k = 0; k < kh * kw; k++) wk[k] = (float)w[64 * (k / 4) + k % 4];
    /* the plane as (x + xoff), padded with xpad; then one row of sums at a time. A small plane's buffer is on
     * the stack: the late layers' planes (3x3 and 6x6 maps, up to 960 of them) each took a malloc and a free,
     * most of their time (MobileNetV2 int8 at 96x96, AVX2 build: 0.33-0.51 ms per depthwise conv of 960
     * channels on 3x3 maps) */
    float small[2048];
    const int64_t need = Hp * Wp + 2 * ow;
    float *buf = need <= 2048 ? small : sat_qalloc(sizeof(float) * (size_t)need);
    float *restrict pad = buf, *restrict acc = buf + Hp * Wp, *restrict rs = acc + ow;
    const float xoff = (float)q->xoff, xpad = (float)q->xpad;
    for (int64_t i = 0; i < Hp * Wp; i++) pad[i] = xpad;
    for (int64_t iy = 0; iy < H; iy++)
        for (int64_t ix = 0; ix < W; ix++) pad[(q->ph + iy) * Wp + q->pw + ix] = x[iy * W + ix] + xoff;
    const int64_t corr = q->corr[m], bz = q->bz[m];
    const float scale = q->scale[m], zy = q->zy, lo = q->lo, hi = q->hi;
    if (ow < 8) {
        /* narrow rows: each output's sums in registers (the row loop below would add every tap into the same
         * few stored sums, one store-to-load wait per tap) */
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                float s = 0.0f, r = 0.0f;
                for (int64_t ky = 0; ky < kh; ky++)
                    for (int64_t kx = 0; kx < kw; kx++) {
                        const float v = pad[(oy * sh + ky * dh) * Wp + ox * sw + kx * dw];
                        s += wk[ky * kw + kx] * v;
                        r += v;
                    }
                const float t = rintf((float)((int64_t)s + corr - bz * (int64_t)r) * scale) + zy;
                y[oy * ow + ox] = t < lo ? lo : (t > hi ? hi : t);
            }
        if (buf != small) free(buf);
        return;
    }
    for (int64_t oy = 0; oy < oh; oy++) {
        for (int64_t ox = 0; ox < ow; ox++) acc[ox] = rs[ox] = 0.0f;
        for (int64_t ky = 0; ky < kh; ky++)
            for (int64_t kx = 0; kx < kw; kx++) {
                const float *restrict src = pad + (oy * sh + ky * dh) * Wp + kx * dw;
                const float wv = wk[ky * kw + kx];
                if (sw == 1)
                    for (int64_t ox = 0; ox < ow; ox++) {
                        acc[ox] += wv * src[ox];
                        rs[ox] += src[ox];
                    }
                else
                    for (int64_t ox = 0; ox < ow; ox++) {
                        acc[ox] += wv * src[ox * sw];
                        rs[ox] += src[ox * sw];
                    }
            }
        int64_t ox = 0;
#ifdef __AVX2__
        /* 8 outputs at a time: the float sums are exact integers (under 2^24), the sum in wrapping 32-bit lanes
         * (exact, see corr32), then the scalar loop's arithmetic */
        const __m256i c32 = _mm256_set1_epi32(q->corr32[m]), b32 = _mm256_set1_epi32((int32_t)bz);
        for (; ox + 8 <= ow; ox += 8) {
            const __m256i sum = _mm256_sub_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(_mm256_loadu_ps(acc + ox)), c32),
                                                 _mm256_mullo_epi32(_mm256_cvttps_epi32(_mm256_loadu_ps(rs + ox)), b32));
            __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(scale));
            v = _mm256_add_ps(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), _mm256_set1_ps(zy));
            _mm256_storeu_ps(y + oy * ow + ox, _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(lo)), _mm256_set1_ps(hi)));
        }
#endif
        for (; ox < ow; ox++) {
            const int64_t sum = (int64_t)acc[ox] + corr - bz * (int64_t)rs[ox];
            const float v = rintf((float)sum * scale) + zy;
            y[oy * ow + ox] = v < lo ? lo : (v > hi ? hi : v);
        }
    }
    if (buf != small) free(buf);
}

/* int32 sums of SAT_QROWS byte rows (stride lda) with `np` (1 or 2) consecutive 16-channel weight panels:
 * two give 12 independent accumulators, enough to hide vpdpbusd's latency. */
void sat_qdot_panels(const uint8_t *a, int64_t lda, const int8_t *w, int64_t K4, int np,
                            int32_t acc[SAT_QROWS][32]) {
#ifdef SAT_HAVE_VNNI
    __m512i s[SAT_QROWS], t[SAT_QROWS];
    for (int r = 0; r < SAT_QROWS; r++) s[r] = t[r] = _mm512_setzero_si512();
    if (np == 2) {
        const int8_t *w2 = w + K4 * 64;
        for (int64_t k = 0; k < K4; k++) {
            const __m512i b = _mm512_loadu_si512((const void *)(w + k * 64));
            const __m512i b2 = _mm512_loadu_si512((const void *)(w2 + k * 64));
            for (int r = 0; r < SAT_QROWS; r++) {
                int32_t four;
                memcpy(&four, a + r * lda + 4 * k, 4);
                const __m512i x = _mm512_set1_epi32(four);
                s[r] = _mm512_dpbusd_epi32(s[r], x, b);
                t[r] = _mm512_dpbusd_epi32(t[r], x, b2);
            }
        }
    } else {
        for (int64_t k = 0; k < K4; k++) {
            const __m512i b = _mm512_loadu_si512((const void *)(w + k * 64));
            for (int r = 0; r < SAT_QROWS; r++) {
                int32_t four;
                memcpy(&four, a + r * lda + 4 * k, 4);
                s[r] = _mm512_dpbusd_epi32(s[r], _mm512_set1_epi32(four), b);
            }
        }
    }
    for (int r = 0; r < SAT_QROWS; r++) {
        _mm512_storeu_si512((void *)acc[r], s[r]);
        _mm512_storeu_si512((void *)(acc[r] + 16), t[r]);
    }
#else
    for (int r = 0; r < SAT_QROWS; r++)
        for (int c = 0; c < 32; c++) acc[r][c] = 0;
    for (int h = 0; h < np; h++) {
        const int8_t *wh = w + h * K4 * 64;
        for (int64_t k = 0; k < K4; k++) {
            const int8_t *b = wh + k * 64;
            for (int r = 0; r < SAT_QROWS; r++) {
                const uint8_t *ar = a + r * lda + 4 * k;
                const int32_t a0 = ar[0], a1 = ar[1], a2 = ar[2], a3 = ar[3];
                int32_t *o = acc[r] + 16 * h;
                for (int c = 0; c < 16; c++)
                    o[c] += a0 * b[4 * c] + a1 * b[4 * c + 1] + a2 * b[4 * c + 2] + a3 * b[4 * c + 3];
            }
        }
    }
#endif
}

#ifdef SAT_HAVE_QDOT16
/* sat_qdot_panels on AVX2: the rows as 16-bit lanes (lda of them apart), each 16-channel panel in two halves
 * of 8 channels: per 4-tap step, the half's 32 weight bytes widened into two vectors (4 channels x 4 taps
 * each), and for each of the 6 rows its 4 taps broadcast and multiplied by both (12 accumulators, a channel's
 * sum in two adjacent lanes). */
void sat_qdot_panels16(const int16_t *a, int64_t lda, const int8_t *w, int64_t K4, int np, int32_t acc[SAT_QROWS][32]) {
    for (int hp = 0; hp < 2 * np; hp++) {
        const int8_t *wh = w + (hp / 2) * K4 * 64 + (hp % 2) * 32;
        __m256i s[SAT_QROWS][2];
        for (int r = 0; r < SAT_QROWS; r++) s[r][0] = s[r][1] = _mm256_setzero_si256();
        for (int64_t k = 0; k < K4; k++) {
            const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wh + k * 64)));
            const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wh + k * 64 + 16)));
            for (int r = 0; r < SAT_QROWS; r++) {
                int64_t four;
                memcpy(&four, a + r * lda + 4 * k, 8);
                const __m256i x = _mm256_set1_epi64x(four);
                s[r][0] = _mm256_add_epi32(s[r][0], _mm256_madd_epi16(x, w0));
                s[r][1] = _mm256_add_epi32(s[r][1], _mm256_madd_epi16(x, w1));
            }
        }
        /* lanes 2c and 2c + 1 of a vector hold the two halves of its channel c's sum: the pairs added (channels
         * 0 1 4 5 | 2 3 6 7), then put in order */
        for (int r = 0; r < SAT_QROWS; r++)
            _mm256_storeu_si256((__m256i *)(acc[r] + 8 * hp),
                                _mm256_permute4x64_epi64(_mm256_hadd_epi32(s[r][0], s[r][1]), _MM_SHUFFLE(3, 1, 2, 0)));
    }
}
#endif

void sat_qconv_item(void *ctx, int64_t item, int tid) {
    const sat_qconv_args *q = ctx;
    (void)tid;
    const int64_t P = q->matmul ? q->images : q->oh * q->ow, Mg = q->M / q->group, panels = (Mg + 15) / 16;
    const int64_t s = item % q->split;
    item /= q->split;
    const int64_t t = item % q->tiles, g = (item / q->tiles) % q->group, n = item / (q->tiles * q->group);
    const int64_t p0 = t * SAT_QTILE, p1 = p0 + SAT_QTILE < P ? p0 + SAT_QTILE : P, lda = 4 * q->K4;
    /* the rows the register tiles read: the tile's pixels, rounded up to whole tiles (a 3x3 map's 9 pixels are
     * 12 rows, not SAT_QTILE) */
    const int64_t rows = (p1 - p0 + SAT_QROWS - 1) / SAT_QROWS * SAT_QROWS;
    uint8_t *a = sat_qalloc((size_t)(rows * lda));
    int32_t rowsum[SAT_QTILE];
    for (int64_t p = p0; p < p0 + rows; p++) {
        if (p < p1) {
            rowsum[p - p0] = sat_qgather(q, n, g, p, a + (p - p0) * lda);
        } else {  /* rows past the last pixel are computed and dropped */
            memset(a + (p - p0) * lda, 0, (size_t)lda);
            rowsum[p - p0] = 0;
        }
    }
    const int8_t *wg = q->w + g * panels * q->K4 * 64;
    int32_t acc[SAT_QROWS][32];
#ifdef SAT_HAVE_QDOT16
    int16_t *a16 = sat_qalloc(sizeof(int16_t) * (size_t)(rows * lda));
    for (int64_t i = 0; i < rows * lda; i++) a16[i] = a[i];
#endif
    const int64_t j1 = 2 * (s + 1) * q->pairs < panels ? 2 * (s + 1) * q->pairs : panels;
    for (int64_t j = 2 * s * q->pairs; j < j1; j += 2) {
        const int np = panels - j >= 2 ? 2 : 1;
        const int64_t m0 = g * Mg + j * 16, mc = Mg - j * 16 < 16 * np ? Mg - j * 16 : 16 * np;
        for (int64_t r0 = 0; r0 < p1 - p0; r0 += SAT_QROWS) {
#ifdef SAT_HAVE_QDOT16
            sat_qdot_panels16(a16 + r0 * lda, lda, wg + j * q->K4 * 64, q->K4, np, acc);
#else
            sat_qdot_panels(a + r0 * lda, lda, wg + j * q->K4 * 64, q->K4, np, acc);
#endif
            for (int64_t r = 0; r < SAT_QROWS && p0 + r0 + r < p1; r++) {
                const int64_t p = p0 + r0 + r;
                int64_t c = 0;
#ifdef __AVX2__
                /* 8 channels at a time, the same arithmetic as the scalar loop below: the sum in wrapping 32-bit
                 * lanes (exact, see corr32), converted, scaled, rounded half to even, offset and saturated */
                const __m256i rs = _mm256_set1_epi32(rowsum[r0 + r]);
                for (; c + 8 <= mc; c += 8) {
                    const int64_t m = m0 + c;
                    const __m256i sum = _mm256_sub_epi32(
                        _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(acc[r] + c)),
                                         _mm256_loadu_si256((const __m256i *)(q->corr32 + m))),
                        _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)(q->bz + m)), rs));
                    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(sum), _mm256_loadu_ps(q->scale + m));
                    v = _mm256_add_ps(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                      _mm256_set1_ps(q->zy));
                    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(q->lo)), _mm256_set1_ps(q->hi));
                    if (q->matmul) {
                        _mm256_storeu_ps(q->y + p * q->M + m, v);
                    } else {
                        float t[8];
                        _mm256_storeu_ps(t, v);
                        for (int i = 0; i < 8; i++) q->y[(n * q->M + m + i) * P + p] = t[i];
                    }
                }
#endif
                for (; c < mc; c++) {
                    const int64_t m = m0 + c;
                    const int64_t sum = (int64_t)acc[r][c] + q->corr[m] - (int64_t)q->bz[m] * rowsum[r0 + r];
                    float v = rintf((float)sum * q->scale[m]) + q->zy;
                    v = v < q->lo ? q->lo : (v > q->hi ? q->hi : v);
                    q->y[q->matmul ? p * q->M + m : (n * q->M + m) * P + p] = v;
                }
            }
        }
    }
#ifdef SAT_HAVE_QDOT16
    free(a16);
#endif
    free(a);
}

/* Input row `item` (image n, row iy) of a conv as bytes (x + xoff) into its padded channels-last copy. */
static void sat_qpad_row(void *ctx, int64_t item, int tid) {
    const sat_qconv_args *q = ctx;
    const int64_t n = item / q->H, iy = item % q->H, C = q->C, W = q->W;
    uint8_t *xb = (uint8_t *)q->xb;
    (void)tid;
    for (int64_t c = 0; c < C; c++) {
        const float *restrict src = q->x + ((n * C + c) * q->H + iy) * W;
        uint8_t *restrict dst = xb + ((n * q->Hp + q->ph + iy) * q->Wp + q->pw) * C + c;
        for (int64_t ix = 0; ix < W; ix++) dst[ix * C] = (uint8_t)((int)src[ix] + q->xoff);
    }
}

/* QLinearConv (matmul = 0: x is images x C x H x W, y images x M x oh x ow) or QLinearMatMul (matmul = 1:
 * x is `images` rows of K, y those rows of M; one group, a 1 x 1 window). */
void sat_qconv(const float *x, const void *w, const void *corr, const void *bz, const float *scale, float *y,
                      int64_t images, int64_t C, int64_t H, int64_t W, int64_t M, int64_t kh, int64_t kw, int64_t oh,
                      int64_t ow, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t group,
                      int64_t K, int xoff, int xpad, float zy, float lo, float hi, int matmul) {
    sat_qconv_args q = {x, NULL, 0, 0, w, corr, bz, scale, y, images, C, H, W, M, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw,
                        group, K, (K + 3) / 4, 0, xoff, xpad, matmul, zy, lo, hi};
    const int64_t P = matmul ? images : oh * ow;
    q.tiles = (P + SAT_QTILE - 1) / SAT_QTILE;
    if (P == 0 || M == 0) return;
    int32_t *corr32 = sat_qalloc(sizeof(int32_t) * (size_t)M);
    for (int64_t m = 0; m < M; m++) corr32[m] = (int32_t)(uint32_t)(uint64_t)((const int64_t *)corr)[m];
    q.corr32 = corr32;
    if (!matmul && group == C && group == M && kh * kw <= 64) {
        sat_parallel(images * M, sat_qdw_plane, &q);
        free(corr32);
        return;
    }
    uint8_t *xb = NULL;
    if (!matmul) {
        /* Taps past the input's end (bottom and right pads) land in the padded planes too. */
        const int64_t hs = (oh - 1) * sh + (kh - 1) * dh + 1, ws = (ow - 1) * sw + (kw - 1) * dw + 1;
        q.Hp = hs > ph + H ? hs : ph + H;
        q.Wp = ws > pw + W ? ws : pw + W;
        const size_t bytes = (size_t)(images * q.Hp * q.Wp * C);
        xb = sat_qalloc(bytes);
        memset(xb, xpad, bytes);
        /* the copy row by row, shared among the threads */
        q.xb = xb;
        sat_parallel(images * H, sat_qpad_row, &q);
    }
    /* Fewer (image, group, tile) units than four per thread (a late layer's 6x6 or 3x3 map is one tile): each
     * split by channel panels, or one thread would run the conv alone (ResNet-18 int8's 512-channel convs on
     * 3x3 maps took as long at 2 threads as at 1) */
    const int64_t units = (matmul ? 1 : images) * group * q.tiles, all = (M / group + 31) / 32;
    q.split = 1, q.pairs = all;
    if (sat_threads > 1 && !sat_in_parallel && units < 4 * sat_threads) {
        q.pairs = (all * units + 4 * sat_threads - 1) / (4 * sat_threads);
        q.pairs = q.pairs < 1 ? 1 : q.pairs;
        q.split = (all + q.pairs - 1) / q.pairs;
    }
    sat_parallel(units * q.split, sat_qconv_item, &q);
    free(corr32);
    free(xb);
}
