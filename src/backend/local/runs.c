/*
 * runs.c -- the local backend's run ops (backend/runops.h): runs whose
 * master is a process of this host.
 *
 * Nothing here needs the run's cooperation.  A local run is its run
 * directory ($TMPDIR/fiber-<uid>/<run id>/, runtime/runid.h): alive while
 * master.sock accepts a connection (connect, then close at once: the
 * master logs that at info level and moves on), while the master
 * recorded in master.pid lives, or while master.lock is flocked.  Its
 * processes are found in /proc: the master owns the listening socket, and
 * every job carries FIBER_BOOT_RUN=<run id> in its initial environment
 * (the runtime hands it over; the child unsets it from environ, but
 * /proc/<pid>/environ keeps the original block).
 *
 * The run directory is also what container runs leave on this host (a
 * docker master mounts it), so the list, logs and clean ops here serve
 * every run that has one; runs/runs.c calls them for such runs too.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/local/local.h"
#include "backend/runops.h"
#include "base/common.h"
#include "runtime/runid.h"

#define ENV_READ_MAX (256 * 1024)

/* ======================================================================
 * Processes
 * ====================================================================== */

/* What /proc/<pid>/stat says: state letter, start time (seconds since the
 * epoch).  Returns 0, or -1 if the process is gone. */
static int proc_stat(long pid, char *state, double *start_epoch)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold anything */
    if (!p)
        return -1;
    char st = '?';
    unsigned long long ticks = 0;
    /* fields after comm: 3 state, 4 ppid, ..., 22 starttime */
    if (sscanf(p + 1,
               " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d "
               "%*d %*d %*d %*d %llu",
               &st, &ticks) != 2)
        return -1;
    if (state)
        *state = st;
    if (start_epoch) {
        long btime = 0; /* boot time, seconds since the epoch */
        FILE *f = fopen("/proc/stat", "re");
        char line[256];
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "btime %ld", &btime) == 1)
                break;
        if (f)
            fclose(f);
        *start_epoch =
            (double)btime + (double)ticks / (double)sysconf(_SC_CLK_TCK);
    }
    return 0;
}

/* Is pid a live process (not a zombie)? */
static int proc_alive(long pid)
{
    char state;
    return pid > 0 && proc_stat(pid, &state, NULL) == 0 && state != 'Z' &&
           state != 'X';
}

/* Reads <run_dir>/master.pid and returns the pid if that process still
 * runs and is the one that was recorded (it started before the file was
 * written), else -1. */
static long pidfile_master(const char *run_dir)
{
    char path[PATH_MAX], text[32];
    snprintf(path, sizeof path, "%s/%s", run_dir, FB_RUN_PIDFILE);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    ssize_t n = fstat(fd, &st) == 0 ? read(fd, text, sizeof text - 1) : -1;
    close(fd);
    if (n <= 0)
        return -1;
    text[n] = '\0';
    long pid = strtol(text, NULL, 10);
    double started;
    char state;
    if (pid <= 0 || proc_stat(pid, &state, &started) != 0 || state == 'Z' ||
        state == 'X')
        return -1;
    /* A pid is reused once its process has gone: the recorded process
     * started before its pid was written down; a later one is another. */
    if (started > (double)st.st_mtime + 2.0)
        return -1;
    return pid;
}

/* A process that belongs to a run, from its initial environment. */
struct run_proc {
    long pid;
    char state;
    int is_job; /* has FIBER_BOOT_ADDR: a job; else a launched master */
    char run[FB_RUN_ID_SIZE];
    char *name;
};

struct proc_table {
    struct run_proc *items;
    size_t n, cap;
};

static void procs_free(struct proc_table *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->items[i].name);
    free(t->items);
}

/* Finds name=value in a NUL-separated environment block. */
static const char *env_find(const char *block, size_t len, const char *name)
{
    size_t nl = strlen(name);
    for (size_t off = 0; off < len;) {
        const char *e = block + off;
        size_t el = strnlen(e, len - off);
        if (el > nl && memcmp(e, name, nl) == 0 && e[nl] == '=')
            return e + nl + 1;
        off += el + 1;
    }
    return NULL;
}

static int read_small_file(const char *path, char *buf, size_t size,
                           size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t have = 0;
    ssize_t n;
    while (have + 1 < size &&
           (n = read(fd, buf + have, size - 1 - have)) > 0)
        have += (size_t)n;
    close(fd);
    buf[have] = '\0';
    *len = have;
    return 0;
}

