// fan-copy: how fast every GPU of a host writes its part into every other GPU at once (an
// all-gather's traffic), and reads every other's part (a reduce-scatter's), by copy engine and by
// SM.
//
// One process sees all the GPUs (or the first N), with peer access between every pair. Each GPU
// holds an input and an output of total bytes (an all-gather sends total/N of it). All GPUs start together (a gate
// kernel each, released by the host), each pattern runs 5 times, and the best run's slowest GPU
// gives busbw = (N - 1) / N * total / time, as nccl-tests counts an all-gather or reduce-scatter.
//   fan-copy [MB total, default 64,256,1024] [N]
// Patterns:
//   ce-push-stream-per-peer   a copy into each peer, each on its own stream
//   ce-push-one-stream        the same copies one after another on one stream
//   ce-push-pieces-K          the copies cut in K MB pieces, round robin over the peers, on
//                             one stream per peer
//   ce-pull-stream-per-peer   each GPU copies its block of each peer's input into its output
//   sm-push                   one kernel per GPU storing its input into every peer's output
//   sm-pull-reduce            one kernel per GPU loading its block of every peer's input and
//                             its own, summing (float) into its output: a reduce-scatter
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"

#define MAXG 8

__global__ void gate_kernel(volatile int* flag) {
  while (*flag == 0) {
  }
}

// Block b writes to peer (b % npeers): its share of that peer's copy, 16-byte words.
struct push_args {
  uint4* dst[MAXG];
  int npeers;
};
__global__ void sm_push(const uint4* __restrict__ src, push_args a, size_t n) {
  const int p = blockIdx.x % a.npeers, nb = gridDim.x / a.npeers, b = blockIdx.x / a.npeers;
  uint4* dst = a.dst[p];
  for (size_t i = b * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)nb * blockDim.x)
    dst[i] = src[i];
}

struct pull_args {
  const float4* src[MAXG]; /* every GPU's input block for this GPU, own included */
  int nsrc;
};
__global__ void sm_pull_reduce(float4* __restrict__ out, pull_args a, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float4 s = a.src[0][i];
    for (int k = 1; k < a.nsrc; k++) {
      float4 v = a.src[k][i];
      s.x += v.x;
      s.y += v.y;
      s.z += v.z;
      s.w += v.w;
    }
    out[i] = s;
  }
}

static int ng;
static char* in[MAXG];
static char* out[MAXG];
static cudaStream_t main_s[MAXG], peer_s[MAXG][MAXG];
static cudaEvent_t ev_start[MAXG], ev_end[MAXG], ev_join[MAXG][MAXG];
static volatile int* flag;
static int sms;

enum pattern { CE_PUSH_PEER, CE_PUSH_ONE, CE_PUSH_PIECES, CE_PULL_PEER, SM_PUSH, SM_PULL_REDUCE };

static void enqueue(int g, enum pattern p, size_t part, size_t piece) {
  CHECK(cudaSetDevice(g));
  gate_kernel<<<1, 1, 0, main_s[g]>>>(flag);
  CHECK(cudaEventRecord(ev_start[g], main_s[g]));
  for (int q = 0; q < ng; q++) CHECK(cudaStreamWaitEvent(peer_s[g][q], ev_start[g], 0));
  switch (p) {
    case CE_PUSH_PEER:
      for (int q = 0; q < ng; q++)
        if (q != g)
          CHECK(cudaMemcpyAsync(out[q] + g * part, in[g], part, cudaMemcpyDeviceToDevice,
                                peer_s[g][q]));
      break;
    case CE_PUSH_ONE:
      for (int k = 1; k < ng; k++) {
        int q = (g + k) % ng;
        CHECK(cudaMemcpyAsync(out[q] + g * part, in[g], part, cudaMemcpyDeviceToDevice,
                              peer_s[g][g]));
      }
      break;
    case CE_PUSH_PIECES:
      for (size_t off = 0; off < part; off += piece)
        for (int k = 1; k < ng; k++) {
          int q = (g + k) % ng;
          size_t len = part - off < piece ? part - off : piece;
          CHECK(cudaMemcpyAsync(out[q] + g * part + off, in[g] + off, len,
                                cudaMemcpyDeviceToDevice, peer_s[g][q]));
        }
      break;
    case CE_PULL_PEER:
      for (int q = 0; q < ng; q++)
        if (q != g)
          CHECK(cudaMemcpyAsync(out[g] + q * part, in[q], part, cudaMemcpyDeviceToDevice,
                                peer_s[g][q]));
      break;
    case SM_PUSH: {
      push_args a;
      memset(&a, 0, sizeof a);
      for (int k = 1; k < ng; k++) a.dst[k - 1] = (uint4*)(out[(g + k) % ng] + g * part);
      a.npeers = ng - 1;
      int blocks = sms * 2 / a.npeers * a.npeers;
      sm_push<<<blocks, 512, 0, peer_s[g][g]>>>((const uint4*)in[g], a, part / 16);
      CHECK(cudaGetLastError());
      break;
    }
    case SM_PULL_REDUCE: {
      // Each GPU's input is `total`; GPU g reduces block g (part bytes) of every input.
      pull_args a;
      memset(&a, 0, sizeof a);
      size_t blk = part;
      for (int k = 0; k < ng; k++) a.src[k] = (const float4*)(in[(g + k) % ng] + g * blk);
      a.nsrc = ng;
      sm_pull_reduce<<<sms * 2, 512, 0, peer_s[g][g]>>>((float4*)out[g], a, blk / 16);
      CHECK(cudaGetLastError());
      break;
    }
  }
  for (int q = 0; q < ng; q++) {
    CHECK(cudaEventRecord(ev_join[g][q], peer_s[g][q]));
    CHECK(cudaStreamWaitEvent(main_s[g], ev_join[g][q], 0));
  }
  CHECK(cudaEventRecord(ev_end[g], main_s[g]));
}

