/*
 * log.c -- fiber's own log: one line per call, written with a single
 * write(2) so that lines from several threads (and, on a shared file opened
 * with O_APPEND, several processes) never interleave.  No lock is needed.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"

/* Longest line written, newline included; longer messages end in "...". */
#define FB_LOG_LINE_MAX 4096
#define FB_LOG_NAME_MAX 64

/*
 * The log's settings are part of the runtime's global state: a process has
 * one log, one name and one level.  The level and the descriptor are atomic
 * because any thread may log while the runtime changes them.  The name is a
 * plain buffer, written only when it changes; the runtime changes it while
 * fiber_init() runs, before fiber has started threads of its own.
 */
static _Atomic int log_level = FIBER_LOG_WARN;
static _Atomic int log_fd = STDERR_FILENO;
static char log_name[FB_LOG_NAME_MAX] = "master";

/* The file fb_log_to_dir or fb_log_to_prefix chose, opened when the first
 * line is written: most children never log, and creating a file costs more
 * than the rest of a child's start-up (an inode allocation per job).
 * open_mu serialises that one open. */
static char pending_path[PATH_MAX];
static _Atomic int pending_open;
static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};

static int clamp_level(int level)
{
    if (level < FIBER_LOG_ERROR)
        return FIBER_LOG_ERROR;
    return level > FIBER_LOG_DEBUG ? FIBER_LOG_DEBUG : level;
}

void fb_log_setup(int level, const char *proc_name)
{
    log_level = clamp_level(level);
    /* Rewriting an unchanged name would still race with threads reading
     * it, and the runtime repeats the name when only the level changes. */
    if (proc_name != NULL &&
        strncmp(log_name, proc_name, sizeof log_name - 1) != 0)
        fb_strlcpy(log_name, proc_name, sizeof log_name);
}

int fb_log_enabled(int level) { return level <= log_level; }

/* ---- the log file -------------------------------------------------------- */

/* Copies proc_name into buf as a safe file name: every byte outside
 * [A-Za-z0-9_.-] and a leading '.' become '_', so a name cannot leave the
 * directory (no '/', no "..") or hide the file. */