/* Is pid in our mount namespace?  Processes of containers are visible in
 * /proc too (with the FIBER_BOOT_RUN their container was given), but they
 * are the containers' business: their backend lists the containers. */
static int same_mount_ns(long pid, const char *ours)
{
    char path[64], ns[64];
    snprintf(path, sizeof path, "/proc/%ld/ns/mnt", pid);
    ssize_t n = readlink(path, ns, sizeof ns - 1);
    if (n < 0)
        return 1; /* cannot tell: count it as ours */
    ns[n] = '\0';
    return strcmp(ns, ours) == 0;
}

/* Adds pid, whose environment block is block, to t if it is a process of
 * a run.  Returns 0 or FIBER_ENOMEM. */
static int add_proc(struct proc_table *t, long pid, const char *block,
                    size_t len)
{
    const char *run = env_find(block, len, FB_ENV_RUN);
    char state;
    if (!run || !fb_run_id_valid(run) || proc_stat(pid, &state, NULL) != 0)
        return 0;
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 16;
        struct run_proc *items = realloc(t->items, cap * sizeof *items);
        if (!items)
            return fb_err(FIBER_ENOMEM, "out of memory");
        t->items = items;
        t->cap = cap;
    }
    struct run_proc *p = &t->items[t->n];
    memset(p, 0, sizeof *p);
    p->pid = pid;
    p->state = state;
    p->is_job = env_find(block, len, FB_ENV_ADDR) != NULL;
    const char *name = env_find(block, len, FB_ENV_NAME);
    fb_strlcpy(p->run, run, sizeof p->run);
    p->name = strdup(name ? name : p->is_job ? "job" : "master");
    if (!p->name)
        return fb_err(FIBER_ENOMEM, "out of memory");
    t->n++;
    return 0;
}

/* Every process (readable to us, in our mount namespace) that carries
 * FIBER_BOOT_RUN. */
static int scan_procs(struct proc_table *t)
{
    char our_ns[64] = "";
    ssize_t ns_len = readlink("/proc/self/ns/mnt", our_ns, sizeof our_ns - 1);
    our_ns[ns_len > 0 ? ns_len : 0] = '\0';
    DIR *d = opendir("/proc");
    if (!d)
        return fb_err_errno(FIBER_ESYS, "cannot read /proc");
    char *block = malloc(ENV_READ_MAX);
    if (!block) {
        closedir(d);
        return fb_err(FIBER_ENOMEM, "out of memory");
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid == (long)getpid())
            continue;
        char path[64];
        size_t len;
        snprintf(path, sizeof path, "/proc/%ld/environ", pid);
        if (read_small_file(path, block, ENV_READ_MAX, &len) != 0 ||
            (our_ns[0] && !same_mount_ns(pid, our_ns)))
            continue;
        rc = add_proc(t, pid, block, len);
    }
    free(block);
    closedir(d);
    return rc;
}

/* The inode of the listening unix socket bound at path (from
 * /proc/net/unix), or 0. */
static unsigned long socket_inode(const char *path)
{
    FILE *f = fopen("/proc/net/unix", "re");
    if (!f)
        return 0;
    char line[PATH_MAX + 128];
    unsigned long found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long inode;
        unsigned flags;
        int consumed = 0;
        /* Num RefCount Protocol Flags Type St Inode Path */
        if (sscanf(line, "%*s %*s %*s %x %*s %*s %lu %n", &flags, &inode,
                   &consumed) < 2 || consumed == 0)
            continue;
        char *p = line + consumed;
        p[strcspn(p, "\n")] = '\0';
        if ((flags & 0x10000u) && strcmp(p, path) == 0) /* __SO_ACCEPTCON */
            found = inode;
    }
    fclose(f);
    return found;
}

/* Does process pid hold the descriptor whose link reads want? */
static int holds_fd(long pid, const char *want)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%ld/fd", pid);
    DIR *fds = opendir(dir);
    if (!fds)
        return 0;
    int found = 0;
    struct dirent *f;
    while (!found && (f = readdir(fds))) {
        char link[PATH_MAX], target[80];
        snprintf(link, sizeof link, "%s/%s", dir, f->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n > 0) {
            target[n] = '\0';
            found = strcmp(target, want) == 0;
        }
    }
    closedir(fds);
    return found;
}

