/* The kernel library's half of pool.h: compiled once per instruction set (build.py), linked into every model. */
#include "pool.h"

#include <sys/resource.h>
#include <time.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* (glibc declares it only under _GNU_SOURCE, which the headers included before this file's did not set) */
#if defined(__linux__) && !defined(RUSAGE_THREAD)
#define RUSAGE_THREAD 1
#endif

int sat_threads = 1;

void sat_set_threads(int n) {
    __atomic_store_n(&sat_threads, n < 1 ? 1 : n > SAT_MAX_THREADS ? SAT_MAX_THREADS : n, __ATOMIC_RELAXED);
}

_Atomic int sat_pool_active;

_Atomic int sat_pool_share = SAT_MAX_THREADS;

__thread int sat_in_parallel;

__thread int sat_pool_tid;

sat_pool_state sat_pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
                           .done_cv = PTHREAD_COND_INITIALIZER};

/* Keeping the threads apart (see SAT_APART_NS), Linux only: each worker's kernel thread id (0 until it has
 * started), the CPUs the caller may use outside a run apart and the others than its own (words of a
 * cpu_set_t), whether this run keeps them apart, and whether the workers are let onto the caller's CPU (the
 * caller waits asleep for the items they hold, see SAT_APART_SPIN_NS). */
#define SAT_CPU_WORDS 16
static _Atomic int sat_pool_os_tid[SAT_MAX_THREADS];
static unsigned long sat_pool_cpus[SAT_CPU_WORDS], sat_pool_others[SAT_CPU_WORDS];
static _Atomic int sat_pool_kept_apart;
static int sat_pool_lent;
/* Whether this run began apart, and how many threads fewer than sat_threads it shares its jobs among. */
static int sat_pool_run_apart, sat_pool_run_fewer;

static int sat_os_tid(void) {
#if defined(__linux__)
    return (int)syscall(SYS_gettid);
#else
    return 0;
#endif
}

static int64_t sat_pool_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Claim an item from range r: its front (the owner's) or its back; -1 when the range is empty. */
static int64_t sat_pool_claim(int r, int front) {
    _Atomic uint64_t *span = &sat_pool.range[r].span;
    uint64_t s = atomic_load_explicit(span, memory_order_relaxed);
    for (;;) {
        const uint32_t lo = (uint32_t)s, hi = (uint32_t)(s >> 32);
        if (lo >= hi) return -1;
        const uint64_t next = front ? s + 1 : s - ((uint64_t)1 << 32);
        if (atomic_compare_exchange_weak_explicit(span, &s, next, memory_order_acq_rel, memory_order_relaxed))
            return front ? lo : (int64_t)hi - 1;
    }
}

/* Claim and run items until every range is empty: this thread's own range first, then the others'. */
void sat_pool_drain(int tid) {
    for (;;) {
        const int ranges = atomic_load_explicit(&sat_pool.ranges, memory_order_acquire);
        int64_t item = tid < ranges ? sat_pool_claim(tid, 1) : -1;
        for (int k = 1; item < 0 && k < ranges; k++) item = sat_pool_claim((tid + k) % ranges, 0);
        if (item < 0) return;
        /* Read only now: an open range belongs to the job published last, which cannot end (nor its fields
         * change) before this item is done; a thread that read them before claiming could hold an earlier
         * job's, if a range of the new job happened to read as the one it saw. */
        sat_body fn = sat_pool.fn;
        void *ctx = sat_pool.ctx;
        const int64_t n = sat_pool.n;
        fn(ctx, item, tid);
        /* seq_cst, as the caller's store of caller_asleep and its load of done are: one sees the other */
        if (atomic_fetch_add(&sat_pool.done, 1) + 1 == n && tid != 0 && atomic_load(&sat_pool.caller_asleep)) {
            pthread_mutex_lock(&sat_pool.mu);
            pthread_cond_broadcast(&sat_pool.done_cv);
            pthread_mutex_unlock(&sat_pool.mu);
        }
    }
}

void *sat_pool_worker(void *arg) {
    const int tid = (int)(intptr_t)arg;
    uint32_t seen = 0;
    sat_in_parallel = 1; /* a worker only ever runs items */
    sat_pool_tid = tid;
    sat_pool_os_tid[tid] = sat_os_tid();
    for (;;) {
        uint32_t t = 0;
        /* Spin for the next job while a run lasts (jobs come in bursts within one inference) for up to
         * SAT_SPIN_NS, at most SAT_GAP_NS of it after the job is done (see pool.h), and briefly after the
         * run; then sleep until a job or the next run. */
        int64_t start = 0, since = 0;
        int idle = 0;
        const uint32_t run = atomic_load(&sat_pool.runs);
        for (int spin = 0; spin < 20000 || (sat_pool_wanted(tid) && !idle && !sat_pool_kept_apart); spin++) {
            t = atomic_load_explicit(&sat_pool.job, memory_order_acquire);
            if (t != seen) break;
            if ((spin & 255) == 255) {
                const int64_t now = sat_pool_ns();
                start = start ? start : now;
                /* (n and done may already be the next job's: it is then about to come) */
                if (atomic_load_explicit(&sat_pool.done, memory_order_relaxed) < __atomic_load_n(&sat_pool.n, __ATOMIC_RELAXED))
                    since = 0;
                else
                    since = since ? since : now;
                idle = now - start > SAT_SPIN_NS || (since && now - since > SAT_GAP_NS);
            }
        }
        if (t == seen) {
            /* (threads apart: asleep as soon as the short spin finds no job, see SAT_APART_SPIN_NS) */
            idle = idle || sat_pool_kept_apart;
            pthread_mutex_lock(&sat_pool.mu);
            /* idle within a run: asleep until the next job, or the next run's start */
            while (atomic_load(&sat_pool.job) == seen &&
                   (idle ? atomic_load(&sat_pool.runs) == run : !sat_pool_wanted(tid)))
                pthread_cond_wait(&sat_pool.cv, &sat_pool.mu);
            pthread_mutex_unlock(&sat_pool.mu);
            t = atomic_load_explicit(&sat_pool.job, memory_order_acquire);
            if (t == seen) continue; /* woken for a run: spin for its first job */
        }
        seen = t;
        if (sat_pool_takes(tid)) sat_pool_drain(tid);
    }
    return NULL;
}

/* This thread's involuntary context switches so far (-1 where the system does not count them). */
static long sat_pool_preempted(void) {
#ifdef RUSAGE_THREAD
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) == 0) return ru.ru_nivcsw;
#endif
    return -1;
}

