/* The kernel library's half of wino.h: compiled once per instruction set (build.py), linked into every model. */
#include <unistd.h>

#include "kernels.h"

float *sat_wino_buf[SAT_MAX_THREADS];

size_t sat_wino_cap[SAT_MAX_THREADS];

/* Tiles [t0, t0 + nt) of one image, channel c, into the 16 slices of v (`vs` floats apart): element
 * (c, t) of tile panel q at [q ps + c SAT_PR + t % SAT_PR], ps = C SAT_PR + SAT_VL. Per tile row the 4
 * input rows are combined first (B^T d, whole rows at once), then split into even and odd columns, so the
 * column step (d B) of every tile reads contiguous runs the compiler vectorizes. Channels go in
 * increasing order (the vector stores below rely on it). */
void sat_wino_in(const sat_wino_args *a, const float *xc, float *v, int64_t vs, int64_t ps, int c, int t0,
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

void sat_wino_unit(void *ctx, int64_t u, int tid) { sat_wino_run(ctx, u, tid, NULL); }

/* Floats a block's transformed input and sums take: half the core's L2 (at most 4 MB), else
 * SAT_WINO_VFLOATS. The weights (16 C M floats: 4 MB for 256 channels in and out) stream from L3 or memory
 * once per block, and the block's tiles are all the use each weight gets there: on a Xeon with 2 MB of L2
 * per core (1 thread, per-step medians), VGG-11's 3x3 convs of 256 and 512 channels on 56x56 and 28x28
 * maps took 23.1 and 26.9 ms with 192 KB blocks (12 and 6 tiles), 17.9 and 19.4 ms with 1 MB, 19.5 and
 * 19.4 with 1.5 MB. (Read once; a race between threads would store the same value.) */
int64_t sat_wino_block_floats(void) {
    static int64_t floats;
    if (!floats) {
        long l2 = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
        l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
        const int64_t half = l2 > 0 ? (int64_t)l2 / 8 : 0;
        floats = half < SAT_WINO_VFLOATS ? SAT_WINO_VFLOATS : half > 1024 * 1024 ? 1024 * 1024 : half;
    }
    return floats;
}

/* 3x3 convolution, unit strides and dilations, one group, begin pads ph, pw (any end pads: OH, OW say
 * where the output ends), on weights transformed and packed by the emitter (emit.wino_weights: per
 * SAT_PN-channel panel, M rounded up to SAT_PN, 16 slices of C x SAT_PN). `body` is the emitter's instantiation of sat_wino_run with
 * its 8-channel epilogue, or NULL (then `epi` runs on the output rows). Blocks hold about
 * sat_wino_block_floats floats of transformed input and sums, evened out over an image's tiles; when the
 * units are too few to share evenly, each is split by channel chunks (each chunk transforms its block's
 * input again, a small cost beside its products). */
void sat_conv_wino(const float *x, const float *u, float *y, int N, int C, int H, int W, int M, int OH,
                          int OW, int ph, int pw, sat_epi epi, sat_body body) {
    if ((int64_t)OH * OW <= 0 || M <= 0) return;
    const int TH = (OH + 1) / 2, TW = (OW + 1) / 2, tiles = TH * TW;
    int tb = (int)(sat_wino_block_floats() / (16 * ((int64_t)C + SAT_PN)) / SAT_PR * SAT_PR);
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
    sat_wino_args a = {x, u, y, C, H, W, M, OH, OW, ph, pw, TW, tiles, tb, blocks, split, chunk, epi};
    sat_parallel(units * split, body ? body : sat_wino_unit, &a);
}

#if defined(SAT_HAVE_WINO16)
/* Tiles [t0, t0 + nt) of one image (raster order), channel c (plane xc), into the 16 slices of v (`slice`
 * floats apart): tile t0 + t at [(t / NR * C + c) * NR + t % NR], NR = SAT_WZ_NR. A vector of tiles of a row at
 * a time: their columns 2 tw .. 2 tw + 3 of each of the 4 input rows are the even and odd lanes of two pairs
 * of loads straight from the plane (masked where a pad falls), and B^T d B runs on those vectors. */
void sat_wino16_in(const sat_wino16_args *a, const float *xc, float *v, int64_t slice, int c, int t0, int nt) {
    const int TW = a->TW, H = a->H, W = a->W, C = a->C, NR = SAT_WZ_NR, VL = SAT_WZ_VL;
    const int th0 = t0 / TW, th1 = (t0 + nt - 1) / TW;
    for (int th = th0; th <= th1; th++) {
        const int tw1 = th == th1 ? (t0 + nt - 1) % TW + 1 : TW;
        for (int tw0 = th == th0 ? t0 % TW : 0; tw0 < tw1; tw0 += VL) {
            const int n = tw1 - tw0 < VL ? tw1 - tw0 : VL, c0 = 2 * tw0 - a->pw;
            /* lanes of each load inside the row */
            const sat_wz_m k0 = sat_wz_lanes(-c0, W - c0), k1 = sat_wz_lanes(-c0 - VL, W - c0 - VL);
            const sat_wz_m k2 = sat_wz_lanes(-c0 - 2, W - c0 - 2), k3 = sat_wz_lanes(-c0 - 2 - VL, W - c0 - 2 - VL);
            sat_wz_v d[4][4];
            for (int r = 0; r < 4; r++) {
                const int ih = 2 * th - a->ph + r;
                if (ih < 0 || ih >= H) {
                    d[r][0] = d[r][1] = d[r][2] = d[r][3] = sat_wz_zero();
                    continue;
                }
                const float *s = xc + (int64_t)ih * W + c0;
                const sat_wz_v l0 = sat_wz_load(k0, s), l1 = sat_wz_load(k1, s + VL);
                const sat_wz_v h0 = sat_wz_load(k2, s + 2), h1 = sat_wz_load(k3, s + 2 + VL);
                d[r][0] = sat_wz_even(l0, l1);
                d[r][1] = sat_wz_odd(l0, l1);
                d[r][2] = sat_wz_even(h0, h1);
                d[r][3] = sat_wz_odd(h0, h1);
            }
            sat_wz_v e[4][4];
            for (int i = 0; i < 4; i++) {
                e[0][i] = d[0][i] - d[2][i], e[1][i] = d[1][i] + d[2][i];
                e[2][i] = d[2][i] - d[1][i], e[3][i] = d[1][i] - d[3][i];
            }
            const int t = th * TW + tw0 - t0, o = t % NR;
            float *dst = v + ((int64_t)(t / NR) * C + c) * NR + o;
            /* a run crossing into the next panel: its lanes from NR - o on go to that panel's start */
            const sat_wz_m all = sat_wz_lanes(0, n), first = sat_wz_lanes(0, n < NR - o ? n : NR - o);
            const sat_wz_m second = sat_wz_andnot(first, all);
            const int split = sat_wz_any(second);
            for (int j = 0; j < 4; j++) {
                const sat_wz_v e0 = e[j][0], e1 = e[j][1], e2 = e[j][2], e3 = e[j][3];
                const sat_wz_v vj[4] = {e0 - e2, e1 + e2, e2 - e1, e1 - e3};
                for (int i = 0; i < 4; i++) {
                    float *sl = dst + (4 * j + i) * slice;
                    sat_wz_store(sl, first, vj[i]);
                    if (split) sat_wz_store(sl + (int64_t)C * NR - NR, second, vj[i]);
                }
            }
        }
    }
}

void sat_wino16_unit(void *ctx, int64_t u, int tid) { sat_wino16_run(ctx, u, tid, NULL); }

/* 3x3 convolution, unit strides and dilations, one group, begin pads ph, pw (OH, OW say where the output ends),
 * on weights transformed and packed by the emitter (emit.wino16_weights). `body` is the emitter's instantiation
 * of sat_wino16_run with the epilogue's row form, or NULL (then `epi` runs on each stored run). Blocks hold
 * about half sat_wino_block_floats floats of V and sums (at least SAT_WINO_VFLOATS); when the units are fewer
 * than the threads, each is split by channel chunks (each transforms its block's input again). */
void sat_conv_wino16(const float *x, const float *u, float *y, int N, int C, int H, int W, int M, int OH, int OW,
                     int ph, int pw, sat_epi epi, sat_body body) {
    if ((int64_t)OH * OW <= 0 || M <= 0) return;
    const int NR = SAT_WZ_NR, MR = SAT_WZ_MR;
    const int TH = (OH + 1) / 2, TW = (OW + 1) / 2, tiles = TH * TW, Mp = (M + MR - 1) / MR * MR;
    const int pass = Mp < SAT_WZ_MPASS ? Mp : SAT_WZ_MPASS;
    /* An image's tiles in one range per thread where the images do not share evenly between them, each range
     * in blocks of whole tile panels (its last may be short), so only a range's last panel pads */
    const int ranges = sat_threads > 1 && !sat_in_parallel && N % sat_threads != 0 && tiles >= NR * sat_threads
                           ? sat_threads : 1;
    /* Blocks of a quarter of the L2, not half as the first form's: ResNet-50's 3x3 convs of 64 channels on 56x56
     * maps at 224x224, AVX-512, 1 thread, per-step medians beside each other, 0.86-1.08 -> 0.82-0.93 ms (an
     * eighth: 0.88-1.09), the 28x28 ones level. */
    const int64_t quarter = sat_wino_block_floats() / 2, floats = quarter > SAT_WINO_VFLOATS ? quarter : SAT_WINO_VFLOATS;
    const int64_t fit = floats / (16 * (int64_t)(C + pass)) / NR * NR;
    const int per = (tiles + ranges - 1) / ranges, blocks = fit < NR ? (per + NR - 1) / NR : (int)((per + fit - 1) / fit);
    const int64_t units = (int64_t)N * ranges * blocks;
    int split = sat_threads > 1 && !sat_in_parallel && units < sat_threads ? sat_threads : 1;
    const int chunk = ((M + split - 1) / split + MR - 1) / MR * MR;
    split = (M + chunk - 1) / chunk;
    sat_wino16_args a = {x, u, y, C, H, W, M, Mp, OH, OW, ph, pw, TW, tiles, ranges, blocks, split, chunk, epi};
    sat_parallel(units * split, body ? body : sat_wino16_unit, &a);
}
#endif
