/* red2 MB C MODE [PFD]: 2 threads, the backward's sums over two MB-MiB tensors of rows of C f32,
   variants of the walk (PFD: prefetch distance in bytes, default 4096)
   1: a row at a time, sums in L1 (as red's mode 1)   8: sums in registers (wrong sums: timing only)
   9: a row at a time + prefetcht0 PFD bytes ahead on both tensors   10: the same with prefetcht2
   11: rows by fours + the prefetch PFD ahead   12: a plain read
   13: a row at a time with the rows-by-fours arithmetic in nine L1 arrays (the kernels' bwd_seq_row)
       + the prefetch PFD ahead */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t n=(size_t)atol(argv[1])<<18; long C=atol(argv[2]); int mode=atoi(argv[3]); long pfd=argc>4?atol(argv[4]):4096;
  size_t rows=n/C; n=rows*C;
  float*x=aligned_alloc(64,n*4+(1<<20)),*y=aligned_alloc(64,n*4+(1<<20));
  float*k=aligned_alloc(64,2*C*4); for(long i=0;i<2*C;i++)k[i]=0.5f;
  #pragma omp parallel for
  for(size_t i=0;i<n;i++){x[i]=1;y[i]=2;}
  double t[21]; float sink=0;
  for(int r=0;r<21;r++){double t0=now();
    #pragma omp parallel reduction(+:sink)
    {int th=omp_get_thread_num(),nt=omp_get_num_threads();size_t r0=rows*th/nt,r1=rows*(th+1)/nt;
     float *s=aligned_alloc(64,3*C*4); for(long j=0;j<3*C;j++)s[j]=0;
     float *s1=s,*s2=s+C,*s3=s+2*C;
     if(mode==1||mode==9||mode==10){ for(size_t q=r0;q<r1;q++){ const float*a=x+q*C,*b=y+q*C;
        for(long j=0;j<C;j+=16){
          if(mode==9){_mm_prefetch((const char*)(a+j)+pfd,_MM_HINT_T0);_mm_prefetch((const char*)(b+j)+pfd,_MM_HINT_T0);}
          if(mode==10){_mm_prefetch((const char*)(a+j)+pfd,_MM_HINT_T2);_mm_prefetch((const char*)(b+j)+pfd,_MM_HINT_T2);}
          __m512 h=_mm512_fmadd_ps(_mm512_load_ps(a+j),_mm512_load_ps(k+j),_mm512_load_ps(k+C+j)); __m512 g=_mm512_load_ps(b+j);
          _mm512_store_ps(s1+j,_mm512_add_ps(_mm512_load_ps(s1+j),g)); _mm512_store_ps(s2+j,_mm512_fmadd_ps(g,h,_mm512_load_ps(s2+j))); _mm512_store_ps(s3+j,_mm512_add_ps(_mm512_load_ps(s3+j),h));}}}
     else if(mode==8){ __m512 A[4],B[4],D[4]; for(int u=0;u<4;u++){A[u]=B[u]=D[u]=_mm512_setzero_ps();}
        for(size_t q=r0;q<r1;q++){ const float*a=x+q*C,*b=y+q*C;
        for(long j=0;j<C;j+=64){
          for(int u=0;u<4;u++){ __m512 h=_mm512_fmadd_ps(_mm512_load_ps(a+j+16*u),_mm512_load_ps(k+j+16*u),_mm512_load_ps(k+C+j+16*u)); __m512 g=_mm512_load_ps(b+j+16*u);
          A[u]=_mm512_add_ps(A[u],g); B[u]=_mm512_fmadd_ps(g,h,B[u]); D[u]=_mm512_add_ps(D[u],h);}}}
        for(int u=0;u<4;u++){_mm512_store_ps(s1+16*u,A[u]);_mm512_store_ps(s2+16*u,B[u]);_mm512_store_ps(s3+16*u,D[u]);}}
     else if(mode==11){ for(size_t q=r0;q+4<=r1;q+=4){ const float*a=x+q*C,*b=y+q*C;
      for(long j=0;j<C;j+=16){
      _mm_prefetch((const char*)(a+j)+pfd,_MM_HINT_T0);_mm_prefetch((const char*)(b+j)+pfd,_MM_HINT_T0);
      _mm_prefetch((const char*)(a+C+j)+pfd,_MM_HINT_T0);_mm_prefetch((const char*)(b+C+j)+pfd,_MM_HINT_T0);
      _mm_prefetch((const char*)(a+2*C+j)+pfd,_MM_HINT_T0);_mm_prefetch((const char*)(b+2*C+j)+pfd,_MM_HINT_T0);
      _mm_prefetch((const char*)(a+3*C+j)+pfd,_MM_HINT_T0);_mm_prefetch((const char*)(b+3*C+j)+pfd,_MM_HINT_T0);
      const __m512 xs = _mm512_load_ps(k + j), xo = _mm512_load_ps(k + C + j);
      const __m512 h0 = _mm512_fmadd_ps(_mm512_load_ps(a + j), xs, xo);
      const __m512 h1 = _mm512_fmadd_ps(_mm512_load_ps(a + C + j), xs, xo);
      const __m512 h2 = _mm512_fmadd_ps(_mm512_load_ps(a + 2 * C + j), xs, xo);
      const __m512 h3 = _mm512_fmadd_ps(_mm512_load_ps(a + 3 * C + j), xs, xo);
      const __m512 g0 = _mm512_load_ps(b + j), g1 = _mm512_load_ps(b + C + j);
      const __m512 g2 = _mm512_load_ps(b + 2 * C + j), g3 = _mm512_load_ps(b + 3 * C + j);
      _mm512_store_ps(s1 + j, _mm512_add_ps(_mm512_load_ps(s1 + j), _mm512_add_ps(_mm512_add_ps(g0, g1), _mm512_add_ps(g2, g3))));
      _mm512_store_ps(s2 + j, _mm512_add_ps(_mm512_load_ps(s2 + j), _mm512_fmadd_ps(g0, h0, _mm512_fmadd_ps(g1, h1, _mm512_fmadd_ps(g2, h2, _mm512_mul_ps(g3, h3))))));
      _mm512_store_ps(s3 + j, _mm512_add_ps(_mm512_load_ps(s3 + j), _mm512_add_ps(_mm512_add_ps(h0, h1), _mm512_add_ps(h2, h3))));
      }}}
     else if(mode==13){ float *w=aligned_alloc(64,9*C*4); for(long j=0;j<9*C;j++)w[j]=0;
        float *p1=w+3*C,*p2=w+4*C,*p3=w+5*C,*q1=w+6*C,*q2=w+7*C,*q3=w+8*C; s1=w;s2=w+C;s3=w+2*C;
        for(size_t qq=r0;qq<r1;qq++){ const float*a=x+qq*C,*b=y+qq*C; int q=(int)((qq-r0)&3);
        for(long j=0;j<C;j+=16){
          _mm_prefetch((const char*)(a+j)+pfd,_MM_HINT_T0);_mm_prefetch((const char*)(b+j)+pfd,_MM_HINT_T0);
          __m512 xh=_mm512_fmadd_ps(_mm512_load_ps(a+j),_mm512_load_ps(k+j),_mm512_load_ps(k+C+j)); __m512 g=_mm512_load_ps(b+j);
          if(q==0){_mm512_store_ps(p1+j,g);_mm512_store_ps(p2+j,_mm512_mul_ps(g,xh));_mm512_store_ps(p3+j,xh);}
          else if(q==1){_mm512_store_ps(p1+j,_mm512_add_ps(_mm512_load_ps(p1+j),g));_mm512_store_ps(p2+j,_mm512_fmadd_ps(g,xh,_mm512_load_ps(p2+j)));_mm512_store_ps(p3+j,_mm512_add_ps(_mm512_load_ps(p3+j),xh));}
          else if(q==2){_mm512_store_ps(q1+j,g);_mm512_store_ps(q2+j,_mm512_mul_ps(g,xh));_mm512_store_ps(q3+j,xh);}
          else {_mm512_store_ps(s1+j,_mm512_add_ps(_mm512_load_ps(s1+j),_mm512_add_ps(_mm512_load_ps(p1+j),_mm512_add_ps(_mm512_load_ps(q1+j),g))));
                _mm512_store_ps(s2+j,_mm512_add_ps(_mm512_load_ps(s2+j),_mm512_add_ps(_mm512_load_ps(p2+j),_mm512_fmadd_ps(g,xh,_mm512_load_ps(q2+j)))));
                _mm512_store_ps(s3+j,_mm512_add_ps(_mm512_load_ps(s3+j),_mm512_add_ps(_mm512_load_ps(p3+j),_mm512_add_ps(_mm512_load_ps(q3+j),xh))));}
        }} s=w; }
     else { __m512 a0=_mm512_setzero_ps(),a1=a0; for(size_t i=r0*C;i<r1*C;i+=32){a0=_mm512_fmadd_ps(_mm512_load_ps(x+i),_mm512_load_ps(y+i),a0);a1=_mm512_fmadd_ps(_mm512_load_ps(x+i+16),_mm512_load_ps(y+i+16),a1);} s1[0]=a0[0]+a1[0]; }
     sink+=s1[0]+s2[0]+s3[0]; free(s);}
    t[r]=now()-t0;}
  for(int i=0;i<21;i++)for(int j=i+1;j<21;j++)if(t[j]<t[i]){double q=t[i];t[i]=t[j];t[j]=q;}
  printf("C %ld mode %d pfd %ld: median %.3f ms  %.1f GB/s (%g)\n",C,mode,pfd,t[10]*1e3,n*8.0/t[10]/1e9,(double)sink);
}