/* The process holding the listening socket at path, or -1. */
static long socket_owner(const char *path)
{
    unsigned long inode = socket_inode(path);
    if (!inode)
        return -1;
    char want[64];
    snprintf(want, sizeof want, "socket:[%lu]", inode);
    DIR *d = opendir("/proc");
    if (!d)
        return -1;
    long owner = -1;
    struct dirent *e;
    while (owner < 0 && (e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (!*end && pid > 0 && holds_fd(pid, want))
            owner = pid;
    }
    closedir(d);
    return owner;
}

/* Is <run_dir>/master.lock locked?  A master holds an flock on it for
 * its lifetime (runtime/service.c); the kernel drops the lock when the
 * process dies, SIGKILL included, and across containers that mount the
 * directory.  Returns 1 held, 0 not held, -1 no such file. */
static int lock_held(const char *run_dir)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", run_dir, FB_RUN_LOCKFILE);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    int held = 0;
    if (flock(fd, LOCK_SH | LOCK_NB) != 0)
        held = errno == EWOULDBLOCK;
    else
        flock(fd, LOCK_UN);
    close(fd);
    return held;
}

/* Does a master accept connections at path?  Connect, then close. */
static int socket_alive(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path)
        return 0;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return 0;
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    /* EAGAIN: a listener whose backlog is full is still a listener. */
    int alive = rc == 0 || errno == EAGAIN || errno == EINPROGRESS;
    close(fd);
    return alive;
}

/* ======================================================================
 * list
 * ====================================================================== */

static int has_job(const fiber_run_info *r, const char *name)
{
    for (size_t i = 0; i < r->n_jobs; i++)
        if (strcmp(r->jobs[i].name, name) == 0)
            return 1;
    return 0;
}

static int add_process_job(fiber_run_info *r, const char *name,
                           const char *role, long pid, char state)
{
    char status[32];
    snprintf(status, sizeof status, "pid %ld", pid);
    return fb_runs_add_job(r, name, role, state == 'Z' ? "zombie" : "running",
                           status, pid, NULL)
               ? 0
               : FIBER_ENOMEM;
}

/* Jobs that are gone but left a log file. */
static int add_logged_jobs(fiber_run_info *r, const char *log_dir)
{
    DIR *d = opendir(log_dir);
    if (!d)
        return 0;
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (e->d_name[0] == '.' || n < 5 ||
            strcmp(e->d_name + n - 4, ".log") != 0)
            continue;
        e->d_name[n - 4] = '\0'; /* the job's name */
        if (has_job(r, e->d_name))
            continue;
        if (!fb_runs_add_job(r, e->d_name,
                             strcmp(e->d_name, "master") ? "job" : "master",
                             "ended", "ended; log kept", -1, NULL))
            rc = FIBER_ENOMEM;
    }
    closedir(d);
    return rc;
}

/* A run directory with no sign of life is not always dead:
 *   - a master that listens on TCP (container backends) and has no job
 *     running right now leaves no socket file; the docker backend keeps a
 *     secrets/ directory in the run directory while its master lives (and
 *     a crashed one leaves it behind);
 *   - a master creates its run directory a moment before its socket.
 * Such runs are "cannot tell" (-1), never "dead", so that fiber clean
 * leaves them alone (a container backend's list op, called later, sets 1
 * when it sees the run running).  A stale socket file is the sign of a
 * dead master. */
#define YOUNG_RUN_DIR_S 10
static void mark_undecided(fiber_run_info *r)
{
    char path[PATH_MAX];
    struct stat st;
    if (r->alive)
        return;
    snprintf(path, sizeof path, "%s/%s", r->dir, FB_RUN_SOCKET);
    if (lstat(path, &st) == 0 || lock_held(r->dir) == 0)
        return;
    snprintf(path, sizeof path, "%s/%s", r->dir, FB_RUN_PIDFILE);
    if (lstat(path, &st) == 0)
        return; /* its recorded master has ended */
    snprintf(path, sizeof path, "%s/secrets", r->dir);
    if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
        r->alive = -1;
    else if (lstat(r->dir, &st) == 0 &&
             time(NULL) - st.st_mtime < YOUNG_RUN_DIR_S)
        r->alive = -1;
}

