/* trace.h - NORMA_TRACE=path.json: one Chrome / Perfetto trace event per API call (op, shape,
   dtype, layout, flags, time, bytes moved under the minimum-traffic model, GB/s).  When the
   variable is unset the cost is one predictable branch per call. */
#ifndef NORMA_TRACE_H
#define NORMA_TRACE_H

#include "internal.h"

extern int norma__trace_on; /* -1 unknown, 0 off, 1 on */
int norma__trace_init(void);

/* start time in microseconds when tracing, else 0 */
static inline double bn_trace_begin(void) {
  extern double norma__trace_now(void);
  if (__builtin_expect(norma__trace_on == 0, 1)) return 0.0;
  if (norma__trace_on < 0 && !norma__trace_init()) return 0.0;
  return norma__trace_now();
}

/* records the call begun at t0 (no-op when t0 == 0); tensors: tensor-sized arrays moved */
void bn_trace_end(const char *op, const bn_problem *p, double t0, double tensors,
                  norma_status st);

#endif
