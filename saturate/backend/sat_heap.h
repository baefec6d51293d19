/* Heap use of a compiled model, counted. Kernels allocate scratch of their own (each extra thread's
 * convolution columns, per-thread buffers grown on demand and kept); that is workspace too, so the
 * build includes this header ahead of the program (-include) and every malloc, calloc, aligned_alloc
 * and free in it goes through these counters. sat_heap_peak_bytes() is the most held at once since
 * sat_heap_reset_peak(); sat_heap_bytes() what is held now (not the weights, which are mapped from their file). */
#ifndef SATURATE_HEAP_H
#define SATURATE_HEAP_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int64_t sat_heap_bytes(void);
int64_t sat_heap_peak_bytes(void);
void sat_heap_reset_peak(void);

#pragma GCC visibility push(hidden)
extern _Atomic int64_t sat_heap_live, sat_heap_peak;
void *sat_heap_alloc(size_t bytes, int zero);
void sat_heap_free(void *q);
#pragma GCC visibility pop

/* The C API's view of the counters, defined in each model (the library exports nothing). */
#ifndef SAT_LIBRARY
int64_t sat_heap_bytes(void) { return atomic_load(&sat_heap_live); }
int64_t sat_heap_peak_bytes(void) { return atomic_load(&sat_heap_peak); }
void sat_heap_reset_peak(void) { atomic_store(&sat_heap_peak, atomic_load(&sat_heap_live)); }
#endif

/* Each block carries its size in a 64-byte header, so blocks stay 64-byte aligned for aligned_alloc. */
#define SAT_HEAP_HEAD 64

static inline void *sat_heap_calloc(size_t n, size_t size) { return sat_heap_alloc(n * size, 1); }

#define malloc(bytes) sat_heap_alloc((bytes), 0)
#define calloc(n, size) sat_heap_calloc((n), (size))
#define aligned_alloc(align, bytes) sat_heap_alloc((bytes), 0)
#define free(p) sat_heap_free(p)

#endif
