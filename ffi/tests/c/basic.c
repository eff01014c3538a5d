/* A C program on oxccl's C ABI, started by oxrun on any number of ranks: it calls every
 * function of oxccl.h, checks every result against values computed here, and takes every error
 * path a C caller can reach (NULL, destroyed and foreign handles, out-of-range types, operators,
 * roots and peers, overflowing counts, overlapping buffers, streams, bad configs, unbalanced
 * groups, foreign memory). Prints "rank R of N: ok" and exits 0, or names the first failure
 * and exits 1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oxccl.h"

#define K 6

static int rank = -1;

#define CHECK(call)                                                                        \
  do {                                                                                     \
    oxcclResult_t res_ = (call);                                                           \
    if (res_ != oxcclSuccess) {                                                            \
      fprintf(stderr, "rank %d: line %d: %s failed: %s: %s\n", rank, __LINE__, #call,      \
              oxcclGetErrorString(res_), oxcclGetLastError(NULL));                         \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

/* `call` must fail with `code`, and the last error must name `word`. */
#define FAILS(call, code, word)                                                            \
  do {                                                                                     \
    oxcclResult_t res_ = (call);                                                           \
    const char *msg_ = oxcclGetLastError(NULL);                                            \
    if (res_ != (code) || strstr(msg_, (word)) == NULL) {                                  \
      fprintf(stderr, "rank %d: line %d: %s gave %d (%s), expected %d naming \"%s\"\n",   \
              rank, __LINE__, #call, (int)res_, msg_, (int)(code), (word));                \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

#define EXPECT(cond, what, i)                                                              \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "rank %d: line %d: wrong %s at %d\n", rank, __LINE__, what, (int)(i)); \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

/* Waits until `comm` is no longer in progress and returns its state. */
static oxcclResult_t settle(oxcclComm_t comm) {
  oxcclResult_t state = oxcclInProgress;
  long spins = 0;
  while (state == oxcclInProgress) {
    CHECK(oxcclCommGetAsyncError(comm, &state));
    if (++spins > 200000000L) {
      fprintf(stderr, "rank %d: comm stays in progress\n", rank);
      exit(1);
    }
  }
  return state;
}

/* The value of a normal float8 e4m3 (bias 7, 3 mantissa bits). */
static float e4m3(unsigned char b) {
  int e = (b >> 3) & 15, m = b & 7;
  float v = (1.0f + (float)m / 8.0f);
  for (; e > 7; e--) v *= 2.0f;
  for (; e < 7; e++) v /= 2.0f;
  return (b & 0x80) ? -v : v;
}

/* The collectives on `comm` (n ranks, this one `me`), checked. */
static void collectives(oxcclComm_t comm, int me, int n) {
  float send[K], recv[K];
  int bcast[K], i, r;
  double *gathered, *rs_in, rs_out[K], *all;
  int32_t a2a_in[64], a2a_out[64];

  for (i = 0; i < K; i++) send[i] = (float)(me + i);
  CHECK(oxcclAllReduce(send, recv, K, oxcclFloat32, oxcclSum, comm, NULL));
  for (i = 0; i < K; i++) EXPECT(recv[i] == (float)(n * (n - 1) / 2 + n * i), "all-reduce", i);
  CHECK(oxcclAllReduce(recv, recv, K, oxcclFloat32, oxcclAvg, comm, NULL));
  for (i = 0; i < K; i++) EXPECT(recv[i] == (float)(n * (n - 1) / 2 + n * i), "avg", i);
  for (i = 0; i < K; i++) send[i] = (float)(me * 10 + i);
  CHECK(oxcclAllReduce(send, recv, K, oxcclFloat32, oxcclMax, comm, NULL));
  for (i = 0; i < K; i++) EXPECT(recv[i] == (float)((n - 1) * 10 + i), "max", i);

  /* float8: n ones sum to n, exact up to 16 */
  if (n <= 16) {
    unsigned char f8[K];
    for (i = 0; i < K; i++) f8[i] = 0x38; /* 1.0 */
    CHECK(oxcclAllReduce(f8, f8, K, oxcclFloat8e4m3, oxcclSum, comm, NULL));
    for (i = 0; i < K; i++) EXPECT(e4m3(f8[i]) == (float)n, "float8 all-reduce", i);
  }

  for (i = 0; i < K; i++) bcast[i] = me == n - 1 ? 1000 + i : -1;
  CHECK(oxcclBroadcast(bcast, bcast, K, oxcclInt32, n - 1, comm, NULL));
  for (i = 0; i < K; i++) EXPECT(bcast[i] == 1000 + i, "broadcast", i);
  for (i = 0; i < K; i++) bcast[i] = me == 0 ? 7 * i : 0;
  CHECK(oxcclBcast(bcast, K, oxcclInt32, 0, comm, NULL));
  for (i = 0; i < K; i++) EXPECT(bcast[i] == 7 * i, "bcast", i);

  for (i = 0; i < K; i++) send[i] = (float)(me + 1);
  CHECK(oxcclReduce(send, me == 0 ? recv : NULL, K, oxcclFloat32, oxcclProd, 0, comm, NULL));
  if (me == 0) {
    float prod = 1.0f;
    for (r = 0; r < n; r++) prod *= (float)(r + 1);
    for (i = 0; i < K; i++) EXPECT(recv[i] == prod, "reduce", i);
  }

  gathered = malloc(sizeof(double) * K * (size_t)n);
  rs_in = malloc(sizeof(double) * K * (size_t)n);
  all = malloc(sizeof(double) * K * (size_t)n);
  if (gathered == NULL || rs_in == NULL || all == NULL) exit(2);
  for (i = 0; i < K; i++) gathered[me * K + i] = 10.0 * me + i;
  CHECK(oxcclAllGather(gathered + me * K, gathered, K, oxcclFloat64, comm, NULL));
  for (r = 0; r < n; r++)
    for (i = 0; i < K; i++) EXPECT(gathered[r * K + i] == 10.0 * r + i, "all-gather", r * K + i);

  for (i = 0; i < K * n; i++) rs_in[i] = (double)i;
  CHECK(oxcclReduceScatter(rs_in, rs_out, K, oxcclFloat64, oxcclSum, comm, NULL));
  for (i = 0; i < K; i++) EXPECT(rs_out[i] == (double)n * (me * K + i), "reduce-scatter", i);

  /* gather to the last rank, scatter back from it */
  for (i = 0; i < K; i++) rs_out[i] = 100.0 * me + i;
  CHECK(oxcclGather(rs_out, me == n - 1 ? all : NULL, K, oxcclFloat64, n - 1, comm, NULL));
  if (me == n - 1)
    for (i = 0; i < K * n; i++) EXPECT(all[i] == 100.0 * (i / K) + i % K, "gather", i);
  for (i = 0; i < K; i++) rs_out[i] = -1.0;
  CHECK(oxcclScatter(me == n - 1 ? all : NULL, rs_out, K, oxcclFloat64, n - 1, comm, NULL));
  for (i = 0; i < K; i++) EXPECT(rs_out[i] == 100.0 * me + i, "scatter", i);

  /* all-to-all: block j of rank r's input is 100 r + j */
  if (n <= 64) {
    for (i = 0; i < n; i++) a2a_in[i] = 100 * me + i;
    CHECK(oxcclAlltoAll(a2a_in, a2a_out, 1, oxcclInt32, comm, NULL));
    for (i = 0; i < n; i++) EXPECT(a2a_out[i] == 100 * i + me, "all-to-all", i);
  }

  /* a ring shift with send and receive in one group */
  for (i = 0; i < K; i++) bcast[i] = me * 1000 + i;
  CHECK(oxcclGroupStart());
  CHECK(oxcclSend(bcast, K, oxcclInt32, (me + 1) % n, comm, NULL));
  CHECK(oxcclRecv(a2a_out, K, oxcclInt32, (me + n - 1) % n, comm, NULL));
  CHECK(oxcclGroupEnd());
  for (i = 0; i < K; i++) EXPECT(a2a_out[i] == ((me + n - 1) % n) * 1000 + i, "send/recv", i);

  /* the same shift started one call at a time, every rank sending first (extension) */
  if (n > 1) {
    oxcclRequest_t sreq = NULL, rreq = NULL;
    int done = 0;
    for (i = 0; i < K; i++) a2a_out[i] = -1;
    CHECK(oxcclSendStart(bcast, K, oxcclInt32, (me + 1) % n, 0, comm, &sreq));
    CHECK(oxcclRecvStart(a2a_out, K, oxcclInt32, (me + n - 1) % n, 0, comm, &rreq));
    while (!done) CHECK(oxcclRequestTest(&rreq, &done));
    CHECK(oxcclRequestWait(&sreq));
    if (sreq != NULL || rreq != NULL) {
      fprintf(stderr, "rank %d: ended requests are not NULL\n", me);
      exit(1);
    }
    for (i = 0; i < K; i++)
      EXPECT(a2a_out[i] == ((me + n - 1) % n) * 1000 + i, "started send/recv", i);
  }

  CHECK(oxcclBarrier(comm, NULL));
  free(gathered);
  free(rs_in);
  free(all);
}

/* Every error path a C caller can reach, on `comm` (n ranks). */
static void errors(oxcclComm_t comm, int n) {
  float a[8] = {0}, b[8] = {0};
  int x = 0;
  oxcclComm_t gone = NULL, foreign = (oxcclComm_t)(void *)&x;
  oxcclConfig_t config = OXCCL_CONFIG_INITIALIZER;
  oxcclUniqueId id;
  void *mem = NULL;
  oxcclRedOp_t op;
  double half = 0.5;

  FAILS(oxcclGetVersion(NULL), oxcclInvalidArgument, "version");
  FAILS(oxcclCommCount(NULL, &x), oxcclInvalidArgument, "comm is NULL");
  FAILS(oxcclCommCount(foreign, &x), oxcclInvalidArgument, "not a live communicator");
  FAILS(oxcclCommUserRank(comm, NULL), oxcclInvalidArgument, "rank is NULL");
  FAILS(oxcclAllReduce(a, b, 8, 12, oxcclSum, comm, NULL), oxcclInvalidArgument, "datatype");
  FAILS(oxcclAllReduce(a, b, 8, -1, oxcclSum, comm, NULL), oxcclInvalidArgument, "datatype");
  FAILS(oxcclAllReduce(a, b, 8, oxcclFloat32, 99, comm, NULL), oxcclInvalidArgument, "op");
  FAILS(oxcclAllReduce(a, b, 8, oxcclFloat32, oxcclBand, comm, NULL), oxcclInvalidArgument, "op");
  FAILS(oxcclAllReduce(a, b, SIZE_MAX / 2, oxcclFloat32, oxcclSum, comm, NULL),
        oxcclInvalidArgument, "count");
  FAILS(oxcclAllReduce(a, a + 1, 4, oxcclFloat32, oxcclSum, comm, NULL), oxcclInvalidArgument,
        "overlap");
  FAILS(oxcclAllReduce(NULL, b, 8, oxcclFloat32, oxcclSum, comm, NULL), oxcclInvalidArgument,
        "sendbuff");
  FAILS(oxcclBroadcast(a, b, 8, oxcclFloat32, n, comm, NULL), oxcclInvalidArgument, "root");
  FAILS(oxcclReduce(a, b, 8, oxcclFloat32, oxcclSum, -1, comm, NULL), oxcclInvalidArgument,
        "root");
  FAILS(oxcclSend(a, 8, oxcclFloat32, n, comm, NULL), oxcclInvalidArgument, "peer");
  FAILS(oxcclRecv(a, 8, oxcclFloat32, -1, comm, NULL), oxcclInvalidArgument, "peer");
  {
    oxcclRequest_t req = NULL, stale = (oxcclRequest_t)(void *)&x;
    FAILS(oxcclSendStart(a, 8, oxcclFloat32, n, 0, comm, &req), oxcclInvalidArgument, "peer");
    FAILS(oxcclRecvStart(a, 8, oxcclFloat32, 0, 0, comm, NULL), oxcclInvalidArgument, "request");
    FAILS(oxcclRequestWait(&stale), oxcclInvalidArgument, "not a live request");
    FAILS(oxcclRequestTest(&stale, NULL), oxcclInvalidArgument, "done");
  }
  /* The barrier takes no stream (collectives, sends and receives with a stream take device
   * memory: ffi/src/tests, on a GPU). */
  FAILS(oxcclBarrier(comm, (void *)&x), oxcclInvalidUsage, "stream");
  FAILS(oxcclGroupEnd(), oxcclInvalidUsage, "oxcclGroupStart");
  FAILS(oxcclMemFree(&x), oxcclInvalidArgument, "oxcclMemAlloc");
  FAILS(oxcclRedOpDestroy(oxcclNumOps, comm), oxcclInvalidArgument, "op");
  FAILS(oxcclRedOpCreatePreMulSum(&op, &half, oxcclFloat64, 5, comm), oxcclInvalidArgument,
        "residence");
  FAILS(oxcclCommDeregister(comm, &x), oxcclInvalidArgument, "handle");
  FAILS(oxcclCommSplit(comm, -5, 0, &gone, NULL), oxcclInvalidArgument, "color");
  memset(&id, 0x5a, sizeof id);
  FAILS(oxcclCommInitRank(&gone, 0, id, 0), oxcclInvalidArgument, "nranks");
  FAILS(oxcclCommInitRank(&gone, 1, id, 0), oxcclInvalidArgument, "commId");
  CHECK(oxcclGetUniqueId(&id));
  FAILS(oxcclCommInitRank(&gone, 2, id, 2), oxcclInvalidArgument, "rank");
  config.magic = 1;
  FAILS(oxcclCommInitRankConfig(&gone, 1, id, 0, &config), oxcclInvalidArgument, "magic");
  CHECK(oxcclMemAlloc(&mem, 64));
  CHECK(oxcclMemFree(mem));
  FAILS(oxcclMemFree(mem), oxcclInvalidArgument, "oxcclMemAlloc");
  if (strcmp(oxcclGetErrorString(oxcclRemoteError), oxcclGetErrorString(12345)) == 0) exit(4);
}

int main(void) {
  oxcclComm_t comm, optioned, byid, nonblocking, child, pair[2], solo;
  oxcclUniqueId id, ids[2];
  oxcclConfig_t config = OXCCL_CONFIG_INITIALIZER;
  oxcclResult_t state;
  oxcclRedOp_t premul;
  int nranks, version, i, dev, count, r2;
  float scale = 2.0f, v[K], w[K];
  void *mem = NULL, *handle = NULL;
  oxcclWindow_t win = NULL;

  CHECK(oxcclGetVersion(&version));
  CHECK(oxcclCommInitFromEnv(&comm));
  CHECK(oxcclCommUserRank(comm, &rank));
  CHECK(oxcclCommCount(comm, &nranks));
  CHECK(oxcclCommCuDevice(comm, &dev));
  EXPECT(dev == -1, "device", 0);
  collectives(comm, rank, nranks);

  /* a unique id from rank 0, shared by broadcast, makes a second communicator */
  if (rank == 0) CHECK(oxcclGetUniqueId(&id));
  CHECK(oxcclBroadcast(&id, &id, sizeof id, oxcclUint8, 0, comm, NULL));
  CHECK(oxcclCommInitRank(&byid, nranks, id, rank));
  collectives(byid, rank, nranks);

  /* settings of one communicator in place of the environment's */
  if (rank == 0) CHECK(oxcclGetUniqueId(&id));
  CHECK(oxcclBroadcast(&id, &id, sizeof id, oxcclUint8, 0, comm, NULL));
  FAILS(oxcclCommInitRankOptions(&optioned, nranks, id, rank, NULL, "OXCCL_TIMEOUT"),
        oxcclInvalidArgument, "NAME=VALUE");
  FAILS(oxcclCommInitRankOptions(&optioned, nranks, id, rank, NULL, "HOME=/"), oxcclInvalidArgument,
        "not a setting");
  CHECK(oxcclCommInitRankOptions(&optioned, nranks, id, rank, NULL, "OXCCL_TIMEOUT=30"));
  collectives(optioned, rank, nranks);
  {
    /* every rank lives: none seen failing, and a rank out of range is refused */
    int peer = 7, failed = 7;
    CHECK(oxcclCommFailedPeer(optioned, &peer));
    EXPECT(peer == -1, "failed peer while every rank lives", peer);
    CHECK(oxcclCommPeerFailed(optioned, nranks - 1, &failed));
    EXPECT(failed == 0, "last rank failed while it lives", failed);
    FAILS(oxcclCommPeerFailed(optioned, nranks, &failed), oxcclInvalidArgument, "not a rank");
  }
  CHECK(oxcclCommDestroy(optioned));

  /* non-blocking: creation and operations return oxcclInProgress */
  if (rank == 0) CHECK(oxcclGetUniqueId(&id));
  CHECK(oxcclBroadcast(&id, &id, sizeof id, oxcclUint8, 0, comm, NULL));
  config.blocking = 0;
  state = oxcclCommInitRankConfig(&nonblocking, nranks, id, rank, &config);
  EXPECT(state == oxcclInProgress || state == oxcclSuccess, "non-blocking init", state);
  EXPECT(settle(nonblocking) == oxcclSuccess, "non-blocking init state", 0);
  for (i = 0; i < K; i++) v[i] = (float)(rank + i);
  state = oxcclAllReduce(v, v, K, oxcclFloat32, oxcclSum, nonblocking, NULL);
  EXPECT(state == oxcclInProgress || state == oxcclSuccess, "non-blocking all-reduce", state);
  EXPECT(settle(nonblocking) == oxcclSuccess, "non-blocking all-reduce state", 0);
  for (i = 0; i < K; i++) EXPECT(v[i] == (float)(nranks * (nranks - 1) / 2 + nranks * i), "nb", i);
  state = oxcclCommFinalize(nonblocking);
  EXPECT(state == oxcclInProgress || state == oxcclSuccess, "finalize", state);
  EXPECT(settle(nonblocking) == oxcclSuccess, "finalize state", 0);
  CHECK(oxcclCommDestroy(nonblocking));

  /* scalable init: two ids, every rank has both */
  if (rank == 0) {
    CHECK(oxcclGetUniqueId(&ids[0]));
    CHECK(oxcclGetUniqueId(&ids[1]));
  }
  CHECK(oxcclBroadcast(ids, ids, sizeof ids, oxcclUint8, 0, comm, NULL));
  CHECK(oxcclCommInitRankScalable(&child, nranks, rank, nranks < 2 ? 1 : 2, ids, NULL));
  CHECK(oxcclCommCount(child, &count));
  EXPECT(count == nranks, "scalable count", count);
  CHECK(oxcclCommFinalize(child));
  CHECK(oxcclCommDestroy(child));

  /* split: even and odd ranks, reversed by key; the last rank of 3+ joins none */
  {
    int color = (nranks > 2 && rank == nranks - 1) ? OXCCL_SPLIT_NOCOLOR : rank % 2;
    CHECK(oxcclCommSplit(comm, color, -rank, &child, NULL));
    if (color == OXCCL_SPLIT_NOCOLOR) {
      EXPECT(child == NULL, "nocolor", 0);
    } else {
      int members = 0, below = 0, q;
      for (q = 0; q < nranks; q++) {
        int qc = (nranks > 2 && q == nranks - 1) ? -1 : q % 2;
        if (qc == color) {
          members++;
          if (q > rank) below++;
        }
      }
      CHECK(oxcclCommCount(child, &count));
      CHECK(oxcclCommUserRank(child, &r2));
      EXPECT(count == members && r2 == below, "split", r2);
      collectives(child, r2, count);
      CHECK(oxcclCommDestroy(child));
    }
  }

  /* pre-multiplied sum: sum of 2 (rank + i) */
  CHECK(oxcclRedOpCreatePreMulSum(&premul, &scale, oxcclFloat32, oxcclScalarHostImmediate, comm));
  for (i = 0; i < K; i++) v[i] = (float)(rank + i);
  CHECK(oxcclAllReduce(v, w, K, oxcclFloat32, premul, comm, NULL));
  for (i = 0; i < K; i++) EXPECT(w[i] == 2.0f * (float)(nranks * (nranks - 1) / 2 + nranks * i), "premul", i);
  CHECK(oxcclRedOpDestroy(premul, comm));

  /* memory and registrations */
  CHECK(oxcclMemAlloc(&mem, sizeof(float) * K));
  CHECK(oxcclCommRegister(comm, mem, sizeof(float) * K, &handle));
  CHECK(oxcclCommWindowRegister(comm, mem, sizeof(float) * K, &win, OXCCL_WIN_COLL_SYMMETRIC));
  for (i = 0; i < K; i++) ((float *)mem)[i] = 1.0f;
  CHECK(oxcclAllReduce(mem, mem, K, oxcclFloat32, oxcclSum, comm, NULL));
  for (i = 0; i < K; i++) EXPECT(((float *)mem)[i] == (float)nranks, "registered", i);
  CHECK(oxcclCommWindowDeregister(comm, win));
  CHECK(oxcclCommDeregister(comm, handle));
  CHECK(oxcclMemFree(mem));

  /* one process, two ranks, driven from this thread in a group; then abort a third */
  CHECK(oxcclCommInitAll(pair, 2, NULL));
  for (i = 0; i < K; i++) {
    v[i] = 1.0f + (float)i;
    w[i] = 2.0f;
  }
  CHECK(oxcclGroupStart());
  CHECK(oxcclAllReduce(v, v, K, oxcclFloat32, oxcclProd, pair[0], NULL));
  CHECK(oxcclAllReduce(w, w, K, oxcclFloat32, oxcclProd, pair[1], NULL));
  CHECK(oxcclGroupEnd());
  for (i = 0; i < K; i++) EXPECT(v[i] == 2.0f * (1.0f + (float)i) && w[i] == v[i], "group", i);
  CHECK(oxcclCommDestroy(pair[0]));
  CHECK(oxcclCommDestroy(pair[1]));
  CHECK(oxcclCommInitAll(&solo, 1, NULL));
  CHECK(oxcclCommAbort(solo));
  FAILS(oxcclCommCount(solo, &count), oxcclInvalidArgument, "not a live communicator");
  CHECK(oxcclCommGetAsyncError(comm, &state));
  EXPECT(state == oxcclSuccess, "async error", state);

  errors(comm, nranks);

  CHECK(oxcclCommDestroy(byid));
  FAILS(oxcclCommDestroy(byid), oxcclInvalidArgument, "not a live communicator");
  CHECK(oxcclBarrier(comm, NULL));
  CHECK(oxcclCommDestroy(comm));
  printf("rank %d of %d: ok (oxccl %d)\n", rank, nranks, version);
  return 0;
}
