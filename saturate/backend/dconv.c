/* The kernel library's half of dconv.h: compiled once per instruction set (build.py), linked into every model. */
#include "kernels.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#if defined(__AVX512F__)
float sat_dconv_acc[SAT_MAX_THREADS][SAT_DCHUNK * 384] __attribute__((aligned(64)));

float sat_dconv_stage[SAT_MAX_THREADS][32 * 16] __attribute__((aligned(64)));
#else
float sat_dconv8_acc[SAT_MAX_THREADS][SAT_DCHUNK * SAT_D8R * SAT_D8N] __attribute__((aligned(64)));

void sat_dconv8_plain(void *ctx, int64_t u, int tid) { sat_dconv8_unit(ctx, u, tid, NULL); }
#endif

void sat_pad_rows(void *ctx, int64_t band, int tid) {
    const sat_dconv_pad_args *a = ctx;
    const int H = a->H, W = a->W, Hq = a->Hq, Wp = a->Wp, ph = a->ph, pw = a->pw;
    (void)tid;
    const int len = W + pw <= Wp ? W : (Wp > pw ? Wp - pw : 0), rend = ph + H < Hq ? ph + H : Hq;
    const int lead = pw < Wp ? pw : Wp, tail = Wp - pw - len > 0 ? Wp - pw - len : 0;
    const int r0 = (int)(band * Hq / a->bands), r1 = (int)((band + 1) * Hq / a->bands);
    for (int64_t c = 0; c < a->C; c++)
        for (int r = r0; r < r1; r++) {
            float *d = a->xpad + (c * Hq + r) * Wp;
            if (r < ph || r >= rend) {
                memset(d, 0, sizeof(float) * (size_t)Wp);
                continue;
            }
            memset(d, 0, sizeof(float) * (size_t)lead);
            memcpy(d + pw, a->x + (c * H + r - ph) * W, sizeof(float) * (size_t)len);
            memset(d + pw + len, 0, sizeof(float) * (size_t)tail);
        }
}

void sat_gather_plane(void *ctx, int64_t c, int tid) {
    const sat_dconv_gather_args *a = ctx;
    (void)tid;
    const float *xc = a->x + c * a->H * a->W;
    float *d = a->xs + c * a->OH * a->OW;
    if (a->xpan) {
        const float *xc0 = a->x + c * SAT_NR;
        for (int oh = 0; oh < a->OH; oh++) {
            const int ih = oh * a->sh - a->ph;
            for (int ow = 0; ow < a->OW; ow++) {
                const int iw = ow * a->sw - a->pw;
                *d++ = ih >= 0 && ih < a->H && iw >= 0 && iw < a->W
                           ? xc0[sat_panel_at((int64_t)ih * a->W + iw, a->xpan, SAT_NR)] : 0.0f;
            }
        }
        return;
    }
    if (a->ph == 0 && a->pw == 0 && (a->OH - 1) * a->sh < a->H && (a->OW - 1) * a->sw < a->W) {
        for (int oh = 0; oh < a->OH; oh++) {
            const float *row = xc + oh * a->sh * a->W;
            for (int ow = 0; ow < a->OW; ow++) d[ow] = row[ow * a->sw];
            d += a->OW;
        }
        return;
    }
    for (int oh = 0; oh < a->OH; oh++) {
        const int ih = oh * a->sh - a->ph;
        for (int ow = 0; ow < a->OW; ow++) {
            const int iw = ow * a->sw - a->pw;
            *d++ = ih >= 0 && ih < a->H && iw >= 0 && iw < a->W ? xc[ih * a->W + iw] : 0.0f;
        }
    }
}

/* Grouped 2-D convolution by direct tiles; `scratch` holds the padded input and the offset table
 * (sat_dconv_scratch floats); `unit` is the emitter's instantiation of sat_dconv_unit; `width` the channels
 * of the packed weights' panels (32, 64 for the AVX-512 6 x 64 tiles, 16 on AVX2). With `xpan` (one group, a
 * strided 1x1 conv that gathers its pixels) x is in sat_conv_pw's pixel panels (plan.panel_roots): image n's
 * panel q holds channel c of pixels q * SAT_NR + i at ((n * Q + q) * C + c) * SAT_NR + i, Q = ceil(H * W / SAT_NR). */
