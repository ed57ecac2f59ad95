/* test_settings_race.c - the global settings under ThreadSanitizer: threads that set the thread
   count, the ISA cap and the reference switch while others read them (what every call does
   first).  Built with -fsanitize=thread from settings.c, cpu.c and status.c alone (no OpenMP,
   whose runtime TSan cannot see into); a data race makes TSan fail the run (exit status 66).
   Before the settings were atomics this reported "data race ... in norma__threads". */
#include <pthread.h>

#include "internal.h"
#include "test_util.h"

enum { ROUNDS = 20000 };

static void *setter(void *arg) {
  (void)arg;
  for (int i = 0; i < ROUNDS; i++) {
    norma_set_num_threads(i % 5);
    (void)norma_set_max_isa(i % 2 ? NORMA_ISA_SCALAR : NORMA_ISA_AVX2);
    norma_set_use_reference(i % 3 == 0);
  }
  return NULL;
}

static void *reader(void *arg) {
  long *bad = arg;
  for (int i = 0; i < ROUNDS; i++) {
    const int t = norma__threads();
    const norma_isa isa = norma__isa();
    const int ref = norma__use_reference();
    if (t < 1 || (t > 4 && t != norma_get_num_threads()) || (int)isa < 0 ||
        isa > NORMA_ISA_AVX2 || (ref != 0 && ref != 1))
      (*bad)++;
  }
  return NULL;
}

int main(void) {
  pthread_t s[2], r[2];
  long bad[2] = {0, 0};
  for (int i = 0; i < 2; i++) pthread_create(&s[i], NULL, setter, NULL);
  for (int i = 0; i < 2; i++) pthread_create(&r[i], NULL, reader, &bad[i]);
  for (int i = 0; i < 2; i++) pthread_join(s[i], NULL), pthread_join(r[i], NULL);
  TU_CHECK(bad[0] + bad[1] == 0, "%ld reads out of range", bad[0] + bad[1]);
  return tu_finish("test_settings_race");
}
