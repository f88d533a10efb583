/*
 * A program outside Braid's tree, built against an installed Braid the way users build theirs
 * (pkg-config or find_package(Braid)). It checks that it was compiled with Braid's nccl.h, not
 * another NCCL header on the include path, and that the library it runs with reports the API
 * level that header declares.
 */
#include <stdio.h>

#include <nccl.h>

#ifndef BRAID_VERSION_CODE
#error "nccl.h is not Braid's: the include path finds another NCCL header first"
#endif

int main(void) {
  int version = 0;
  ncclResult_t res = ncclGetVersion(&version);
  if (res != ncclSuccess) {
    fprintf(stderr, "consumer: ncclGetVersion failed: %s\n", ncclGetErrorString(res));
    return 1;
  }
  printf("consumer: %s, NCCL API version %d (header: %d), ncclSuccess reads \"%s\"\n",
         braidGetVersionString(), version, NCCL_VERSION_CODE, ncclGetErrorString(ncclSuccess));
  if (version != NCCL_VERSION_CODE) {
    fprintf(stderr, "consumer: the library reports %d, the header %d\n", version,
            NCCL_VERSION_CODE);
    return 1;
  }
  return 0;
}
