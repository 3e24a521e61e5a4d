/*
 * tool.c -- running Slurm's command-line tools (sbatch, squeue, scontrol,
 * scancel) from the slurm backend and collecting what they print.
 *
 * The tools are started with posix_spawn: standard input is /dev/null,
 * every descriptor from 3 up is closed, signals are at their defaults, and
 * the environment is the master's (so SLURM_CONF and the like apply).  Both
 * output streams are read until the tool exits or its time runs out, when
 * it is killed.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/slurm/slurm.h"
#include "base/common.h"

extern char **environ;

int fb_slurm_find_tool(const char *name, char *path, size_t size)
{
    const char *env = getenv("PATH");
    const char *dirs = env && *env ? env : "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = dirs; *p;) {
        const char *colon = strchr(p, ':');
        size_t n = colon ? (size_t)(colon - p) : strlen(p);
        int len = snprintf(path, size, "%.*s/%s", (int)n, p, name);
        struct stat st;
        if (n > 0 && len > 0 && (size_t)len < size && stat(path, &st) == 0 &&
            S_ISREG(st.st_mode) && access(path, X_OK) == 0)
            return 0;
        p += n + (colon ? 1 : 0);
    }
    path[0] = '\0';
    return -1;
}

int fb_slurm_spawn(char *const argv[], int in_fd, int out_fd, int err_fd,
                   pid_t *pid)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    int ok = (in_fd >= 0 ? posix_spawn_file_actions_adddup2(&fa, in_fd, 0)
                         : posix_spawn_file_actions_addopen(
                               &fa, 0, "/dev/null", O_RDONLY, 0)) == 0;
    ok = ok && (out_fd >= 0 ? posix_spawn_file_actions_adddup2(&fa, out_fd, 1)
                            : posix_spawn_file_actions_addopen(
                                  &fa, 1, "/dev/null", O_WRONLY, 0)) == 0;
    ok = ok && posix_spawn_file_actions_adddup2(&fa, err_fd >= 0 ? err_fd : 1,
                                                2) == 0;
    ok = ok && posix_spawn_file_actions_addclosefrom_np(&fa, 3) == 0 &&
         posix_spawnattr_setsigmask(&attr, &none) == 0 &&
         posix_spawnattr_setsigdefault(&attr, &all) == 0 &&
         posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK |
                                             POSIX_SPAWN_SETSIGDEF) == 0;
    int err = ok ? posix_spawn(pid, argv[0], &fa, &attr, argv, environ)
                 : ENOMEM;
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    return err;
}

/* Appends what fd has to buf; returns 1 at end of stream, 0 otherwise. */
static int drain(int fd, fiber_buf *buf, size_t cap)
{
    char chunk[4096];
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
        return 1;
    if (n > 0 && buf->len < cap)
        fiber_buf_append(buf, chunk, (size_t)n);
    return 0;
}

int fb_slurm_run(char *const argv[], fiber_buf *out, fiber_buf *err,
                 int timeout_ms)
{
    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    if (pipe2(po, O_CLOEXEC) != 0 || pipe2(pe, O_CLOEXEC) != 0) {
        int e = errno;
        for (int i = 0; i < 2; i++) {
            if (po[i] >= 0)
                close(po[i]);
            if (pe[i] >= 0)
                close(pe[i]);
        }
        errno = e;
        return -1;
    }
    pid_t pid = -1;
    int e = fb_slurm_spawn(argv, -1, po[1], pe[1], &pid);
    close(po[1]);
    close(pe[1]);
    if (e != 0) {
        close(po[0]);
        close(pe[0]);
        errno = e;
        return -1;
    }
    const size_t cap = 1u << 22; /* what we keep of each stream */
    int open_out = 1, open_err = 1, timed_out = 0;
    uint64_t deadline = fb_now_ms() + (uint64_t)timeout_ms;
    while (open_out || open_err) {
        struct pollfd p[2] = {{open_out ? po[0] : -1, POLLIN, 0},
                              {open_err ? pe[0] : -1, POLLIN, 0}};
        uint64_t now = fb_now_ms();
        if (now >= deadline) {
            timed_out = 1;
            break;
        }
        int r = poll(p, 2, (int)(deadline - now));
        if (r < 0 && errno != EINTR)
            break;
        if (r <= 0)
            continue;
        if (open_out && p[0].revents && drain(po[0], out, cap))
            open_out = 0;
        if (open_err && p[1].revents && drain(pe[0], err, cap))
            open_err = 0;
    }
    close(po[0]);
    close(pe[0]);
    if (timed_out && pid > 0)
        kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (timed_out) {
        errno = ETIMEDOUT;
        return -1;
    }
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

void fb_slurm_last_line(const fiber_buf *b, char *out, size_t size)
{
    out[0] = '\0';
    if (!b->data || size == 0)
        return;
    size_t end = b->len;
    const char *d = (const char *)b->data;
    while (end > 0 && (d[end - 1] == '\n' || d[end - 1] == '\r' ||
                       d[end - 1] == ' '))
        end--;
    size_t start = end;
    while (start > 0 && d[start - 1] != '\n')
        start--;
    size_t n = end - start;
    if (n >= size)
        n = size - 1;
    memcpy(out, d + start, n);
    out[n] = '\0';
}
