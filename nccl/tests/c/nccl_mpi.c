/* An NCCL program as NCCL's documentation writes one (one rank per MPI process: rank 0 makes
 * the unique id, MPI_Bcast hands it out, every rank calls ncclCommInitRank), on host buffers
 * with a NULL stream. It runs all-reduce (sum, and avg in place), broadcast, all-gather and
 * reduce-scatter, checks each result against values computed here, and prints
 * "rank R of N: ok". Built against include/nccl.h and linked with -lnccl by nccl/tests/mpi.rs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "nccl.h"

#define K 5

#define MPICHECK(cmd)                                                                      \
  do {                                                                                     \
    int e_ = (cmd);                                                                        \
    if (e_ != MPI_SUCCESS) {                                                               \
      fprintf(stderr, "%s:%d: MPI error %d\n", __FILE__, __LINE__, e_);                    \
      exit(EXIT_FAILURE);                                                                  \
    }                                                                                      \
  } while (0)

#define NCCLCHECK(cmd)                                                                     \
  do {                                                                                     \
    ncclResult_t r_ = (cmd);                                                               \
    if (r_ != ncclSuccess) {                                                               \
      fprintf(stderr, "%s:%d: NCCL error '%s': %s\n", __FILE__, __LINE__,                  \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                             \
      exit(EXIT_FAILURE);                                                                  \
    }                                                                                      \
  } while (0)

#define EXPECT(cond, what, i)                                                              \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "rank %d: wrong %s at %d\n", myRank, what, (int)(i));                \
      exit(EXIT_FAILURE);                                                                  \
    }                                                                                      \
  } while (0)

int main(int argc, char *argv[]) {
  int myRank, nRanks, version, count, rank, i, r;
  ncclUniqueId id;
  ncclComm_t comm;
  float sendf[K], recvf[K];
  double avg[K];
  int bcast_in[K], bcast_out[K], *scatter_in, scatter_out[K];
  long long gather_in[K], *gathered;

  MPICHECK(MPI_Init(&argc, &argv));
  MPICHECK(MPI_Comm_rank(MPI_COMM_WORLD, &myRank));
  MPICHECK(MPI_Comm_size(MPI_COMM_WORLD, &nRanks));

  NCCLCHECK(ncclGetVersion(&version));
  EXPECT(version == NCCL_VERSION_CODE, "version", version);

  /* Rank 0 makes the id; every rank gets it. */
  if (myRank == 0) NCCLCHECK(ncclGetUniqueId(&id));
  MPICHECK(MPI_Bcast((void *)&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
  NCCLCHECK(ncclCommInitRank(&comm, nRanks, id, myRank));
  NCCLCHECK(ncclCommCount(comm, &count));
  NCCLCHECK(ncclCommUserRank(comm, &rank));
  EXPECT(count == nRanks && rank == myRank, "size or rank", rank);

  /* All-reduce, sum: element i is the sum over ranks of rank + i. */
  for (i = 0; i < K; i++) sendf[i] = (float)(myRank + i);
  NCCLCHECK(ncclAllReduce(sendf, recvf, K, ncclFloat, ncclSum, comm, NULL));
  for (i = 0; i < K; i++)
    EXPECT(recvf[i] == (float)(nRanks * (nRanks - 1) / 2 + nRanks * i), "all-reduce sum", i);

  /* All-reduce, average, in place, through the profiling alias: of 2 * rank + i, nRanks - 1 + i. */
  for (i = 0; i < K; i++) avg[i] = 2.0 * myRank + i;
  NCCLCHECK(pncclAllReduce(avg, avg, K, ncclDouble, ncclAvg, comm, NULL));
  for (i = 0; i < K; i++) EXPECT(avg[i] == (double)(nRanks - 1 + i), "all-reduce avg", i);

  /* Broadcast from the last rank. */
  for (i = 0; i < K; i++) {
    bcast_in[i] = myRank == nRanks - 1 ? 700 + i : -1;
    bcast_out[i] = -2;
  }
  NCCLCHECK(ncclBroadcast(bcast_in, bcast_out, K, ncclInt32, nRanks - 1, comm, NULL));
  for (i = 0; i < K; i++) EXPECT(bcast_out[i] == 700 + i, "broadcast", i);

  /* All-gather: block r is rank r's 100 * r + i. */
  gathered = malloc(sizeof(long long) * K * (size_t)nRanks);
  scatter_in = malloc(sizeof(int) * K * (size_t)nRanks);
  if (gathered == NULL || scatter_in == NULL) return EXIT_FAILURE;
  for (i = 0; i < K; i++) gather_in[i] = 100LL * myRank + i;
  NCCLCHECK(ncclAllGather(gather_in, gathered, K, ncclInt64, comm, NULL));
  for (r = 0; r < nRanks; r++)
    for (i = 0; i < K; i++)
      EXPECT(gathered[r * K + i] == 100LL * r + i, "all-gather", r * K + i);

  /* Reduce-scatter, sum: element j of every rank's input is j + rank, so element i of block r
   * sums to nRanks * (r * K + i) + nRanks * (nRanks - 1) / 2. */
  for (i = 0; i < K * nRanks; i++) scatter_in[i] = i + myRank;
  NCCLCHECK(ncclReduceScatter(scatter_in, scatter_out, K, ncclInt32, ncclSum, comm, NULL));
  for (i = 0; i < K; i++)
    EXPECT(scatter_out[i] == nRanks * (myRank * K + i) + nRanks * (nRanks - 1) / 2,
           "reduce-scatter", i);

  /* A wrong argument: an error code, its string, and a message naming the argument. */
  EXPECT(ncclAllReduce(sendf, recvf, K, (ncclDataType_t)ncclNumTypes, ncclSum, comm, NULL) ==
             ncclInvalidArgument,
         "result of a bad datatype", 0);
  EXPECT(strstr(ncclGetLastError(comm), "datatype") != NULL, "last error", 0);
  EXPECT(strcmp(ncclGetErrorString(ncclInvalidArgument), ncclGetErrorString(ncclSuccess)) != 0,
         "error strings", 0);

  NCCLCHECK(ncclCommDestroy(comm));
  free(gathered);
  free(scatter_in);
  printf("rank %d of %d: ok (NCCL API %d)\n", myRank, nRanks, version);
  MPICHECK(MPI_Finalize());
  return 0;
}
