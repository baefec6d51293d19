/* Glue between the Cython module (binding.pyx) and a compiled model's C API (sat_api.h). */
#ifndef SATURATE_BINDING_H
#define SATURATE_BINDING_H

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

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

/* Seconds `calls` back-to-back sat_run calls take, timed around the loop in C (one clock read before and
 * one after, so the clock's own cost, a system call for the thread CPU clock, is not counted per call): the
 * time inside sat_run that per-call overhead is measured against (saturate.backend.bench.call_overhead).
 * `cpu_clock` reads the calling thread's CPU time, which time slices lost to other processes do not
 * inflate (meaningful at one thread, where every kernel runs on the caller), else the monotonic clock. */
static double satb_time_runs(void **inputs, void **outputs, void *workspace, int threads, int64_t calls,
                             int cpu_clock) {
    const clockid_t clock = cpu_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
    struct timespec t0, t1;
    pthread_mutex_lock(&satb_lock);
    clock_gettime(clock, &t0);
    for (int64_t i = 0; i < calls; i++)
        sat_run((const float *const *)inputs, (float *const *)outputs, (float *)workspace, threads);
    clock_gettime(clock, &t1);
    pthread_mutex_unlock(&satb_lock);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

/* Profiling builds (-DSAT_PROFILE) define sat_profile; the weak reference is NULL in the others. */
double *sat_profile(void) __attribute__((weak));

static double *satb_profile(void) { return sat_profile ? sat_profile() : NULL; }

#endif
