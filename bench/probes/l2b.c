/* l2b ROWS C mode: 2 threads, each the sums + apply of its half of the channels of every row
   mode 0: shared arrays (rows of C, halves interleaved); 1: separate arrays per thread (rows of C/2);
   2: shared arrays, threads take halves of the rows instead; 3: channel halves for the sums,
   then (after a barrier) row halves for the apply; 4: row halves for both, with the barrier */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){ long R=atol(argv[1]),C=atol(argv[2]); int mode=atoi(argv[3]); int nth=argc>4?atoi(argv[4]):2;
  size_t n=R*C; float *X=aligned_alloc(4096,n*4),*Y=aligned_alloc(4096,n*4),*Z=aligned_alloc(4096,n*4);
  float *xs[2],*ys[2],*zs[2]; for(int t=0;t<2;t++){xs[t]=aligned_alloc(4096,n*2);ys[t]=aligned_alloc(4096,n*2);zs[t]=aligned_alloc(4096,n*2);for(size_t i=0;i<n/2;i++){xs[t][i]=1;ys[t][i]=2;zs[t][i]=0;}}
  for(size_t i=0;i<n;i++){X[i]=1;Y[i]=2;Z[i]=0;}
  static double ts[4000]; for(int r=0;r<4000;r++){ double t0=now();
    #pragma omp parallel num_threads(nth)
    { int t=omp_get_thread_num(); long h=C/2;
      for(int part=(nth==1?0:t); part<(nth==1?2:t+1); part++){
      const float *a,*b; float *c; long ld, c0, rows0=0, rows1=R, w=h;
      if(mode==0){a=X;b=Y;c=Z;ld=C;c0=part*h;} else if(mode==1){a=xs[part];b=ys[part];c=zs[part];ld=h;c0=0;} else if(mode==3){a=X;b=Y;c=Z;ld=C;c0=part*h;} else {a=X;b=Y;c=Z;ld=C;c0=0;w=C;rows0=R*part/2;rows1=R*(part+1)/2;}
      __m512 acc[40]; for(int k=0;k<w/16&&k<40;k++)acc[k]=_mm512_setzero_ps();
      for(long q=rows0;q<rows1;q++) for(long j=0;j<w;j+=16){ size_t e=q*ld+c0+j; acc[(j/16)%40]=_mm512_fmadd_ps(_mm512_load_ps(a+e),_mm512_load_ps(b+e),acc[(j/16)%40]); }
      if(mode>=3){ 
        #pragma omp barrier
        c0=0;w=C;rows0=R*part/2;rows1=R*(part+1)/2; }
      __m512 k=_mm512_set1_ps(0.5f), s=acc[0];
      for(long q=rows0;q<rows1;q++) for(long j=0;j<w;j+=16){ size_t e=q*ld+c0+j; _mm512_store_ps(c+e,_mm512_fmadd_ps(_mm512_load_ps(a+e),k,_mm512_mul_ps(s,_mm512_load_ps(b+e)))); }
      }
    }
    ts[r]=now()-t0;}
  qsort(ts,4000,8,cmp); printf("R %ld C %ld mode %d threads %d: median %.2f us\n",R,C,mode,nth,ts[2000]*1e6); }
