/*
 * Data-parallel training with NCCL, the way a framework's DDP does it, in one file.
 *
 * Every rank (one process per GPU) holds the same small MLP, 32 -> 64 -> 32 -> 1
 * with tanh between layers (4,225 parameters), and trains it on its own shard of
 * a synthetic regression data set. What the example demonstrates:
 *
 *   - rank 0 initialises the weights and ncclBroadcast gives every rank the same;
 *   - gradients are all-reduced in buckets (one per layer, ncclAvg) on a separate
 *     communication stream, overlapped with the backward pass: as soon as a
 *     layer's weight gradient is computed on the compute stream, an event is
 *     recorded, the communication stream waits on it and starts that bucket's
 *     ncclAllReduce, while the compute stream goes on with the gradient for the
 *     layer below;
 *   - only the SGD step waits for the communication stream;
 *   - the loss printed by every rank each step is the global mean, itself all-reduced;
 *   - at the end, ncclAllGather of a hash of the weights checks that every rank
 *     holds bitwise the same model, and the program checks that the loss went
 *     down. It exits 1 when either check fails, 77 when there are not enough GPUs.
 *
 * Run: ./ddp_train --nranks 2              (forks 2 ranks, one per GPU)
 *      mpirun -np 2 ./ddp_train            (no MPI library needed, see launch.h)
 * Options: --steps N (default 200, at least 2), --lr X (default 0.05).
 * The kernels are deliberately plain (one thread per output value, no cuBLAS).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "check.h"
#include "launch.h"

#define D_IN 32
#define BATCH 256        /* samples per rank per step */
#define SHARD_BATCHES 16 /* each rank's shard: SHARD_BATCHES * BATCH samples */
#define NLAYERS 3
#define THREADS 256

static const int layer_in[NLAYERS] = {D_IN, 64, 32};
static const int layer_out[NLAYERS] = {64, 32, 1};

/* out[b][j] = act(bias[j] + sum_i W[j][i] in[b][i]), act = tanh or identity. */
__global__ void dense_forward(const float* in, const float* W, const float* bias, float* out,
                              int nin, int nout, int use_tanh) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= BATCH * nout) return;
  int b = idx / nout, j = idx % nout;
  float z = bias[j];
  for (int i = 0; i < nin; i++) z += W[j * nin + i] * in[b * nin + i];
  out[idx] = use_tanh ? tanhf(z) : z;
}

/* Mean squared error over the batch, in one block of THREADS threads (a fixed
 * reduction order, so the same inputs always give the same bits).
 * grad[b] = d loss / d pred[b]. */
__global__ void mse_loss(const float* pred, const float* y, float* grad, float* loss) {
  __shared__ float part[THREADS];
  float s = 0.0f;
  for (int b = threadIdx.x; b < BATCH; b += THREADS) {
    float d = pred[b] - y[b];
    grad[b] = 2.0f * d / BATCH;
    s += d * d;
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int half = THREADS / 2; half > 0; half /= 2) {
    if ((int)threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = part[0] / BATCH;
}

/* A layer's parameter gradient, laid out like its parameters: dW (nout x nin)
 * then db (nout). g[b][j] is d loss / d z[b][j] for this layer's output. */
__global__ void dense_backward_params(const float* in, const float* g, float* grad, int nin,
                                      int nout) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= nout * nin + nout) return;
  float s = 0.0f;
  if (idx < nout * nin) {
    int j = idx / nin, i = idx % nin;
    for (int b = 0; b < BATCH; b++) s += g[b * nout + j] * in[b * nin + i];
  } else {
    int j = idx - nout * nin;
    for (int b = 0; b < BATCH; b++) s += g[b * nout + j];
  }
  grad[idx] = s;
}

/* gin[b][i] = d loss / d z of the layer below: (sum_j g[b][j] W[j][i]) * tanh'(z),
 * with tanh'(z) = 1 - in^2 since `in` is that layer's tanh output. */
