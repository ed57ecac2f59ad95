/* bph N C S [reps]: NHWC (CF=1: NCHW) f32 backward: full / reduce / apply medians (ms) */
#include <norma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec*1e-6;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  long n=atol(argv[1]),c=atol(argv[2]),s=atol(argv[3]);int reps=argc>4?atoi(argv[4]):15;
  int bf=getenv("BF")!=NULL; int es=bf?2:4;
  norma_bn_desc d={n,c,s,getenv("CF")?NORMA_CHANNELS_FIRST:NORMA_CHANNELS_LAST,bf?NORMA_BF16:NORMA_F32,1e-5,0};
  size_t tot=(size_t)n*c*s;
  float *x=aligned_alloc(64,tot*4),*dy=aligned_alloc(64,tot*4),*dx=aligned_alloc(64,tot*4);
  for(size_t i=0;i<tot;i++){x[i]=(float)((i*2654435761u)%1000)/500.f-1;dy[i]=(float)((i*40503u)%777)/388.f-1;}
  if(bf){unsigned short*a=(void*)x,*b=(void*)dy;for(size_t i=0;i<tot;i++){unsigned u;memcpy(&u,&x[i],4);a[i]=u>>16;memcpy(&u,&dy[i],4);b[i]=u>>16;}}
  float *mean=calloc(c,4),*inv=malloc(c*4),*dg=malloc(c*4),*db=malloc(c*4);
  double *s1=malloc(c*8),*s2=malloc(c*8),*s3=malloc(c*8);
  for(long j=0;j<c;j++)inv[j]=1.7f;
  norma_bn_forward_training(&d,x,NULL,NULL,NULL,dx,mean,inv,NULL,NULL,0.1);
  double *mm=malloc(c*8),*ii=malloc(c*8);for(long j=0;j<c;j++){mm[j]=mean[j];ii[j]=inv[j];}
  double tf[400],tr[400],ta[400];
  for(int r=0;r<reps;r++){
    double t0=now();norma_bn_backward(&d,x,NULL,dy,NULL,NULL,mean,inv,dx,NULL,dg,db);tf[r]=now()-t0;
    t0=now();norma_bn_backward_reduce(&d,x,NULL,dy,NULL,NULL,mm,ii,s1,s2,s3);tr[r]=now()-t0;
    t0=now();norma_bn_backward_apply(&d,x,NULL,dy,NULL,NULL,mm,ii,s1,s2,s3,n*s,dx,NULL);ta[r]=now()-t0;
  }
  qsort(tf,reps,8,cmp);qsort(tr,reps,8,cmp);qsort(ta,reps,8,cmp);
  printf("bwd %.3f  reduce %.3f  apply %.3f ms  (%.0f MB x)\n",tf[reps/2],tr[reps/2],ta[reps/2],tot*es/1e6);
  return 0;}
