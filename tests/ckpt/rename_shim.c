/* LD_PRELOAD shim for ckpt_test.sh's fallback cases: a file system without
 * RENAME_EXCHANGE (renameat2 fails with EINVAL), and a crash at a chosen
 * point of a checkpoint's replacement. LOOM_SHIM_KILL=rename:N kills the
 * process (SIGKILL) right after the Nth rename of a checkpoint directory
 * (a path holding "/step-"); unlink-old:N right after the Nth unlink of a
 * file in a step-N.old directory; LOOM_SHIM_FAIL=rename:N makes the Nth such
 * rename fail with EIO instead. */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void crash_point(const char *kind)
{
    static int renames, unlinks;
    const char *want = getenv("LOOM_SHIM_KILL");
    if (!want)
        return;
    size_t n = strlen(kind);
    if (strncmp(want, kind, n) != 0 || want[n] != ':')
        return;
    int count = !strcmp(kind, "rename") ? ++renames : ++unlinks;
    if (count == atoi(want + n + 1))
        raise(SIGKILL);
}

int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
              unsigned int flags)
{
    (void)olddirfd, (void)oldpath, (void)newdirfd, (void)newpath, (void)flags;
    errno = EINVAL;
    return -1;
}

int rename(const char *from, const char *to)
{
    static int renames;
    int ours = strstr(from, "/step-") || strstr(to, "/step-");
    const char *fail = getenv("LOOM_SHIM_FAIL");
    if (ours && fail && !strncmp(fail, "rename:", 7) && ++renames == atoi(fail + 7)) {
        errno = EIO;
        return -1;
    }
    int (*real)(const char *, const char *) =
        (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
    int rc = real(from, to);
    if (rc == 0 && (strstr(from, "/step-") || strstr(to, "/step-")))
        crash_point("rename");
    return rc;
}

int unlink(const char *path)
{
    int (*real)(const char *) = (int (*)(const char *))dlsym(RTLD_NEXT, "unlink");
    int rc = real(path);
    if (rc == 0 && strstr(path, ".old/"))
        crash_point("unlink-old");
    return rc;
}