/* One local run directory. */
static int list_run(fiber_run_list *l, const char *run,
                    const struct proc_table *procs)
{
    fiber_run_info *r = fb_runs_add_run(l, run, "local");
    if (!r)
        return FIBER_ENOMEM;
    int rc = fb_run_dir(run, r->dir, sizeof r->dir);
    if (rc)
        return rc;
    char sock[PATH_MAX];
    snprintf(sock, sizeof sock, "%s/%s", r->dir, FB_RUN_SOCKET);
    int listening = socket_alive(sock);
    long pid = pidfile_master(r->dir);
    if (pid < 0 && listening)
        pid = socket_owner(sock);
    r->master_pid = pid;
    r->alive = listening || pid > 0 || lock_held(r->dir) == 1;
    if (pid > 0) {
        char state = 'R';
        proc_stat(pid, &state, NULL);
        rc = add_process_job(r, "master", "master", pid, state);
    }
    for (size_t i = 0; rc == 0 && i < procs->n; i++) {
        const struct run_proc *p = &procs->items[i];
        if (!p->is_job || strcmp(p->run, run) != 0)
            continue;
        /* A job lives only as long as its master does (it exits within
         * moments of losing it), so a running job means a live run. */
        r->alive |= p->state != 'Z';
        rc = add_process_job(r, p->name, "job", p->pid, p->state);
    }
    char logs[PATH_MAX];
    if (rc == 0 && fb_run_log_dir(run, r->dir, logs, sizeof logs) == 0)
        rc = add_logged_jobs(r, logs);
    if (rc == 0)
        mark_undecided(r);
    return rc;
}

static int local_list(fiber_run_list *l, const char *only)
{
    char base[PATH_MAX];
    int rc = fb_run_base(base, sizeof base);
    if (rc)
        return rc;
    struct proc_table procs = {0};
    rc = scan_procs(&procs);
    DIR *d = rc == 0 ? opendir(base) : NULL;
    struct dirent *e;
    while (d && rc == 0 && (e = readdir(d))) {
        if (!fb_run_id_valid(e->d_name) || (only && strcmp(only, e->d_name)))
            continue;
        char path[PATH_MAX];
        struct stat st;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", base, e->d_name) >=
                sizeof path ||
            lstat(path, &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        rc = list_run(l, e->d_name, &procs);
    }
    if (d)
        closedir(d);
    procs_free(&procs);
    return rc;
}

/* ======================================================================
 * logs
 * ====================================================================== */

static int name_cmp(const void *a, const void *b)
{
    return strverscmp(*(char *const *)a, *(char *const *)b);
}

/* The names of the log files in dir (of job only, when given), sorted;
 * the caller frees each and the array. */
static char **log_files(const char *dir, const char *job, size_t *n)
{
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    char **names = NULL;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || len < 5 ||
            strcmp(e->d_name + len - 4, ".log") != 0)
            continue;
        if (job && (len - 4 != strlen(job) ||
                    strncmp(e->d_name, job, len - 4) != 0))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **more = realloc(names, cap * sizeof *names);
            if (!more)
                break;
            names = more;
        }
        if ((names[*n] = strdup(e->d_name)) != NULL)
            (*n)++;
    }
    closedir(d);
    if (*n > 1)
        qsort(names, *n, sizeof *names, name_cmp);
    return names;
}

/* The files of the run's log directory (one, when job is given). */
static int local_logs(const fiber_run_info *r, const char *job, int headings,
                      fiber_buf *out)
{
    char dir[PATH_MAX];
    if (!r->dir[0])
        return FIBER_ENOKEY;
    int rc = fb_run_log_dir(r->run, r->dir, dir, sizeof dir);
    if (rc)
        return rc;
    size_t n;
    char **names = log_files(dir, job, &n);
    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX * 2];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        names[i][strlen(names[i]) - 4] = '\0';
        if (rc == 0 && headings)
            rc = fb_runs_heading(out, names[i]);
        if (rc == 0)
            rc = fb_buf_append_file(out, path);
        free(names[i]);
    }
    free(names);
    return rc == 0 && n == 0 ? FIBER_ENOKEY : rc;
}

/* ======================================================================
 * kill and clean
 * ====================================================================== */

