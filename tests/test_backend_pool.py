"""The C backend's thread pool (saturate/backend/pool.h) under a stream of small jobs."""

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.compiler

BACKEND = Path(__file__).resolve().parents[1] / "saturate" / "backend"

# Jobs of varying sizes back to back, now and then after a pause that lets the workers sleep, in runs
# (sat_pool_begin / sat_pool_end, as sat_run brackets its jobs) on 2 and then 3 threads;
# every item checks it belongs to the job it runs in, every job that every item ran once.
STRESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "pool.h"

typedef struct { int64_t n; _Atomic int64_t ran; } job;
static _Atomic int64_t outside;

static void body(void *ctx, int64_t i, int tid) {
    job *j = ctx;
    (void)tid;
    if (i < 0 || i >= j->n) atomic_fetch_add(&outside, 1);
    for (volatile int k = 0; k < 50; k++) {
    }
    atomic_fetch_add(&j->ran, 1);
}

int main(int argc, char **argv) {
    sat_threads = 2;
    const long jobs = atol(argv[1]);
    long early = 0;
    sat_pool_begin();
    for (long g = 0; g < jobs; g++) {
        if (g % 700 == 0) {
            /* a run ends; the next one starts, at times on another thread count */
            sat_pool_end();
            struct timespec t = {0, 50000 * (g % 3)};
            nanosleep(&t, NULL);
            sat_threads = 2 + (g / 2100) % 2;
            sat_pool_begin();
        }
        job j = {.n = 1 + (g * 7919) % 13, .ran = 0};
        sat_parallel(j.n, body, &j);
        if (atomic_load(&j.ran) != j.n) early++;
        if (g % 1000 == 0) {
            struct timespec t = {0, 100000 * (g % 3)};
            nanosleep(&t, NULL);
        }
    }
    sat_pool_end();
    printf("%ld %ld\n", (long)atomic_load(&outside), early);
    return 0;
}
"""


def test_every_job_runs_each_of_its_items_once_before_it_returns(tmp_path):
    # A worker late to claim from a finished job once ran an item of the next job under the old
    # numbering and counted it as the new job's: 506 of 200,000 jobs returned early.
    src, exe = tmp_path / "stress.c", tmp_path / "stress"
    src.write_text(STRESS)
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", "-pthread", f"-I{BACKEND}", str(src), str(BACKEND / "pool.c"), "-o", str(exe)],
                   check=True)
    out = subprocess.run([str(exe), "200000"], capture_output=True, text=True, check=True, timeout=120).stdout
    assert out.split() == ["0", "0"]
