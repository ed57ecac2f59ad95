/* fph N C S [reps]: NHWC (CF=1: NCHW) f32 training forward: the whole call, norma_bn_moments alone,
   norma_bn_forward_apply alone, and two stand-alone loops over the same bytes (a plain read of
   x; y = a x + b with streaming stores): the forward's phases against their floors (medians, ms).
   The loops run after the calls in each repetition, so the first call of the next one finds y
   written around the cache: compare the phases with the floors, not the whole call with them. */
#include <norma.h>
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec*1e-6;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  long n=atol(argv[1]),c=atol(argv[2]),s=atol(argv[3]);int reps=argc>4?atoi(argv[4]):15;
  norma_bn_desc d={n,c,s,getenv("CF")?NORMA_CHANNELS_FIRST:NORMA_CHANNELS_LAST,NORMA_F32,1e-5,0};
  size_t tot=(size_t)n*c*s;
  float *x=aligned_alloc(64,tot*4),*y=aligned_alloc(64,tot*4);
  for(size_t i=0;i<tot;i++){x[i]=(float)((i*2654435761u)%1000)/500.f-1;y[i]=0;}
  float *mean=calloc(c,4),*inv=malloc(c*4);
  int64_t *cnt=malloc(c*8); double *mm=malloc(c*8),*m2=malloc(c*8),*dm=malloc(c*8),*di=malloc(c*8);
  for(long j=0;j<c;j++){dm[j]=0.1;di[j]=1.3;}
  double tf[400],tm[400],ta[400],tr[400],tc[400]; volatile float sink;
  for(int r=0;r<reps;r++){
    double t0=now();norma_bn_forward_training(&d,x,NULL,NULL,NULL,y,mean,inv,NULL,NULL,0.1);tf[r]=now()-t0;
    t0=now();norma_bn_moments(&d,x,cnt,mm,m2);tm[r]=now()-t0;
    t0=now();norma_bn_forward_apply(&d,x,NULL,NULL,NULL,dm,di,y);ta[r]=now()-t0;
    t0=now(); float acc=0;
    #pragma omp parallel reduction(+:acc)
    {int th=omp_get_thread_num(),nt=omp_get_num_threads();size_t i0=tot*th/nt/64*64,i1=th==nt-1?tot/32*32:tot*(th+1)/nt/64*64;
     __m512 s0=_mm512_setzero_ps(),s1=s0;
     for(size_t i=i0;i<i1;i+=32){s0=_mm512_add_ps(s0,_mm512_load_ps(x+i));s1=_mm512_add_ps(s1,_mm512_load_ps(x+i+16));}
     acc+=_mm512_reduce_add_ps(_mm512_add_ps(s0,s1));}
    sink=acc; tr[r]=now()-t0;
    t0=now();
    #pragma omp parallel
    {int th=omp_get_thread_num(),nt=omp_get_num_threads();size_t i0=tot*th/nt/64*64,i1=th==nt-1?tot/32*32:tot*(th+1)/nt/64*64;
     __m512 a=_mm512_set1_ps(1.5f),b=_mm512_set1_ps(0.5f);
     for(size_t i=i0;i<i1;i+=32){_mm512_stream_ps(y+i,_mm512_fmadd_ps(a,_mm512_load_ps(x+i),b));_mm512_stream_ps(y+i+16,_mm512_fmadd_ps(a,_mm512_load_ps(x+i+16),b));}
     _mm_sfence();}
    tc[r]=now()-t0;
  }
  qsort(tf,reps,8,cmp);qsort(tm,reps,8,cmp);qsort(ta,reps,8,cmp);qsort(tr,reps,8,cmp);qsort(tc,reps,8,cmp);
  printf("fwd %.3f  moments %.3f  apply %.3f  | read %.3f  nt-copy %.3f ms  (%.0f MB x)\n",tf[reps/2],tm[reps/2],ta[reps/2],tr[reps/2],tc[reps/2],tot*4/1e6);
  return 0;}
