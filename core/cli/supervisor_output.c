/* loom launch's ranks' output: each line of a rank's stdout and stderr
 * passed on whole, prefixed with the rank ("[3] "), in one write so no
 * other rank's line lands inside it (supervisor_run.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/supervisor_run.h"
#include "runtime/files.h"

#define MAX_PARTIAL 65536 /* a longer line is cut rather than held */

/* Append data to the stream's line and pass on every complete line with
 * the rank's prefix, in one write so no other rank's line lands inside it.
 * final: the stream ended, so a last unterminated line goes too. */
static void stream_emit(rank_stream *st, const char *data, size_t n, int final)
{
    /* A rank that printed nothing has no line buffer yet, and memcpy or
     * memmove with a NULL pointer is undefined even for 0 bytes. */
    if (st->len + n == 0)
        return;
    if (st->len + n > st->cap) {
        size_t cap = st->cap ? st->cap : 4096;
        while (cap < st->len + n)
            cap *= 2;
        char *line = realloc(st->line, cap);
        if (!line)
            return;
        st->line = line;
        st->cap = cap;
    }
    memcpy(st->line + st->len, data, n);
    st->len += n;

    char prefix[24];
    size_t plen = (size_t)snprintf(prefix, sizeof prefix, "[%d] ", st->rank);
    size_t lines = 1;
    for (size_t i = 0; i < st->len; i++)
        lines += st->line[i] == '\n';
    char *out = malloc(st->len + lines * plen + 1);
    if (!out)
        return;
    size_t used = 0, start = 0;
    for (size_t i = 0; i < st->len; i++) {
        if (st->line[i] != '\n')
            continue;
        memcpy(out + used, prefix, plen);
        memcpy(out + used + plen, st->line + start, i + 1 - start);
        used += plen + i + 1 - start;
        start = i + 1;
    }
    if (start < st->len && (final || st->len - start >= MAX_PARTIAL)) {
        memcpy(out + used, prefix, plen);
        memcpy(out + used + plen, st->line + start, st->len - start);
        used += plen + st->len - start;
        out[used++] = '\n';
        start = st->len;
    }
    loom_write_all(st->to_fd, out, used);
    free(out);
    memmove(st->line, st->line + start, st->len - start);
    st->len -= start;
}

void loom_stream_close(rank_stream *st)
{
    if (st->fd < 0)
        return;
    stream_emit(st, "", 0, 1);
    close(st->fd);
    st->fd = -1;
}

int loom_stream_read(rank_stream *st)
{
    char buf[65536];
    ssize_t n = read(st->fd, buf, sizeof buf);
    if (n > 0) {
        stream_emit(st, buf, (size_t)n, 0);
        return 1;
    }
    if (n < 0 && errno == EINTR)
        return 1;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    loom_stream_close(st);
    return 0;
}

void loom_stream_init(rank_stream *st, int fd, int to_fd, int rank)
{
    memset(st, 0, sizeof *st);
    st->fd = fd;
    st->rank = rank;
    st->to_fd = to_fd;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}
