/*
 * The floor of a small rooted call handed between two cores through a ring of slots, as the
 * shared area's 8-byte broadcast did with its layout of 2026-11-27 (since 2026-11-28: 64
 * slots, 8 calls ahead, 32 where ranks outnumber cores): a producer (the root, core 0) writes
 * one cache line per call (stamp and data) into a ring of 16, and waits only when it is 8
 * calls ahead of the consumer (core 1), which spins on each stamp, reads the data and
 * publishes its own turn.
 * Arguments: LOCKED_ROOT LOCKED_PEER (0 or 1): with 1, that side also runs two (root) or one
 * (peer) locked read-modify-writes per call, as a mutex, an Arc count or a fetch_add would;
 * a locked instruction waits for the call's own stores to leave the store buffer. Prints the
 * time per call. On the 2-core VM of 2026-11-27, runs an hour apart: 14-63 ns without locked
 * instructions, 21-98 ns with them on both sides (58-81 ns with them on one side), where
 * oxccl's 8-byte broadcast took 260-490 ns and Open MPI's 200 ns: most of oxccl's time is
 * its own call path, not the hand-off.
 *
 *   cc -O2 -pthread -o /tmp/slot_handoff tools/perf/slot_handoff.c
 *   for m in "0 0" "1 0" "0 1" "1 1"; do /tmp/slot_handoff $m; done
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define SLOTS 16
#define LAG 8
struct slot { volatile uint64_t stamp; uint64_t data; char pad[48]; } __attribute__((aligned(64)));
static struct slot root[SLOTS];
static struct slot peer[SLOTS];
static long N = 20000000;
static int locked_root, locked_peer;
static volatile uint64_t priv_a[8] __attribute__((aligned(64)));
static volatile uint64_t priv_b[8] __attribute__((aligned(64)));
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
static void *consumer(void *a){ pin(1); uint64_t sum=0;
  for (long k=0;k<N;k++){ struct slot *s=&root[k%SLOTS]; while (__atomic_load_n(&s->stamp,__ATOMIC_ACQUIRE)!=(uint64_t)k+1) __builtin_ia32_pause();
    sum+=s->data; __atomic_store_n(&peer[k%SLOTS].stamp,k+1,__ATOMIC_RELEASE);
    if (locked_peer) __atomic_fetch_add(&priv_b[0],1,__ATOMIC_SEQ_CST); }
  return (void*)sum; }
int main(int argc,char**argv){ locked_root=atoi(argv[1]); locked_peer=atoi(argv[2]); pin(0);
  pthread_t t; pthread_create(&t,0,consumer,0);
  struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a); uint64_t seen=0;
  for (long k=0;k<N;k++){
    if (k>=LAG && seen < (uint64_t)(k-LAG)+1) { while ((seen=__atomic_load_n(&peer[(k-LAG)%SLOTS].stamp,__ATOMIC_ACQUIRE)) < (uint64_t)(k-LAG)+1) __builtin_ia32_pause();
      /* catch up to the latest */ for (long j=k-1;j>k-LAG;j--){uint64_t v=__atomic_load_n(&peer[j%SLOTS].stamp,__ATOMIC_ACQUIRE); if (v==(uint64_t)j+1){seen=v;break;}} }
    struct slot *s=&root[k%SLOTS]; s->data=k; __atomic_store_n(&s->stamp,k+1,__ATOMIC_RELEASE);
    if (locked_root) { __atomic_fetch_add(&priv_a[0],1,__ATOMIC_SEQ_CST); __atomic_fetch_add(&priv_a[0],1,__ATOMIC_SEQ_CST);} }
  pthread_join(t,0); clock_gettime(CLOCK_MONOTONIC,&b);
  printf("root locked %d peer locked %d: %.1f ns/call\n",locked_root,locked_peer,((b.tv_sec-a.tv_sec)*1e9+(b.tv_nsec-a.tv_nsec))/N); }
