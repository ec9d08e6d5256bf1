/* loom runtime — logging, the per-thread error detail and the clock: the error convention of the
 * whole core: a function returns a loom_status; on failure it has recorded one
 * line of detail with loom_fail(), which the CLI prints as it is. The detail
 * says what is wrong, where, and what to do. */
#ifndef LOOM_RUNTIME_LOG_H
#define LOOM_RUNTIME_LOG_H

#include <stdarg.h>
#include <stdint.h>
#include "loom/plugin.h"

#define LOOM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

void loom_log_set_rank(int rank);            /* prefix for every line; -1: none */
void loom_log_set_level(loom_log_level level);
loom_log_level loom_log_get_level(void);
/* The level LOOM_LOG names ("error", "warn", "info", "debug"); unset or
 * empty leaves the level as it is. LOOM_ERR_INVALID, with the detail, for
 * any other value. */
int loom_log_level_from_env(void);
void loom_log(loom_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void loom_vlog(loom_log_level level, const char *who, const char *fmt, va_list ap);
/* Record the calling thread's error detail (one line) and return status. */
int loom_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int loom_vfail(int status, const char *fmt, va_list ap);
const char *loom_last_error(void); /* "" when none */
void loom_clear_error(void);
uint64_t loom_now_ns(void); /* CLOCK_MONOTONIC */

#endif
