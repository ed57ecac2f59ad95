/* test_cpu.c - CPU feature detection (src/core/cpu.c): the cpuid / xgetbv bits against the
   kernel's view in /proc/cpuinfo (Linux; the "flags" line lists a feature only when the CPU has
   it and the kernel enabled its state), the ISA the library picks, and that concurrent first
   calls agree.  Prints the detected features. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>

#include "cpu.h"
#include "test_util.h"

/* 1 / 0: the flag is / is not in the first "flags" line; -1: no /proc/cpuinfo */
static int cpuinfo_has(const char *flag) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return -1;
  static char line[16384];
  int found = -1;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "flags", 5) != 0) continue;
    found = 0;
    size_t n = strlen(flag);
    for (char *p = strstr(line, flag); p; p = strstr(p + 1, flag))
      if ((p[-1] == ' ' || p[-1] == '\t') && (p[n] == ' ' || p[n] == '\n' || p[n] == '\0'))
        found = 1;
    break;
  }
  fclose(f);
  return found;
}

static void *first_call(void *arg) {
  *(const norma_cpu_features **)arg = norma__cpu_features();
  return NULL;
}

int main(void) {
  /* concurrent first calls: every thread gets the one published object */
  enum { T = 4 };
  pthread_t th[T];
  const norma_cpu_features *got[T];
  for (int i = 0; i < T; i++) pthread_create(&th[i], NULL, first_call, &got[i]);
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  const norma_cpu_features *f = norma__cpu_features();
  for (int i = 0; i < T; i++) TU_CHECK(got[i] == f, "thread %d got another object", i);

  printf("cpu: avx2 %d fma %d f16c %d avx512f %d avx512bw %d avx512vl %d avx512dq %d "
         "avx512bf16 %d avx512fp16 %d os_avx %d os_avx512 %d\n",
         f->avx2, f->fma, f->f16c, f->avx512f, f->avx512bw, f->avx512vl, f->avx512dq,
         f->avx512bf16, f->avx512fp16, f->os_avx, f->os_avx512);

#if defined(__x86_64__) || defined(__i386__)
  /* each CPUID bit against the kernel's flag; the kernel hides a flag whose state the OS does
     not save, so compare the bit and the OS bit together */
  const struct {
    const char *flag;
    int bit, os;
  } rows[] = {
      {"avx2", f->avx2, f->os_avx},          {"fma", f->fma, f->os_avx},
      {"f16c", f->f16c, f->os_avx},          {"avx512f", f->avx512f, f->os_avx512},
      {"avx512bw", f->avx512bw, f->os_avx512}, {"avx512vl", f->avx512vl, f->os_avx512},
      {"avx512dq", f->avx512dq, f->os_avx512}, {"avx512_bf16", f->avx512bf16, f->os_avx512},
      {"avx512_fp16", f->avx512fp16, f->os_avx512},
  };
  int have_cpuinfo = cpuinfo_has("fpu") >= 0;
  if (have_cpuinfo) {
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
      int k = cpuinfo_has(rows[i].flag);
      TU_CHECK(k == (rows[i].bit && rows[i].os), "%s: cpuid %d (os %d), /proc/cpuinfo %d",
               rows[i].flag, rows[i].bit, rows[i].os, k);
    }
    /* os_avx needs the kernel to have enabled AVX: /proc/cpuinfo "avx" */
    TU_CHECK(f->os_avx == (cpuinfo_has("avx") == 1), "os_avx %d, /proc/cpuinfo avx %d", f->os_avx,
             cpuinfo_has("avx"));
  } else {
    printf("cpu: no /proc/cpuinfo; only self-consistency checked\n");
  }
  TU_CHECK(!f->os_avx512 || f->os_avx, "os_avx512 without os_avx");
  /* what the library does with it */
  const int avx2_ok = norma__cpu_has_avx2_kernels(f);
  const int avx512_ok = avx2_ok && norma__cpu_has_avx512_kernels(f);
  norma_isa isa = norma_get_isa();
  const char *cap = getenv("NORMA_MAX_ISA");
  const char *emu = getenv("NORMA_EMULATE_AVX512");
  if (!cap && !(emu && *emu && strcmp(emu, "0") != 0)) {
    /* with no cap the dispatch takes the best kernels the CPU (and the build) can run */
    norma_isa want = NORMA_ISA_SCALAR;
#ifdef NORMA_TEST_HAVE_AVX2
    if (avx2_ok) want = NORMA_ISA_AVX2;
#endif
#ifdef NORMA_TEST_HAVE_AVX512
    if (avx512_ok) want = NORMA_ISA_AVX512;
#endif
    TU_CHECK(isa == want, "isa %s, expected %s (avx2 kernels usable %d, avx512 %d)",
             norma_isa_name(isa), norma_isa_name(want), avx2_ok, avx512_ok);
  }
  if (!avx512_ok && !(emu && *emu && strcmp(emu, "0") != 0))
    TU_CHECK(isa != NORMA_ISA_AVX512, "isa avx512 on a CPU without usable AVX-512");
  (void)avx2_ok;
#else
  TU_CHECK(!f->avx2 && !f->os_avx, "features reported on a non-x86 CPU");
#endif
  return tu_finish("test_cpu");
}
