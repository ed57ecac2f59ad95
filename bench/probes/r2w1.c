/* r2w1 MB: 2 threads, c = a*x + b*y with NT stores (mode 0) or normal stores (1); read-2 probe (2) */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t n=(size_t)(atof(argv[1])*262144); int mode=atoi(argv[2]);
  float*x=aligned_alloc(64,n*4),*y=aligned_alloc(64,n*4),*z=aligned_alloc(64,n*4);
  #pragma omp parallel for
  for(size_t i=0;i<n;i++){x[i]=1;y[i]=2;z[i]=0;}
  double t[201]; volatile float sink=0;
  for(int r=0;r<201;r++){double t0=now(); float tot=0;
    #pragma omp parallel reduction(+:tot)
    {int th=omp_get_thread_num(),nt=omp_get_num_threads();size_t i0=n*th/nt/64*64,i1=th==nt-1?n:n*(th+1)/nt/64*64;
     __m512 a=_mm512_set1_ps(1.5f),b=_mm512_set1_ps(0.5f),s=_mm512_setzero_ps(),s2=s;
     if(mode==0) for(size_t i=i0;i<i1;i+=32){__m512 v=_mm512_fmadd_ps(a,_mm512_load_ps(x+i),_mm512_mul_ps(b,_mm512_load_ps(y+i)));__m512 w=_mm512_fmadd_ps(a,_mm512_load_ps(x+i+16),_mm512_mul_ps(b,_mm512_load_ps(y+i+16)));_mm512_stream_ps(z+i,v);_mm512_stream_ps(z+i+16,w);}
     else if(mode==1) for(size_t i=i0;i<i1;i+=32){__m512 v=_mm512_fmadd_ps(a,_mm512_load_ps(x+i),_mm512_mul_ps(b,_mm512_load_ps(y+i)));__m512 w=_mm512_fmadd_ps(a,_mm512_load_ps(x+i+16),_mm512_mul_ps(b,_mm512_load_ps(y+i+16)));_mm512_store_ps(z+i,v);_mm512_store_ps(z+i+16,w);}
     else for(size_t i=i0;i<i1;i+=32){s=_mm512_fmadd_ps(_mm512_load_ps(x+i),_mm512_load_ps(y+i),s);s2=_mm512_fmadd_ps(_mm512_load_ps(x+i+16),_mm512_load_ps(y+i+16),s2);}
     tot+=_mm512_reduce_add_ps(_mm512_add_ps(s,s2));}
    sink=tot; t[r]=now()-t0;}
  for(int i=0;i<201;i++)for(int j=i+1;j<201;j++)if(t[j]<t[i]){double q=t[i];t[i]=t[j];t[j]=q;}
  double bytes=n*4.0*(mode==2?2:3);
  printf("mode %d: median %.3f ms  %.1f GB/s (min %.3f ms)\n",mode,t[100]*1e3,bytes/t[100]/1e9,t[0]*1e3);
}
