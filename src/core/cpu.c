/* cpu.c - x86 CPU feature detection through cpuid and xgetbv (see cpu.h). */
#include "cpu.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define NORMA_X86 1
#endif

#ifdef NORMA_X86
static void cpuid(uint32_t leaf, uint32_t subleaf, uint32_t r[4]) {
  uint32_t a, b, c, d;
  __asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(leaf), "c"(subleaf));
  r[0] = a, r[1] = b, r[2] = c, r[3] = d;
}

/* XCR0; only valid when CPUID.1:ECX.OSXSAVE is set (else xgetbv faults) */
static uint64_t xgetbv0(void) {
  uint32_t lo, hi;
  __asm__ __volatile__(".byte 0x0f, 0x01, 0xd0" /* xgetbv */ : "=a"(lo), "=d"(hi) : "c"(0u));
  return ((uint64_t)hi << 32) | lo;
}

static void detect(norma_cpu_features *f) {
  uint32_t r[4];
  cpuid(0, 0, r);
  const uint32_t max_leaf = r[0];
  if (max_leaf < 1) return;
  cpuid(1, 0, r);
  const uint32_t ecx1 = r[2];
  f->fma = (ecx1 >> 12) & 1;
  f->f16c = (ecx1 >> 29) & 1;
  const int osxsave = (ecx1 >> 27) & 1, avx = (ecx1 >> 28) & 1;
  uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  /* XCR0 bit 1 SSE, bit 2 YMM (AVX); bits 5-7 opmask, ZMM_Hi256, Hi16_ZMM */
  f->os_avx = osxsave && avx && (xcr0 & 0x6) == 0x6;
  f->os_avx512 = f->os_avx && (xcr0 & 0xe0) == 0xe0;
  if (max_leaf < 7) return;
  cpuid(7, 0, r);
  const uint32_t ebx7 = r[1], edx7 = r[3], max_sub7 = r[0];
  f->avx2 = (ebx7 >> 5) & 1;
  f->avx512f = (ebx7 >> 16) & 1;
  f->avx512dq = (ebx7 >> 17) & 1;
  f->avx512bw = (ebx7 >> 30) & 1;
  f->avx512vl = (ebx7 >> 31) & 1;
  f->avx512fp16 = (edx7 >> 23) & 1;
  if (max_sub7 >= 1) {
    cpuid(7, 1, r);
    f->avx512bf16 = (r[0] >> 5) & 1;
  }
}
#else
static void detect(norma_cpu_features *f) { (void)f; }
#endif

/* Detection is idempotent and every thread computes the same bits, so a race costs at most a
   second cpuid: each thread fills its own copy, publishes it under a release store, and
   readers take the published copy with an acquire load. */
#if !defined(__STDC_NO_ATOMICS__)
#include <stdatomic.h>
static norma_cpu_features g_features;
static atomic_int g_state; /* 0: not detected; 1: someone is writing; 2: g_features valid */

const norma_cpu_features *norma__cpu_features(void) {
  if (atomic_load_explicit(&g_state, memory_order_acquire) == 2) return &g_features;
  norma_cpu_features f;
  memset(&f, 0, sizeof f);
  detect(&f);
  int expected = 0;
  if (atomic_compare_exchange_strong_explicit(&g_state, &expected, 1, memory_order_acq_rel,
                                              memory_order_acquire)) {
    g_features = f;
    atomic_store_explicit(&g_state, 2, memory_order_release);
    return &g_features;
  }
  /* another thread is publishing the same bits: wait for it (a few stores) */
  while (atomic_load_explicit(&g_state, memory_order_acquire) != 2) {
  }
  return &g_features;
}
#else
#error "norma needs C11 atomics"
#endif

int norma__cpu_has_avx2_kernels(const norma_cpu_features *f) {
  return f->os_avx && f->avx2 && f->fma && f->f16c;
}
int norma__cpu_has_avx512_kernels(const norma_cpu_features *f) {
  return f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->os_avx512;
}