static void file_name_of(const char *proc_name, char *buf, size_t size)
{
    size_t len = fb_strlcpy(buf, proc_name[0] ? proc_name : "process", size);
    for (size_t i = 0; i < len; i++) {
        char ch = buf[i];
        int safe = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                   (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' ||
                   (ch == '.' && i > 0);
        if (!safe)
            buf[i] = '_';
    }
}

/* Makes fd the log's descriptor.  The first switch takes fd's number; later
 * ones move the new file onto that same number with dup3(), which replaces
 * it atomically: a thread writing at that moment reaches the old file or
 * the new one, never a descriptor number that was closed and reused. */
static int install_fd(int fd)
{
    int current = log_fd;
    if (current == STDERR_FILENO) {
        log_fd = fd;
        return 0;
    }
    int rc = dup3(fd, current, O_CLOEXEC);
    int saved = errno;
    close(fd);
    errno = saved;
    return rc < 0 ? -1 : 0;
}

static int open_pending(void);

/* Makes path the file the next line opens (or opens it now).  Creates the
 * folder path lies in, with mode 0700, if it is missing (unless the
 * caller has: made_folder). */
static int log_to_path(const char *path, int now, int made_folder)
{
    char folder[PATH_MAX];
    size_t len = fb_strlcpy(folder, path, sizeof folder);
    if (len >= sizeof folder) {
        errno = ENAMETOOLONG;
        return fb_err_errno(FIBER_ESYS, "cannot open log file %.200s...",
                            path);
    }
    char *slash = strrchr(folder, '/');
    if (!made_folder && slash && slash != folder) {
        *slash = '\0';
        if (fb_make_dirs(folder) != 0)
            return fb_err_errno(FIBER_ESYS, "cannot create log directory %s",
                                folder);
    }
    pthread_mutex_lock(&open_mu);
    memcpy(pending_path, path, len + 1);
    pending_open = 1;
    pthread_mutex_unlock(&open_mu);
    if (now && open_pending() != 0)
        return fb_err(FIBER_ESYS, "cannot open log file %s", path);
    return 0;
}

int fb_log_to_dir(const char *dir, const char *proc_name)
{
    char file_name[FB_LOG_NAME_MAX];
    char path[PATH_MAX];
    file_name_of(proc_name ? proc_name : log_name, file_name,
                 sizeof file_name);
    if (fb_make_dirs(dir) != 0)
        return fb_err_errno(FIBER_ESYS, "cannot create log directory %s",
                            dir);
    int len = snprintf(path, sizeof path, "%s/%s.log", dir, file_name);
    if (len < 0 || (size_t)len >= sizeof path) {
        errno = ENAMETOOLONG;
        return fb_err_errno(FIBER_ESYS, "cannot open log file in %s", dir);
    }
    return log_to_path(path, 0, 1);
}

int fb_log_to_prefix(const char *prefix, const char *proc_name, int now)
{
    char file_name[FB_LOG_NAME_MAX];
    char path[PATH_MAX];
    file_name_of(proc_name ? proc_name : log_name, file_name,
                 sizeof file_name);
    int len = snprintf(path, sizeof path, "%s.%s", prefix, file_name);
    if (len < 0 || (size_t)len >= sizeof path) {
        errno = ENAMETOOLONG;
        return fb_err_errno(FIBER_ESYS, "cannot open log file %.200s...",
                            prefix);
    }
    return log_to_path(path, now, 0);
}

void fb_log_to_stderr(void)
{
    pthread_mutex_lock(&open_mu);
    pending_open = 0;
    int current = log_fd;
    if (current != STDERR_FILENO) {
        /* Same number, now standard error: see install_fd. */
        if (dup3(STDERR_FILENO, current, O_CLOEXEC) < 0) {
            /* stays on the file */
        }
    }
    pthread_mutex_unlock(&open_mu);
}

/* Opens the file chosen last, once.  If it cannot be opened the log stays
 * where it was, says so there, and -1 is returned. */
static int open_pending(void)
{
    int rc = 0;
    pthread_mutex_lock(&open_mu);
    if (pending_open) {
        /* pending_open drops only once the file is in place, so a thread
         * that saw it set waits here and then writes to the file. */
        int fd = open(pending_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
                      0600);
        if (fd < 0 || install_fd(fd) != 0) {
            char msg[PATH_MAX + 64];
            int n = snprintf(msg, sizeof msg, "fiber: cannot open log file %s\n",
                             pending_path);
            if (n > 0 && write(log_fd, msg, (size_t)n) < 0) {
                /* nowhere left to say it */
            }
            rc = -1;
        }
        pending_open = 0;
    }
    pthread_mutex_unlock(&open_mu);
    return rc;
}

/* ---- writing a line ------------------------------------------------------ */

/* Writes "2026-11-29T18:40:01.123Z WARN  name[pid] " into buf.  Returns the
 * length written (never more than size - 1). */
static size_t format_prefix(char *buf, size_t size, int level)
{
    struct timespec now;
    struct tm utc;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &utc);
    size_t used = strftime(buf, size, "%Y-%m-%dT%H:%M:%S", &utc);
    int len = snprintf(buf + used, size - used, ".%03ldZ %s %s[%ld] ",
                       now.tv_nsec / 1000000L, level_names[level], log_name,
                       (long)getpid());
    if (len > 0)
        used += (size_t)len;
    return used < size ? used : size - 1;
}

/* Ends the line at buf[len] with a newline, marking a cut message with
 * "..." and dropping a newline the caller already put at the end. */
static size_t finish_line(char *buf, size_t len, int cut)
{
    if (cut) {
        len = FB_LOG_LINE_MAX - 4; /* room for "...\n" */
        memcpy(buf + len, "...", 3);
        len += 3;
    } else if (len > 0 && buf[len - 1] == '\n') {
        len--;
    }
    buf[len++] = '\n';
    return len;
}

FIBER_API void fiber_log(int level, const char *fmt, ...)
{
    if (!fb_log_enabled(level))
        return;
    /* Callers log on their error paths and then report errno; keep it. */
    int saved_errno = errno;
    char line[FB_LOG_LINE_MAX];
    size_t used = format_prefix(line, sizeof line, clamp_level(level));
    va_list ap;
    va_start(ap, fmt);
    /* One byte of the buffer stays free for the newline. */
    int len = vsnprintf(line + used, sizeof line - used - 1, fmt, ap);
    va_end(ap);
    int cut = len > 0 && (size_t)len >= sizeof line - used - 1;
    if (len > 0 && !cut)
        used += (size_t)len;
    used = finish_line(line, used, cut);
    if (pending_open)
        open_pending();
    /* A log line is best effort: a failed write has nowhere to be
     * reported. */
    while (write(log_fd, line, used) < 0 && errno == EINTR)
        ;
    errno = saved_errno;
}
