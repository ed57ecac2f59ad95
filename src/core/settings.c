/* settings.c - global settings: threads, ISA cap, reference switch, version; CPU detection. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "internal.h"

#define STR2(x) #x
#define STR(x) STR2(x)

const char *norma_version(void) {
  return STR(NORMA_VERSION_MAJOR) "." STR(NORMA_VERSION_MINOR) "." STR(NORMA_VERSION_PATCH);
}

/* ---- threads ---- */
static int g_threads = 0; /* 0: library default */

void norma_set_num_threads(int n) { g_threads = n > 0 ? n : 0; }

int norma_get_num_threads(void) { return norma__threads(); }

int norma__threads(void) {
  if (g_threads > 0) return g_threads;
#ifdef _OPENMP
  int t = omp_get_max_threads();
  return t > 0 ? t : 1;
#else
  return 1;
#endif
}

/* ---- reference switch ---- */
static int g_use_ref = -1; /* -1: not read from the environment yet */

void norma_set_use_reference(int on) { g_use_ref = on ? 1 : 0; }
int norma_get_use_reference(void) { return norma__use_reference(); }

int norma__use_reference(void) {
  if (g_use_ref < 0) {
    const char *e = getenv("NORMA_USE_REFERENCE");
    g_use_ref = (e && *e && strcmp(e, "0") != 0) ? 1 : 0;
  }
  return g_use_ref;
}

/* ---- CPU features ---- */
static int cpu_has_avx2_fma_f16c(void) {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  /* __builtin_cpu_supports checks both the CPUID bits and that the OS saves the YMM state */
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return 0;
#endif
}

static int cpu_has_avx512(void) {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  /* F, BW, VL, DQ; __builtin_cpu_supports also checks that the OS saves the ZMM state */
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return 0;
#endif
}

static norma_isa g_best = (norma_isa)-1; /* best the CPU (and the build) supports */
static norma_isa g_cap = (norma_isa)-1;  /* user cap */
static int g_emulated = 0;               /* avx512 served by the AVX2 emulation */

static void isa_init(void) {
  if ((int)g_best >= 0) return;
  norma_isa best = NORMA_ISA_SCALAR;
#ifdef NORMA_HAVE_AVX2
  if (cpu_has_avx2_fma_f16c()) best = NORMA_ISA_AVX2;
#else
  (void)cpu_has_avx2_fma_f16c;
#endif
#ifdef NORMA_HAVE_AVX512
  if (best == NORMA_ISA_AVX2 && cpu_has_avx512()) best = NORMA_ISA_AVX512;
#else
  (void)cpu_has_avx512;
#endif
  if (best == NORMA_ISA_AVX2) {
    const char *e = getenv("NORMA_EMULATE_AVX512");
    if (e && *e && strcmp(e, "0") != 0) best = NORMA_ISA_AVX512, g_emulated = 1;
  }
  if ((int)g_cap < 0) {
    const char *e = getenv("NORMA_MAX_ISA");
    g_cap = NORMA_ISA_AVX512;
    if (e && strcmp(e, "scalar") == 0) g_cap = NORMA_ISA_SCALAR;
    if (e && strcmp(e, "avx2") == 0) g_cap = NORMA_ISA_AVX2;
  }
  g_best = best;
}

int norma__avx512_emulated(void) {
  isa_init();
  return g_emulated;
}

norma_status norma_set_max_isa(norma_isa isa) {
  if (isa != NORMA_ISA_SCALAR && isa != NORMA_ISA_AVX2 && isa != NORMA_ISA_AVX512)
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "norma_set_max_isa: isa must be "
                       "NORMA_ISA_SCALAR, NORMA_ISA_AVX2 or NORMA_ISA_AVX512 (got %d)", (int)isa);
  isa_init();
  g_cap = isa;
  return NORMA_OK;
}

norma_isa norma__isa(void) {
  isa_init();
  return g_best < g_cap ? g_best : g_cap;
}

norma_isa norma_get_isa(void) { return norma__isa(); }

const char *norma_isa_name(norma_isa isa) {
  switch (isa) {
    case NORMA_ISA_SCALAR: return "scalar";
    case NORMA_ISA_AVX2: return "avx2";
    case NORMA_ISA_AVX512: return "avx512";
  }
  return "unknown";
}

/* ---- caches ---- */
static int64_t g_l2 = 0;

int64_t norma__l2_bytes(void) {
  if (g_l2 == 0) {
    long v = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
    v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    /* clamp: virtual machines report odd values */
    g_l2 = (v >= 128 * 1024 && v <= 64L * 1024 * 1024) ? (int64_t)v : 512 * 1024;
  }
  return g_l2;
}
