/* C backend threading: a small work-sharing pool. The caller runs items too and waits only for items
 * another thread has claimed, never for a thread that has not woken up: on a busy machine a parallel
 * loop then costs at most what the serial loop costs, where a fork-join barrier waits a time slice.
 * A job's items are dealt out in contiguous ranges, one per thread, each thread running its own range
 * from the front and, once that is empty, taking items from the back of the others': thread t then runs
 * the same part of every job, and since kernels number their items in the order of the data they write
 * (a conv's items run over pixels first), the next step finds most of what it reads in the cache of the
 * core that wrote it. */
#ifndef SATURATE_POOL_H
#define SATURATE_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define SAT_MAX_THREADS 64

/* Loop body: item i, run by thread `tid` (0 is the caller). */
typedef void (*sat_body)(void *ctx, int64_t i, int tid);

extern int sat_threads;

/* Set sat_threads (clamped to 1 .. SAT_MAX_THREADS) between runs: an atomic store, as idle workers read it. */
void sat_set_threads(int n);

/* Set while sat_run runs: the pool's workers then spin between jobs (each gap up to SAT_SPIN_NS), and sleep
 * as soon as the run ends (sat_pool_begin / sat_pool_end). */
extern _Atomic int sat_pool_active;

/* At most how many threads this run's jobs are shared among, the caller included: all (SAT_MAX_THREADS), or
 * fewer than sat_threads while the caller keeps losing its core even with the threads apart (see SAT_APART_NS). */
extern _Atomic int sat_pool_share;

/* Whether worker `tid` takes items: it is one of the threads asked for and of those sharing this run. */
static inline int sat_pool_takes(int tid) {
    return tid < __atomic_load_n(&sat_threads, __ATOMIC_RELAXED) &&
           tid < atomic_load_explicit(&sat_pool_share, memory_order_relaxed);
}

/* Whether worker `tid` is to stay awake: a run is on and it has a share of the run's threads (a model
 * called with fewer threads than before leaves the extra workers asleep). */
static inline int sat_pool_wanted(int tid) {
    return atomic_load_explicit(&sat_pool_active, memory_order_relaxed) && sat_pool_takes(tid);
}

/* Set on a thread while it runs items of a parallel loop: a kernel that calls sat_parallel from inside one
 * (a batched matmul's items call sat_gemm, which splits its own work) then runs that loop serially, since
 * the pool holds one job at a time. */
extern __thread int sat_in_parallel;
/* This thread's id in the pool (0: the caller). */
extern __thread int sat_pool_tid;

/* One thread's range of a job's items: hi << 32 | lo, items [lo, hi) not yet claimed (lo >= hi: none). Its
 * owner claims lo, the others hi - 1. A line of its own: the owner claims on every item. */
typedef struct {
    _Alignas(64) _Atomic uint64_t span;
} sat_pool_range;

typedef struct {
    sat_body fn;
    void *ctx;
    int64_t n;
    _Atomic uint32_t job;    /* the generation of the job published last */
    _Atomic int ranges;      /* ranges (threads sharing the job) */
    _Atomic int64_t done;
    int started;
    _Atomic int caller_asleep; /* the caller sleeps on done_cv until the last claimed item is done */
    _Atomic uint32_t runs;     /* sat_pool_begin calls: a worker asleep within one run wakes for the next */
    /* Runs beside other work (see SAT_APART_NS): the caller's involuntary context switches when this run
     * began, the time until which runs keep their threads apart, the threads fewer than sat_threads of the
     * runs before fewer_until, and how long the last such reduction lasted */
    long nivcsw;
    int64_t apart_until;
    int fewer;
    int64_t fewer_until, fewer_ns;
    pthread_mutex_t mu;
    pthread_cond_t cv, done_cv;
    sat_pool_range range[SAT_MAX_THREADS];
} sat_pool_state;

/* How long a thread spins for work (a worker between jobs) or for the last items (the caller) before it
 * sleeps. On a machine with more runnable threads than cores a spinning thread holds a core another one
 * needs: a worker spinning beside the caller on one core halves the caller's serial steps, and a caller
 * spinning for an item whose worker was preempted keeps that worker off the core it could run on, where a
 * thread that sleeps gives its core up at once. On an idle machine the gaps between one inference's jobs
 * are far shorter, so there the workers still never sleep within a run. */
