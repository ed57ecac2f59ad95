/* ap4 MB C PFD OFFY OFFZ: backward-apply loop (six constants, NT stores), row at a time, 2 threads,
   prefetch x and dy PFD bytes ahead (0: none); y at OFFY bytes past a page, z at OFFZ */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t n=(size_t)atol(argv[1])<<18; long C=atol(argv[2]); long pfd=atol(argv[3]); long oy=atol(argv[4]), oz=atol(argv[5]);
  size_t rows=n/C; n=rows*C;
  float*x=aligned_alloc(4096,n*4+8192),*y=(float*)((char*)aligned_alloc(4096,n*4+8192)+oy),*z=(float*)((char*)aligned_alloc(4096,n*4+8192)+oz);
  float*c=(float*)aligned_alloc(4096,6*C*4+8192); for(long i=0;i<6*C;i++)c[i]=0.1f*(i%7);
  #pragma omp parallel for
  for(size_t i=0;i<n;i++){x[i]=1;y[i]=2;z[i]=0;}
  double t[21];
  for(int r=0;r<21;r++){double t0=now();
    #pragma omp parallel
    {int th=omp_get_thread_num(),nt=omp_get_num_threads();size_t r0=rows*th/nt,r1=rows*(th+1)/nt;
     for(size_t q=r0;q<r1;q++){ size_t e=q*C;
      for(long j=0;j<C;j+=16){
        if(pfd){_mm_prefetch((const char*)(x+e+j)+pfd,_MM_HINT_T0);_mm_prefetch((const char*)(y+e+j)+pfd,_MM_HINT_T0);}
        __m512 xh=_mm512_fmadd_ps(_mm512_load_ps(x+e+j),_mm512_load_ps(c+j),_mm512_load_ps(c+C+j));
        __m512 g=_mm512_load_ps(y+e+j);
        _mm512_stream_ps(z+e+j,_mm512_fmadd_ps(_mm512_load_ps(c+3*C+j),_mm512_sub_ps(g,_mm512_load_ps(c+2*C+j)),_mm512_fmadd_ps(_mm512_load_ps(c+4*C+j),xh,_mm512_load_ps(c+5*C+j))));}}}
    t[r]=now()-t0;}
  for(int i=0;i<21;i++)for(int j=i+1;j<21;j++)if(t[j]<t[i]){double q=t[i];t[i]=t[j];t[j]=q;}
  printf("C %ld pfd %ld offs %ld %ld: median %.3f ms  %.1f GB/s\n",C,pfd,oy,oz,t[10]*1e3,n*12.0/t[10]/1e9);
}
