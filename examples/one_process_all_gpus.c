/*
 * One process, one thread, every local GPU: ncclCommInitAll and grouped calls.
 *
 * The process creates one communicator per GPU with ncclCommInitAll, then runs
 * four collectives, each issued for all GPUs inside one
 * ncclGroupStart/ncclGroupEnd (without the group, the first GPU's call would
 * wait forever for the others, which this thread has not issued yet):
 *
 *   ncclAllReduce (sum), ncclAllGather, ncclReduceScatter (sum), ncclBroadcast
 *   (root: the last GPU).
 *
 * GPU g's input holds (g + 1) * (i % 97 + 1): small integers, so every sum is
 * exact in float and the host can say exactly what each GPU must receive. The
 * program prints PASS or FAIL for each collective and exits 1 if any failed,
 * 77 when fewer GPUs than asked for are visible.
 *
 * Run: ./one_process_all_gpus               (all visible GPUs)
 *      ./one_process_all_gpus --ngpus 2     (the first 2)
 * Options: --count N (elements per GPU, default 1048583, an odd size on purpose).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "check.h"
#include "launch.h"

#define MAX_GPUS 64

static const char* const prog = "one_process_all_gpus";

typedef enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, NCOLLS } coll_t;
static const char* const coll_name[NCOLLS] = {"AllReduce", "AllGather", "ReduceScatter",
                                              "Broadcast"};

static float input_value(int gpu, size_t i) { return (float)((gpu + 1) * (int)(i % 97 + 1)); }

/* Elements each GPU sends and receives for `coll`, with `count` per GPU. */
static void coll_sizes(coll_t coll, size_t count, int ngpus, size_t* send, size_t* recv) {
  *send = count;
  *recv = count;
  if (coll == ALL_GATHER) *recv = count * (size_t)ngpus;
  if (coll == REDUCE_SCATTER) *send = count * (size_t)ngpus;
}

/* What element i of GPU g's receive buffer must hold after `coll`. */
static float expected(coll_t coll, int g, size_t i, size_t count, int ngpus) {
  float ranks_sum = (float)(ngpus * (ngpus + 1) / 2);
  switch (coll) {
    case ALL_REDUCE:
      return ranks_sum * (float)(i % 97 + 1);
    case ALL_GATHER:
      return input_value((int)(i / count), i % count);
    case REDUCE_SCATTER:
      return ranks_sum * (float)((g * count + i) % 97 + 1);
    default:
      return input_value(ngpus - 1, i); /* BROADCAST */
  }
}

