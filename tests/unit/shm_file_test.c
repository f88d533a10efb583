/*
 * The SHM transport's files without CUDA (transport/shm_file.h): a file the receiver makes is
 * gone from /dev/shm as soon as the sender opened it, while both still share its memory; names
 * parse back to their maker; and the sweep removes only what a dead maker of this pid
 * namespace left (in a scratch folder standing in for /dev/shm).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/utils.h"
#include "test.h"
#include "transport/shm_file.h"

static uint64_t my_ns(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static void test_open_unlinks(void) {
  char name[SHM_FILE_NAME_MAX];
  uint32_t nonce = 0;
  TEST_CHECK(braid_random_bytes(&nonce, sizeof nonce) == ncclSuccess, "random");
  TEST_CHECK(shm_file_name(name, sizeof name, my_ns(), (int)getpid(),
                           braid_process_start((int)getpid()), 0, 1, 2, nonce) == ncclSuccess,
             "name");
  const size_t bytes = 8192;
  int rfd = -1, sfd = -1;
  if (shm_file_create(name, bytes, &rfd) != ncclSuccess) {
    TEST_CHECK(0, "shm_file_create(%s)", name);
    return;
  }
  char path[160];
  snprintf(path, sizeof path, "/dev/shm%s", name);
  TEST_CHECK(access(path, F_OK) == 0, "%s exists after the create", path);
  TEST_CHECK(shm_file_open_unlink(name, bytes + 1, &sfd) != ncclSuccess && sfd < 0,
             "a size other than the announced one is refused");
  /* That refusal removed the name too: make it again for the real open. */
  close(rfd);
  TEST_CHECK(shm_file_create(name, bytes, &rfd) == ncclSuccess, "create again");
  TEST_CHECK(shm_file_open_unlink(name, bytes, &sfd) == ncclSuccess, "open");
  TEST_CHECK(access(path, F_OK) != 0 && errno == ENOENT, "%s gone once the sender opened it",
             path);
  char* r = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rfd, 0);
  char* s = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
  TEST_CHECK(r != MAP_FAILED && s != MAP_FAILED, "both map it");
  if (r != MAP_FAILED && s != MAP_FAILED) {
    TEST_CHECK(r[bytes - 1] == 0, "it starts zeroed");
    r[bytes - 1] = 42;
    TEST_CHECK(s[bytes - 1] == 42, "both ends share its memory after the name is gone");
  }
  if (r != MAP_FAILED) munmap(r, bytes);
  if (s != MAP_FAILED) munmap(s, bytes);
  close(rfd);
  close(sfd);
  TEST_CHECK(shm_file_open_unlink(name, bytes, &sfd) != ncclSuccess, "a second open finds nothing");
  TEST_CHECK(shm_unlink(name) != 0 && errno == ENOENT, "nothing left to remove");
}

static void test_parse(void) {
  char name[SHM_FILE_NAME_MAX];
  uint64_t ns = 0, start = 0;
  int pid = 0;
  TEST_CHECK(shm_file_name(name, sizeof name, 0xf0000123ULL, 4242, 0x1234abcdULL, 3, 5, 31,
                           0xdeadbeef) == ncclSuccess, "name");
  TEST_CHECK(shm_file_parse(name + 1, &ns, &pid, &start) == 1, "parse %s", name);
  TEST_CHECK(ns == 0xf0000123ULL && pid == 4242 && start == 0x1234abcdULL, "fields of %s", name);
  TEST_CHECK(!shm_file_parse("braid-4242-r0-p1-c0-0badf00d", &ns, &pid, &start),
             "an older name without namespace and start time is not parsed");
  TEST_CHECK(!shm_file_parse("other-1-2-3-r0", &ns, &pid, &start), "another prefix");
  TEST_CHECK(!shm_file_parse("braid-x-2-3-r0", &ns, &pid, &start), "a bad namespace");
  char small[16];
  TEST_CHECK(shm_file_name(small, sizeof small, 1, 2, 3, 4, 5, 6, 7) != ncclSuccess,
             "a name that does not fit is an error");
}

