/*
 * The machine's phase, in one number: the round trip of one cache line between two cores
 * (threads pinned to CPUs 0 and 1 take turns writing a shared word), in nanoseconds, over
 * 200000 round trips (25-100 ms). The 2-core VM of 2026-11-29 (AMD EPYC, family 25)
 * alternated, for a second to tens of seconds at a time, between 95-150 ns ("near") and
 * 450-570 ns ("far"), about half the time in each, with no steal time and no change in what
 * one core alone does (a 4 KiB memcpy took the same before and after) - most likely the host
 * moving the two vCPUs between cores that share a cache and cores that do not. Small
 * collectives hand a cache line or two between the ranks per call, so oxccl's rows run in a
 * far phase took twice (8-byte broadcast: 0.40 against 0.20 us) to three times (8 KiB
 * all-gather: 3.0 against 1.0 us) as long as in a near one, while Open MPI's 8-byte
 * broadcast, which streams messages through a ring its receiver reads behind the sender, took
 * 0.18-0.20 us in both. tools/perf/coll-vs-peers.sh and tools/perf/ab.sh record it around
 * every run and, with -g, measure in near phases only.
 *
 *   cc -O2 -pthread -o /tmp/c2c_latency tools/perf/c2c_latency.c && /tmp/c2c_latency
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#define ROUNDS 200000

static _Alignas(64) _Atomic long word;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *other(void *arg) {
    (void)arg;
    pin(1);
    for (long k = 1; k < 2 * ROUNDS; k += 2) {
        while (atomic_load_explicit(&word, memory_order_acquire) != k) {}
        atomic_store_explicit(&word, k + 1, memory_order_release);
    }
    return NULL;
}

int main(void) {
    pin(0);
    pthread_t th;
    pthread_create(&th, NULL, other, NULL);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long k = 0; k < 2 * ROUNDS; k += 2) {
        atomic_store_explicit(&word, k + 1, memory_order_release);
        while (atomic_load_explicit(&word, memory_order_acquire) != k + 2) {}
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(th, NULL);
    printf("%.0f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / ROUNDS);
    return 0;
}
