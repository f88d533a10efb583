// ce-probe: the time of one step of the copy-engine exchange, on one GPU.
//
// A device-to-device cudaMemcpyAsync on one stream, alone or while a kernel on another stream
// spins on a flag that a one-thread kernel after the copy sets (the shape of the exchange in
// src/runtime/ce.c). Prints microseconds per round.
//   ce-probe [MB [ipc|two]]
// With "ipc": the destination is another process's allocation, opened with
// cudaIpcOpenMemHandle (as the exchange's peer slots are); the parent process holds it and
// waits. With "two": two processes run the rounds at once, each on its own buffers (two
// clients of one GPU, as under CUDA MPS).
#include <cuda_runtime.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(x)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

__global__ void spin_until(const volatile uint32_t* flag, uint32_t want) {
  if (threadIdx.x == 0)
    while (*flag < want) {
    }
  __syncthreads();
}

__global__ void set_flag(volatile uint32_t* flag, uint32_t v) {
  __threadfence_system();
  *flag = v;
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char** argv) {
  size_t mb = argc > 1 ? strtoul(argv[1], NULL, 10) : 32;
  size_t bytes = mb << 20;
  int ipc = argc > 2 && strcmp(argv[2], "ipc") == 0;
  if (argc > 2 && strcmp(argv[2], "two") == 0) {
    pid_t pid = fork();
    if (pid == 0) printf("(second process)\n");
    if (pid > 0) atexit([] { int st; wait(&st); });
  }
  char *a, *b;
  if (ipc) {  // the parent allocates the destination and exports it; the child runs the rounds
    int fds[2], done[2];
    if (pipe(fds) != 0 || pipe(done) != 0) return 1;
    pid_t pid = fork();
    if (pid > 0) {
      cudaIpcMemHandle_t h;
      CHECK(cudaMalloc(&b, bytes));
      CHECK(cudaIpcGetMemHandle(&h, b));
      if (write(fds[1], &h, sizeof h) != sizeof h) return 1;
      char c;
      if (read(done[0], &c, 1) != 1) return 1;
      int st;
      waitpid(pid, &st, 0);
      return WEXITSTATUS(st);
    }
    cudaIpcMemHandle_t h;
    if (read(fds[0], &h, sizeof h) != sizeof h) return 1;
    CHECK(cudaIpcOpenMemHandle((void**)&b, h, cudaIpcMemLazyEnablePeerAccess));
    printf("child: destination is the parent's, opened by IPC\n");
    atexit([] {});
    static int done_fd;
    done_fd = done[1];
    atexit([] { char c = 1; if (write(done_fd, &c, 1)) {} });
  }
  uint32_t* flag;
  cudaStream_t s0, s1;
  CHECK(cudaMalloc(&a, bytes));
  if (!ipc) CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMalloc(&flag, 8));
  CHECK(cudaMemset(flag, 0, 8));
  CHECK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  const int iters = 20;
  cudaEvent_t fork, join;
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  for (int mode = 0; mode < 6; mode++) {
    // 0: copy alone; 1: copy + set_flag; 2: spinning kernel (32 blocks) + copy + set_flag;
    // 3: as 2, 4 chunks of bytes/4 each followed by set_flag
    uint32_t v = 0;
    CHECK(cudaMemset(flag, 0, 4));
    CHECK(cudaDeviceSynchronize());
    double t0 = 0;
    for (int i = -2; i < iters; i++) {
      if (i == 0) {
        CHECK(cudaDeviceSynchronize());
        t0 = now_us();
      }
      // 4: as 2, the copy stream forked from and joined back into the kernel's stream by events
      // (src/runtime/ce.c's shape); 5: as 4 with a one-thread kernel before the copy too
      int nchunks = mode == 3 ? 4 : 1;
      if (mode >= 4) {
        CHECK(cudaEventRecord(fork, s0));
        CHECK(cudaStreamWaitEvent(s1, fork, 0));
      }
      if (mode >= 2) spin_until<<<32, 512, 0, s0>>>(flag, v + nchunks);
      for (int c = 0; c < nchunks; c++) {
        if (mode == 5) set_flag<<<1, 1, 0, s1>>>(flag + 1, v);
        CHECK(cudaMemcpyAsync(b + c * (bytes / nchunks), a + c * (bytes / nchunks), bytes / nchunks,
                              cudaMemcpyDefault, s1));
        if (mode >= 1) set_flag<<<1, 1, 0, s1>>>(flag, ++v);
      }
      if (mode >= 4) {
        CHECK(cudaEventRecord(join, s1));
        CHECK(cudaStreamWaitEvent(s0, join, 0));
      }
      CHECK(cudaStreamSynchronize(s0));
      CHECK(cudaStreamSynchronize(s1));
    }
    double us = (now_us() - t0) / iters;
    printf("mode %d, %zu MB: %.1f us per round (%.1f GB/s)\n", mode, mb, us, bytes / us / 1e3);
  }
  return 0;
}
