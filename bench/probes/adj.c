/* adj C S OFF: NHWC f32 1xSxC (S rows of C channels) with y placed OFF bytes from x (negative: before x):
   medians of 400 training forwards and inferences (ms), 2 threads by default */
#include <norma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec*1e-6;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){ long c=atol(argv[1]),s=atol(argv[2]); long off=atol(argv[3]); size_t tot=c*s;
  size_t span=tot*4*3+(labs(off))+65536; char*ar=aligned_alloc(4096,(span+4095)/4096*4096); memset(ar,0,span);
  char*base=ar+tot*4+32768; float*x=(float*)(base), *y=(float*)(base+off); float *dy=(float*)(ar+ (off<0? tot*8+65536+ (size_t)0 : 0)); (void)dy;
  float*g=calloc(c,4),*b=calloc(c,4),*m=calloc(c,4),*iv=calloc(c,4),*rm=calloc(c,4),*rv=calloc(c,4);
  for(size_t i=0;i<tot;i++)x[i]=(float)((i*2654435761u)%1000)/500.f-1;
  for(long j=0;j<c;j++){g[j]=1;iv[j]=1;}
  norma_bn_desc d={1,c,s,NORMA_CHANNELS_LAST,NORMA_F32,1e-5,0};
  static double t[3][400];
  for(int r=0;r<400;r++){double t0=now(); norma_bn_forward_training(&d,x,NULL,g,b,y,m,iv,rm,rv,0.1); double t1=now();
    norma_bn_forward_inference(&d,x,NULL,g,b,rm,rv,y); double t2=now(); t[0][r]=t1-t0; t[1][r]=t2-t1;}
  qsort(t[0],400,8,cmp); qsort(t[1],400,8,cmp);
  printf("y - x = %ld: train %.4f  infer %.4f ms\n",off,t[0][200],t[1][200]); return 0; }
