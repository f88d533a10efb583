/*
 * The parameter table: every row complete, defaults, BRAID_ names, NCCL
 * aliases (BRAID_ wins when both are set), size suffixes, and a malformed
 * integer falling back to the default.
 */
#include <stdlib.h>
#include <string.h>

#include "base/param.h"
#include "test.h"

static void test_table_complete(void) {
  TEST_CHECK(braid_param_count() == BRAID_P_COUNT, "count %d", braid_param_count());
  for (int i = 0; i < braid_param_count(); i++) {
    const char* name = braid_param_name(i);
    TEST_CHECK(name != NULL && strncmp(name, "BRAID_", 6) == 0 && strlen(name) > 6,
               "row %d has a name (%s)", i, name ? name : "NULL");
    TEST_CHECK(braid_param_help(i) != NULL && strlen(braid_param_help(i)) > 10, "row %d (%s) has help", i,
               name ? name : "?");
    const char* alias = braid_param_alias(i);
    TEST_CHECK(alias == NULL || strncmp(alias, "NCCL_", 5) == 0, "row %d alias %s", i, alias);
  }
}

static void test_values(void) {
  unsetenv("BRAID_BUFFSIZE");
  unsetenv("NCCL_BUFFSIZE");
  braid_param_reload();
  TEST_CHECK(braid_param_int(BRAID_P_BUFFSIZE) == 0, "default %lld",
             (long long)braid_param_int(BRAID_P_BUFFSIZE));
  TEST_CHECK(braid_param_source(BRAID_P_BUFFSIZE) == BRAID_PARAM_FROM_DEFAULT, "source default");

  setenv("NCCL_BUFFSIZE", "1048576", 1);
  braid_param_reload();
  TEST_CHECK(braid_param_int(BRAID_P_BUFFSIZE) == 1048576, "alias read");
  TEST_CHECK(braid_param_source(BRAID_P_BUFFSIZE) == BRAID_PARAM_FROM_NCCL_ENV, "source alias");

  setenv("BRAID_BUFFSIZE", "2M", 1);
  braid_param_reload();
  TEST_CHECK(braid_param_int(BRAID_P_BUFFSIZE) == 2 << 20, "BRAID_ wins, with suffix: %lld",
             (long long)braid_param_int(BRAID_P_BUFFSIZE));
  TEST_CHECK(braid_param_source(BRAID_P_BUFFSIZE) == BRAID_PARAM_FROM_BRAID_ENV, "source braid");

  setenv("BRAID_BUFFSIZE", "lots", 1);
  braid_param_reload();
  TEST_CHECK(braid_param_int(BRAID_P_BUFFSIZE) == 0, "malformed falls back to default");

  setenv("BRAID_BUFFSIZE", "0x1000", 1);
  braid_param_reload();
  TEST_CHECK(braid_param_int(BRAID_P_BUFFSIZE) == 4096, "hex");

  setenv("NCCL_DEBUG", "INFO", 1);
  braid_param_reload();
  TEST_CHECK(strcmp(braid_param_str(BRAID_P_DEBUG), "INFO") == 0, "string alias");
  unsetenv("BRAID_BUFFSIZE");
  unsetenv("NCCL_BUFFSIZE");
  unsetenv("NCCL_DEBUG");
  braid_param_reload();
  TEST_CHECK(braid_param_str(BRAID_P_TOPO_FILE) == NULL, "unset string without default is NULL");
}

static void test_print(void) {
  char* buf = NULL;
  size_t size = 0;
  FILE* f = open_memstream(&buf, &size);
  braid_param_print_all(f);
  fclose(f);
  TEST_CHECK(strstr(buf, "BRAID_DEBUG=") && strstr(buf, "alias: NCCL_DEBUG"), "printed table");
  TEST_CHECK(strstr(buf, "BRAID_BOOTSTRAP_TIMEOUT=120") != NULL, "default shown");
  free(buf);
}

int main(void) {
  test_table_complete();
  test_values();
  test_print();
  return test_summary();
}
