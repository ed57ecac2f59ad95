/* main.c - the smallest real use of an installed norma: the version, then a training forward
   on a [2, 3, 4] f32 tensor whose statistics are known exactly.  Exits 0 when all is right. */
#include <stdio.h>
#include <string.h>

#include <norma.h>

int main(void) {
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", NORMA_VERSION_MAJOR, NORMA_VERSION_MINOR,
           NORMA_VERSION_PATCH);
  printf("norma %s (header %s), ISA %s\n", norma_version(), want, norma_isa_name(norma_get_isa()));
  if (strcmp(norma_version(), want) != 0) {
    fprintf(stderr, "library version %s does not match the header (%s)\n", norma_version(), want);
    return 1;
  }

  /* channel j holds j + {-1.5, -0.5, 0.5, 1.5} twice: mean j, biased variance 1.25 */
  enum { N = 2, C = 3, S = 4 };
  static const float d4[S] = {-1.5f, -0.5f, 0.5f, 1.5f};
  float x[N * C * S], y[N * C * S], mean[C], invstd[C], rmean[C] = {0}, rvar[C] = {1, 1, 1};
  for (int i = 0; i < N; i++)
    for (int j = 0; j < C; j++)
      for (int s = 0; s < S; s++) x[(i * C + j) * S + s] = (float)j + d4[(s + i) % S];
  const norma_bn_desc d = {N, C, S, NORMA_CHANNELS_FIRST, NORMA_F32, 0.0, 0};
  norma_status st = norma_bn_forward_training(&d, x, NULL, NULL, NULL, y, mean, invstd, rmean,
                                              rvar, 1.0);
  if (st != NORMA_OK) {
    fprintf(stderr, "norma_bn_forward_training: %s: %s\n", norma_status_string(st),
            norma_last_error());
    return 1;
  }
  int bad = 0;
  for (int j = 0; j < C; j++) {
    /* 1 / sqrt(1.25) = 0.894427191; running_var is unbiased: 1.25 * 8 / 7 */
    if (mean[j] != (float)j || invstd[j] < 0.8944271f || invstd[j] > 0.8944273f) bad++;
    if (rmean[j] != (float)j || rvar[j] < 1.4285713f || rvar[j] > 1.4285716f) bad++;
  }
  for (int k = 0; k < N * C * S; k++) {
    float want_y = (x[k] - (float)(k / S % C)) * 0.89442719f, e = y[k] - want_y;
    if (e > 1e-6f || e < -1e-6f) bad++;
  }
  /* and an error, reported as documented */
  const norma_bn_desc bad_d = {N, 0, S, NORMA_CHANNELS_FIRST, NORMA_F32, 0.0, 0};
  st = norma_bn_forward_inference(&bad_d, x, NULL, NULL, NULL, mean, rvar, y);
  if (st != NORMA_ERR_INVALID_ARGUMENT || strstr(norma_last_error(), "c") == NULL) bad++;
  printf("%s\n", bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}
