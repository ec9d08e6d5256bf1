/* Checks for the multi-rank tests: check.h's, each line naming this rank
 * (my_rank, set by the test once it knows it). */
#ifndef LOOM_RANK_CHECK_H
#define LOOM_RANK_CHECK_H

static int my_rank;

#define CHECK_WHO_FORMAT "[rank %d] "
#define CHECK_WHO my_rank
#include "check.h"

#endif
