"""The C backend's thread pool (saturate/backend/pool.h) under a stream of small jobs."""

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.compiler

BACKEND = Path(__file__).resolve().parents[1] / "saturate" / "backend"

# Jobs of varying sizes back to back, now and then after a pause that lets the workers sleep, in runs
# (sat_pool_begin / sat_pool_end, as sat_run brackets its jobs) on 2, 3 and 4 threads; every item
# counts its own runs, and each job checks, once it returns, that every item ran exactly once.
# Every seventh job has up to 300 items, so threads run out of their own range and take from others'.
STRESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "pool.h"

#define MAX_ITEMS 300
typedef struct { int64_t n; _Atomic int hits[MAX_ITEMS]; } job;
static _Atomic int64_t outside;

static void body(void *ctx, int64_t i, int tid) {
    job *j = ctx;
    (void)tid;
    if (i < 0 || i >= j->n) {
        atomic_fetch_add(&outside, 1);
        return;
    }
    for (volatile int k = 0; k < 50; k++) {
    }
    atomic_fetch_add(&j->hits[i], 1);
}

int main(int argc, char **argv) {
    sat_set_threads(2);
    const long jobs = atol(argv[1]);
    long wrong = 0;
    static job j;
    sat_pool_begin();
    for (long g = 0; g < jobs; g++) {
        if (g % 700 == 0) {
            /* a run ends; the next one starts, at times on another thread count */
            sat_pool_end();
            struct timespec t = {0, 50000 * (g % 3)};
            nanosleep(&t, NULL);
            sat_set_threads(2 + (g / 2100) % 3);
            sat_pool_begin();
        }
        j.n = g % 7 == 0 ? 1 + (g * 7919) % MAX_ITEMS : 1 + (g * 7919) % 13;
        for (int i = 0; i < MAX_ITEMS; i++) atomic_store(&j.hits[i], 0);
        sat_parallel(j.n, body, &j);
        for (int i = 0; i < j.n; i++) wrong += atomic_load(&j.hits[i]) != 1;
        if (g % 1000 == 0) {
            struct timespec t = {0, 100000 * (g % 3)};
            nanosleep(&t, NULL);
        }
    }
    sat_pool_end();
    printf("%ld %ld\n", (long)atomic_load(&outside), wrong);
    return 0;
}
"""


def run_against_pool(tmp_path, name: str, source: str, *args: str, flags: tuple[str, ...] = ("-O2",)) -> list[int]:
    """Compile `source` with the pool's C and run it: the integers it prints."""
    src, exe = tmp_path / f"{name}.c", tmp_path / name
    src.write_text(source)
    subprocess.run(["cc", *flags, "-Wall", "-Werror", "-pthread", f"-I{BACKEND}", str(src), str(BACKEND / "pool.c"), "-o",
                    str(exe)], check=True)
    # (without address-space randomization: ThreadSanitizer refuses some kernels' layouts of a randomized one)
    command = ["setarch", platform.machine(), "-R", str(exe)] if shutil.which("setarch") else [str(exe)]
    proc = subprocess.run([*command, *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TSAN_OPTIONS="halt_on_error=1 exitcode=66"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [int(v) for v in proc.stdout.split()]


def test_every_job_runs_each_of_its_items_once_before_it_returns(tmp_path):
    # A worker late to claim from a finished job once ran an item of the next job under the old
    # numbering and counted it as the new job's: 506 of 200,000 jobs returned early. (One static job
    # reused: an item run under another job's numbering shows as a count other than one.)
    assert run_against_pool(tmp_path, "stress", STRESS, "200000") == [0, 0]


# Jobs of 64 items on 2 threads, each item recording the thread that ran it.
RANGES = r"""
#include <stdio.h>
#include <stdlib.h>
#include "pool.h"

#define ITEMS 64
static int ran_by[ITEMS];

static void body(void *ctx, int64_t i, int tid) {
    (void)ctx;
    for (volatile int k = 0; k < 2000; k++) {
    }
    ran_by[i] = tid;
}

int main(int argc, char **argv) {
    sat_set_threads(2);
    const long jobs = atol(argv[1]);
    long shared = 0, off_front = 0, caller_past_half = 0;
    sat_pool_begin();
    for (long g = 0; g < jobs; g++) {
        sat_parallel(ITEMS, body, NULL);
        int worker_ran = 0;
        for (int i = 0; i < ITEMS; i++) worker_ran += ran_by[i] == 1;
        if (!worker_ran) continue;
        shared++;
        /* the worker starts at the front of its half; the caller reaches into it only from the back */
        if (ran_by[ITEMS / 2] != 1) off_front++;
        for (int i = ITEMS / 2; i < ITEMS - 1; i++)
            if (ran_by[i] == 0 && ran_by[i + 1] == 1) caller_past_half++;
    }
    sat_pool_end();
    printf("%ld %ld %ld\n", shared, off_front, caller_past_half);
    return 0;
}
"""


def test_each_thread_runs_its_own_range_of_a_job(tmp_path):
    # Thread t runs the same contiguous part of every job, so a step reads what the same core wrote
    # in the step before: the worker's items start at the front of its half, and the caller takes
    # items of that half only from its back.
    shared, off_front, caller_past_half = run_against_pool(tmp_path, "ranges", RANGES, "2000")
    assert shared > 0
    assert (off_front, caller_past_half) == (0, 0)


def test_the_pool_has_no_data_race_under_thread_sanitizer(tmp_path):
    # Claims, job fields and the thread count cross threads through atomics and the ranges' release
    # stores; ThreadSanitizer sees every access the two programs above make (jobs fewer, each slower).
    flags = ("-O1", "-g", "-fsanitize=thread")
    assert run_against_pool(tmp_path, "stress", STRESS, "30000", flags=flags) == [0, 0]
    shared, off_front, caller_past_half = run_against_pool(tmp_path, "ranges", RANGES, "500", flags=flags)
    assert shared > 0 and (off_front, caller_past_half) == (0, 0)
