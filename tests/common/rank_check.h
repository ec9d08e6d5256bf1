/* Checks for the multi-rank tests: CHECK counts a failure and reports the
 * first 20 with this rank and the line; OK stops the rank when a loom call
 * fails, printing the call, its status and the detail line. */
#ifndef LOOM_RANK_CHECK_H
#define LOOM_RANK_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "loom/status.h"

const char *loom_last_error(void);

static int failures;
static int my_rank;

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond) && failures++ < 20) {                                                 \
            fprintf(stderr, "[rank %d] FAIL %s:%d: ", my_rank, __FILE__, __LINE__);       \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fprintf(stderr, "\n");                                                        \
        }                                                                                 \
    } while (0)

#define OK(call)                                                                          \
    do {                                                                                  \
        int rc_ = (call);                                                                 \
        if (rc_ != LOOM_OK) {                                                             \
            fprintf(stderr, "[rank %d] %s:%d: %s -> %s: %s\n", my_rank, __FILE__, __LINE__, \
                    #call, loom_status_string(rc_), loom_last_error());                   \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#endif
