/* status.c - status names and the thread-local last-error message. */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

static _Thread_local char last_error[512];

const char *norma_status_string(norma_status s) {
  switch (s) {
    case NORMA_OK: return "NORMA_OK";
    case NORMA_ERR_INVALID_ARGUMENT: return "NORMA_ERR_INVALID_ARGUMENT";
    case NORMA_ERR_UNSUPPORTED: return "NORMA_ERR_UNSUPPORTED";
    case NORMA_ERR_OUT_OF_MEMORY: return "NORMA_ERR_OUT_OF_MEMORY";
    case NORMA_ERR_NONFINITE: return "NORMA_ERR_NONFINITE";
    case NORMA_ERR_COMMUNICATION: return "NORMA_ERR_COMMUNICATION";
  }
  return "unknown status";
}

const char *norma_last_error(void) { return last_error; }

norma_status norma__fail(norma_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return st;
}

/* For norma's own modules built as separate libraries (libnorma_mpi): record their failures
   here too, so norma_last_error() reports every norma call.  Exported, not in norma.h. */
NORMA_API void norma__record_error(const char *msg) {
  snprintf(last_error, sizeof last_error, "%s", msg ? msg : "");
}
