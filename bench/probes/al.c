/* al N C S OFFDY OFFDX: backward NHWC f32 with dy and dx placed OFFDY / OFFDX bytes past x's
   4 KiB offset (all three in one arena), median of 2000 calls (ms) */
#include <norma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec*1e-6;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  long n=atol(argv[1]),c=atol(argv[2]),s=atol(argv[3]); long od=atol(argv[4]), ox=atol(argv[5]);
  size_t tot=(size_t)n*c*s, tb=(tot*4+4095)/4096*4096+8192;
  char*arena=aligned_alloc(4096,3*tb+65536);
  float*x=(float*)(arena), *dy=(float*)(arena+tb+od), *dx=(float*)(arena+2*tb+ox);
  for(size_t i=0;i<tot;i++){x[i]=(float)((i*2654435761u)%1000)/500.f-1; dy[i]=(float)((i*40503u)%997)/498.f-1; dx[i]=0;}
  norma_bn_desc d={n,c,s,NORMA_CHANNELS_LAST,NORMA_F32,1e-5,0};
  float*g=malloc(c*4),*b=malloc(c*4),*m=malloc(c*4),*iv=malloc(c*4),*dg=malloc(c*4),*db=malloc(c*4);
  for(long j=0;j<c;j++){g[j]=1;b[j]=0;m[j]=0.01f;iv[j]=1.5f;}
  static double t[2000];
  for(int r=0;r<200;r++) norma_bn_backward(&d,x,NULL,dy,g,b,m,iv,dx,NULL,dg,db);
  for(int r=0;r<2000;r++){double t0=now(); norma_bn_backward(&d,x,NULL,dy,g,b,m,iv,dx,NULL,dg,db); t[r]=now()-t0;}
  qsort(t,2000,8,cmp); printf("off dy %ld dx %ld: %.4f ms\n",od,ox,t[1000]); return 0;}
