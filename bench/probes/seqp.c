/* seqp MB C MODE RED: 2 threads, a backward-like sequence over two MB-MiB tensors of rows of C
   f32: when RED is 1, the sums by fours (as the kernels' far sums) over each thread's half of
   the rows, then the apply by fours with streaming stores, walking forwards (MODE 1) or
   backwards in 64 KiB blocks read forwards (MODE 2); medians of 21 iterations of each part.
   The apply's six per-channel constants are loaded once per four rows. */
#include <immintrin.h>
#include "sums4.h"
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define K(q) _mm512_load_ps(c+(q)*C+j)
static inline __m512 dxv(__m512 x,__m512 g,__m512 xs,__m512 xo,__m512 gm,__m512 da,__m512 db,__m512 dd){
  __m512 xh=_mm512_fmadd_ps(x,xs,xo); return _mm512_fmadd_ps(da,_mm512_sub_ps(g,gm),_mm512_fmadd_ps(db,xh,dd)); }
static void rows1(const float*x,const float*y,float*z,const float*c,long C,size_t a,size_t b){
  for(size_t q=a;q<b;q++){ size_t e=q*C; for(long j=0;j<C;j+=16)
    _mm512_stream_ps(z+e+j,dxv(_mm512_load_ps(x+e+j),_mm512_load_ps(y+e+j),K(0),K(1),K(2),K(3),K(4),K(5))); } }
static void rows4(const float*x,const float*y,float*z,const float*c,long C,size_t a,size_t b){
  size_t q=a; for(;q+4<=b;q+=4){ size_t e=q*C; for(long j=0;j<C;j+=16){
    __m512 xs=K(0),xo=K(1),gm=K(2),da=K(3),db=K(4),dd=K(5);
    __m512 o0=dxv(_mm512_load_ps(x+e+j),_mm512_load_ps(y+e+j),xs,xo,gm,da,db,dd);
    __m512 o1=dxv(_mm512_load_ps(x+e+C+j),_mm512_load_ps(y+e+C+j),xs,xo,gm,da,db,dd);
    __m512 o2=dxv(_mm512_load_ps(x+e+2*C+j),_mm512_load_ps(y+e+2*C+j),xs,xo,gm,da,db,dd);
    __m512 o3=dxv(_mm512_load_ps(x+e+3*C+j),_mm512_load_ps(y+e+3*C+j),xs,xo,gm,da,db,dd);
    _mm512_stream_ps(z+e+j,o0);_mm512_stream_ps(z+e+C+j,o1);_mm512_stream_ps(z+e+2*C+j,o2);_mm512_stream_ps(z+e+3*C+j,o3);} }
  rows1(x,y,z,c,C,q,b); }
static void red4(const float*x,const float*y,const float*k,long C,size_t r0,size_t r1,float*s){
  for(long j=0;j<3*C;j++)s[j]=0;
  sums4(x,y,k,C,r0,r1,s,0); }
int main(int argc,char**argv){
  size_t n=(size_t)atol(argv[1])<<18; long C=atol(argv[2]); int mode=atoi(argv[3]); int dored=atoi(argv[4]);
  size_t rows=n/C; n=rows*C;
  float*x=aligned_alloc(64,n*4),*y=aligned_alloc(64,n*4),*z=aligned_alloc(64,n*4);
  float*c=aligned_alloc(64,6*C*4); for(long i=0;i<6*C;i++)c[i]=0.1f*(i%7);
  #pragma omp parallel for
  for(size_t i=0;i<n;i++){x[i]=1;y[i]=2;z[i]=0;}
  double tr[21],ta[21];
  for(int r=0;r<21;r++){double t0=now();
    if(dored){
    #pragma omp parallel
    {int th=omp_get_thread_num(),nt=omp_get_num_threads();size_t r0=rows*th/nt,r1=rows*(th+1)/nt; float s[3*2048] __attribute__((aligned(64))); red4(x,y,c,C,r0,r1,s); if(s[0]==1.2345f)printf("x");}
    }
    double t1=now();
    #pragma omp parallel
    {int th=omp_get_thread_num(),nt=omp_get_num_threads();size_t r0=rows*th/nt,r1=rows*(th+1)/nt;
     size_t blk=65536/(C*4); if(blk<1)blk=1;
     if(mode==1) rows4(x,y,z,c,C,r0,r1);
     else { for(size_t hi=r1;hi>r0;){ size_t lo=hi-r0>blk?hi-blk:r0; rows4(x,y,z,c,C,lo,hi); hi=lo; } }
     _mm_sfence(); }
    tr[r]=t1-t0; ta[r]=now()-t1;}
  for(int i=0;i<21;i++)for(int j=i+1;j<21;j++){if(tr[j]<tr[i]){double q=tr[i];tr[i]=tr[j];tr[j]=q;} if(ta[j]<ta[i]){double q=ta[i];ta[i]=ta[j];ta[j]=q;}}
  printf("C %ld apply mode %d (reduce before: %d): reduce %.3f apply %.3f ms\n",C,mode,dored,tr[10]*1e3,ta[10]*1e3);
}
