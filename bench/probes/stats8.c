/* stats8.c - the training forward's channels-last statistics loop (rows by eights, the
 * accumulators in L1 arrays: stats_rows_shifted's ROWS_STEP in src/cpu/ukernels_vec.inc) as a
 * stand-alone AVX-512 loop over R rows of C f32 channels from memory, 2 threads, blocks of 64
 * rows, against loops that read the same bytes with less arithmetic.  Usage: stats8 C R MODE
 * [PF_BYTES]; prints the median of 9 timed passes.
 *   0  the kernel's arithmetic: d = x - k, pairwise sums of d, d^2 and OR of d's bits over
 *      eight rows, added to the accumulators; prefetch PF_BYTES (rounded to 4 rows) ahead
 *   1  the same without the prefetch
 *   2  a row at a time within each eight rows, two vectors of channels in registers
 *   6  the same access pattern as 0 (eight rows a step), only a sum of x
 *   7  a plain read in address order, four vector sums
 *   8  mode 0 without the OR of the bits (the kernel's loop since the twenty-second session)
 *   9  mode 8 with d and d^2 added straight into the accumulators, row after row
 *  10  mode 8 with d^2 summed as two chains of four
 *  11, 12  mode 9 with the prefetch hint T1, T2 instead of T0
 * C at most 2048.  PF_BYTES: modes 0 and 8-12 prefetch it rounded up to a multiple of 4 rows
 * (C * 16 bytes: 4 rows ahead, C * 32: 8 rows).
 * Build with -O3 (at -O2 gcc leaves mode 0's array of eight vectors on the stack). */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