/* SIGTERM, then SIGKILL for those still alive after the grace period. */
static int stop_pids(const long *pids, char *const *names, size_t n,
                     fiber_buf *rep)
{
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        if (kill((pid_t)pids[i], SIGTERM) != 0 && errno != ESRCH) {
            fb_runs_report(rep, "cannot signal %s (pid %ld): %s", names[i],
                           pids[i], strerror(errno));
            failed = 1;
        }
    }
    uint64_t deadline = fb_deadline_ms(fb_runs_grace_ms());
    for (;;) {
        int left = 0;
        for (size_t i = 0; i < n; i++)
            left += proc_alive(pids[i]);
        if (!left || fb_ms_left(deadline) == 0)
            break;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    for (size_t i = 0; i < n; i++) {
        if (proc_alive(pids[i])) {
            kill((pid_t)pids[i], SIGKILL);
            fb_runs_report(rep, "killed %s (pid %ld) with SIGKILL after the "
                                "grace period",
                           names[i], pids[i]);
        } else {
            fb_runs_report(rep, "stopped %s (pid %ld)", names[i], pids[i]);
        }
    }
    return failed;
}

/* The run's processes on this host: its master and jobs with a pid. */
static int local_kill(const fiber_run_info *r, fiber_buf *rep, int *stopped)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n_jobs; i++)
        n += r->jobs[i].pid > 0 && fb_runs_job_running(&r->jobs[i]);
    if (n == 0)
        return 0;
    long *pids = calloc(n, sizeof *pids);
    char **names = calloc(n, sizeof *names);
    if (!pids || !names) {
        free(pids);
        free(names);
        return fb_err(FIBER_ENOMEM, "out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < r->n_jobs; i++) {
        if (r->jobs[i].pid > 0 && fb_runs_job_running(&r->jobs[i])) {
            pids[k] = r->jobs[i].pid;
            names[k++] = r->jobs[i].name;
        }
    }
    int failed = stop_pids(pids, names, n, rep);
    *stopped += (int)n;
    free(pids);
    free(names);
    return failed ? fb_err(FIBER_ESYS, "could not signal every process of "
                                       "run %s (see the report)",
                           r->run)
                  : 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw)
{
    FB_UNUSED(st);
    FB_UNUSED(ftw);
    int rc = flag == FTW_DP ? rmdir(path) : unlink(path);
    return rc != 0 && errno != ENOENT ? -1 : 0;
}

/* Removes the run directory, logs included. */
static int local_clean(const fiber_run_info *r, int named, fiber_buf *rep)
{
    FB_UNUSED(named);
    if (!r->dir[0])
        return 0;
    if (nftw(r->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return fb_err_errno(FIBER_ESYS, "cannot remove %s", r->dir);
    fb_runs_report(rep, "removed %s", r->dir);
    return 0;
}

/* ======================================================================
 * start, follow, wait
 * ====================================================================== */

static int write_pidfile(const char *dir, long pid)
{
    char path[PATH_MAX], text[32];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, FB_RUN_PIDFILE) >=
        sizeof path)
        return fb_err(FIBER_EINVAL, "path too long: %s", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return fb_err_errno(FIBER_ESYS, "cannot write %s", path);
    int n = snprintf(text, sizeof text, "%ld\n", pid);
    int ok = write(fd, text, (size_t)n) == n;
    close(fd);
    return ok ? 0 : fb_err_errno(FIBER_ESYS, "cannot write %s", path);
}

/* Removes the run directory if nothing worth keeping is in it: the pid
 * file goes, an empty log directory goes, logs with content stay. */
static void tidy_run_dir(const char *dir)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/%s", dir, FB_RUN_PIDFILE);
    unlink(path);
    snprintf(path, sizeof path, "%s/logs", dir);
    rmdir(path);
    rmdir(dir);
}

/* Makes the run directory (and the base above it), private. */
static int make_run_dir(const char *run, char *dir, size_t size)
{
    char base[PATH_MAX];
    int rc = fb_run_base(base, sizeof base);
    if (rc == 0)
        rc = fb_private_dir(base);
    if (rc == 0)
        rc = fb_run_dir(run, dir, size);
    if (rc == 0)
        rc = fb_private_dir(dir);
    return rc;
}

