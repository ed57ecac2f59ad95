/* test_convert.c - unit tests of the scalar conversions in src/core/convert.h:
 *  - f16 -> f32 for all 65536 patterns against a value computed here from the fields;
 *  - f16 -> f32 -> f16 round trip exact for all patterns (NaN: stays NaN, quiet bit set, sign
 *    and payload kept);
 *  - f32 -> f16 round to nearest even: every midpoint between adjacent f16 values (normal and
 *    subnormal, both signs) rounds to the even one, and the f32 neighbours of the midpoint round
 *    to the nearer one; overflow to Inf from 65520 up, 65519.99 stays 65504; underflow to 0;
 *  - the same for bf16 (all 65536 patterns, every midpoint, overflow at the top binade);
 *  - f32 NaNs (quiet and signalling, any payload) become NaN, never Inf.
 */
#include "test_util.h"

static float f32_from_bits(uint32_t u) { return norma__bits_f32(u); }
static float next_up(float f) { return nextafterf(f, INFINITY); }
static float next_down(float f) { return nextafterf(f, -INFINITY); }

static int f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }
static int bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu); }

/* value of an f16 pattern from its fields, in double */
static double f16_value(uint16_t h) {
  int sign = h >> 15, e = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v;
  if (e == 0x1f) v = man ? NAN : INFINITY;
  else if (e == 0) v = ldexp(man, -24);
  else v = ldexp(1024 + man, e - 25);
  return sign ? -v : v;
}

static void test_f16(void) {
  long bad_value = 0, bad_trip = 0, bad_nan = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = norma__f16_to_f32((uint16_t)h);
    double want = f16_value((uint16_t)h);
    if (f16_is_nan((uint16_t)h)) {
      bad_value += !isnan(f);
      uint16_t back = norma__f32_to_f16(f);
      /* quietened: the quiet bit set, sign and the rest of the payload kept */
      bad_nan += back != (uint16_t)(h | 0x200u);
      continue;
    }
    bad_value += !((double)f == want && !!signbit(f) == !!signbit(want));
    uint16_t back = norma__f32_to_f16(f);
    bad_trip += back != h;
  }
  TU_CHECK(bad_value == 0, "f16 -> f32: %ld patterns give the wrong value", bad_value);
  TU_CHECK(bad_trip == 0, "f16 -> f32 -> f16: %ld patterns do not round-trip", bad_trip);
  TU_CHECK(bad_nan == 0, "f16 NaN -> f32 -> f16: %ld NaNs not kept (quietened)", bad_nan);

  /* midpoints: between h and h + 1 for every finite positive h below the largest */
  long bad_tie = 0, bad_near = 0;
  for (uint32_t h = 0; h < 0x7bff; h++) {
    for (int sign = 0; sign < 2; sign++) {
      uint16_t lo = (uint16_t)(h | (sign << 15)), hi = (uint16_t)((h + 1) | (sign << 15));
      double a = f16_value(lo), b = f16_value(hi);
      float mid = (float)((a + b) / 2); /* exact: f16 has 11 bits, f32 24 */
      if ((double)mid != (a + b) / 2) {
        bad_tie++;
        continue;
      }
      uint16_t even = (h & 1) ? hi : lo;
      bad_tie += norma__f32_to_f16(mid) != even;
      /* the f32 neighbours of the midpoint, toward each side */
      float toward_lo = sign ? next_up(mid) : next_down(mid);
      float toward_hi = sign ? next_down(mid) : next_up(mid);
      if (h == 0 && !sign) toward_lo = next_down(mid); /* a tiny positive value: rounds to 0 */
      bad_near += norma__f32_to_f16(toward_lo) != lo;
      bad_near += norma__f32_to_f16(toward_hi) != hi;
    }
  }
  TU_CHECK(bad_tie == 0, "f32 -> f16: %ld midpoints not rounded to even", bad_tie);
  TU_CHECK(bad_near == 0, "f32 -> f16: %ld values next to a midpoint not rounded to nearest",
           bad_near);

  /* specific values */
  struct { float f; uint16_t h;
  } cases[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {65504.0f, 0x7bff},
      {65519.99f, 0x7bff},
      {65520.0f, 0x7c00},
      {-65520.0f, 0xfc00},
      {1e9f, 0x7c00},
      {3.4e38f, 0x7c00},
      {INFINITY, 0x7c00},
      {-INFINITY, 0xfc00},
      {0x1p-24f, 0x0001},
      {0x1p-25f, 0x0000},
      {0x1.8p-25f, 0x0001},
      {0x1.8p-24f, 0x0002},
      {0x1p-26f, 0x0000},
      {-0x1p-26f, 0x8000},
      {0x1p-14f, 0x0400},
      {0x1.ffcp-15f, 0x0400},
      {0x1.ff8p-15f, 0x03ff},
      {1.0f + 0x1p-11f, 0x3c00},
      {1.0f + 0x3p-11f, 0x3c02},
      {1e-10f, 0x0000},
      {0x1p-149f, 0x0000},
  };
  for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
    uint16_t got = norma__f32_to_f16(cases[i].f);
    TU_CHECK(got == cases[i].h, "f32 -> f16 (%a): got 0x%04x, want 0x%04x", (double)cases[i].f, got,
             cases[i].h);
  }
  /* NaNs of every kind stay NaN */
  static const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xffc00000u, 0xff800001u, 0x7fffffffu,
                                  0x7f802000u, 0x7fa00000u, 0xffffffffu};
  for (int i = 0; i < (int)(sizeof nans / sizeof nans[0]); i++) {
    uint16_t h = norma__f32_to_f16(f32_from_bits(nans[i]));
    TU_CHECK(f16_is_nan(h) && (h & 0x200u) && (h >> 15) == (nans[i] >> 31),
             "f32 NaN 0x%08x -> f16 0x%04x is not a quiet NaN of the same sign", nans[i], h);
  }
}

