/* replay.c - runs a fuzz target over files and directories of inputs without libFuzzer (gcc
   or clang, any build): `fuzz_replay_<target> <file|dir>...`.  Each input runs once; a
   contract violation aborts (as under libFuzzer).  Prints "<n> inputs" and exits 0 when every
   input ran; 1 when no input was found (an empty corpus is a mistake). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* optional, as under libFuzzer (the MPI targets initialize MPI there) */
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static long g_inputs;

static int cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    exit(2);
  }
  size_t cap = 1 << 12, n = 0;
  uint8_t *buf = malloc(cap);
  for (;;) {
    if (n == cap) buf = realloc(buf, cap *= 2);
    size_t got = fread(buf + n, 1, cap - n, f);
    if (!got) break;
    n += got;
  }
  fclose(f);
  /* an exact-size copy, so that ASan sees reads past the end of the input */
  uint8_t *exact = malloc(n ? n : 1);
  memcpy(exact, buf, n);
  free(buf);
  LLVMFuzzerTestOneInput(exact, n);
  free(exact);
  g_inputs++;
}

static void run_path(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) {
    fprintf(stderr, "replay: no such file or directory: %s\n", path);
    exit(2);
  }
  if (!S_ISDIR(st.st_mode)) {
    run_file(path);
    return;
  }
  DIR *d = opendir(path);
  if (!d) exit(2);
  char **names = NULL;
  size_t count = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    names = realloc(names, (count + 1) * sizeof *names);
    size_t len = strlen(path) + strlen(e->d_name) + 2;
    names[count] = malloc(len);
    snprintf(names[count], len, "%s/%s", path, e->d_name);
    count++;
  }
  closedir(d);
  qsort(names, count, sizeof *names, cmp); /* a fixed order */
  for (size_t i = 0; i < count; i++) {
    run_path(names[i]);
    free(names[i]);
  }
  free(names);
}

int main(int argc, char **argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  for (int i = 1; i < argc; i++) run_path(argv[i]);
  printf("replay: %ld inputs\n", g_inputs);
  return g_inputs > 0 ? 0 : 1;
}