/* Opens <log dir>/master.log for a detached master; path gets its name. */
static int open_master_log(const struct fiber_run *r, char *path, size_t size,
                           int *fd)
{
    char logs[PATH_MAX - 16];
    int rc = fb_run_log_dir(r->name, r->dir, logs, sizeof logs);
    if (rc == 0 && fb_make_dirs(logs) != 0)
        rc = fb_err_errno(FIBER_ESYS, "cannot create %s", logs);
    snprintf(path, size, "%s/master.log", logs);
    if (rc == 0 && (*fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
                               0600)) < 0)
        rc = fb_err_errno(FIBER_ESYS, "cannot create %s", path);
    return rc;
}

static int spawn_master(const struct fb_run_start *s, int detach, int log_fd,
                        pid_t *pid)
{
    char **env = fb_local_env(s->vars, s->n_vars);
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    if (detach) {
        /* Its own session: the terminal's ^C is not for it. */
        posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null",
                                         O_RDONLY, 0);
        posix_spawn_file_actions_adddup2(&fa, log_fd, STDOUT_FILENO);
        posix_spawn_file_actions_adddup2(&fa, log_fd, STDERR_FILENO);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
    }
    int err = env ? posix_spawnp(pid, s->argv[0], &fa, &attr,
                                 (char *const *)s->argv, env)
                  : ENOMEM;
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    free(env);
    if (err) {
        errno = err;
        return fb_err_errno(FIBER_ESPAWN, "cannot start %s", s->argv[0]);
    }
    return 0;
}

static int local_start(const struct fb_run_start *s, struct fiber_run *r)
{
    const fiber_run_opts *o = s->opts;
    if (o->cpu > 0 || o->memory_mb > 0 || o->gpu > 0 || o->image)
        return fb_err(FIBER_ENOTSUP,
                      "cpu, memory, gpu and image limit or choose a "
                      "container; the local backend runs the program on "
                      "this host as it is (drop them, or use the docker "
                      "backend)");
    int rc = make_run_dir(s->run, r->dir, sizeof r->dir);
    if (rc)
        return rc;
    int log_fd = -1;
    char log_path[PATH_MAX];
    if (o->detach && (rc = open_master_log(r, log_path, sizeof log_path,
                                           &log_fd)) != 0) {
        tidy_run_dir(r->dir);
        return rc;
    }
    pid_t pid;
    rc = spawn_master(s, o->detach, log_fd, &pid);
    if (log_fd >= 0)
        close(log_fd);
    if (rc) {
        if (o->detach)
            unlink(log_path);
        tidy_run_dir(r->dir);
        return rc;
    }
    r->pid = pid;
    r->detached = o->detach;
    if (write_pidfile(r->dir, pid) != 0)
        fb_err_clear(); /* the run goes on; only fiber ps will not know
                           its pid */
    return 0;
}

/* The child writes to our streams, or to its log. */
static int local_follow(struct fiber_run *r, int out_fd, int err_fd)
{
    FB_UNUSED(r);
    FB_UNUSED(out_fd);
    FB_UNUSED(err_fd);
    return 0;
}

static int local_wait(struct fiber_run *r, int timeout_ms, int *exit_code)
{
    uint64_t deadline = fb_deadline_ms(timeout_ms);
    while (!r->reaped) {
        int status;
        pid_t got = waitpid((pid_t)r->pid, &status,
                            timeout_ms < 0 ? 0 : WNOHANG);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return fb_err_errno(FIBER_ESYS, "waitpid(%ld)", r->pid);
        if (got == 0) {
            if (fb_ms_left(deadline) == 0)
                return fb_err(FIBER_ETIMEDOUT, "run %s is still running",
                              r->name);
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        r->reaped = 1;
        r->exit_code = WIFEXITED(status)     ? WEXITSTATUS(status)
                       : WIFSIGNALED(status) ? -WTERMSIG(status)
                                             : -1;
        tidy_run_dir(r->dir);
    }
    if (exit_code)
        *exit_code = r->exit_code;
    return 0;
}

static int local_describe(char *detail, size_t size)
{
    snprintf(detail, size, "processes on this host (%ld CPUs online)",
             sysconf(_SC_NPROCESSORS_ONLN));
    return 0;
}

const struct fb_run_ops fb_run_ops_local = {
    .name = "local",
    .describe = local_describe,
    .start = local_start,
    .follow = local_follow,
    .wait = local_wait,
    .list = local_list,
    .logs = local_logs,
    .kill = local_kill,
    .clean = local_clean,
};