static void test_bf16(void) {
  long bad_value = 0, bad_trip = 0, bad_nan = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = norma__bf16_to_f32((uint16_t)h);
    uint32_t bits = norma__f32_bits(f);
    if (bf16_is_nan((uint16_t)h)) {
      bad_value += !isnan(f);
      bad_nan += norma__f32_to_bf16(f) != (uint16_t)(h | 0x40u);
      continue;
    }
    bad_value += bits != (h << 16);
    bad_trip += norma__f32_to_bf16(f) != h;
  }
  TU_CHECK(bad_value == 0, "bf16 -> f32: %ld patterns give the wrong value", bad_value);
  TU_CHECK(bad_trip == 0, "bf16 -> f32 -> bf16: %ld patterns do not round-trip", bad_trip);
  TU_CHECK(bad_nan == 0, "bf16 NaN -> f32 -> bf16: %ld NaNs not kept (quietened)", bad_nan);

  long bad_tie = 0, bad_near = 0;
  for (uint32_t h = 0; h < 0x7f7f; h++) {
    for (int sign = 0; sign < 2; sign++) {
      uint16_t lo = (uint16_t)(h | (sign << 15)), hi = (uint16_t)((h + 1) | (sign << 15));
      /* the midpoint is the f32 with the lower half 0x8000 */
      float mid = f32_from_bits(((uint32_t)lo << 16) | 0x8000u);
      uint16_t even = (h & 1) ? hi : lo;
      bad_tie += norma__f32_to_bf16(mid) != even;
      float toward_lo = f32_from_bits(((uint32_t)lo << 16) | 0x7fffu);
      float toward_hi = f32_from_bits(((uint32_t)lo << 16) | 0x8001u);
      bad_near += norma__f32_to_bf16(toward_lo) != lo;
      bad_near += norma__f32_to_bf16(toward_hi) != hi;
    }
  }
  TU_CHECK(bad_tie == 0, "f32 -> bf16: %ld midpoints not rounded to even", bad_tie);
  TU_CHECK(bad_near == 0, "f32 -> bf16: %ld values next to a midpoint not rounded to nearest",
           bad_near);
  /* the top: the largest bf16 0x7f7f, then Inf from its midpoint with 2^128 */
  struct { uint32_t f; uint16_t h; } cases[] = {
      {0x7f7f7fffu, 0x7f7f}, {0x7f7f8000u, 0x7f80}, {0x7f7fffffu, 0x7f80}, {0xff7f8000u, 0xff80},
      {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80}, {0x00000001u, 0x0000}, {0x00008000u, 0x0000},
      {0x00018000u, 0x0002}, {0x80008001u, 0x8001}, {0x3f800000u, 0x3f80}, {0x3f808000u, 0x3f80},
      {0x3f818000u, 0x3f82},
  };
  for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
    uint16_t got = norma__f32_to_bf16(f32_from_bits(cases[i].f));
    TU_CHECK(got == cases[i].h, "f32 -> bf16 (0x%08x): got 0x%04x, want 0x%04x", cases[i].f, got,
             cases[i].h);
  }
  static const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xffc00000u, 0xff800001u, 0x7fffffffu,
                                  0x7f80ffffu, 0xff810000u};
  for (int i = 0; i < (int)(sizeof nans / sizeof nans[0]); i++) {
    uint16_t h = norma__f32_to_bf16(f32_from_bits(nans[i]));
    TU_CHECK(bf16_is_nan(h) && (h & 0x40u) && (h >> 15) == (nans[i] >> 31),
             "f32 NaN 0x%08x -> bf16 0x%04x is not a quiet NaN of the same sign", nans[i], h);
  }
}