void sat_conv_direct(const float *x, const float *wp, int64_t wp_group, float *y, float *scratch, int N,
                            int C, int H, int W, int M, int KH, int KW, int OH, int OW, int sh, int sw, int ph,
                            int pw, int dh, int dw, int G, int width, int xpan, sat_epi epi, sat_body unit) {
    const int Cg = C / G, Mg = M / G, K = Cg * KH * KW;
    /* A strided 1x1 conv onto a small map runs on its gathered pixels (sat_gather_plane) at unit stride.
     * ResNet-50's downsampling convs at 1 thread: onto 3x3 maps 0.41 -> 0.37 ms, 6x6 0.235 -> 0.225; onto
     * 12x12 the copy costs more than it saves (0.165 -> 0.177: in place or not, a block's input is in L2).
     * On the 6 x 64 tiles every strided 1x1 conv is gathered (those onto at most 256 pixels take them): its
     * 512 -> 1024 from 28x28 ran 1.43 ms as the packed product, 1.64 in place, 1.34 gathered. */
    const int wide = width == 64;
    const int gather = KH == 1 && KW == 1 && (sh > 1 || sw > 1) && ((int64_t)OH * OW <= SAT_GATHER_MAXP || wide);
    const int Hp = (OH - 1) * sh + (KH - 1) * dh + 1, Wq = (OW - 1) * sw + (KW - 1) * dw + 1;
    /* Without pads the input is read in place (pitch W); else copied into a zero-padded plane. */
    const int inplace = !gather && ph == 0 && pw == 0 && Hp <= H && Wq <= W;
    const int Wp = gather ? OW : inplace ? W : Wq, Hq = gather ? OH : inplace ? H : Hp;
    const int xsh = gather ? 1 : sh, xsw = gather ? 1 : sw;
    int32_t *koff = (int32_t *)scratch;
    float *xpad = scratch + (K + 15) / 16 * 16;
    /* (in nested loops, not three divisions per index: the table is built on the calling thread alone
     * while the other threads wait for the conv's first job) */
    for (int c = 0, k = 0; c < Cg; c++)
        for (int kh = 0; kh < KH; kh++)
            for (int kw = 0; kw < KW; kw++) koff[k++] = (int32_t)((int64_t)c * Hq * Wp + kh * dh * Wp + kw * dw);
    const int64_t P = (int64_t)OH * OW;
#if defined(__AVX512F__)
    const int R = wide ? 6 : sat_dconv_rows(P);
#else
    const int R = SAT_D8R;
#endif
    const int panels = (int)((P + R - 1) / R), jpanels = (Mg + width - 1) / width;
    /* A unit is a run of panels (about 256 pixels, so its input rows stay in cache) over one weight
     * panel; smaller runs when there are too few units to share between threads. */
    int chunk = (256 + R - 1) / R;
    const int want = 4 * sat_threads, small = P * Mg * K < SAT_CONV_PAR_MACS;
    if (sat_threads > 1 && !small && (int64_t)((panels + chunk - 1) / chunk) * jpanels < want) {
        const int per = (want + jpanels - 1) / jpanels;
        chunk = (panels + per - 1) / per;
    }
    if (chunk > panels) chunk = panels;
    if (chunk > SAT_DCHUNK) chunk = SAT_DCHUNK;
    if (chunk < 1) chunk = 1;
    /* (see sat_dconv_flush; an even chunk keeps each staged pair on one 64-byte line) */
    const int stage = width == 32 && R == 8 && P * 4 % 2048 == 0;
    if (stage && chunk > 1 && chunk % 2) chunk++;
    const int chunks = (panels + chunk - 1) / chunk;
    /* The AVX2 tiles of a conv of at most 12 pixels (two 6-pixel panels, so each weight block serves two tiles
     * and the weights stream from memory) take blocks of 128: ResNet-50's 3x3 convs of 512 channels on 3x3
     * maps ran 0.90-0.95 -> 0.87-0.90 ms; on 6x6 maps (six panels) 128 was 1-2% slower than 256. */
    const int kc = width == 16 && P <= 12 ? 128 : SAT_DKC;
    for (int n = 0; n < N; n++)
        for (int g = 0; g < G; g++) {
            const float *xg = xpan ? x + (int64_t)n * C * (((int64_t)H * W + SAT_NR - 1) / SAT_NR * SAT_NR)
                                   : x + ((int64_t)n * C + (int64_t)g * Cg) * H * W;
            if (gather) {
                sat_dconv_gather_args ga = {xg, xpad, H, W, OH, OW, sh, sw, ph, pw, xpan ? C : 0};
                sat_parallel(Cg, sat_gather_plane, &ga);
            } else if (!inplace) {
                const int bands = Hq < 2 * sat_threads ? Hq : 2 * sat_threads;
                sat_dconv_pad_args pa = {xg, xpad, Cg, H, W, Hq, Wp, ph, pw, bands};
                sat_parallel(bands, sat_pad_rows, &pa);
            }
            sat_dconv_args a = {inplace ? xg : xpad, wp + g * wp_group, koff, y,
                                ((int64_t)n * M + (int64_t)g * Mg) * P, P, K, Mg, OW, Wp, xsh, xsw, R, chunk,
                                panels, jpanels, stage, kc, wide, epi};
            /* (a conv of few multiply-adds on one thread: see SAT_CONV_PAR_MACS) */
            (small ? sat_serial : sat_parallel)((int64_t)chunks * jpanels, unit, &a);
        }
}

#endif
