/* loom — status codes shared by the core and every plugin.
 *
 * 0 is success, positive values are states (an operation still in progress),
 * negative values are error classes. A function that fails records a detail
 * line for the calling thread (plugins through loom_host.error, the core
 * through loom_last_error()). */
#ifndef LOOM_STATUS_H
#define LOOM_STATUS_H

typedef enum loom_status {
    LOOM_OK = 0,
    LOOM_IN_PROGRESS = 1,
    LOOM_ERR_NOT_SUPPORTED = -1,
    LOOM_ERR_INVALID = -2,
    LOOM_ERR_NO_MEMORY = -3,
    LOOM_ERR_NOT_FOUND = -4,
    LOOM_ERR_TIMEOUT = -5,
    LOOM_ERR_REMOTE = -6, /* a remote rank failed or vanished */
    LOOM_ERR_INTERNAL = -7,
} loom_status;

/* Inline so that plugins, which link no loom library, can use it too. */
static inline const char *loom_status_string(int status)
{
    switch (status) {
    case LOOM_OK: return "ok";
    case LOOM_IN_PROGRESS: return "in progress";
    case LOOM_ERR_NOT_SUPPORTED: return "not supported";
    case LOOM_ERR_INVALID: return "invalid argument";
    case LOOM_ERR_NO_MEMORY: return "out of memory";
    case LOOM_ERR_NOT_FOUND: return "not found";
    case LOOM_ERR_TIMEOUT: return "timed out";
    case LOOM_ERR_REMOTE: return "remote rank failed";
    case LOOM_ERR_INTERNAL: return "internal error";
    default: return status > 0 ? "unknown state" : "unknown error";
    }
}

#endif
