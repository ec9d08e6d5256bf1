/* loom runtime — The CUDA device tier. */
#ifndef LOOM_RUNTIME_DEVICE_H
#define LOOM_RUNTIME_DEVICE_H

#include <stddef.h>
#include <stdint.h>
#include "loom/plugin.h"

/* The CUDA device tier (docs/offload.md), defined only in builds with CUDA
 * (LOOM_HAVE_CUDA); callers guard their use with that macro. Device and
 * pinned blocks live on the calling thread's current CUDA device (comm-nccl
 * selects it when it makes its world: the local rank, or comm.nccl.device).
 * Without a usable GPU every call fails with one line that says why. */

/* LOOM_OK when a CUDA device is visible, else fails with "no CUDA device
 * visible (cudaGetDeviceCount: <CUDA's text>)" or why the runtime did not load. */
int loom_device_available(void);
/* How many CUDA devices this process sees (0 without a usable runtime). */
int loom_device_count(void);
/* The memory of CUDA device `device` in bytes (cudaMemGetInfo's total). */
int loom_device_memory_total(int device, uint64_t *bytes);
/* Raw device (cudaMalloc) or pinned host (cudaMallocHost) memory; memory.c
 * does the accounting. loom_device_free releases a block of ours and says
 * what it was (returns 1), or returns 0 for a pointer it does not know. */
int loom_device_alloc(loom_tier tier, loom_purpose purpose, size_t bytes, void **out);
int loom_device_free(void *ptr, loom_tier *tier, loom_purpose *purpose, uint64_t *bytes);

/* Asynchronous copies between host and device memory (either way, or device
 * to device), ordered on a stream, each with a completion event. A NULL
 * stream is CUDA's default stream. */
typedef struct loom_device_stream loom_device_stream;
typedef struct loom_device_event loom_device_event;
int loom_device_stream_create(loom_device_stream **out);
void loom_device_stream_destroy(loom_device_stream *stream);
int loom_device_copy_async(void *dst, const void *src, size_t bytes, loom_device_stream *stream,
                           loom_device_event **done);
/* LOOM_OK when the copy is done (the event is released), LOOM_IN_PROGRESS,
 * or an error (released). wait polls until done or timeout_s. */
int loom_device_event_test(loom_device_event *event);
int loom_device_event_wait(loom_device_event *event, double timeout_s);
/* copy_async + wait on the default stream, bounded by timeout_s. */
int loom_device_copy(void *dst, const void *src, size_t bytes, double timeout_s);

#endif
