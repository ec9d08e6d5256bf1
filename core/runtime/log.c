/* Logging and the per-thread error detail. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "runtime/log.h"

static int log_rank = -1;
static loom_log_level log_level = LOOM_LOG_INFO;
static _Thread_local char last_error[1024];

void loom_log_set_rank(int rank) { log_rank = rank; }
void loom_log_set_level(loom_log_level level) { log_level = level; }
loom_log_level loom_log_get_level(void) { return log_level; }

int loom_log_level_from_env(void)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    const char *text = getenv("LOOM_LOG");
    if (!text || !text[0])
        return LOOM_OK;
    for (int level = LOOM_LOG_ERROR; level <= LOOM_LOG_DEBUG; level++)
        if (!strcmp(text, names[level])) {
            log_level = (loom_log_level)level;
            return LOOM_OK;
        }
    return loom_fail(LOOM_ERR_INVALID,
                     "LOOM_LOG=%s is not a log level; use error, warn, info or debug, or unset it",
                     text);
}

void loom_vlog(loom_log_level level, const char *who, const char *fmt, va_list ap)
{
    static const char *tags[] = {"error: ", "warning: ", "", "debug: "};
    if (level > log_level)
        return;
    char line[2048];
    int n = 0;
    if (log_rank >= 0)
        n = snprintf(line, sizeof line, "[rank %d] ", log_rank);
    n += snprintf(line + n, sizeof line - (size_t)n, "%s: %s", who ? who : "loom", tags[level]);
    if (n < (int)sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    fprintf(stderr, "%s\n", line);
}

void loom_log(loom_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    loom_vlog(level, NULL, fmt, ap);
    va_end(ap);
}

int loom_vfail(int status, const char *fmt, va_list ap)
{
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    return status;
}

int loom_fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    loom_vfail(status, fmt, ap);
    va_end(ap);
    return status;
}

const char *loom_last_error(void) { return last_error; }
void loom_clear_error(void) { last_error[0] = '\0'; }

uint64_t loom_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
