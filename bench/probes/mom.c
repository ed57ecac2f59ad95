/* mom N C S MODE REPS: one phase of NHWC f32 (CF=1: NCHW) BatchNorm repeated REPS times (at most
   1000), 2 threads, its median and minimum: 0 norma_bn_moments, 1 a plain read of x, 2
   norma_bn_forward_apply, 3 a copy with streaming stores (the apply's floor).  Unlike fph,
   each process runs one phase back to back, so the caches hold what that phase left.  Build:
   cc -O2 -march=native -fopenmp -Iinclude bench/probes/mom.c -Lbuild -lnorma -o /tmp/mom */
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
  norma_bn_desc d={n,c,s,getenv("CF")?NORMA_CHANNELS_FIRST:NORMA_CHANNELS_LAST,NORMA_F32,1e-5,0};
  size_t tot=(size_t)n*c*s;
  float *x=aligned_alloc(64,tot*4),*y=aligned_alloc(64,tot*4);
  for(size_t i=0;i<tot;i++){x[i]=(float)((i*2654435761u)%1000)/500.f-1;y[i]=0;}
  int64_t *cnt=malloc(c*8); double *mm=malloc(c*8),*m2=malloc(c*8),*dm=malloc(c*8),*di=malloc(c*8);
  for(long j=0;j<c;j++){dm[j]=0.1;di[j]=1.3;}
  double t[1000]; volatile float sink;
  for(int r=0;r<reps;r++){
    double t0=now();
    if(mode==0) norma_bn_moments(&d,x,cnt,mm,m2);
    else if(mode==2) norma_bn_forward_apply(&d,x,NULL,NULL,NULL,dm,di,y);
    else if(mode==1){ float acc=0;
    #pragma omp parallel reduction(+:acc)
    {int th=omp_get_thread_num(),nt=omp_get_num_threads();size_t i0=tot*th/nt/64*64,i1=th==nt-1?tot/32*32:tot*(th+1)/nt/64*64;
     __m512 s0=_mm512_setzero_ps(),s1=s0;
     for(size_t i=i0;i<i1;i+=32){s0=_mm512_add_ps(s0,_mm512_load_ps(x+i));s1=_mm512_add_ps(s1,_mm512_load_ps(x+i+16));}
     acc+=_mm512_reduce_add_ps(_mm512_add_ps(s0,s1));}
    sink=acc;}
    else {
    #pragma omp parallel
    {int th=omp_get_thread_num(),nt=omp_get_num_threads();size_t i0=tot*th/nt/64*64,i1=th==nt-1?tot/32*32:tot*(th+1)/nt/64*64;
     __m512 a=_mm512_set1_ps(1.5f),b=_mm512_set1_ps(0.5f);
     for(size_t i=i0;i<i1;i+=32){_mm512_stream_ps(y+i,_mm512_fmadd_ps(a,_mm512_load_ps(x+i),b));_mm512_stream_ps(y+i+16,_mm512_fmadd_ps(a,_mm512_load_ps(x+i+16),b));}
     _mm_sfence();}}
    t[r]=now()-t0;
  }
  qsort(t,reps,8,cmp);
  printf("mode %d: median %.3f min %.3f ms (%.0f MB x)\n",mode,t[reps/2],t[0],tot*4/1e6);
  return 0;}
