/* test_bf16_round.c - the AVX512-BF16 store rounding (simd_avx512.h compiled with
 * NORMA_SIMD_AVX512BF16: vcvtneps2bf16, and the integer rounding for vectors holding a
 * subnormal) gives the bits of the integer rounding and of the portable definition
 * (convert.h) for every one of the 2^32 f32 inputs: NaNs (quieted, payload kept), infinities,
 * subnormals, values that round up to infinity.  Then subnormal lanes mixed into vectors of
 * normal values, so that the fallback is taken for whole vectors.
 *
 * Exits 77 (ctest: skipped, which is not a pass) on a CPU without AVX512-BF16.
 */
#define NORMA_SIMD_AVX512BF16 1
#include "../../src/cpu/simd_avx512.h"
#include "cpu.h"
#include "test_util.h"

static int check_vector(const uint32_t *bits) {
  float f[16];
  memcpy(f, bits, sizeof f);
  const vf v = _mm512_loadu_ps(f);
  uint16_t hw[16], in[16];
  _mm256_storeu_si256((__m256i *)hw, v_to_bf16(v));
  _mm256_storeu_si256((__m256i *)in, v_to_bf16_int(v));
  int bad = 0;
  for (int l = 0; l < 16; l++) {
    const uint16_t ref = norma__f32_to_bf16(f[l]);
    if (hw[l] != ref || in[l] != ref) {
      if (!bad)
        TU_CHECK(0, "input 0x%08x: AVX512-BF16 path 0x%04x, integer 0x%04x, convert.h 0x%04x",
                 (unsigned)bits[l], hw[l], in[l], ref);
      bad = 1;
    }
  }
  return !bad;
}

int main(void) {
  const norma_cpu_features *cf = norma__cpu_features();
  if (!(norma__cpu_has_avx512_kernels(cf) && cf->avx512bf16)) {
    printf("test_bf16_round: this CPU has no AVX512-BF16; not run (skipped, not passed)\n");
    return 77;
  }
  /* every input, 16 consecutive patterns per vector; one check per 2^20 inputs */
  uint32_t bits[16];
  for (uint64_t base = 0; base < (1ull << 32); base += 1u << 20) {
    int ok = 1;
    for (uint64_t p = base; p < base + (1u << 20); p += 16) {
      for (int l = 0; l < 16; l++) bits[l] = (uint32_t)(p + (uint64_t)l);
      ok &= check_vector(bits);
    }
    TU_CHECK(ok, "inputs 0x%08llx.. differ", (unsigned long long)base);
  }
  /* one subnormal lane (or a few) among normal values, negative and positive zero, NaN */
  tu_rng rng = tu_rng_make(7);
  for (int it = 0; it < 200000; it++) {
    for (int l = 0; l < 16; l++) bits[l] = (uint32_t)tu_next(&rng);
    const int k = 1 + (int)((uint32_t)tu_next(&rng) % 3);
    for (int j = 0; j < k; j++)
      bits[(uint32_t)tu_next(&rng) % 16] =
          ((uint32_t)tu_next(&rng) & 0x807fffffu) | 1u; /* subnormal */
    TU_CHECK(check_vector(bits), "mixed vector %d", it);
  }
  return tu_finish("test_bf16_round");
}