static void touch(const char* dir, const char* name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_CREAT | O_WRONLY, 0600);
  TEST_CHECK(fd >= 0, "create %s", path);
  if (fd >= 0) close(fd);
}

static int present(const char* dir, const char* name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return access(path, F_OK) == 0;
}

static void test_sweep(void) {
  char dir[] = "/tmp/braid-shm-sweep-XXXXXX";
  if (mkdtemp(dir) == NULL) {
    TEST_CHECK(0, "mkdtemp");
    return;
  }
  uint64_t ns = my_ns();
  int me = (int)getpid();
  uint64_t my_start = braid_process_start(me);
  if (ns == 0 || my_start == 0) {
    fprintf(stderr, "sweep: no pid namespace or start time here; skipped\n");
    rmdir(dir);
    return;
  }
  /* A dead maker: a child that exited and was reaped. */
  int hold[2];
  TEST_CHECK(pipe(hold) == 0, "pipe");
  pid_t c = fork();
  if (c == 0) {
    char b;
    close(hold[1]);
    _exit(read(hold[0], &b, 1) < 0 ? 1 : 0);
  }
  close(hold[0]);
  uint64_t dead_start = braid_process_start((int)c);
  close(hold[1]);
  waitpid(c, NULL, 0);
  char dead[SHM_FILE_NAME_MAX], live[SHM_FILE_NAME_MAX], other_ns[SHM_FILE_NAME_MAX],
      reused[SHM_FILE_NAME_MAX], nostart[SHM_FILE_NAME_MAX];
  shm_file_name(dead, sizeof dead, ns, (int)c, dead_start, 0, 1, 0, 1);
  shm_file_name(live, sizeof live, ns, me, my_start, 0, 1, 0, 2);
  shm_file_name(other_ns, sizeof other_ns, ns + 1, (int)c, dead_start, 0, 1, 0, 3);
  /* Our pid with another start time: an earlier process of that pid, gone. */
  pid_t parent = getppid();
  uint64_t parent_start = braid_process_start((int)parent);
  shm_file_name(reused, sizeof reused, ns, (int)parent, parent_start + 1, 0, 1, 0, 4);
  shm_file_name(nostart, sizeof nostart, ns, (int)c, 0, 0, 1, 0, 5);
  const char* names[] = {dead + 1, live + 1, other_ns + 1, reused + 1, nostart + 1,
                         "braid-4242-r0-p1-c0-0badf00d", "unrelated"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) touch(dir, names[i]);
  int removed = shm_file_sweep(dir, ns);
  TEST_CHECK(!present(dir, dead + 1), "a dead maker's file is removed");
  TEST_CHECK(!present(dir, reused + 1) || parent_start == 0,
             "a file whose pid now belongs to another process is removed");
  TEST_CHECK(present(dir, live + 1), "a live maker's file stays");
  TEST_CHECK(present(dir, other_ns + 1), "another pid namespace's file stays");
  TEST_CHECK(present(dir, nostart + 1), "a file without its maker's start time stays");
  TEST_CHECK(present(dir, "braid-4242-r0-p1-c0-0badf00d"), "an older name stays");
  TEST_CHECK(present(dir, "unrelated"), "other files stay");
  TEST_CHECK(removed == (parent_start ? 2 : 1), "removed %d", removed);
  TEST_CHECK(shm_file_sweep(dir, 0) == 0, "an unknown namespace removes nothing");
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    unlink(path);
  }
  TEST_CHECK(rmdir(dir) == 0, "rmdir %s", dir);
}

int main(void) {
  if (access("/dev/shm", W_OK) != 0) TEST_SKIP("no writable /dev/shm");
  test_parse();
  test_open_unlinks();
  test_sweep();
  return test_summary();
}