/* random f32 values against a rounding computed here in double */
static void test_random(void) {
  tu_rng r = tu_rng_make(99);
  long bad16 = 0, badb = 0;
  for (int i = 0; i < 2000000; i++) {
    uint32_t u = (uint32_t)tu_next(&r);
    /* keep exponents near the f16 range half of the time */
    if (i & 1) u = (u & 0x807fffffu) | ((uint32_t)(100 + tu_below(&r, 50)) << 23);
    float f = f32_from_bits(u);
    if (isnan(f)) continue;
    /* f16: nearest, ties to even, computed by searching the neighbours */
    uint16_t h = norma__f32_to_f16(f);
    double a = fabs((double)f);
    double got = fabs(f16_value(h));
    if (a >= 65520.0) bad16 += (h & 0x7fffu) != 0x7c00u;
    else {
      uint16_t hm = h & 0x7fffu;
      double below = hm > 0 ? f16_value((uint16_t)(hm - 1)) : -1.0;
      double above = hm < 0x7bff ? f16_value((uint16_t)(hm + 1)) : INFINITY;
      double e = fabs(got - a);
      int ok = e <= fabs(a - below) && e <= fabs(above - a) && (!!signbit(f) == ((h >> 15) != 0));
      if (ok && (e == fabs(a - below) || e == fabs(above - a)) && e != 0) ok = (hm & 1) == 0;
      bad16 += !ok;
    }
    /* bf16: the nearest value, ties to even */
    uint16_t b = norma__f32_to_bf16(f);
    uint32_t lower = u & 0xffffu, up = u >> 16;
    uint16_t want = (uint16_t)(up + (lower > 0x8000u || (lower == 0x8000u && (up & 1))));
    badb += b != want;
  }
  TU_CHECK(bad16 == 0, "f32 -> f16: %ld of 2e6 random values not rounded to nearest even", bad16);
  TU_CHECK(badb == 0, "f32 -> bf16: %ld of 2e6 random values not rounded to nearest even", badb);
}

int main(void) {
  test_f16();
  test_bf16();
  test_random();
  return tu_finish("test_convert");
}