#define SAT_SPIN_NS 200000

/* A worker out of items sleeps sooner once its job is done and no next job has come: within a run the
 * calling thread publishes the next job a few microseconds after the last (its CPU time between jobs, avx2
 * build: under 20 us before all but 1.4 of ResNet-50's 66 jobs per inference, and all but one in twenty
 * inferences' of BERT-128's 47 and Llama-128's 82), so a longer wait means that thread lost its core, and
 * a worker spinning on then only holds a core from it.
 * While the job is still being finished (another thread runs its last item) the next one is at most an item
 * away, and the worker spins on up to SAT_SPIN_NS. On the shared 2-core Zen 4 (load 3), 2 threads, the avx2
 * build, median of 40 interleaved runs: ResNet-50 28.3 -> 21.2 ms (its CPU time 25.3 -> 20.7 ms), BERT-128
 * 18.3 -> 15.2 ms; spinning SAT_SPIN_NS in both cases was the former. */
#define SAT_GAP_NS 20000

/* When the caller lost its core SAT_FEWER_SWITCHES times or more in one run (involuntary context switches:
 * other processes hold cores, or a worker woken for a job took the caller's core from it), the runs of the
 * next SAT_APART_NS keep the threads apart: the caller on the CPU it is on, the workers on the others it may
 * use, each thread's CPUs as they were again when the run ends. Left to the scheduler, beside a process
 * spinning on one of two cores the caller and its worker shared one core and left the other to the spinner
 * (perf sched: both on CPU 0 for a whole run of BERT at 512 tokens, 1.03 cores of CPU time per core of wall
 * time), where ONNX Runtime's threads had 1.3-1.45. Apart, the caller has its core and the worker shares the
 * other: `bench/backend_speed.py --avx2-only --load` on the 2-core Xeon, 2 threads, C/ORT 0.54-0.90 on the
 * eleven models where it was up to 1.22 (BERT-512) and 1.23 (Llama-512) with the runs falling back to the
 * caller alone; 2 threads took 0.72-0.93x the time of 1 on the transformers (up to 1.05x before). A run apart that still loses the core extends the time apart, and the runs of the next
 * SAT_FEWER_NS share their jobs among one thread fewer, one fewer again each time such a run too loses the
 * core, down to the caller alone; the first run after that takes every thread again, and if it too lost its
 * core the next reduction lasts twice as long (up to SAT_FEWER_MAX_NS). Apart costs little on an idle machine
 * (each thread stays where it would run anyway; a run pays 2 system calls a thread), so the time apart is long:
 * a free run beside a busy core costs far more. On an idle machine the caller is not preempted, and every
 * thread runs free as before. */
#define SAT_FEWER_SWITCHES 4
#define SAT_APART_NS 2000000000
#define SAT_FEWER_NS 50000000
#define SAT_FEWER_MAX_NS 1600000000

/* With the threads apart, how long the caller spins for the items its workers hold before it lets them onto
 * its own CPU and sleeps until they are done: a worker preempted on its shared core mid-item then finishes
 * it on the caller's, where before the caller waited out the other process's time slice. Workers apart sleep
 * once a short spin (20000 checks) finds no job, rather than spinning on for the next: the scheduler then
 * counts them as the sleepers they are and lets them in as soon as a job wakes them. Beside a spinning process, 2 threads of
 * the avx2 build on the 2-core Xeon, medians of 15 interleaved calls: BERT-512 44.4 -> 39.8 ms and Llama-512
 * 40.7 -> 34.9 against spinning SAT_SPIN_NS and no lending (1 thread 45.2 and 40.8); spinning 30 us or 3 ms
 * was no better, nor spinning 1 ms without lending. */
#define SAT_APART_SPIN_NS 1000000

extern sat_pool_state sat_pool;

void sat_pool_drain(int tid);

void *sat_pool_worker(void *arg);

void sat_pool_begin(void);

void sat_pool_end(void);

void sat_parallel(int64_t n, sat_body fn, void *ctx);

/* sat_parallel's loop on the calling thread alone: for jobs whose work is less than two threads' job costs. */
void sat_serial(int64_t n, sat_body fn, void *ctx);

#endif
