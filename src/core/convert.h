/* convert.h - scalar f16 / bf16 <-> f32 conversions, round to nearest even, NaN kept quiet.
   The vector kernels convert in registers (F16C, integer shifts); these are the portable
   definitions they must agree with. */
#ifndef NORMA_CONVERT_H
#define NORMA_CONVERT_H

#include <stdint.h>
#include <string.h>

static inline uint32_t norma__f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float norma__bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float norma__bf16_to_f32(uint16_t h) { return norma__bits_f32((uint32_t)h << 16); }

static inline uint16_t norma__f32_to_bf16(float f) {
  uint32_t u = norma__f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);                                           /* RNE */
  return (uint16_t)(u >> 16);
}

static inline float norma__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (e == 0x1f) return norma__bits_f32(sign | 0x7f800000u | (man << 13)); /* Inf / NaN */
  if (e != 0) return norma__bits_f32(sign | ((e + 112u) << 23) | (man << 13));
  float v = (float)man * 0x1p-24f; /* zero or subnormal: exact */
  return norma__bits_f32(norma__f32_bits(v) | sign);
}

static inline uint16_t norma__f32_to_f16(float f) {
  uint32_t u = norma__f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (or Inf): Inf */
  if (a < 0x38800000u) {                                  /* below 2^-14: subnormal or 0 */
    /* a * 2^24 is exact; adding 2^23 rounds it to an integer, to nearest even */
    float t = norma__bits_f32(a) * 0x1p24f + 0x1p23f;
    return (uint16_t)(sign | (norma__f32_bits(t) - 0x4b000000u));
  }
  uint32_t r = a - 0x38000000u;          /* rebias the exponent from 127 to 15 */
  r += 0xfffu + ((r >> 13) & 1u);        /* RNE on the 13 dropped bits */
  return (uint16_t)(sign | (r >> 13));
}

#endif
