/* fuzz_settings.c - the global settings and the status / name / version functions against
   norma.h: a sequence of calls with arbitrary values (fuzz_common.h). */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  int cap = NORMA_ISA_AVX512; /* what this sequence set last */
  (void)norma_set_max_isa(NORMA_ISA_AVX512);
  for (int step = 0; step < 32 && r.n; step++) {
    const unsigned op = fz_u8(&r) % 8;
    const int v = (int)fz_u32(&r);
    const int small = (int)(fz_u8(&r) % 8) - 2;
    const int x = fz_u8(&r) < 128 ? small : v;
    switch (op) {
      case 0: {
        norma_status st = norma_set_max_isa((norma_isa)x);
        const int ok = x >= NORMA_ISA_SCALAR && x <= NORMA_ISA_AVX512;
        if ((st == NORMA_OK) != ok) fz_fail(NULL, "set_max_isa(%d): %s", x, norma_status_string(st));
        if (!ok && st != NORMA_ERR_INVALID_ARGUMENT) fz_fail(NULL, "set_max_isa(%d): %d", x, (int)st);
        if (ok) cap = x;
        const int isa = (int)norma_get_isa();
        if (isa < 0 || isa > cap) fz_fail(NULL, "isa %d with cap %d", isa, cap);
        break;
      }
      case 1: {
        const char *s = norma_isa_name((norma_isa)x);
        if (!s || !*s) fz_fail(NULL, "isa_name(%d) empty", x);
        if ((x >= 0 && x <= 2) == (strcmp(s, "unknown") == 0)) fz_fail(NULL, "isa_name(%d) = %s", x, s);
        break;
      }
      case 2: {
        norma_set_num_threads(x);
        const int n = norma_get_num_threads();
        if (n < 1 || (x > 0 && n != x)) fz_fail(NULL, "set_num_threads(%d): get %d", x, n);
        break;
      }
      case 3: {
        const char *s = norma_status_string((norma_status)x);
        if (!s || !*s) fz_fail(NULL, "status_string(%d) empty", x);
        if ((x >= 0 && x <= 5) == (strcmp(s, "unknown status") == 0))
          fz_fail(NULL, "status_string(%d) = %s", x, s);
        break;
      }
      case 4: {
        norma_set_use_reference(x);
        if (norma_get_use_reference() != (x != 0)) fz_fail(NULL, "use_reference(%d)", x);
        break;
      }
      case 5: {
        const char *e = norma_last_error(), *ver = norma_version();
        if (!e || !ver || strcmp(ver, "0.1.0") != 0) fz_fail(NULL, "version / last error");
        break;
      }
      case 6: {
        /* the streaming-store range: any two sizes >= 0 are accepted (speed only) */
        const int64_t lo = (int64_t)x * 4096, hi = (int64_t)v * 64;
        norma_status st = norma_set_streaming_stores(lo, hi);
        if ((st == NORMA_OK) != (lo >= 0 && hi >= 0))
          fz_fail(NULL, "set_streaming_stores(%lld, %lld): %s", (long long)lo, (long long)hi,
                  norma_status_string(st));
        break;
      }
      default: {
        /* a tiny call under whatever the settings are now, checked against itself in one
           thread: results never depend on the thread count */
        float x4[8] = {1, 2, 3, 5, -1, 0, 4, 2}, y1[8], y2[8];
        norma_bn_desc d = {2, 2, 2, NORMA_CHANNELS_FIRST, NORMA_F32, 1e-5, 0};
        norma_status s1 = norma_bn_forward_training(&d, x4, NULL, NULL, NULL, y1, NULL, NULL,
                                                    NULL, NULL, 0);
        const int nt = norma_get_num_threads();
        norma_set_num_threads(1);
        norma_status s2 = norma_bn_forward_training(&d, x4, NULL, NULL, NULL, y2, NULL, NULL,
                                                    NULL, NULL, 0);
        norma_set_num_threads(nt);
        if (s1 != NORMA_OK || s2 != NORMA_OK || memcmp(y1, y2, sizeof y1) != 0)
          fz_fail(NULL, "forward under the settings: %d %d", (int)s1, (int)s2);
        break;
      }
    }
  }
  norma_set_num_threads(0);
  norma_set_use_reference(0);
  (void)norma_set_streaming_stores(0, INT64_MAX);
  (void)norma_set_max_isa(NORMA_ISA_AVX512);
  return 0;
}
