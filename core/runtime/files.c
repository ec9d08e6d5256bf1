/* Opening the files a user names, for reading, and writing all of a buffer (files.h). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/files.h"

static const char *not_regular(mode_t mode)
{
    if (S_ISFIFO(mode))
        return "it is a FIFO, not a regular file";
    if (S_ISDIR(mode))
        return "it is a directory, not a regular file";
    if (S_ISCHR(mode))
        return "it is a character device, not a regular file";
    if (S_ISBLK(mode))
        return "it is a block device, not a regular file";
    if (S_ISSOCK(mode))
        return "it is a socket, not a regular file";
    return "it is not a regular file";
}

int loom_open_regular(const char *path, const char **why)
{
    const char *because = NULL;
    /* O_NONBLOCK: open() of a FIFO returns at once instead of waiting for
     * a writer; it changes nothing for a regular file, and is cleared. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        because = strerror(errno);
    else if (fstat(fd, &st) != 0)
        because = strerror(errno);
    else if (!S_ISREG(st.st_mode)) {
        because = not_regular(st.st_mode);
        errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
    } else {
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
            because = strerror(errno);
    }
    if (!because)
        return fd;
    if (fd >= 0) {
        int err = errno;
        close(fd);
        errno = err;
    }
    if (why)
        *why = because;
    return -1;
}

FILE *loom_fopen_regular(const char *path, const char **why)
{
    int fd = loom_open_regular(path, why);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int err = errno;
        close(fd);
        errno = err;
        if (why)
            *why = strerror(err);
    }
    return f;
}

void loom_write_all(int fd, const void *buf, size_t len)
{
    const char *at = buf;
    while (len > 0) {
        ssize_t n = write(fd, at, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        at += n;
        len -= (size_t)n;
    }
}
