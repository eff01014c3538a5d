/*
 * How fast data moves between two cores, over time: one thread (core 0) writes 256 KiB, the
 * other (core 1) reads it, in turn; every half second for 20 s it prints the mean time of one
 * write-and-read round in microseconds. On a quiet machine the figures are flat; on the
 * 2-core VM of 2026-11-27 they swung between 15-20 us and 60-90 us for seconds at a time,
 * which is what made calibrations and benchmark rows of the ways that move data through
 * shared caches (one-shot, two-shot, staged) come out 4x apart from one run to the next.
 * Run it before and after a benchmark to see which the machine was in.
 *
 *   cc -O2 -pthread -o /tmp/c2c_phases tools/perf/c2c_phases.c && /tmp/c2c_phases
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LEN (256 * 1024)

static char *buf;
static _Atomic long turn = 0;
static atomic_int stop = 0;
static volatile long sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *reader(void *arg) {
    (void)arg;
    pin(1);
    for (long t = 1; !atomic_load(&stop); t += 2) {
        while (atomic_load(&turn) != t)
            if (atomic_load(&stop)) return NULL;
        long s = 0;
        for (int i = 0; i < LEN; i += 64) s += buf[i];
        sink += s;
        atomic_store(&turn, t + 1);
    }
    return NULL;
}

int main(void) {
    buf = aligned_alloc(4096, LEN);
    if (!buf) return 1;
    memset(buf, 1, LEN);
    pin(0);
    pthread_t th;
    pthread_create(&th, NULL, reader, NULL);
    double t0 = now();
    long t = 0;
    for (int s = 0; s < 40; s++) {
        double end = t0 + 0.5 * (s + 1), start = now();
        long n = 0;
        while (now() < end) {
            while (atomic_load(&turn) != t) {}
            memset(buf, (int)t, LEN);
            atomic_store(&turn, t + 1);
            t += 2;
            n++;
        }
        printf("%.0f ", (now() - start) / n * 1e6);
        fflush(stdout);
    }
    printf("\n");
    atomic_store(&stop, 1);
    while (atomic_load(&turn) != t) {}
    pthread_join(th, NULL);
    return 0;
}