// Runs pattern p 5 times; returns the best run's slowest GPU, in ms.
static float run(enum pattern p, size_t part, size_t piece) {
  float best = 1e30f;
  for (int rep = 0; rep < 6; rep++) {
    *flag = 0;
    for (int g = 0; g < ng; g++) enqueue(g, p, part, piece);
    __sync_synchronize();
    *flag = 1;
    float worst = 0;
    for (int g = 0; g < ng; g++) {
      CHECK(cudaSetDevice(g));
      CHECK(cudaEventSynchronize(ev_end[g]));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, ev_start[g], ev_end[g]));
      if (ms > worst) worst = ms;
    }
    if (rep > 0 && worst < best) best = worst; /* the first run warms up */
  }
  return best;
}

int main(int argc, char** argv) {
  size_t sizes_mb[8] = {64, 256, 1024};
  int nsizes = 3;
  if (argc > 1) {
    nsizes = 0;
    for (char* s = strtok(argv[1], ","); s && nsizes < 8; s = strtok(NULL, ","))
      sizes_mb[nsizes++] = strtoull(s, NULL, 10);
  }
  CHECK(cudaGetDeviceCount(&ng));
  if (argc > 2 && atoi(argv[2]) < ng) ng = atoi(argv[2]);
  if (ng > MAXG) ng = MAXG;
  if (ng < 2) {
    fprintf(stderr, "fan-copy: needs 2 or more GPUs, found %d\n", ng);
    return 2;
  }
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaHostAlloc((void**)&flag, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
  size_t max_total = 0;
  for (int i = 0; i < nsizes; i++)
    if (sizes_mb[i] > max_total) max_total = sizes_mb[i];
  max_total <<= 20;
  for (int g = 0; g < ng; g++) {
    CHECK(cudaSetDevice(g));
    for (int q = 0; q < ng; q++) {
      int can = 0;
      if (q == g) continue;
      CHECK(cudaDeviceCanAccessPeer(&can, g, q));
      if (!can) {
        fprintf(stderr, "fan-copy: GPU %d cannot access GPU %d\n", g, q);
        return 2;
      }
      CHECK(cudaDeviceEnablePeerAccess(q, 0));
    }
    CHECK(cudaMalloc(&in[g], max_total));
    CHECK(cudaMalloc(&out[g], max_total));
    CHECK(cudaMemset(in[g], 0, max_total));
    CHECK(cudaStreamCreateWithFlags(&main_s[g], cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&ev_start[g]));
    CHECK(cudaEventCreate(&ev_end[g]));
    for (int q = 0; q < ng; q++) {
      CHECK(cudaStreamCreateWithFlags(&peer_s[g][q], cudaStreamNonBlocking));
      CHECK(cudaEventCreateWithFlags(&ev_join[g][q], cudaEventDisableTiming));
    }
  }
  printf("fan-copy: %d GPUs, busbw GB/s = (N-1)/N * total / slowest GPU's time, best of 5\n", ng);
  printf("%-26s", "pattern \\ total MB");
  for (int i = 0; i < nsizes; i++) printf(" %9zu", sizes_mb[i]);
  printf("\n");
  struct {
    const char* name;
    enum pattern p;
    size_t piece_mb;
  } pats[] = {{"ce-push-stream-per-peer", CE_PUSH_PEER, 0},
              {"ce-push-one-stream", CE_PUSH_ONE, 0},
              {"ce-push-pieces-2", CE_PUSH_PIECES, 2},
              {"ce-push-pieces-8", CE_PUSH_PIECES, 8},
              {"ce-pull-stream-per-peer", CE_PULL_PEER, 0},
              {"sm-push", SM_PUSH, 0},
              {"sm-pull-reduce", SM_PULL_REDUCE, 0}};
  for (size_t k = 0; k < sizeof pats / sizeof pats[0]; k++) {
    printf("%-26s", pats[k].name);
    for (int i = 0; i < nsizes; i++) {
      size_t total = sizes_mb[i] << 20, part = total / ng / 4096 * 4096;
      float ms = run(pats[k].p, part, pats[k].piece_mb << 20);
      printf(" %9.1f", (double)(ng - 1) * part / (ms * 1e6));
      fflush(stdout);
    }
    printf("\n");
  }
  return 0;
}