/* Set the CPUs of workers 1 .. started to cpus. */
static void sat_pool_pin_workers(const unsigned long *cpus) {
#if defined(__linux__)
    for (int t = 1; t <= sat_pool.started && t < SAT_MAX_THREADS; t++) {
        const int id = atomic_load(&sat_pool_os_tid[t]);
        if (id > 0) syscall(SYS_sched_setaffinity, id, SAT_CPU_WORDS * sizeof(unsigned long), cpus);
    }
#else
    (void)cpus;
#endif
}

/* Pin the caller to the CPU it runs on and the workers to the caller's other CPUs; nothing where a thread's
 * CPUs cannot be read or set, or the caller has one CPU. */
static void sat_pool_apart(void) {
#if defined(__linux__)
    unsigned cpu = 0;
    unsigned long own[SAT_CPU_WORDS] = {0};
    if (syscall(SYS_getcpu, &cpu, NULL, NULL) != 0 || cpu >= 64 * SAT_CPU_WORDS ||
        syscall(SYS_sched_getaffinity, 0, sizeof sat_pool_cpus, sat_pool_cpus) <= 0)
        return;
    own[cpu / 64] = 1ul << (cpu % 64);
    int others = 0;
    for (int w = 0; w < SAT_CPU_WORDS; w++) {
        sat_pool_others[w] = sat_pool_cpus[w] & ~own[w];
        others |= sat_pool_others[w] != 0;
    }
    if (!others || syscall(SYS_sched_setaffinity, 0, sizeof own, own) != 0) return;
    atomic_store(&sat_pool_kept_apart, 1);
    sat_pool_lent = 0;
    sat_pool_pin_workers(sat_pool_others);
#endif
}

/* Every thread back on the CPUs the caller had before sat_pool_apart. */
static void sat_pool_together(void) {
#if defined(__linux__)
    if (!atomic_load(&sat_pool_kept_apart)) return;
    atomic_store(&sat_pool_kept_apart, 0);
    sat_pool_lent = 0;
    syscall(SYS_sched_setaffinity, 0, sizeof sat_pool_cpus, sat_pool_cpus);
    sat_pool_pin_workers(sat_pool_cpus);
#endif
}

/* A run begins: sleeping workers wake now, so their wake-up overlaps the caller's first work instead of
 * leaving the first jobs to the caller alone; while the caller keeps losing its core, the threads apart and
 * then fewer of them (see SAT_APART_NS). */
void sat_pool_begin(void) {
    if (sat_threads <= 1 || sat_in_parallel) return;
    const int64_t now = sat_pool_ns();
    sat_pool_run_apart = now < sat_pool.apart_until;
    sat_pool_run_fewer = now < sat_pool.fewer_until ? sat_pool.fewer : 0;
    const int share = sat_pool_run_fewer >= sat_threads ? 1 : sat_threads - sat_pool_run_fewer;
    atomic_store(&sat_pool_share, share);
    if (share <= 1) return;
    sat_pool.nivcsw = sat_pool_preempted();
    if (sat_pool_run_apart) sat_pool_apart();
    pthread_mutex_lock(&sat_pool.mu);
    atomic_store(&sat_pool_active, 1);
    atomic_fetch_add(&sat_pool.runs, 1);
    pthread_cond_broadcast(&sat_pool.cv);
    pthread_mutex_unlock(&sat_pool.mu);
}

