/* The collective suite's comm table over device buffers (device_staging.c). */
#ifndef LOOM_TEST_DEVICE_STAGING_H
#define LOOM_TEST_DEVICE_STAGING_H

#include <stddef.h>

#include "loom/comm.h"

extern const loom_comm_api loom_staged_comm_api;

/* LOOM_OK when api's struct_size is loom_comm_api's and every op slot is
 * set; otherwise LOOM_ERR_INTERNAL, and why names the first empty slot (its
 * index, op name and byte offset). Needs no GPU. */
int loom_staged_table_check(const loom_comm_api *api, char *why, size_t cap);

#endif
