/* Quantized kernels: QLinearConv and QLinearMatMul on 8-bit integers with int32 accumulation and a
 * requantizing epilogue, included by kernels.h.
 *
 * Quantized activations live in the workspace as float32 numbers holding their integer values exactly (see
 * INT_CODED in shapes.py); a work item gathers its pixels' taps into unsigned bytes (x + xoff, so int8
 * inputs become x + 128) and multiplies them with the signed weight bytes (w - woff, uint8 weights become
 * w - 128), packed here in 16-channel panels [K4][16][4]. With a = x_zero_point + xoff and b[m] the weights'
 * zero point in the same offset, sum (x - zx)(w - zw) = dot - b[m] * rowsum - a * wsum[m] + K a b[m]; the
 * terms that do not depend on the pixel are folded into corr[m] (int64, bias included) at compile time.
 * The result is requantized as ONNX Runtime does: float(sum) * (x_scale * w_scale / y_scale), rounded half
 * to even, plus y_zero_point, saturated. AVX-512 VNNI builds multiply with vpdpbusd (4 bytes per lane); the
 * portable loop keeps the same packing and int32 sums. */
#ifndef SATURATE_QGEMM_H
#define SATURATE_QGEMM_H

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define SAT_HAVE_VNNI 1
#elif defined(__AVX2__)
/* Without VNNI, AVX2 multiplies 16-bit lanes: the pixels' bytes widened once per work item, the weight bytes
 * as each step loads them, and vpmaddwd sums two exact products per 32-bit lane (vpmaddubsw's faster
 * byte products saturate their 16-bit pair sums, 2 x 255 x 128 > 32767, so they would differ from ONNX's
 * int32 sums). */
#include <immintrin.h>
#define SAT_HAVE_QDOT16 1
#endif

#define SAT_QROWS 6    /* pixels per register tile */
#define SAT_QTILE 96   /* pixels per work item (a multiple of SAT_QROWS) */

typedef struct {
    const float *x;
    const uint8_t *xb;  /* convs: the input as bytes (x + xoff), channels last, padded with xpad to Hp x Wp */
    int64_t Hp, Wp;
    const int8_t *w;
    const int64_t *corr;
    const int32_t *bz;
    const float *scale;
    float *y;
    int64_t images, C, H, W, M, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, group, K, K4, tiles;
    int xoff, xpad, matmul;
    float zy, lo, hi;
    /* corr[m] modulo 2^32: a sum corr + dot - bz rowsum fits 32 bits (qlinear_params bounds K), so 32-bit
     * lanes that wrap give it exactly, whatever corr's own size */
    const int32_t *corr32;
    /* each (image, group, pixel tile) is `split` items, each `pairs` consecutive pairs of channel panels */
    int64_t split, pairs;
} sat_qconv_args;

int32_t sat_qgather(const sat_qconv_args *q, int64_t n, int64_t g, int64_t p, uint8_t *restrict a);

void sat_qdw_plane(void *ctx, int64_t item, int tid);

void sat_qdot_panels(const uint8_t *a, int64_t lda, const int8_t *w, int64_t K4, int np,
                            int32_t acc[SAT_QROWS][32]);

#ifdef SAT_HAVE_QDOT16
void sat_qdot_panels16(const int16_t *a, int64_t lda, const int8_t *w, int64_t K4, int np, int32_t acc[SAT_QROWS][32]);
#endif

void sat_qconv_item(void *ctx, int64_t item, int tid);

void sat_qconv(const float *x, const void *w, const void *corr, const void *bz, const float *scale, float *y,
                      int64_t images, int64_t C, int64_t H, int64_t W, int64_t M, int64_t kh, int64_t kw, int64_t oh,
                      int64_t ow, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t group,
                      int64_t K, int xoff, int xpad, float zy, float lo, float hi, int matmul);

#endif
