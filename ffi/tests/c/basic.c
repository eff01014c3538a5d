/* A C program on oxccl's C ABI, started by oxrun: every rank creates its communicator from the
 * launcher's environment, runs all-reduce, broadcast, all-gather and reduce-scatter on host
 * buffers, checks the results, and prints "rank R of N: ok". Exits 1 on the first failure. */
#include <stdio.h>
#include <stdlib.h>

#include "oxccl.h"

#define K 6

#define CHECK(call)                                                                        \
  do {                                                                                     \
    oxcclResult_t res_ = (call);                                                           \
    if (res_ != oxcclSuccess) {                                                            \
      fprintf(stderr, "%s failed: %s: %s\n", #call, oxcclGetErrorString(res_),             \
              oxcclGetLastError(NULL));                                                    \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

#define EXPECT(cond, what, i)                                                              \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "rank %d: wrong %s at %d\n", rank, what, (int)(i));                  \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

int main(void) {
  oxcclComm_t comm;
  int rank, nranks, version, i, r;
  float send[K], recv[K];
  int bcast[K];
  double *gathered, *scattered_in, scattered_out[K];

  CHECK(oxcclGetVersion(&version));
  CHECK(oxcclCommInitFromEnv(&comm));
  CHECK(oxcclCommUserRank(comm, &rank));
  CHECK(oxcclCommCount(comm, &nranks));

  /* all-reduce: sum of rank + i over the ranks. */
  for (i = 0; i < K; i++) send[i] = (float)(rank + i);
  CHECK(oxcclAllReduce(send, recv, K, oxcclFloat32, oxcclSum, comm, NULL));
  for (i = 0; i < K; i++)
    EXPECT(recv[i] == (float)(nranks * (nranks - 1) / 2 + nranks * i), "all-reduce", i);

  /* broadcast from the last rank, in place. */
  for (i = 0; i < K; i++) bcast[i] = rank == nranks - 1 ? 1000 + i : -1;
  CHECK(oxcclBroadcast(bcast, bcast, K, oxcclInt32, nranks - 1, comm, NULL));
  for (i = 0; i < K; i++) EXPECT(bcast[i] == 1000 + i, "broadcast", i);

  /* all-gather: block r holds 10 * r + i. */
  gathered = malloc(sizeof(double) * K * (size_t)nranks);
  if (gathered == NULL) return 2;
  for (i = 0; i < K; i++) send[i] = (float)(10 * rank + i);
  for (i = 0; i < K; i++) gathered[rank * K + i] = 10.0 * rank + i;
  CHECK(oxcclAllGather(gathered + rank * K, gathered, K, oxcclFloat64, comm, NULL));
  for (r = 0; r < nranks; r++)
    for (i = 0; i < K; i++) EXPECT(gathered[r * K + i] == 10.0 * r + i, "all-gather", r * K + i);

  /* reduce-scatter: element j of every rank's input is j, so block r of the sum is
   * nranks * (r * K + i). */
  scattered_in = malloc(sizeof(double) * K * (size_t)nranks);
  if (scattered_in == NULL) return 2;
  for (i = 0; i < K * nranks; i++) scattered_in[i] = (double)i;
  CHECK(oxcclReduceScatter(scattered_in, scattered_out, K, oxcclFloat64, oxcclSum, comm, NULL));
  for (i = 0; i < K; i++)
    EXPECT(scattered_out[i] == (double)nranks * (rank * K + i), "reduce-scatter", i);

  /* a stream is refused with a message. */
  if (oxcclBarrier(comm, (void *)&version) != oxcclInvalidUsage) return 3;

  CHECK(oxcclBarrier(comm, NULL));
  CHECK(oxcclCommDestroy(comm));
  free(gathered);
  free(scattered_in);
  printf("rank %d of %d: ok (oxccl %d)\n", rank, nranks, version);
  return 0;
}
