/* ukernels.c - the kernel tables the engine runs: for each ISA and dtype, the ISA's kernels
   where it has them and the portable ones elsewhere, merged once. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "norm_math.h"
#include "ukernels.h"

#define CHAN_FN(f) f##_base
#include "chan_vec.inc"
#undef CHAN_FN

#define NISA 3
#define NDT 4
static bn_ukernels merged[NISA][NDT];
static norma_isa served[NISA][NDT];
static pthread_once_t once = PTHREAD_ONCE_INIT;

#ifdef NORMA_HAVE_AVX512BF16
/* NORMA_NO_AVX512BF16=1 keeps bf16 on the integer rounding of ukernels_avx512.c (the same
   bits; for testing and measuring the two against each other) */
static int norma__no_avx512bf16(void) {
  const char *e = getenv("NORMA_NO_AVX512BF16");
  return e && *e && strcmp(e, "0") != 0;
}
#endif

/* the table an ISA level provides for dtype t (NULL: none) */
static const bn_ukernels *native(norma_isa isa, norma_dtype t) {
  switch (isa) {
#ifdef NORMA_HAVE_AVX2
    case NORMA_ISA_AVX2: return bn_ukernels_avx2(t);
#endif
#ifdef NORMA_HAVE_AVX2
    case NORMA_ISA_AVX512:
#ifdef NORMA_HAVE_EMU16
      if (norma__avx512_emulated()) return bn_ukernels_emu16(t);
#endif
#ifdef NORMA_HAVE_AVX512BF16
      if (t == NORMA_BF16 && norma__cpu_features()->avx512bf16 && !norma__no_avx512bf16())
        return bn_ukernels_avx512bf16(t);
#endif
#ifdef NORMA_HAVE_AVX512
      return bn_ukernels_avx512(t);
#else
      return NULL;
#endif
#endif
    default: return NULL;
  }
}

static void merge_all(void) {
  for (int i = 0; i < NISA; i++)
    for (int t = 0; t < NDT; t++) {
      /* a level without a table of its own falls back to the level below */
      const bn_ukernels *own = NULL;
      int lvl = i;
      for (; lvl > 0 && !(own = native((norma_isa)lvl, (norma_dtype)t)); lvl--) {
      }
      bn_ukernels m = *bn_ukernels_scalar((norma_dtype)t);
      if (own) {
#define TAKE(f) if (own->f) m.f = own->f;
        BN_UKERNEL_SLOTS(TAKE)
#undef TAKE
      }
      merged[i][t] = m;
      served[i][t] = own ? (norma_isa)lvl : NORMA_ISA_SCALAR;
    }
}

/* the widest of the ISA's double-precision helpers the CPU runs natively */
static int dbl_isa(void) {
  const norma_isa isa = norma__isa();
#ifdef NORMA_HAVE_AVX512
  if (isa == NORMA_ISA_AVX512 && !norma__avx512_emulated()) return 2;
#endif
#ifdef NORMA_HAVE_AVX2
  if (isa >= NORMA_ISA_AVX2) return 1;
#endif
  (void)isa;
  return 0;
}

int norm_fwd_consts_scalar(const norm_fwd_block *b, int64_t i, int64_t n) {
  int slow = 0;
  for (; i < n; i++) {
    const float mf = (float)b->mean[i];
    const double mhi = (double)mf, lo = (b->mean[i] - mhi) + b->mlo[i], sc = b->scale[i];
    const double shift = lo == 0.0 ? b->beta[i] : b->beta[i] - lo * sc;
    b->cm[i] = mf, b->csc[i] = (float)sc, b->csh[i] = (float)shift;
    b->dm[i] = mhi, b->dsc[i] = sc, b->dsh[i] = shift;
    slow |= (fabs(sc) > FLT_MAX && isfinite(sc)) | (fabs(shift) > FLT_MAX && isfinite(shift));
  }
  return slow;
}

int norm_fwd_consts(const norm_fwd_block *b, int64_t n) {
  switch (dbl_isa()) {
#ifdef NORMA_HAVE_AVX512
    case 2: return norm_fwd_consts_avx512(b, n);
#endif
#ifdef NORMA_HAVE_AVX2
    case 1: return norm_fwd_consts_avx2(b, n);
#endif
    default: return norm_fwd_consts_scalar(b, 0, n);
  }
}

const norm_chan_ops *norm_chan(void) {
  switch (dbl_isa()) {
#ifdef NORMA_HAVE_AVX512
    case 2: return &norm_chan_ops_avx512;
#endif
#ifdef NORMA_HAVE_AVX2
    case 1: return &norm_chan_ops_avx2;
#endif
    default: return &norm_chan_ops_base;
  }
}

const bn_ukernels *bn_ukernels_for(norma_isa isa, norma_dtype t) {
  (void)pthread_once(&once, merge_all);
  return &merged[(int)isa < NISA ? (int)isa : NISA - 1][(int)t];
}

norma_isa bn_ukernels_isa(norma_isa isa, norma_dtype t) {
  (void)pthread_once(&once, merge_all);
  return served[(int)isa < NISA ? (int)isa : NISA - 1][(int)t];
}
