/* ap2 MB C mode: backward-apply-like loop, 2 threads, NT stores.
   0: six SoA constant arrays (norma today)  1: AoS, the six vectors of a channel vector adjacent
   2: three constants (A g + B x + C)   3: six constants, C=64 repeated (in registers, compiler hoists? no: reloaded)
   4: four constants (xs, xo, da, dd'; dx = da*g + db*xh + dd)  */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t n=(size_t)atol(argv[1])<<18; long C=atol(argv[2]); int mode=atoi(argv[3]);
  size_t rows=n/C; n=rows*C;
  float*x=aligned_alloc(64,n*4),*y=aligned_alloc(64,n*4),*z=aligned_alloc(64,n*4);
  float*c=(float*)aligned_alloc(4096,6*C*4+8192); for(long i=0;i<6*C;i++)c[i]=0.1f*(i%7);
  #pragma omp parallel for
  for(size_t i=0;i<n;i++){x[i]=1;y[i]=2;z[i]=0;}
  double t[21];
  for(int r=0;r<21;r++){double t0=now();
    #pragma omp parallel
    {int th=omp_get_thread_num(),nt=omp_get_num_threads();size_t r0=rows*th/nt,r1=rows*(th+1)/nt;
     for(size_t q=r0;q<r1;q++){ size_t e=q*C;
      if(mode==0) for(long j=0;j<C;j+=16){
        __m512 xh=_mm512_fmadd_ps(_mm512_load_ps(x+e+j),_mm512_load_ps(c+j),_mm512_load_ps(c+C+j));
        __m512 g=_mm512_load_ps(y+e+j);
        _mm512_stream_ps(z+e+j,_mm512_fmadd_ps(_mm512_load_ps(c+3*C+j),_mm512_sub_ps(g,_mm512_load_ps(c+2*C+j)),_mm512_fmadd_ps(_mm512_load_ps(c+4*C+j),xh,_mm512_load_ps(c+5*C+j))));}
      else if(mode==1) for(long j=0;j<C;j+=16){ const float*k=c+6*j;
        __m512 xh=_mm512_fmadd_ps(_mm512_load_ps(x+e+j),_mm512_load_ps(k),_mm512_load_ps(k+16));
        __m512 g=_mm512_load_ps(y+e+j);
        _mm512_stream_ps(z+e+j,_mm512_fmadd_ps(_mm512_load_ps(k+48),_mm512_sub_ps(g,_mm512_load_ps(k+32)),_mm512_fmadd_ps(_mm512_load_ps(k+64),xh,_mm512_load_ps(k+80))));}
      else if(mode==2) for(long j=0;j<C;j+=16){
        _mm512_stream_ps(z+e+j,_mm512_fmadd_ps(_mm512_load_ps(c+j),_mm512_load_ps(y+e+j),_mm512_fmadd_ps(_mm512_load_ps(x+e+j),_mm512_load_ps(c+C+j),_mm512_load_ps(c+2*C+j))));}
      else if(mode==3) for(long j=0;j<C;j+=16){ long jj=j&63;
        __m512 xh=_mm512_fmadd_ps(_mm512_load_ps(x+e+j),_mm512_load_ps(c+jj),_mm512_load_ps(c+C+jj));
        __m512 g=_mm512_load_ps(y+e+j);
        _mm512_stream_ps(z+e+j,_mm512_fmadd_ps(_mm512_load_ps(c+3*C+jj),_mm512_sub_ps(g,_mm512_load_ps(c+2*C+jj)),_mm512_fmadd_ps(_mm512_load_ps(c+4*C+jj),xh,_mm512_load_ps(c+5*C+jj))));}
      else if(mode==4) for(long j=0;j<C;j+=16){
        __m512 xh=_mm512_fmadd_ps(_mm512_load_ps(x+e+j),_mm512_load_ps(c+j),_mm512_load_ps(c+C+j));
        _mm512_stream_ps(z+e+j,_mm512_fmadd_ps(_mm512_load_ps(c+3*C+j),_mm512_load_ps(y+e+j),_mm512_fmadd_ps(_mm512_load_ps(c+4*C+j),xh,_mm512_load_ps(c+5*C+j))));}
      else if(mode==5) for(long j=0;j<C;j+=16){ /* 6 constants, plain stores */
        __m512 xh=_mm512_fmadd_ps(_mm512_load_ps(x+e+j),_mm512_load_ps(c+j),_mm512_load_ps(c+C+j));
        __m512 g=_mm512_load_ps(y+e+j);
        _mm512_store_ps(z+e+j,_mm512_fmadd_ps(_mm512_load_ps(c+3*C+j),_mm512_sub_ps(g,_mm512_load_ps(c+2*C+j)),_mm512_fmadd_ps(_mm512_load_ps(c+4*C+j),xh,_mm512_load_ps(c+5*C+j))));}
      else if(mode==7){ if((q-r0)%4 || q+4>r1) continue; for(long j=0;j<C;j+=16){
        __m512 xs=_mm512_load_ps(c+j),xo=_mm512_load_ps(c+C+j),gm=_mm512_load_ps(c+2*C+j),da=_mm512_load_ps(c+3*C+j),db=_mm512_load_ps(c+4*C+j),dd=_mm512_load_ps(c+5*C+j);
        __m512 o[4];
        for(int k=0;k<4;k++){size_t f=e+k*C+j; __m512 xh=_mm512_fmadd_ps(_mm512_load_ps(x+f),xs,xo); o[k]=_mm512_fmadd_ps(da,_mm512_sub_ps(_mm512_load_ps(y+f),gm),_mm512_fmadd_ps(db,xh,dd));}
        for(int k=0;k<4;k++)_mm512_stream_ps(z+e+k*C+j,o[k]);}}
      else for(long j=0;j<C;j+=16){ __m512 a=_mm512_set1_ps(1.5f),b=_mm512_set1_ps(.5f);
        _mm512_stream_ps(z+e+j,_mm512_fmadd_ps(a,_mm512_load_ps(x+e+j),_mm512_mul_ps(b,_mm512_load_ps(y+e+j))));}
     }}
    t[r]=now()-t0;}
  for(int i=0;i<21;i++)for(int j=i+1;j<21;j++)if(t[j]<t[i]){double q=t[i];t[i]=t[j];t[j]=q;}
  printf("C %ld mode %d: median %.3f ms  %.1f GB/s\n",C,mode,t[10]*1e3,n*12.0/t[10]/1e9);
}
