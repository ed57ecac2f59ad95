/* wap N C S MODE REPS: the inference apply of NHWC f32 rows of C channels (N*S rows), 2 threads,
   one MODE repeated REPS times, its median: 0 norma_bn_forward_inference; stand-alone loops a
   row at a time: 1 three per-channel constants from L1, plain stores; 2 the same, streaming
   stores; 3 two constants, streaming; 4 constants in registers, streaming (a copy's floor);
   5 constants in registers, plain stores; 7 tiles of T rows (env T, 16) x 128 channels, the
   constants in registers, plain stores; 8 two rows at a time, constants from L1, plain.
   OFF=k moves the constant arrays k floats past a page.  Build: cc -O2 -march=native -fopenmp
   -Iinclude bench/probes/wap.c -Lbuild -lnorma -o /tmp/wap */
#include <norma.h>
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec*1e-6;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  long n=atol(argv[1]),c=atol(argv[2]),s=atol(argv[3]);int mode=atoi(argv[4]);int reps=atoi(argv[5]); if(reps>1000)reps=1000; if(reps<1)reps=1;
  norma_bn_desc d={n,c,s,NORMA_CHANNELS_LAST,NORMA_F32,1e-5,0};
  size_t tot=(size_t)n*c*s, rows=n*s;
  float *x=aligned_alloc(64,tot*4),*y=aligned_alloc(64,tot*4);
  for(size_t i=0;i<tot;i++){x[i]=(float)((i*2654435761u)%1000)/500.f-1;y[i]=0;}
  float *rm=malloc(c*4),*rv=malloc(c*4),*g=malloc(c*4),*b=malloc(c*4);
  long off=getenv("OFF")?atol(getenv("OFF")):0; float *M=(float*)aligned_alloc(4096,c*4+8192)+off,*S=(float*)aligned_alloc(4096,c*4+8192)+off,*H=(float*)aligned_alloc(4096,c*4+8192)+off;
  for(long j=0;j<c;j++){rm[j]=0.1;rv[j]=1.3;g[j]=1;b[j]=0;M[j]=0.1;S[j]=0.9;H[j]=0.01;}
  double t[1000];
  for(int r=0;r<reps;r++){
    double t0=now();
    if(mode==0) norma_bn_forward_inference(&d,x,NULL,g,b,rm,rv,y);
    else {
    #pragma omp parallel
    {int th=omp_get_thread_num(),nt=omp_get_num_threads();size_t r0=rows*th/nt,r1=rows*(th+1)/nt;
     __m512 a=_mm512_set1_ps(1.5f),bb=_mm512_set1_ps(0.5f);
     if(mode==7||mode==9){ long T=getenv("T")?atol(getenv("T")):16;
       for(size_t q0=r0;q0<r1;q0+=T){size_t q1=q0+T<r1?q0+T:r1;
         for(long j0=0;j0<c;j0+=128){ __m512 m[8],sc[8],h[8];
           for(int v=0;v<8;v++){m[v]=_mm512_load_ps(M+j0+16*v);sc[v]=_mm512_load_ps(S+j0+16*v);h[v]=_mm512_load_ps(H+j0+16*v);}
           for(size_t rr=q0;rr<q1;rr++){const float*xr=x+rr*c+j0;float*yr=y+rr*c+j0;
             for(int v=0;v<8;v++){__m512 o=_mm512_fmadd_ps(_mm512_sub_ps(_mm512_loadu_ps(xr+16*v),m[v]),sc[v],h[v]); if(mode==7)_mm512_storeu_ps(yr+16*v,o); else _mm512_stream_ps(yr+16*v,o);}}}}
       _mm_sfence(); } else
     if(mode==8){ for(size_t rr=r0;rr+1<r1;rr+=2){const float*xr=x+rr*c;float*yr=y+rr*c;
       for(long j=0;j<c;j+=16){__m512 mm=_mm512_load_ps(M+j),ss=_mm512_load_ps(S+j),hh=_mm512_load_ps(H+j);
         _mm512_storeu_ps(yr+j,_mm512_fmadd_ps(_mm512_sub_ps(_mm512_loadu_ps(xr+j),mm),ss,hh));
         _mm512_storeu_ps(yr+c+j,_mm512_fmadd_ps(_mm512_sub_ps(_mm512_loadu_ps(xr+c+j),mm),ss,hh));}}} else
     for(size_t rr=r0;rr<r1;rr++){const float*xr=x+rr*c;float*yr=y+rr*c;
       if(mode==1) for(long j=0;j<c;j+=16) _mm512_storeu_ps(yr+j,_mm512_fmadd_ps(_mm512_sub_ps(_mm512_loadu_ps(xr+j),_mm512_load_ps(M+j)),_mm512_load_ps(S+j),_mm512_load_ps(H+j)));
       else if(mode==2) for(long j=0;j<c;j+=16) _mm512_stream_ps(yr+j,_mm512_fmadd_ps(_mm512_sub_ps(_mm512_loadu_ps(xr+j),_mm512_load_ps(M+j)),_mm512_load_ps(S+j),_mm512_load_ps(H+j)));
       else if(mode==3) for(long j=0;j<c;j+=16) _mm512_stream_ps(yr+j,_mm512_fmadd_ps(_mm512_loadu_ps(xr+j),_mm512_load_ps(S+j),_mm512_load_ps(H+j)));
       else if(mode==5) for(long j=0;j<c;j+=16) _mm512_storeu_ps(yr+j,_mm512_fmadd_ps(_mm512_loadu_ps(xr+j),a,bb));
       else for(long j=0;j<c;j+=16) _mm512_stream_ps(yr+j,_mm512_fmadd_ps(_mm512_loadu_ps(xr+j),a,bb));
     }
     _mm_sfence();}}
    t[r]=now()-t0;
  }
  qsort(t,reps,8,cmp);
  printf("mode %d: median %.3f min %.3f ms (%.0f MB x)\n",mode,t[reps/2],t[0],tot*4/1e6);
  return 0;}
