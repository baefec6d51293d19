/* Glue between the Cython module (binding.pyx) and a compiled model's C API (sat_api.h). */
#ifndef SATURATE_BINDING_H
#define SATURATE_BINDING_H

#include <pthread.h>
#include <stdlib.h>

#include "sat_api.h"

/* sat_run keeps its arguments and thread pool in the library's static state, and the module releases
 * the GIL while it runs: calls from several Python threads take turns here. */
static pthread_mutex_t satb_lock = PTHREAD_MUTEX_INITIALIZER;

static int satb_run(void **inputs, void **outputs, void *workspace, int threads) {
    pthread_mutex_lock(&satb_lock);
    const int rc = sat_run((const float *const *)inputs, (float *const *)outputs, (float *)workspace, threads);
    pthread_mutex_unlock(&satb_lock);
    return rc;
}

/* Profiling builds (-DSAT_PROFILE) define sat_profile; the weak reference is NULL in the others. */
double *sat_profile(void) __attribute__((weak));

static double *satb_profile(void) { return sat_profile ? sat_profile() : NULL; }

/* The workspace, 64-byte aligned as sat_api.h asks (at least one line, so the pointer is never NULL). */
static void *satb_alloc(int64_t bytes) { return aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64 + 64)); }

#endif
