/* trace.c - the NORMA_TRACE call tracer (Chrome trace event format, JSON array). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "trace.h"

int norma__trace_on = -1;
static FILE *trace_file;
static int trace_first = 1;
static double trace_t0;

double norma__trace_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static void trace_close(void) {
  if (trace_file) {
    fputs("\n]\n", trace_file);
    fclose(trace_file);
    trace_file = NULL;
  }
}

int norma__trace_init(void) {
  int on = 0;
#pragma omp critical(norma_trace)
  {
    if (norma__trace_on < 0) {
      const char *path = getenv("NORMA_TRACE");
      if (path && *path) {
        trace_file = fopen(path, "w");
        if (trace_file) {
          /* events are buffered (a flush per event cost ~4 us a call) and written at exit; the
             first event anchors the trace's clock to the wall clock, for aligning with other
             traces */
          struct timespec wall;
          clock_gettime(CLOCK_REALTIME, &wall);
          trace_t0 = norma__trace_now();
          fprintf(trace_file,
                  "[\n{\"name\":\"norma_trace_origin\",\"cat\":\"norma\",\"ph\":\"i\","
                  "\"s\":\"g\",\"ts\":0,\"pid\":%ld,\"tid\":%ld,\"args\":{"
                  "\"unix_time_us\":%.3f,\"version\":\"%s\"}}",
                  (long)getpid(), (long)syscall(SYS_gettid),
                  (double)wall.tv_sec * 1e6 + (double)wall.tv_nsec * 1e-3, norma_version());
          trace_first = 0;
          atexit(trace_close);
        }
      }
      norma__trace_on = trace_file ? 1 : 0;
    }
    on = norma__trace_on;
  }
  return on;
}

static const char *dtype_name(norma_dtype t) {
  switch (t) {
    case NORMA_F32: return "f32";
    case NORMA_F64: return "f64";
    case NORMA_F16: return "f16";
    case NORMA_BF16: return "bf16";
  }
  return "?";
}

void bn_trace_end(const char *op, const bn_problem *p, double t0, double tensors,
                  norma_status st) {
  if (t0 == 0.0 || !trace_file) return;
  const double t1 = norma__trace_now(), dur = t1 - t0;
  const double bytes = tensors * (double)p->total * (double)p->esize;
#pragma omp critical(norma_trace)
  if (trace_file) {
    fprintf(trace_file,
            "%s{\"name\":\"%s\",\"cat\":\"norma\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,"
            "\"pid\":%ld,\"tid\":%ld,\"args\":{\"n\":%lld,\"c\":%lld,\"spatial\":%lld,"
            "\"dtype\":\"%s\",\"layout\":\"%s\",\"flags\":%u,\"isa\":\"%s\",\"threads\":%d,"
            "\"bytes\":%.0f,\"GBps\":%.3f,\"status\":\"%s\"}}",
            trace_first ? "" : ",\n", op, t0 - trace_t0, dur, (long)getpid(),
            (long)syscall(SYS_gettid), (long long)p->n, (long long)p->c, (long long)p->s,
            dtype_name(p->dt),
            p->layout == NORMA_CHANNELS_LAST ? "channels_last" : "channels_first", p->flags,
            norma__use_reference() ? "reference" : norma_isa_name(norma__isa()), norma__threads(),
            bytes, dur > 0 ? bytes / dur * 1e-3 : 0.0, norma_status_string(st));
    trace_first = 0;
  }
}