void sat_pool_end(void) {
    if (sat_threads <= 1 || sat_in_parallel) return;
    const int share = atomic_load(&sat_pool_share);
    atomic_store(&sat_pool_active, 0);
    atomic_store(&sat_pool_share, SAT_MAX_THREADS);
    if (share <= 1) return;
    sat_pool_together();
    const long switches = sat_pool_preempted();
    if (sat_pool.nivcsw < 0 || switches - sat_pool.nivcsw < SAT_FEWER_SWITCHES) {
        if (sat_pool_run_apart && !sat_pool_run_fewer) sat_pool.fewer_ns = 0;
        return;
    }
    const int64_t now = sat_pool_ns();
    if (sat_pool_run_apart) {
        if (!sat_pool_run_fewer) {
            /* every thread again, and the core lost again: the reduction lasts longer than the last */
            sat_pool.fewer_ns = sat_pool.fewer_ns ? 2 * sat_pool.fewer_ns : SAT_FEWER_NS;
            if (sat_pool.fewer_ns > SAT_FEWER_MAX_NS) sat_pool.fewer_ns = SAT_FEWER_MAX_NS;
            sat_pool.fewer_until = now + sat_pool.fewer_ns;
        }
        sat_pool.fewer = sat_pool_run_fewer + 1;
    }
    sat_pool.apart_until = now + SAT_APART_NS > sat_pool.fewer_until ? now + SAT_APART_NS : sat_pool.fewer_until;
}

void sat_serial(int64_t n, sat_body fn, void *ctx) {
    /* under the thread's own id when nested in another loop's item */
    const int tid = sat_in_parallel ? sat_pool_tid : 0;
    for (int64_t i = 0; i < n; i++) fn(ctx, i, tid);
}

/* Run fn(ctx, i, tid) for i in [0, n) on up to sat_threads threads; returns when all have run. */
void sat_parallel(int64_t n, sat_body fn, void *ctx) {
    /* (a share of one: the caller runs this run's jobs alone, see SAT_APART_NS) */
    const int alone = atomic_load_explicit(&sat_pool_share, memory_order_relaxed) < 2;
    /* (a range holds 32-bit item numbers) */
    if (sat_threads <= 1 || n <= 1 || n > (int64_t)UINT32_MAX || sat_in_parallel || alone) {
        sat_serial(n, fn, ctx);
        return;
    }
    while (sat_pool.started < sat_threads - 1 && sat_pool.started < SAT_MAX_THREADS - 1) {
        pthread_t th;
        if (pthread_create(&th, NULL, sat_pool_worker, (void *)(intptr_t)(sat_pool.started + 1)) != 0) break;
        pthread_detach(th);
        sat_pool.started++;
    }
    /* The last job's ranges are all empty (its every item is done), so no claim can succeed until the
     * ranges below open, each with a release store after the fields it covers are written. */
    int share = atomic_load_explicit(&sat_pool_share, memory_order_relaxed);
    share = share < sat_threads ? share : sat_threads;
    const int ranges = n < share ? (int)n : share;
    sat_pool.fn = fn;
    sat_pool.ctx = ctx;
    __atomic_store_n(&sat_pool.n, n, __ATOMIC_RELAXED); /* (spinning workers read it unsynchronized: sat_pool_worker) */
    atomic_store(&sat_pool.done, 0);
    atomic_store_explicit(&sat_pool.ranges, ranges, memory_order_release);
    for (int r = 0; r < ranges; r++) {
        const uint64_t lo = (uint64_t)(n * r / ranges), hi = (uint64_t)(n * (r + 1) / ranges);
        atomic_store_explicit(&sat_pool.range[r].span, hi << 32 | lo, memory_order_release);
    }
    if (sat_pool_lent) {
        sat_pool_lent = 0;
        sat_pool_pin_workers(sat_pool_others);
    }
    pthread_mutex_lock(&sat_pool.mu);
    atomic_store_explicit(&sat_pool.job, atomic_load(&sat_pool.job) + 1, memory_order_release);
    pthread_cond_broadcast(&sat_pool.cv);
    pthread_mutex_unlock(&sat_pool.mu);
    sat_in_parallel = 1;
    sat_pool_drain(0);
    sat_in_parallel = 0;
    /* Items another thread claimed: spin briefly, then sleep until the last one is done (see SAT_SPIN_NS). */
    int64_t since = 0;
    for (int spin = 0; atomic_load_explicit(&sat_pool.done, memory_order_acquire) < n; spin++) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
        if ((spin & 255) != 255) continue;
        const int64_t now = sat_pool_ns();
        since = since ? since : now;
        const int apart = atomic_load_explicit(&sat_pool_kept_apart, memory_order_relaxed);
        if (now - since <= (apart ? SAT_APART_SPIN_NS : SAT_SPIN_NS)) continue;
        if (apart && !sat_pool_lent) {
            sat_pool_lent = 1;
            sat_pool_pin_workers(sat_pool_cpus);
        }
        pthread_mutex_lock(&sat_pool.mu);
        atomic_store(&sat_pool.caller_asleep, 1);
        while (atomic_load(&sat_pool.done) < n) pthread_cond_wait(&sat_pool.done_cv, &sat_pool.mu);
        atomic_store(&sat_pool.caller_asleep, 0);
        pthread_mutex_unlock(&sat_pool.mu);
    }
}
