/* The kernel library's half of gemm.h: compiled once per instruction set (build.py), linked into every model. */
#include "kernels.h"

#if (defined(__AVX512F__))
/* Copy rows [k0, k0+kc) x columns [j0, j0+nc) of B (row pitch ldb) into NR-wide panels, zero-padded:
 * panel q holds element (k, j0 + q*NR + c) at out[q*kc*NR + k*NR + c]. */
void sat_pack_b(const float *B, int64_t ldb, int k0, int kc, int64_t j0, int nc, float *out) {
    for (int q = 0; q * SAT_NR < nc; q++) {
        const int nr = nc - q * SAT_NR < SAT_NR ? nc - q * SAT_NR : SAT_NR;
        const __mmask16 m0 = nr >= 16 ? 0xFFFF : (__mmask16)((1u << nr) - 1);
        const __mmask16 m1 = nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : 0;
        float *dst = out + (int64_t)q * kc * SAT_NR;
        const float *src = B + (int64_t)k0 * ldb + j0 + q * SAT_NR;
        for (int k = 0; k < kc; k++) {
            _mm512_storeu_ps(dst + k * SAT_NR, _mm512_maskz_loadu_ps(m0, src + k * ldb));
            _mm512_storeu_ps(dst + k * SAT_NR + 16, _mm512_maskz_loadu_ps(m1, src + k * ldb + 16));
        }
    }
}

#endif
