/*
 * The vocabulary shared by the API, the planner, the tuning model and the
 * device code: which collective, which algorithm, which protocol. Plain C,
 * included from .c and .cu files alike.
 */
#ifndef BRAID_COLLECTIVES_COLL_H
#define BRAID_COLLECTIVES_COLL_H

typedef enum {
  BRAID_COLL_BROADCAST = 0,
  BRAID_COLL_REDUCE = 1,
  BRAID_COLL_ALLGATHER = 2,
  BRAID_COLL_REDUCESCATTER = 3,
  BRAID_COLL_ALLREDUCE = 4,
  BRAID_COLL_SENDRECV = 5, /* send/recv and what is built on them: alltoall, gather, scatter */
  BRAID_COLL_COUNT = 6
} braid_coll_t;

typedef enum {
  BRAID_ALGO_RING = 0,
  BRAID_ALGO_TREE = 1,
  BRAID_ALGO_DIRECT = 2, /* all-reduce: every rank sends to every other (device/direct.h) */
  BRAID_ALGO_COUNT = 3
} braid_algo_t;

typedef enum {
  BRAID_PROTO_SIMPLE = 0,
  BRAID_PROTO_LL = 1,
  BRAID_PROTO_LL128 = 2,
  BRAID_PROTO_COUNT = 3
} braid_proto_t;

/* Limits every layer agrees on. */
#define BRAID_MAX_CHANNELS 32
/* Blocks past the channels, for a rank's send/recv to itself (runtime/enqueue.c). */
#define BRAID_MAX_SELF_CHANNELS 16
#define BRAID_MAX_GRID (BRAID_MAX_CHANNELS + BRAID_MAX_SELF_CHANNELS)
#define BRAID_MAX_NTHREADS 512
#define BRAID_STEPS 8 /* slots in every connection FIFO */
#define BRAID_DIRECT_MAX_RANKS 32 /* the direct all-reduce's largest communicator */

static inline const char* braid_coll_name(int coll) {
  static const char* names[] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce",
                                "SendRecv"};
  return coll >= 0 && coll < BRAID_COLL_COUNT ? names[coll] : "Unknown";
}
static inline const char* braid_algo_name(int algo) {
  static const char* names[] = {"Ring", "Tree", "Direct"};
  return algo >= 0 && algo < BRAID_ALGO_COUNT ? names[algo] : "Unknown";
}
static inline const char* braid_proto_name(int proto) {
  static const char* names[] = {"Simple", "LL", "LL128"};
  return proto >= 0 && proto < BRAID_PROTO_COUNT ? names[proto] : "Unknown";
}

#endif
