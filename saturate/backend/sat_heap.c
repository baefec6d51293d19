/* The heap counters of sat_heap.h, in the kernel library: every allocation of a model and its kernels
 * goes through them. */
#include "sat_heap.h"

#undef malloc
#undef calloc
#undef aligned_alloc
#undef free

_Atomic int64_t sat_heap_live, sat_heap_peak;

void *sat_heap_alloc(size_t bytes, int zero) {
    char *p = aligned_alloc(SAT_HEAP_HEAD, (bytes + 2 * SAT_HEAP_HEAD - 1) / SAT_HEAP_HEAD * SAT_HEAP_HEAD);
    if (!p) return NULL;
    if (zero) memset(p + SAT_HEAP_HEAD, 0, bytes);
    memcpy(p, &bytes, sizeof bytes);
    const int64_t now = atomic_fetch_add(&sat_heap_live, (int64_t)bytes) + (int64_t)bytes;
    int64_t peak = atomic_load(&sat_heap_peak);
    while (now > peak && !atomic_compare_exchange_weak(&sat_heap_peak, &peak, now)) {
    }
    return p + SAT_HEAP_HEAD;
}

void sat_heap_free(void *q) {
    if (!q) return;
    char *p = (char *)q - SAT_HEAP_HEAD;
    size_t bytes;
    memcpy(&bytes, p, sizeof bytes);
    atomic_fetch_sub(&sat_heap_live, (int64_t)bytes);
    free(p);
}
