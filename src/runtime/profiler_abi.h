/*
 * The binary interface of NCCL's profiler plugins, as NCCL 2.28 loads them:
 * the exported symbols ncclProfiler_v5 down to ncclProfiler_v1, each a
 * struct of a name and five functions. Declared here from NCCL's public
 * plugin headers (src/include/plugin/nccl_profiler.h and
 * profiler/profiler_v1.h ... profiler_v5.h); only profiler.c reads them.
 * Member order and types follow those headers exactly, so that the unions'
 * offsets agree; enumerations passed by value are plain ints.
 */
#ifndef BRAID_RUNTIME_PROFILER_ABI_H
#define BRAID_RUNTIME_PROFILER_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "nccl.h"

/* Event types, a bit each (eActivationMask, the descriptor's type). */
enum {
  PROF_EV_GROUP = 1 << 0,
  PROF_EV_COLL = 1 << 1,
  PROF_EV_P2P = 1 << 2,
  PROF_EV_PROXY_OP = 1 << 3,
  PROF_EV_PROXY_STEP = 1 << 4,
  PROF_EV_PROXY_CTRL = 1 << 5,
  PROF_EV_KERNEL_CH = 1 << 6,
  PROF_EV_NET_PLUGIN = 1 << 7,
  PROF_EV_GROUP_API = 1 << 8,
  PROF_EV_COLL_API = 1 << 9,
  PROF_EV_P2P_API = 1 << 10,
  PROF_EV_KERNEL_LAUNCH = 1 << 11
};

/* ncclProfilerEventState_t: the same numbers in every version. */
enum {
  PROF_STATE_PROXY_OP_IN_PROGRESS_V4 = 19,
  PROF_STATE_STEP_SEND_GPU_WAIT = 8,
  PROF_STATE_STEP_SEND_PEER_WAIT_V4 = 20,
  PROF_STATE_STEP_SEND_WAIT = 9,
  PROF_STATE_STEP_RECV_WAIT = 10,
  PROF_STATE_STEP_RECV_FLUSH_WAIT = 11,
  PROF_STATE_STEP_RECV_GPU_WAIT = 12
};

/* ncclDebugLogger_t; level: 0 none, 1 version, 2 warn, 3 info, 4 abort, 5 trace. */
typedef void (*prof_logger_t)(int level, unsigned long flags, const char* file, int line,
                              const char* fmt, ...);

/* ---- v5 (NCCL 2.28's own) ---- */

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
  };
} prof_descr_v5_t;

typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
} prof_state_args_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                       int nNodes, int nranks, int rank, prof_logger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, prof_descr_v5_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, int eState, prof_state_args_v5_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} prof_v5_t;

/* ---- v4: a uint8_t type, no API events, init's arguments in another order ---- */

typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
  };
} prof_descr_v4_t;

typedef prof_state_args_v5_t prof_state_args_v4_t; /* the same four members */

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask, const char* commName,
                       uint64_t commHash, int nNodes, int nranks, int rank, prof_logger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, prof_descr_v4_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, int eState, prof_state_args_v4_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} prof_v4_t;

/* ---- v3 and v2: the comm's name and hash in each task, init(context, mask) ---- */

typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      const char* name;
      uint64_t commHash;
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nMaxChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
    } coll;
    struct {
      const char* name;
      uint64_t commHash;
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
  };
} prof_descr_v3_t;

typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      const char* name;
      uint64_t commHash;
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      size_t trafficBytes;
      uint8_t nMaxChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
    } coll;
    struct {
      const char* name;
      uint64_t commHash;
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
  };
} prof_descr_v2_t;

/* ---- v1: numbers (ncclFunc_t, ncclDataType_t, NCCL's algorithm and protocol) for names ---- */

typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      const char* name;
      uint64_t commHash;
      uint64_t seqNumber;
      uint8_t func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      uint8_t datatype;
      uint32_t op;
      size_t trafficBytes;
      uint8_t nMaxChannels;
      uint8_t nWarps;
      uint8_t algo;
      uint8_t proto;
      int isCollnet;
      int isNvls;
    } coll;
    struct {
      const char* name;
      uint64_t commHash;
      uint8_t func;
      void* buff;
      uint8_t datatype;
      size_t count;
      int peer;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
  };
} prof_descr_v1_t;

/* v1 to v3 share the state arguments: the proxy op's bytes and steps, or the control's ops. */
typedef union {
  struct {
    size_t transSize;
    int steps;
  } proxyOp;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
} prof_state_args_v1_t;

/* v1 to v3 share this shape, each with its own descriptor (hence void*). */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask);
  ncclResult_t (*startEvent)(void* context, void** eHandle, void* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, int eState, prof_state_args_v1_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} prof_v1_t;

#endif
