/* st MB C MODE REPS: the training forward's one-pass statistics as stand-alone loops over an
   MB-MiB tensor of rows of C f32 channels (C a multiple of 64), 2 threads, each thread its half
   of the rows in blocks of B rows (env B, 128), a 64-channel strip at a time with its sums in
   registers, as the kernels' strips: 0 a plain read in that order, 1 steps of 8 rows (two fours
   combined pairwise), 2 a row at a time, 3 steps of 4 rows, 4 and 5 four or two rows loaded in
   address order first.  Median and minimum of REPS (at most 1000).  B=1000000 walks rows of 64
   channels in address order.  Build: cc -O2 -march=native -fopenmp bench/probes/st.c -o /tmp/st */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec*1e-6;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
#define NV 4
int main(int argc,char**argv){
  size_t mb=atol(argv[1]); long C=atol(argv[2]); int mode=atoi(argv[3]); int reps=atoi(argv[4]); if(reps>1000)reps=1000; if(reps<1)reps=1;
  size_t tot=mb<<18, rows=tot/C;
  float *x=aligned_alloc(64,tot*4); for(size_t i=0;i<tot;i++) x[i]=(float)((i*2654435761u)%1000)/500.f-1;
  double t[1000]; volatile float sink;
  for(int r=0;r<reps;r++){
    double t0=now(); float acc=0;
    #pragma omp parallel reduction(+:acc)
    {int th=omp_get_thread_num(),nt=omp_get_num_threads(); size_t R0=rows*th/nt/8*8, R1=rows*(th+1)/nt/8*8; long B=getenv("B")?atol(getenv("B")):128;
     for(size_t b0=R0;b0<R1;b0+=B) for(long s0=0;s0<C;s0+=64){ size_t r0=b0, r1=b0+B<R1?b0+B:R1; const float*xs=x+s0;
     __m512 A[NV],Q[NV],K[NV]; const float *x=xs;
     for(int v=0;v<NV;v++){A[v]=Q[v]=_mm512_setzero_ps();K[v]=_mm512_set1_ps(0.1f*v);}
     if(mode==0){ for(size_t q=r0;q<r1;q++){for(int v=0;v<NV;v++)A[v]=_mm512_add_ps(A[v],_mm512_load_ps(x+q*C+16*v));}}
     else if(mode==1){ /* 8-row pairwise steps, indexed rows */
       for(size_t q=r0;q<r1;q+=8){ const float*p=x+q*C;
         for(int v=0;v<NV;v++){ __m512 a4[2],q4[2];
           for(int h=0;h<2;h++){ const float*f=p+4*h*C+16*v;
             __m512 d0=_mm512_sub_ps(_mm512_load_ps(f),K[v]),d1=_mm512_sub_ps(_mm512_load_ps(f+C),K[v]),d2=_mm512_sub_ps(_mm512_load_ps(f+2*C),K[v]),d3=_mm512_sub_ps(_mm512_load_ps(f+3*C),K[v]);
             a4[h]=_mm512_add_ps(_mm512_add_ps(d0,d1),_mm512_add_ps(d2,d3));
             q4[h]=_mm512_add_ps(_mm512_fmadd_ps(d1,d1,_mm512_mul_ps(d0,d0)),_mm512_fmadd_ps(d3,d3,_mm512_mul_ps(d2,d2)));}
           A[v]=_mm512_add_ps(A[v],_mm512_add_ps(a4[0],a4[1])); Q[v]=_mm512_add_ps(Q[v],_mm512_add_ps(q4[0],q4[1]));}}}
     else if(mode==2){ /* 1 row per step, straight */
       for(size_t q=r0;q<r1;q++){ const float*p=x+q*C;
         for(int v=0;v<NV;v++){ __m512 d=_mm512_sub_ps(_mm512_load_ps(p+16*v),K[v]); A[v]=_mm512_add_ps(A[v],d); Q[v]=_mm512_fmadd_ps(d,d,Q[v]);}}}
     else if(mode==3){ /* 4-row steps */
       for(size_t q=r0;q<r1;q+=4){ const float*p=x+q*C;
         for(int v=0;v<NV;v++){ const float*f=p+16*v;
             __m512 d0=_mm512_sub_ps(_mm512_load_ps(f),K[v]),d1=_mm512_sub_ps(_mm512_load_ps(f+C),K[v]),d2=_mm512_sub_ps(_mm512_load_ps(f+2*C),K[v]),d3=_mm512_sub_ps(_mm512_load_ps(f+3*C),K[v]);
           A[v]=_mm512_add_ps(A[v],_mm512_add_ps(_mm512_add_ps(d0,d1),_mm512_add_ps(d2,d3)));
           Q[v]=_mm512_add_ps(Q[v],_mm512_add_ps(_mm512_fmadd_ps(d1,d1,_mm512_mul_ps(d0,d0)),_mm512_fmadd_ps(d3,d3,_mm512_mul_ps(d2,d2))));}}}
     if(mode==4){ for(size_t q=r0;q<r1;q+=4){ const float*p=x+q*C; __m512 D[4][NV];
         for(int rr=0;rr<4;rr++) for(int v=0;v<NV;v++) D[rr][v]=_mm512_sub_ps(_mm512_load_ps(p+rr*C+16*v),K[v]);
         for(int v=0;v<NV;v++){ A[v]=_mm512_add_ps(A[v],_mm512_add_ps(_mm512_add_ps(D[0][v],D[1][v]),_mm512_add_ps(D[2][v],D[3][v])));
           Q[v]=_mm512_add_ps(Q[v],_mm512_add_ps(_mm512_fmadd_ps(D[1][v],D[1][v],_mm512_mul_ps(D[0][v],D[0][v])),_mm512_fmadd_ps(D[3][v],D[3][v],_mm512_mul_ps(D[2][v],D[2][v]))));}}}
     if(mode==5){ for(size_t q=r0;q<r1;q+=2){ const float*p=x+q*C; __m512 D[2][NV];
         for(int rr=0;rr<2;rr++) for(int v=0;v<NV;v++) D[rr][v]=_mm512_sub_ps(_mm512_load_ps(p+rr*C+16*v),K[v]);
         for(int v=0;v<NV;v++){ A[v]=_mm512_add_ps(A[v],_mm512_add_ps(D[0][v],D[1][v]));
           Q[v]=_mm512_add_ps(Q[v],_mm512_fmadd_ps(D[1][v],D[1][v],_mm512_mul_ps(D[0][v],D[0][v])));}}}
     for(int v=0;v<NV;v++) acc+=_mm512_reduce_add_ps(_mm512_add_ps(A[v],Q[v]));}}
    sink=acc; t[r]=now()-t0;
  }
  qsort(t,reps,8,cmp); printf("mode %d C %ld: median %.3f min %.3f ms\n",mode,C,t[reps/2],t[0]); return 0;}
