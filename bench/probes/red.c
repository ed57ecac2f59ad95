/* red MB C MODE: 2 threads, backward-sums-like reduction of two MB-MiB tensors of rows of C f32
   0: rows by fours, accumulators in L1 arrays   1: one row at a time (address order), accumulators in L1
   2: raw read (fma of x*y into 2 registers)     3: rows by fours + software prefetch 4 rows ahead
   4, 5: rows by twos, by eights (a loop over the rows)   7: rows by eights, unrolled
   8: rows by fours taken a quarter of the thread's rows apart (eight long ascending streams)
   9: a row at a time with a prefetch PFD bytes ahead (environment, default 4096; 0: none)
   10, 11: rows by eights, by sixteens, as fours combined pairwise (the bits of mode 0) */
#include <immintrin.h>
#include "sums4.h"
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t n=(size_t)atol(argv[1])<<18; long C=atol(argv[2]); int mode=atoi(argv[3]);
  size_t rows=n/C; n=rows*C;
  float*x=aligned_alloc(64,n*4),*y=aligned_alloc(64,n*4);
  float*k=aligned_alloc(64,2*C*4); for(long i=0;i<2*C;i++)k[i]=0.5f;
  #pragma omp parallel for
  for(size_t i=0;i<n;i++){x[i]=1;y[i]=2;}
  double t[21]; float sink=0;
  for(int r=0;r<21;r++){double t0=now();
    #pragma omp parallel reduction(+:sink)
    {int th=omp_get_thread_num(),nt=omp_get_num_threads();size_t r0=rows*th/nt,r1=rows*(th+1)/nt;
     float *s=aligned_alloc(64,3*C*4); for(long j=0;j<3*C;j++)s[j]=0;
     float *s1=s,*s2=s+C,*s3=s+2*C;
     if(mode==0||mode==3) sums4(x,y,k,C,r0,r1,s,mode==3);
     else if(mode==1){ for(size_t q=r0;q<r1;q++){ const float*a=x+q*C,*b=y+q*C;
        for(long j=0;j<C;j+=16){ __m512 h=_mm512_fmadd_ps(_mm512_load_ps(a+j),_mm512_load_ps(k+j),_mm512_load_ps(k+C+j)); __m512 g=_mm512_load_ps(b+j);
          _mm512_store_ps(s1+j,_mm512_add_ps(_mm512_load_ps(s1+j),g)); _mm512_store_ps(s2+j,_mm512_fmadd_ps(g,h,_mm512_load_ps(s2+j))); _mm512_store_ps(s3+j,_mm512_add_ps(_mm512_load_ps(s3+j),h));}}}
     else if(mode==4||mode==5){ int R=mode==4?2:8; size_t q=r0; for(;q+R<=r1;q+=R){ const float*a=x+q*C,*b=y+q*C;
        for(long j=0;j<C;j+=16){ __m512 xs=_mm512_load_ps(k+j),xo=_mm512_load_ps(k+C+j); __m512 A=_mm512_load_ps(s1+j),B=_mm512_load_ps(s2+j),D=_mm512_load_ps(s3+j);
          for(int u=0;u<R;u++){ __m512 h=_mm512_fmadd_ps(_mm512_load_ps(a+u*C+j),xs,xo), g=_mm512_load_ps(b+u*C+j); A=_mm512_add_ps(A,g); B=_mm512_fmadd_ps(g,h,B); D=_mm512_add_ps(D,h);}
          _mm512_store_ps(s1+j,A);_mm512_store_ps(s2+j,B);_mm512_store_ps(s3+j,D);}}}
     else if(mode==8){ size_t R=(r1-r0)/4; for(size_t q=r0;q<r0+R;q++){ const float*a=x+q*C,*b=y+q*C; const size_t d=R*C;
        for(long j=0;j<C;j+=16){ __m512 xs=_mm512_load_ps(k+j),xo=_mm512_load_ps(k+C+j); __m512 h[4],g[4];
          for(int u=0;u<4;u++){h[u]=_mm512_fmadd_ps(_mm512_load_ps(a+u*d+j),xs,xo); g[u]=_mm512_load_ps(b+u*d+j);}
          __m512 G=_mm512_add_ps(_mm512_add_ps(g[0],g[1]),_mm512_add_ps(g[2],g[3]));
          __m512 H=_mm512_add_ps(_mm512_add_ps(h[0],h[1]),_mm512_add_ps(h[2],h[3]));
          __m512 P=_mm512_add_ps(_mm512_fmadd_ps(g[1],h[1],_mm512_mul_ps(g[0],h[0])),_mm512_fmadd_ps(g[3],h[3],_mm512_mul_ps(g[2],h[2])));
          _mm512_store_ps(s1+j,_mm512_add_ps(_mm512_load_ps(s1+j),G)); _mm512_store_ps(s2+j,_mm512_add_ps(_mm512_load_ps(s2+j),P)); _mm512_store_ps(s3+j,_mm512_add_ps(_mm512_load_ps(s3+j),H));}}}
     else if(mode==9){ long pfd=atol(getenv("PFD")?getenv("PFD"):"4096")/4; for(size_t q=r0;q<r1;q++){ const float*a=x+q*C,*b=y+q*C;
        for(long j=0;j<C;j+=16){ if(pfd){_mm_prefetch((const char*)(a+j+pfd),_MM_HINT_T0);_mm_prefetch((const char*)(b+j+pfd),_MM_HINT_T0);}
          __m512 h=_mm512_fmadd_ps(_mm512_load_ps(a+j),_mm512_load_ps(k+j),_mm512_load_ps(k+C+j)); __m512 g=_mm512_load_ps(b+j);
          _mm512_store_ps(s1+j,_mm512_add_ps(_mm512_load_ps(s1+j),g)); _mm512_store_ps(s2+j,_mm512_fmadd_ps(g,h,_mm512_load_ps(s2+j))); _mm512_store_ps(s3+j,_mm512_add_ps(_mm512_load_ps(s3+j),h));}}}
     else if(mode==10||mode==11){ const int Q=mode==10?2:4; size_t q=r0; for(;q+4*Q<=r1;q+=4*Q){ const float*a=x+q*C,*b=y+q*C;
        for(long j=0;j<C;j+=16){ __m512 xs=_mm512_load_ps(k+j),xo=_mm512_load_ps(k+C+j); __m512 A=_mm512_load_ps(s1+j),B=_mm512_load_ps(s2+j),D=_mm512_load_ps(s3+j);
          for(int u=0;u<Q;u++){ const float*aa=a+4*u*C,*bb=b+4*u*C; __m512 h[4],g[4];
            for(int v=0;v<4;v++){h[v]=_mm512_fmadd_ps(_mm512_load_ps(aa+v*C+j),xs,xo); g[v]=_mm512_load_ps(bb+v*C+j);}
            A=_mm512_add_ps(A,_mm512_add_ps(_mm512_add_ps(g[0],g[1]),_mm512_add_ps(g[2],g[3])));
            B=_mm512_add_ps(B,_mm512_add_ps(_mm512_fmadd_ps(g[1],h[1],_mm512_mul_ps(g[0],h[0])),_mm512_fmadd_ps(g[3],h[3],_mm512_mul_ps(g[2],h[2]))));
            D=_mm512_add_ps(D,_mm512_add_ps(_mm512_add_ps(h[0],h[1]),_mm512_add_ps(h[2],h[3])));}
          _mm512_store_ps(s1+j,A);_mm512_store_ps(s2+j,B);_mm512_store_ps(s3+j,D);}}}
     else if(mode==7){ size_t q=r0; for(;q+8<=r1;q+=8){ const float*a=x+q*C,*b=y+q*C;
        for(long j=0;j<C;j+=16){ __m512 xs=_mm512_load_ps(k+j),xo=_mm512_load_ps(k+C+j); __m512 h[8],g[8];
          for(int u=0;u<8;u++){h[u]=_mm512_fmadd_ps(_mm512_load_ps(a+u*C+j),xs,xo); g[u]=_mm512_load_ps(b+u*C+j);}
          __m512 G=_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(g[0],g[1]),_mm512_add_ps(g[2],g[3])),_mm512_add_ps(_mm512_add_ps(g[4],g[5]),_mm512_add_ps(g[6],g[7])));
          __m512 H=_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(h[0],h[1]),_mm512_add_ps(h[2],h[3])),_mm512_add_ps(_mm512_add_ps(h[4],h[5]),_mm512_add_ps(h[6],h[7])));
          __m512 P=_mm512_add_ps(_mm512_fmadd_ps(g[0],h[0],_mm512_fmadd_ps(g[1],h[1],_mm512_fmadd_ps(g[2],h[2],_mm512_mul_ps(g[3],h[3])))),_mm512_fmadd_ps(g[4],h[4],_mm512_fmadd_ps(g[5],h[5],_mm512_fmadd_ps(g[6],h[6],_mm512_mul_ps(g[7],h[7])))));
          _mm512_store_ps(s1+j,_mm512_add_ps(_mm512_load_ps(s1+j),G)); _mm512_store_ps(s2+j,_mm512_add_ps(_mm512_load_ps(s2+j),P)); _mm512_store_ps(s3+j,_mm512_add_ps(_mm512_load_ps(s3+j),H));}}}
     else { __m512 a0=_mm512_setzero_ps(),a1=a0; for(size_t i=r0*C;i<r1*C;i+=32){a0=_mm512_fmadd_ps(_mm512_load_ps(x+i),_mm512_load_ps(y+i),a0);a1=_mm512_fmadd_ps(_mm512_load_ps(x+i+16),_mm512_load_ps(y+i+16),a1);} s1[0]=a0[0]+a1[0]; }
     sink+=s1[0]+s2[0]+s3[0]; free(s);}
    t[r]=now()-t0;}
  for(int i=0;i<21;i++)for(int j=i+1;j<21;j++)if(t[j]<t[i]){double q=t[i];t[i]=t[j];t[j]=q;}
  printf("C %ld mode %d: median %.3f ms  %.1f GB/s (%g)\n",C,mode,t[10]*1e3,n*8.0/t[10]/1e9,(double)sink);
}
