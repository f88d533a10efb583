/*
 * Text of the result table, in nccl-tests' exact layout, so scripts that read
 * nccl-tests output read ours. Pure functions; tested in perf_unit_test.c.
 */
#include <stdio.h>
#include <string.h>

#include "common.h"

void perf_format_number(double value, int width, char* out, size_t out_len) {
  /* Digits before the point decide how many fit after it, as in nccl-tests. */
  int digits = 0;
  double bound = 1;
  while (value >= bound && digits < 30) {
    digits++;
    bound *= 10;
  }
  if (digits < width - 2)
    snprintf(out, out_len, "%*.2f", width, value);
  else if (digits < width - 1)
    snprintf(out, out_len, "%*.1f", width, value);
  else if (digits < width + 1)
    snprintf(out, out_len, "%*.0f", width, value);
  else if (width >= 7)
    snprintf(out, out_len, "%*.1e", width, value);
  else
    snprintf(out, out_len, "%*.0e", width, value);
}

void perf_format_result(double time_us, double algbw, double busbw, int64_t wrong, char* out,
                        size_t out_len) {
  char t[32], a[32], b[32];
  perf_format_number(time_us, 7, t, sizeof(t));
  perf_format_number(algbw, 6, a, sizeof(a));
  perf_format_number(busbw, 6, b, sizeof(b));
  if (wrong < 0)
    snprintf(out, out_len, "  %7s  %6s  %6s    N/A", t, a, b);
  else
    snprintf(out, out_len, "  %7s  %6s  %6s  %6g", t, a, b, (double)wrong);
}

void perf_json_string(const char* in, char* out, size_t out_len) {
  size_t n = 0;
  if (out_len < 3) {
    if (out_len) out[0] = '\0';
    return;
  }
  out[n++] = '"';
  for (const char* p = in ? in : ""; *p && n + 8 < out_len; p++) {
    unsigned char c = (unsigned char)*p;
    if (c == '"' || c == '\\') {
      out[n++] = '\\';
      out[n++] = (char)c;
    } else if (c < 0x20) {
      n += (size_t)snprintf(out + n, out_len - n, "\\u%04x", c);
    } else {
      out[n++] = (char)c;
    }
  }
  out[n++] = '"';
  out[n] = '\0';
}
