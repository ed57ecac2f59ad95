/* bw_probe_kernels.h - loops of the bandwidth probe (bw_probe_avx.c is built with -mavx). */
#ifndef NORMA_BENCH_BW_PROBE_KERNELS_H
#define NORMA_BENCH_BW_PROBE_KERNELS_H
#include <stddef.h>
#if defined(__x86_64__) || defined(_M_X64)
#define BENCH_HAVE_AVX_PROBE 1
void bench_copy_nt_avx(float *dst, const float *src, size_t n);
void bench_copy_st_avx(float *dst, const float *src, size_t n);
double bench_read_avx(const float *src, size_t n);
#endif
#endif