__global__ void dense_backward_input(const float* in, const float* W, const float* g, float* gin,
                                     int nin, int nout) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= BATCH * nin) return;
  int b = idx / nin, i = idx % nin;
  float s = 0.0f;
  for (int j = 0; j < nout; j++) s += g[b * nout + j] * W[j * nin + i];
  gin[idx] = s * (1.0f - in[idx] * in[idx]);
}

__global__ void sgd_step(float* param, const float* grad, float lr, int n) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx < n) param[idx] -= lr * grad[idx];
}

static unsigned blocks(int n) { return (unsigned)((n + THREADS - 1) / THREADS); }

/* splitmix64: a deterministic generator, the same on every host. */
static uint64_t rng_next(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static float rng_uniform(uint64_t* state, float lo, float hi) {
  return lo + (hi - lo) * (float)((rng_next(state) >> 40) * (1.0 / 16777216.0));
}

/* This rank's shard: x uniform in [-1, 1], y = sin(2 u.x) + 0.5 x0 x1, with the
 * same u on every rank and x seeded by the rank, so every shard is different. */
static void make_shard(int rank, float* x, float* y, int nsamples) {
  uint64_t teacher = 12345, data = 1000003ull * (uint64_t)(rank + 1);
  float u[D_IN];
  for (int i = 0; i < D_IN; i++) u[i] = rng_uniform(&teacher, -1.0f, 1.0f) / sqrtf((float)D_IN);
  for (int s = 0; s < nsamples; s++) {
    float dot = 0.0f;
    for (int i = 0; i < D_IN; i++) {
      x[s * D_IN + i] = rng_uniform(&data, -1.0f, 1.0f);
      dot += u[i] * x[s * D_IN + i];
    }
    y[s] = sinf(2.0f * dot) + 0.5f * x[s * D_IN] * x[s * D_IN + 1];
  }
}

/* FNV-1a over the bytes of the weights: equal hashes mean (almost surely) equal bits. */
static uint64_t hash_bytes(const void* p, size_t n) {
  const unsigned char* c = (const unsigned char*)p;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
  return h;
}

int main(int argc, char** argv) {
  static const char* const known[] = {"--nranks", "--id-file", "--steps", "--lr", NULL};
  example_args_check(argc, argv, known, "[--nranks N] [--id-file PATH] [--steps N] [--lr X]");
  int steps = example_arg(argc, argv, "--steps") ? atoi(example_arg(argc, argv, "--steps")) : 200;
  float lr = example_arg(argc, argv, "--lr") ? (float)atof(example_arg(argc, argv, "--lr")) : 0.05f;
  /* The final check compares the first step's loss with the last one's. */
  if (steps < 2) steps = 2;
  setvbuf(stdout, NULL, _IOLBF, 0); /* one write per line: ranks' lines do not mix */

  example_world_t world;
  example_world_init(&world, argc, argv); /* forks here when self-launching */
  int rank = world.rank, nranks = world.nranks;
  int dev = example_gpu_select(&world);

  ncclUniqueId id;
  example_unique_id_share(&world, &id);
  ncclComm_t comm;
  NCCL_CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  example_unique_id_done(&world);
  printf("rank %d of %d on GPU %d\n", rank, nranks, dev);

  /* Parameters of all layers in one buffer, gradients in another with the same
   * layout; bucket l is layer l's slice [off[l], off[l] + size[l]). */
  int off[NLAYERS], size[NLAYERS], nparams = 0;
  for (int l = 0; l < NLAYERS; l++) {
    off[l] = nparams;
    size[l] = layer_out[l] * layer_in[l] + layer_out[l];
    nparams += size[l];
  }
  float *params, *grads, *act[NLAYERS + 1], *delta[NLAYERS], *x, *y, *loss;
  int nsamples = SHARD_BATCHES * BATCH;
  CUDA_CHECK(cudaMalloc(&params, nparams * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&grads, nparams * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&x, (size_t)nsamples * D_IN * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&y, nsamples * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&loss, 2 * sizeof(float))); /* [0] this rank's, [1] global mean */
  for (int l = 0; l < NLAYERS; l++) {
    CUDA_CHECK(cudaMalloc(&act[l + 1], BATCH * layer_out[l] * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&delta[l], BATCH * layer_out[l] * sizeof(float)));
  }

  /* Data, and the initial weights, made on the host. Rank 0's weights reach the
   * others through ncclBroadcast (theirs start as zeros). */
  float* hx = (float*)malloc((size_t)nsamples * D_IN * sizeof(float));
  float* hy = (float*)malloc(nsamples * sizeof(float));
  float* hp = (float*)calloc(nparams, sizeof(float));
  if (!hx || !hy || !hp) {
    fprintf(stderr, "rank %d: out of host memory\n", rank);
    return 1;
  }
  make_shard(rank, hx, hy, nsamples);
  CUDA_CHECK(cudaMemcpy(x, hx, (size_t)nsamples * D_IN * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(y, hy, nsamples * sizeof(float), cudaMemcpyHostToDevice));
  if (rank == 0) {
    uint64_t seed = 42;
    for (int l = 0; l < NLAYERS; l++) {
      float bound = sqrtf(6.0f / (float)(layer_in[l] + layer_out[l])); /* Glorot uniform */
      for (int i = 0; i < layer_out[l] * layer_in[l]; i++)
        hp[off[l] + i] = rng_uniform(&seed, -bound, bound); /* biases stay 0 */
    }
  }
  CUDA_CHECK(cudaMemcpy(params, hp, nparams * sizeof(float), cudaMemcpyHostToDevice));

  cudaStream_t compute, comm_stream;
  cudaEvent_t loss_ready, grad_ready[NLAYERS], comm_done;
  CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&loss_ready, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&comm_done, cudaEventDisableTiming));
  for (int l = 0; l < NLAYERS; l++)
    CUDA_CHECK(cudaEventCreateWithFlags(&grad_ready[l], cudaEventDisableTiming));
  float* host_loss;
  CUDA_CHECK(cudaMallocHost(&host_loss, sizeof(float)));

  NCCL_CHECK(ncclBroadcast(params, params, nparams, ncclFloat, 0, comm, compute));

  float first_loss = 0.0f, last_loss = 0.0f;
  for (int step = 0; step < steps; step++) {
    int batch = step % SHARD_BATCHES;
    act[0] = x + (size_t)batch * BATCH * D_IN;

    /* Forward. */
    for (int l = 0; l < NLAYERS; l++) {
      const float *W = params + off[l], *bias = W + layer_out[l] * layer_in[l];
      dense_forward<<<blocks(BATCH * layer_out[l]), THREADS, 0, compute>>>(
          act[l], W, bias, act[l + 1], layer_in[l], layer_out[l], l + 1 < NLAYERS);
      CUDA_CHECK(cudaGetLastError());
    }
    mse_loss<<<1, THREADS, 0, compute>>>(act[NLAYERS], y + batch * BATCH, delta[NLAYERS - 1],
                                         &loss[0]);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaEventRecord(loss_ready, compute));
    CUDA_CHECK(cudaStreamWaitEvent(comm_stream, loss_ready, 0));
    NCCL_CHECK(ncclAllReduce(&loss[0], &loss[1], 1, ncclFloat, ncclAvg, comm, comm_stream));

    /* Backward, last layer first. Each layer's gradient is handed to the
     * communication stream as soon as it exists; the compute stream goes on
     * with the layer below while the all-reduce runs. */
    for (int l = NLAYERS - 1; l >= 0; l--) {
      dense_backward_params<<<blocks(size[l]), THREADS, 0, compute>>>(
          act[l], delta[l], grads + off[l], layer_in[l], layer_out[l]);
      CUDA_CHECK(cudaGetLastError());
      CUDA_CHECK(cudaEventRecord(grad_ready[l], compute));
      CUDA_CHECK(cudaStreamWaitEvent(comm_stream, grad_ready[l], 0));
      NCCL_CHECK(ncclAllReduce(grads + off[l], grads + off[l], size[l], ncclFloat, ncclAvg, comm,
                               comm_stream));
      if (l > 0) {
        dense_backward_input<<<blocks(BATCH * layer_in[l]), THREADS, 0, compute>>>(
            act[l], params + off[l], delta[l], delta[l - 1], layer_in[l], layer_out[l]);
        CUDA_CHECK(cudaGetLastError());
      }
    }

    /* The optimizer needs every averaged gradient: wait for the communication stream. */
    CUDA_CHECK(cudaEventRecord(comm_done, comm_stream));
    CUDA_CHECK(cudaStreamWaitEvent(compute, comm_done, 0));
    sgd_step<<<blocks(nparams), THREADS, 0, compute>>>(params, grads, lr, nparams);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(
        cudaMemcpyAsync(host_loss, &loss[1], sizeof(float), cudaMemcpyDeviceToHost, compute));
    CUDA_CHECK(cudaStreamSynchronize(compute));
    printf("step %d rank %d loss %.9f\n", step, rank, *host_loss);
    if (step == 0) first_loss = *host_loss;
    last_loss = *host_loss;
  }

  /* Every rank must hold the same weights, bit for bit: gather every rank's hash. */
  CUDA_CHECK(cudaMemcpy(hp, params, nparams * sizeof(float), cudaMemcpyDeviceToHost));
  uint64_t my_hash = hash_bytes(hp, nparams * sizeof(float));
  uint64_t *hashes, *all_hashes = (uint64_t*)malloc(nranks * sizeof(uint64_t));
  CUDA_CHECK(cudaMalloc(&hashes, nranks * sizeof(uint64_t)));
  CUDA_CHECK(cudaMemcpy(hashes + rank, &my_hash, sizeof(uint64_t), cudaMemcpyHostToDevice));
  NCCL_CHECK(ncclAllGather(hashes + rank, hashes, 1, ncclUint64, comm, compute));
  CUDA_CHECK(cudaMemcpyAsync(all_hashes, hashes, nranks * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                             compute));
  CUDA_CHECK(cudaStreamSynchronize(compute));
  int same = 1;
  for (int r = 0; r < nranks; r++) same &= all_hashes[r] == my_hash;
  int learned = last_loss < first_loss;
  printf("rank %d: weights hash %016llx %s; loss %.6f -> %.6f %s\n", rank,
         (unsigned long long)my_hash, same ? "identical on all ranks" : "DIFFERS between ranks",
         first_loss, last_loss, learned ? "(went down)" : "(did NOT go down)");
  if (rank == 0) printf("%s\n", same && learned ? "PASS" : "FAIL");

  NCCL_CHECK(ncclCommFinalize(comm));
  NCCL_CHECK(ncclCommDestroy(comm));
  CUDA_CHECK(cudaFree(hashes));
  CUDA_CHECK(cudaFreeHost(host_loss));
  for (int l = 0; l < NLAYERS; l++) {
    CUDA_CHECK(cudaFree(act[l + 1]));
    CUDA_CHECK(cudaFree(delta[l]));
    CUDA_CHECK(cudaEventDestroy(grad_ready[l]));
  }
  CUDA_CHECK(cudaEventDestroy(loss_ready));
  CUDA_CHECK(cudaEventDestroy(comm_done));
  CUDA_CHECK(cudaStreamDestroy(compute));
  CUDA_CHECK(cudaStreamDestroy(comm_stream));
  CUDA_CHECK(cudaFree(params));
  CUDA_CHECK(cudaFree(grads));
  CUDA_CHECK(cudaFree(x));
  CUDA_CHECK(cudaFree(y));
  CUDA_CHECK(cudaFree(loss));
  free(hx);
  free(hy);
  free(hp);
  free(all_hashes);
  return same && learned ? 0 : 1;
}