#define ALN __attribute__((aligned(64)))
static void blk(const float *x, long rows, long C, const float *k, float *a, float *q, float *o, int mode, long pf) {
  for (long r = 0; r + 8 <= rows; r += 8) {
    if (mode == 2) {
      for (long j = 0; j < C; j += 32) {
        __m512 A0=_mm512_load_ps(a+j),Q0=_mm512_load_ps(q+j),O0=_mm512_load_ps(o+j);
        __m512 A1=_mm512_load_ps(a+j+16),Q1=_mm512_load_ps(q+j+16),O1=_mm512_load_ps(o+j+16);
        __m512 k0=_mm512_load_ps(k+j),k1=_mm512_load_ps(k+j+16);
        for (int i = 0; i < 8; i++) {
          const float *p = x + (r + i) * C + j;
          _mm_prefetch((const char*)(p + pf), _MM_HINT_T0); _mm_prefetch((const char*)(p + pf + 16), _MM_HINT_T0);
          __m512 d0=_mm512_sub_ps(_mm512_loadu_ps(p),k0), d1=_mm512_sub_ps(_mm512_loadu_ps(p+16),k1);
          A0=_mm512_add_ps(A0,d0);Q0=_mm512_fmadd_ps(d0,d0,Q0);O0=_mm512_or_ps(O0,d0);
          A1=_mm512_add_ps(A1,d1);Q1=_mm512_fmadd_ps(d1,d1,Q1);O1=_mm512_or_ps(O1,d1);
        }
        _mm512_store_ps(a+j,A0);_mm512_store_ps(q+j,Q0);_mm512_store_ps(o+j,O0);
        _mm512_store_ps(a+j+16,A1);_mm512_store_ps(q+j+16,Q1);_mm512_store_ps(o+j+16,O1);
      }
      continue;
    }
    if (mode <= 8) for (long j = 0; j < C; j += 16) {
      const float *p = x + r * C + j;
      if (mode == 0 || mode == 8) for (int i = 0; i < 8; i++) _mm_prefetch((const char*)(p + pf + i * C), _MM_HINT_T0);
      __m512 kk = _mm512_load_ps(k + j);
      __m512 d[8];
      for (int i = 0; i < 8; i++) d[i] = _mm512_sub_ps(_mm512_loadu_ps(p + i * C), kk);
      __m512 a0=_mm512_add_ps(_mm512_add_ps(d[0],d[1]),_mm512_add_ps(d[2],d[3]));
      __m512 a1=_mm512_add_ps(_mm512_add_ps(d[4],d[5]),_mm512_add_ps(d[6],d[7]));
      __m512 q0=_mm512_add_ps(_mm512_fmadd_ps(d[1],d[1],_mm512_mul_ps(d[0],d[0])),_mm512_fmadd_ps(d[3],d[3],_mm512_mul_ps(d[2],d[2])));
      __m512 q1=_mm512_add_ps(_mm512_fmadd_ps(d[5],d[5],_mm512_mul_ps(d[4],d[4])),_mm512_fmadd_ps(d[7],d[7],_mm512_mul_ps(d[6],d[6])));
      __m512 o0=_mm512_or_ps(_mm512_or_ps(d[0],d[1]),_mm512_or_ps(d[2],d[3]));
      __m512 o1=_mm512_or_ps(_mm512_or_ps(d[4],d[5]),_mm512_or_ps(d[6],d[7]));
      _mm512_store_ps(a+j,_mm512_add_ps(_mm512_load_ps(a+j),_mm512_add_ps(a0,a1)));
      _mm512_store_ps(q+j,_mm512_add_ps(_mm512_load_ps(q+j),_mm512_add_ps(q0,q1)));
      if (mode != 8) _mm512_store_ps(o+j,_mm512_or_ps(_mm512_load_ps(o+j),_mm512_or_ps(o0,o1)));
    }
    if (mode >= 9) for (long j = 0; j < C; j += 16) {
      const float *p = x + r * C + j;
      if (mode == 11) for (int i = 0; i < 8; i++) _mm_prefetch((const char*)(p + pf + i * C), _MM_HINT_T1);
      else if (mode == 12) for (int i = 0; i < 8; i++) _mm_prefetch((const char*)(p + pf + i * C), _MM_HINT_T2);
      else for (int i = 0; i < 8; i++) _mm_prefetch((const char*)(p + pf + i * C), _MM_HINT_T0);
      __m512 kk = _mm512_load_ps(k + j), A = _mm512_load_ps(a + j), Q = _mm512_load_ps(q + j);
      __m512 d[8];
      for (int i = 0; i < 8; i++) d[i] = _mm512_sub_ps(_mm512_loadu_ps(p + i * C), kk);
      if (mode != 10) {
        for (int i = 0; i < 8; i++) A = _mm512_add_ps(A, d[i]), Q = _mm512_fmadd_ps(d[i], d[i], Q);
      } else {
        __m512 a0=_mm512_add_ps(_mm512_add_ps(d[0],d[1]),_mm512_add_ps(d[2],d[3]));
        __m512 a1=_mm512_add_ps(_mm512_add_ps(d[4],d[5]),_mm512_add_ps(d[6],d[7]));
        A = _mm512_add_ps(A, _mm512_add_ps(a0, a1));
        __m512 q0 = _mm512_mul_ps(d[0], d[0]), q1 = _mm512_mul_ps(d[4], d[4]);
        for (int i = 1; i < 4; i++) q0 = _mm512_fmadd_ps(d[i], d[i], q0), q1 = _mm512_fmadd_ps(d[4 + i], d[4 + i], q1);
        Q = _mm512_add_ps(Q, _mm512_add_ps(q0, q1));
      }
      _mm512_store_ps(a+j,A); _mm512_store_ps(q+j,Q);
    }
  }
}
int main(int argc, char **argv) {
  long C = atol(argv[1]), R = atol(argv[2]); int mode = atoi(argv[3]); long pfb = argc > 4 ? atol(argv[4]) : 12288;
  float *x = aligned_alloc(64, R * C * 4);
  for (long i = 0; i < R * C; i++) x[i] = (float)(i % 977) * 0.01f;
  double best[9]; int nb = 0; double sink = 0;
  for (int rep = 0; rep < 11; rep++) {
    double t0 = now();
#pragma omp parallel reduction(+:sink)
    {
      int th = omp_get_thread_num(), nt = omp_get_num_threads();
      long r0 = R * th / nt / 64 * 64, r1 = th == nt - 1 ? R / 64 * 64 : R * (th + 1) / nt / 64 * 64;
      float k[2048] ALN, a[2048] ALN, q[2048] ALN, o[2048] ALN;
      for (long j = 0; j < C; j++) k[j] = 1.0f;
      long pfe = (mode == 0 || mode >= 8) ? ((pfb + C * 4 - 1) / (C * 4) + 3) / 4 * 4 * C : pfb / 4;
      for (long r = r0; r < r1; r += 64) {
        memset(a, 0, C * 4), memset(q, 0, C * 4), memset(o, 0, C * 4);
        if (mode == 7) { __m512 s0=_mm512_setzero_ps(),s1=s0,s2=s0,s3=s0; const float *p=x+r*C;
          for (long i = 0; i < 64 * C; i += 64) { s0=_mm512_add_ps(s0,_mm512_load_ps(p+i)); s1=_mm512_add_ps(s1,_mm512_load_ps(p+i+16)); s2=_mm512_add_ps(s2,_mm512_load_ps(p+i+32)); s3=_mm512_add_ps(s3,_mm512_load_ps(p+i+48)); }
          float t[16]; _mm512_storeu_ps(t,_mm512_add_ps(_mm512_add_ps(s0,s1),_mm512_add_ps(s2,s3))); sink += t[0]; continue; }
        if (mode == 6) { const float *p=x+r*C;
          for (long rr = 0; rr < 64; rr += 8) for (long j = 0; j < C; j += 16) { const float *b = p + rr*C + j;
            __m512 u = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_load_ps(b),_mm512_load_ps(b+C)),_mm512_add_ps(_mm512_load_ps(b+2*C),_mm512_load_ps(b+3*C))),
                                     _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(b+4*C),_mm512_load_ps(b+5*C)),_mm512_add_ps(_mm512_load_ps(b+6*C),_mm512_load_ps(b+7*C))));
            _mm512_store_ps(a+j, _mm512_add_ps(_mm512_load_ps(a+j), u)); }
          sink += a[0]; continue; }
        blk(x + r * C, 64, C, k, a, q, o, mode == 1 ? 1 : mode, pfe);
        sink += a[0] + q[C - 1];
      }
    }
    double t = now() - t0; if (rep >= 2) best[nb++] = t;
  }
  for (int i = 0; i < nb; i++) for (int j = i + 1; j < nb; j++) if (best[j] < best[i]) { double t = best[i]; best[i] = best[j]; best[j] = t; }
  printf("C %ld mode %d: median %.3f ms (%.0f MB) %g\n", C, mode, best[nb / 2] * 1e3, R * C * 4 / 1e6, sink > 0 ? 0.0 : 1.0);
  return 0;
}