/* Runs `coll` on every GPU in one group, then checks every GPU's result. */
static int run_coll(coll_t coll, int ngpus, size_t count, ncclComm_t* comms, cudaStream_t* streams,
                    float** sendbuf, float** recvbuf, float* host) {
  size_t nsend, nrecv;
  coll_sizes(coll, count, ngpus, &nsend, &nrecv);
  for (int g = 0; g < ngpus; g++) {
    for (size_t i = 0; i < nsend; i++) host[i] = input_value(g, i);
    CUDA_CHECK(cudaSetDevice(g));
    CUDA_CHECK(cudaMemcpy(sendbuf[g], host, nsend * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(recvbuf[g], 0xff, nrecv * sizeof(float))); /* NaN until written */
  }
  NCCL_CHECK(ncclGroupStart());
  for (int g = 0; g < ngpus; g++) {
    switch (coll) {
      case ALL_REDUCE:
        NCCL_CHECK(
            ncclAllReduce(sendbuf[g], recvbuf[g], count, ncclFloat, ncclSum, comms[g], streams[g]));
        break;
      case ALL_GATHER:
        NCCL_CHECK(ncclAllGather(sendbuf[g], recvbuf[g], count, ncclFloat, comms[g], streams[g]));
        break;
      case REDUCE_SCATTER:
        NCCL_CHECK(ncclReduceScatter(sendbuf[g], recvbuf[g], count, ncclFloat, ncclSum, comms[g],
                                     streams[g]));
        break;
      default:
        NCCL_CHECK(ncclBroadcast(sendbuf[g], recvbuf[g], count, ncclFloat, ngpus - 1, comms[g],
                                 streams[g]));
        break;
    }
  }
  NCCL_CHECK(ncclGroupEnd());

  long bad = 0;
  for (int g = 0; g < ngpus; g++) {
    CUDA_CHECK(cudaSetDevice(g));
    CUDA_CHECK(cudaStreamSynchronize(streams[g]));
    CUDA_CHECK(cudaMemcpy(host, recvbuf[g], nrecv * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < nrecv; i++) {
      float want = expected(coll, g, i, count, ngpus);
      if (host[i] != want && bad++ < 5)
        printf("  %s: GPU %d element %zu: got %g, expected %g\n", coll_name[coll], g, i,
               (double)host[i], (double)want);
    }
  }
  printf("%-14s %d GPUs, %zu floats per GPU: %s\n", coll_name[coll], ngpus, count,
         bad ? "FAIL" : "PASS");
  return bad != 0;
}

/* The number of visible GPUs; 0 when there is no device or no usable driver. */
static int visible_gpus(cudaError_t* why) {
  int n = 0;
  *why = cudaGetDeviceCount(&n);
  if (*why == cudaErrorNoDevice || *why == cudaErrorInsufficientDriver) {
    (void)cudaGetLastError();
    return 0;
  }
  CUDA_CHECK(*why);
  return n;
}

int main(int argc, char** argv) {
  static const char* const known[] = {"--ngpus", "--count", NULL};
  example_args_check(argc, argv, known, "[--ngpus N] [--count N]");
  cudaError_t why;
  int visible = visible_gpus(&why);
  const char* ngpus_arg = example_arg(argc, argv, "--ngpus");
  int ngpus = ngpus_arg ? atoi(ngpus_arg) : visible;
  const char* count_arg = example_arg(argc, argv, "--count");
  size_t count = count_arg ? strtoull(count_arg, NULL, 10) : (1u << 20) + 7;
  if (ngpus < 1) ngpus = 1;
  if (ngpus > MAX_GPUS || count < 1) {
    fprintf(stderr, "%s: --ngpus must be at most %d, --count positive\n", prog, MAX_GPUS);
    return 2;
  }
  if (visible < ngpus) {
    printf("%s: SKIP: needs %d GPU%s, %d visible%s\n", prog, ngpus, ngpus > 1 ? "s" : "", visible,
           why == cudaErrorNoDevice             ? " (no CUDA device)"
           : why == cudaErrorInsufficientDriver ? " (no CUDA driver, or one too old)"
                                                : "");
    return EXAMPLE_EXIT_SKIP;
  }

  ncclComm_t comms[MAX_GPUS];
  cudaStream_t streams[MAX_GPUS];
  float *sendbuf[MAX_GPUS], *recvbuf[MAX_GPUS];
  int devs[MAX_GPUS];
  size_t max_elems = count * (size_t)ngpus; /* the larger side of AllGather and ReduceScatter */
  for (int g = 0; g < ngpus; g++) {
    devs[g] = g;
    CUDA_CHECK(cudaSetDevice(g));
    CUDA_CHECK(cudaStreamCreateWithFlags(&streams[g], cudaStreamNonBlocking));
    CUDA_CHECK(cudaMalloc((void**)&sendbuf[g], max_elems * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&recvbuf[g], max_elems * sizeof(float)));
  }
  /* GPU g gets rank g of one communicator spanning all of them. */
  NCCL_CHECK(ncclCommInitAll(comms, ngpus, devs));

  float* host = malloc(max_elems * sizeof(float));
  if (!host) {
    fprintf(stderr, "%s: out of host memory\n", prog);
    return 1;
  }
  int failures = 0;
  for (int c = 0; c < NCOLLS; c++)
    failures += run_coll((coll_t)c, ngpus, count, comms, streams, sendbuf, recvbuf, host);

  for (int g = 0; g < ngpus; g++) {
    NCCL_CHECK(ncclCommDestroy(comms[g]));
    CUDA_CHECK(cudaSetDevice(g));
    CUDA_CHECK(cudaFree(sendbuf[g]));
    CUDA_CHECK(cudaFree(recvbuf[g]));
    CUDA_CHECK(cudaStreamDestroy(streams[g]));
  }
  free(host);
  printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
