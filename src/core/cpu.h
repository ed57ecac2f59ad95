/* cpu.h - x86 CPU feature detection (cpuid + xgetbv), once per process, thread-safe.
   Written with inline assembly that gcc and clang both accept (no __builtin_cpu_supports:
   clang 14 does not know "f16c" there).  On other architectures every field is 0. */
#ifndef NORMA_CPU_H
#define NORMA_CPU_H

typedef struct norma_cpu_features {
  int avx2, fma, f16c;                      /* CPUID bits */
  int avx512f, avx512bw, avx512vl, avx512dq;
  int avx512bf16;                           /* leaf 7 subleaf 1, EAX bit 5 */
  int avx512fp16;                           /* leaf 7 subleaf 0, EDX bit 23 */
  int os_avx;    /* OSXSAVE and XCR0 has SSE + YMM state: the OS saves the AVX registers */
  int os_avx512; /* os_avx and XCR0 has opmask + ZMM_Hi256 + Hi16_ZMM state */
} norma_cpu_features;

/* The features of this CPU, detected on the first call (any thread; later calls return the
   same object).  The CPUID bits are reported as the CPU states them; usable means the bit and
   the matching os_* field (AVX2/FMA/F16C need os_avx, AVX-512 needs os_avx512). */
const norma_cpu_features *norma__cpu_features(void);

/* AVX2 + FMA + F16C present and their state saved by the OS: what the AVX2 kernels need. */
int norma__cpu_has_avx2_kernels(const norma_cpu_features *f);

/* AVX-512 F + BW + VL + DQ present and the ZMM state saved: what the AVX-512 kernels need. */
int norma__cpu_has_avx512_kernels(const norma_cpu_features *f);

#endif
