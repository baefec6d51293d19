/* C backend conv micro-kernel: AVX-512 sgemm on weights packed at compile time (8 x 32 register tile).
 * Conv weights (M x K, rows zero-padded to Mp, a multiple of 8) are packed by the emitter block by
 * block of KC columns: block k0 (Mp x kc floats at Ap + k0*Mp) holds 8-row panels one after another,
 * A[i + r][k0 + k] at Ap[k0*Mp + i*kc + k*8 + r], so each k-block of the weights is one stream. */
#ifndef SATURATE_GEMM_H
#define SATURATE_GEMM_H

#include <stdint.h>
#include <stdlib.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#define SAT_HAVE_PACKED_GEMM 1
#define SAT_MR 8
#define SAT_NR 32
#define SAT_KC 256

void sat_pack_b(const float *B, int64_t ldb, int k0, int kc, int64_t j0, int nc, float *out);

#define SAT_ROW(r)                                                   \
    do {                                                             \
        const __m512 a_ = _mm512_set1_ps(a[r]);                      \
        c##r##0 = _mm512_fmadd_ps(a_, b0, c##r##0);                  \
        c##r##1 = _mm512_fmadd_ps(a_, b1, c##r##1);                  \
    } while (0)

/* A 1x1 conv's epilogue on 16 outputs of one channel: plane q (image * channels + channel), flat output index
 * `off` of the first lane, lanes `mk` (vector_form's row form, instantiated per conv by the emitter). */
typedef __m512 (*sat_epr)(__m512 v, int64_t q, int64_t off, __mmask16 mk);

#define SAT_STORE_EPR(r)                                                                                    \
    if (r < mr) {                                                                                          \
        float *cr = C + (int64_t)r * ldc;                                                                  \
        if (acc) {                                                                                         \
            c##r##0 = _mm512_add_ps(c##r##0, _mm512_maskz_loadu_ps(m0, cr));                               \
            c##r##1 = _mm512_add_ps(c##r##1, _mm512_maskz_loadu_ps(m1, cr + 16));                          \
        }                                                                                                  \
        if (epr) {                                                                                         \
            c##r##0 = epr(c##r##0, q + r, off + (int64_t)r * ldc, m0);                                     \
            c##r##1 = epr(c##r##1, q + r, off + (int64_t)r * ldc + 16, m1);                                \
        }                                                                                                  \
        _mm512_mask_storeu_ps(cr, m0, c##r##0);                                                            \
        _mm512_mask_storeu_ps(cr + 16, m1, c##r##1);                                                       \
    }

/* C (mr x nr of an 8 x 32 tile, pitch ldc) = epr((acc ? C : 0) + a (kc x 8 panel) * b (kc x 32 panel)): rows
 * are channels q .. q+7, C is the output at flat index `off`; no epilogue where `epr` is NULL. With `pf`, the
 * kc * 8 floats there are fetched into L2 meanwhile, a line every other step. */
static inline __attribute__((always_inline)) void sat_kernel_8x32_body(int kc, const float *restrict a,
                                                                       const float *restrict b, float *C,
                                                                       int64_t ldc, int acc, int mr, int nr,
                                                                       sat_epr epr, int64_t q, int64_t off,
                                                                       const float *pf) {
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
           c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    for (int k = 0; k < kc; k++) {
        const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
        if (pf && !(k & 1)) _mm_prefetch((const char *)(pf + k * SAT_MR), _MM_HINT_T1);
        SAT_ROW(0); SAT_ROW(1); SAT_ROW(2); SAT_ROW(3);
        SAT_ROW(4); SAT_ROW(5); SAT_ROW(6); SAT_ROW(7);
        a += SAT_MR;
        b += SAT_NR;
    }
    const __mmask16 m0 = nr >= 16 ? 0xFFFF : (__mmask16)((1u << nr) - 1);
    const __mmask16 m1 = nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : 0;
    SAT_STORE_EPR(0) SAT_STORE_EPR(1) SAT_STORE_EPR(2) SAT_STORE_EPR(3)
    SAT_STORE_EPR(4) SAT_STORE_EPR(5) SAT_STORE_EPR(6) SAT_STORE_EPR(7)
}

/* sat_kernel_8x32_body without fetching (sat_conv_pw's kernel, pw.h). */
static inline __attribute__((always_inline)) void sat_kernel_8x32_epr(int kc, const float *restrict a,
                                                                      const float *restrict b, float *C,
                                                                      int64_t ldc, int acc, int mr, int nr,
                                                                      sat_epr epr, int64_t q, int64_t off) {
    sat_kernel_8x32_body(kc, a, b, C, ldc, acc, mr, nr, epr, q, off, NULL);
}

/* C (mr x nr of an 8 x 32 tile, pitch ldc) = (acc ? C : 0) + a (kc x 8 panel) * b (kc x 32 panel). */
static inline void sat_kernel_8x32(int kc, const float *restrict a, const float *restrict b, float *C,
                                   int64_t ldc, int acc, int mr, int nr) {
    sat_kernel_8x32_body(kc, a, b, C, ldc, acc, mr, nr, NULL, 0, 0, NULL);
}

/* sat_kernel_8x32 fetching the kc * 8 floats at `pf` into L2 meanwhile. */
static inline void sat_kernel_8x32_pf(int kc, const float *restrict a, const float *restrict b, float *C,
                                      int64_t ldc, int acc, int mr, int nr, const float *pf) {
    sat_kernel_8x32_body(kc, a, b, C, ldc, acc, mr, nr, NULL, 0, 0, pf);
}

#endif

#endif
