/* splitscan N C S [reps]: the whole training forward and backward against the split API doing the
   same work (norma_bn_moments + norma_bn_stats_from_moments + norma_bn_forward_apply;
   norma_bn_backward_reduce + norma_bn_backward_apply), each timed in blocks of repeated calls
   (two blocks per variant, medians), so that each finds the caches as its own last call left
   them.  A ratio well above 1 marks a plan the whole call could improve on (it found the
   16-bit backward apply of the eighteenth session).  DT=bf16|f16, CF=1 for NCHW. */
#include <norma.h>
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec*1e-6;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  long n=atol(argv[1]),c=atol(argv[2]),s=atol(argv[3]);int reps=argc>4?atoi(argv[4]):9;
  const char*dt=getenv("DT"); norma_dtype d16=dt&&!strcmp(dt,"bf16")?NORMA_BF16:dt&&!strcmp(dt,"f16")?NORMA_F16:NORMA_F32; int es=d16==NORMA_F32?4:2;
  norma_bn_desc d={n,c,s,getenv("CF")?NORMA_CHANNELS_FIRST:NORMA_CHANNELS_LAST,d16,1e-5,0};
  size_t tot=(size_t)n*c*s;
  char *x=aligned_alloc(64,tot*4),*dy=aligned_alloc(64,tot*4),*dx=aligned_alloc(64,tot*4),*y=aligned_alloc(64,tot*4);
  for(size_t i=0;i<tot;i++){float a=(float)((i*2654435761u)%1000)/500.f-1,b=(float)((i*40503u)%777)/388.f-1;
    if(es==4){((float*)x)[i]=a;((float*)dy)[i]=b;} else {unsigned u; memcpy(&u,&a,4); ((unsigned short*)x)[i]=d16==NORMA_BF16?u>>16:_cvtss_sh(a,0); memcpy(&u,&b,4); ((unsigned short*)dy)[i]=d16==NORMA_BF16?u>>16:_cvtss_sh(b,0);}}
  memset(dx,0,tot*4); memset(y,0,tot*4);
  float *mean=calloc(c,4),*inv=malloc(c*4),*dg=malloc(c*4),*db=malloc(c*4);
  double *s1=malloc(c*8),*s2=malloc(c*8),*s3=malloc(c*8),*mm=malloc(c*8),*ii=malloc(c*8),*m2=malloc(c*8); int64_t*cnt=malloc(c*8);
  norma_bn_forward_training(&d,x,NULL,NULL,NULL,y,mean,inv,NULL,NULL,0.1);
  double tf[100],ts[100],tb[100],tr[100];
  for(int blk=0;blk<2;blk++){ int r0=blk*(reps/2), r1=blk?reps:reps/2;
  for(int r=r0;r<r1;r++){double t0=now();norma_bn_forward_training(&d,x,NULL,NULL,NULL,y,mean,inv,NULL,NULL,0.1);tf[r]=now()-t0;}
  for(int r=r0;r<r1;r++){double t0=now();norma_bn_moments(&d,x,cnt,mm,m2);norma_bn_stats_from_moments(&d,cnt,mm,m2,mm,ii,NULL,NULL,NULL,NULL,0.1);norma_bn_forward_apply(&d,x,NULL,NULL,NULL,mm,ii,y);ts[r]=now()-t0;}
  for(int r=r0;r<r1;r++){double t0=now();norma_bn_backward(&d,x,NULL,dy,NULL,NULL,mean,inv,dx,NULL,dg,db);tb[r]=now()-t0;}
  for(long j=0;j<c;j++){mm[j]=mean[j];ii[j]=inv[j];}
  for(int r=r0;r<r1;r++){double t0=now();norma_bn_backward_reduce(&d,x,NULL,dy,NULL,NULL,mm,ii,s1,s2,s3);norma_bn_backward_apply(&d,x,NULL,dy,NULL,NULL,mm,ii,s1,s2,s3,n*s,dx,NULL);tr[r]=now()-t0;}
  }
  qsort(tf,reps,8,cmp);qsort(ts,reps,8,cmp);qsort(tb,reps,8,cmp);qsort(tr,reps,8,cmp);
  int m=reps/2;
  printf("%s %s %ldx%ldx%ld  fwd %.3f split %.3f (%.2f)  bwd %.3f split %.3f (%.2f)%s\n",getenv("CF")?"nchw":"nhwc",dt?dt:"f32",n,c,s,tf[m],ts[m],tf[m]/ts[m],tb[m],tr[m],tb[m]/tr[m],(tf[m]/ts[m]>1.12||tb[m]/tr[m]>1.12)?"  <<":"");
  return 0;}
