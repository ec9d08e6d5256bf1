/* loom runtime — opening the files a user names, for reading; writing
 * all of a buffer.
 *
 * A path where a file is expected can name a FIFO, a device or a directory:
 * open() of a FIFO waits for a writer, forever, and a directory opens and
 * fails only at the first read. These open without waiting and take
 * regular files only. */
#ifndef LOOM_RUNTIME_FILES_H
#define LOOM_RUNTIME_FILES_H

#include <stddef.h>
#include <stdio.h>

/* Open path read-only (close-on-exec) if it is a regular file: the
 * descriptor, or -1 with errno set and *why (nullable) a phrase that
 * follows "PATH: " in a message: strerror's, or "it is a FIFO, not a
 * regular file" (a directory, a character device, ...). */
int loom_open_regular(const char *path, const char **why);
/* The same as a stream ("rb"): NULL with errno and *why on failure. */
FILE *loom_fopen_regular(const char *path, const char **why);

/* Write all of buf to fd, again after EINTR and short writes; on an error
 * (EPIPE: nobody reads any more) the rest is dropped, as there is no one
 * to tell. Async-signal-safe: the flight recorder's SIGUSR1 dump uses it. */
void loom_write_all(int fd, const void *buf, size_t len);

#endif
