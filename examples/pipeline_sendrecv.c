/*
 * A pipeline of N stages (one process per GPU) joined by ncclSend / ncclRecv.
 *
 * Stage 0 makes micro-batches of known values; every stage r receives a
 * micro-batch from stage r-1, applies its "layer" (adds r + 1 to every value)
 * and sends the result to stage r+1. The last stage checks what arrives:
 * STAGE_INPUT(m, i) + 1 + 2 + ... + N, exact in float.
 *
 * What the example demonstrates:
 *   - a stage that both receives and sends puts the receive of micro-batch t
 *     and the send of micro-batch t-1 in one ncclGroupStart/ncclGroupEnd, so
 *     the two proceed together and neighbouring stages never wait on each other
 *     in a cycle;
 *   - the host enqueues every micro-batch without waiting: each stage cycles
 *     through --slots buffers (stream order keeps a buffer from being reused
 *     before its send completed), so all stages work at once, each on a
 *     different micro-batch;
 *   - the last stage's verdict reaches every rank through ncclBroadcast, so all
 *     ranks exit with the same status: 0 when every value matched, 1 otherwise,
 *     77 when there are not enough GPUs.
 *
 * Run: ./pipeline_sendrecv --nranks 2           (forks 2 ranks, one per GPU)
 *      mpirun -np 2 ./pipeline_sendrecv         (no MPI library needed, see launch.h)
 * Options: --microbatches M (default 32), --count N (floats per micro-batch,
 * default 262144), --slots S (buffers per stage, default 4, at least 2).
 */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "check.h"
#include "launch.h"
#include "stage_kernels.h"

static int arg_int(int argc, char** argv, const char* name, int fallback) {
  const char* v = example_arg(argc, argv, name);
  return v ? atoi(v) : fallback;
}

/* Compares the micro-batches that reached the last stage with what they should
 * hold; prints the first few differences and returns their number. */
static long verify(const float* out, int microbatches, size_t count, int nranks) {
  float added = (float)(nranks * (nranks + 1) / 2);
  long bad = 0;
  for (int m = 0; m < microbatches; m++)
    for (size_t i = 0; i < count; i++) {
      float want = STAGE_INPUT((size_t)m, i) + added, got = out[(size_t)m * count + i];
      if (got != want && bad++ < 5)
        printf("micro-batch %d element %zu: got %.1f, expected %.1f\n", m, i, got, want);
    }
  return bad;
}

int main(int argc, char** argv) {
  static const char* const known[] = {"--nranks", "--id-file", "--microbatches",
                                      "--count",  "--slots",   NULL};
  example_args_check(argc, argv, known,
                     "[--nranks N] [--id-file PATH] [--microbatches M] [--count N] [--slots S]");
  int microbatches = arg_int(argc, argv, "--microbatches", 32);
  int count_arg = arg_int(argc, argv, "--count", 1 << 18);
  int slots = arg_int(argc, argv, "--slots", 4);
  if (microbatches < 1 || count_arg < 1 || slots < 2) {
    fprintf(stderr, "%s: --microbatches and --count must be positive, --slots at least 2\n",
            argv[0]);
    return 2;
  }
  size_t count = (size_t)count_arg;
  setvbuf(stdout, NULL, _IOLBF, 0);

  example_world_t world;
  example_world_init(&world, argc, argv); /* forks here when self-launching */
  int rank = world.rank, nranks = world.nranks;
  if (nranks < 2) {
    if (rank == 0) fprintf(stderr, "%s: a pipeline needs at least 2 ranks\n", world.prog);
    return 2;
  }
  int dev = example_gpu_select(&world);
  ncclUniqueId id;
  example_unique_id_share(&world, &id);
  ncclComm_t comm;
  NCCL_CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  example_unique_id_done(&world);
  printf("stage %d of %d on GPU %d\n", rank, nranks, dev);

  int first = rank == 0, last = rank == nranks - 1;
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float** slot = malloc((size_t)slots * sizeof(float*));
  if (!slot) return 1;
  for (int s = 0; s < slots; s++) CUDA_CHECK(cudaMalloc((void**)&slot[s], count * sizeof(float)));
  float* out = NULL; /* the last stage's results, all micro-batches */
  if (last) CUDA_CHECK(cudaMallocHost((void**)&out, (size_t)microbatches * count * sizeof(float)));

  /* Step t: receive micro-batch t and send micro-batch t-1 (one group), then
   * transform micro-batch t. Stage r's step t pairs with stage r-1's step t+1
   * and stage r+1's step t-1, so the whole pipeline advances together. */
  for (int t = 0; t <= microbatches; t++) {
    float *cur = slot[t % slots], *prev = slot[(t + slots - 1) % slots];
    NCCL_CHECK(ncclGroupStart());
    if (!first && t < microbatches)
      NCCL_CHECK(ncclRecv(cur, count, ncclFloat, rank - 1, comm, stream));
    if (!last && t > 0) NCCL_CHECK(ncclSend(prev, count, ncclFloat, rank + 1, comm, stream));
    NCCL_CHECK(ncclGroupEnd());
    if (t == microbatches) break;
    if (first) CUDA_CHECK(stage_fill(cur, count, t, stream));
    CUDA_CHECK(stage_add(cur, count, (float)(rank + 1), stream));
    if (last)
      CUDA_CHECK(cudaMemcpyAsync(out + (size_t)t * count, cur, count * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));

  /* The last stage decides; ncclBroadcast tells everyone. */
  int verdict = 0, *d_verdict;
  if (last) {
    long bad = verify(out, microbatches, count, nranks);
    verdict = bad != 0;
    printf("%s: %d micro-batches of %zu floats through %d stages, %ld wrong values\n",
           bad ? "FAIL" : "PASS", microbatches, count, nranks, bad);
  }
  CUDA_CHECK(cudaMalloc((void**)&d_verdict, sizeof(int)));
  CUDA_CHECK(cudaMemcpy(d_verdict, &verdict, sizeof(int), cudaMemcpyHostToDevice));
  NCCL_CHECK(ncclBroadcast(d_verdict, d_verdict, 1, ncclInt32, nranks - 1, comm, stream));
  CUDA_CHECK(cudaMemcpyAsync(&verdict, d_verdict, sizeof(int), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (!last) printf("stage %d: done, last stage says %s\n", rank, verdict ? "FAIL" : "PASS");

  NCCL_CHECK(ncclCommFinalize(comm));
  NCCL_CHECK(ncclCommDestroy(comm));
  CUDA_CHECK(cudaFree(d_verdict));
  for (int s = 0; s < slots; s++) CUDA_CHECK(cudaFree(slot[s]));
  free(slot);
  if (out) CUDA_CHECK(cudaFreeHost(out));
  CUDA_CHECK(cudaStreamDestroy(stream));
  return verdict;
}
