/*
 * runs.c -- finding runs and what they left behind: fiber_runs_list,
 * fiber_run_logs, fiber_run_kill, fiber_run_clean, and fiber_backend_check.
 *
 * Nothing here needs the run's cooperation.  A local run is its run
 * directory ($TMPDIR/fiber-<uid>/<run id>/): alive while master.sock
 * accepts a connection (connect, then close at once: the master logs that
 * at info level and moves on) or while the master recorded in master.pid
 * lives.  Its processes are found in /proc: the master owns the listening
 * socket, and every job carries FIBER_BOOT_RUN=<run id> in its initial
 * environment (the runtime hands it over; the child unsets it from environ,
 * but /proc/<pid>/environ keeps the original block).  Containers are found
 * by their fiber.run label.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/file.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "backend/slurm/slurm.h"
#include "api/runs.h"
#include "backend/backend.h"
#include "backend/kubernetes/k8s_master.h"
#include "backend/docker/image.h"
#include "core/common.h"

#define ENV_READ_MAX (256 * 1024)

/* ======================================================================
 * Where runs live
 * ====================================================================== */

int fb_runs_base(char *out, size_t size)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 60)
        tmp = "/tmp"; /* as core/service.c decides */
    int n = snprintf(out, size, "%s/fiber-%u", tmp, (unsigned)geteuid());
    if (n < 0 || (size_t)n >= size)
        return fb_err(FIBER_EINVAL, "run directory path too long");
    return 0;
}

int fb_run_id_valid(const char *run)
{
    size_t n = run ? strlen(run) : 0;
    if (n == 0 || n > 63 || run[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = run[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
            return 0;
    }
    return 1;
}

int fb_run_log_dir(const char *run, const char *run_dir, char *out,
                   size_t size)
{
    char configured[512];
    int rc = fiber_config_get("log_dir", configured, sizeof configured);
    if (rc)
        return rc;
    int n = configured[0] ? snprintf(out, size, "%s/%s", configured, run)
                          : snprintf(out, size, "%s/logs", run_dir);
    if (n < 0 || (size_t)n >= size)
        return fb_err(FIBER_ECONFIG, "log directory path too long");
    return 0;
}

/* ======================================================================
 * Processes
 * ====================================================================== */

/* What /proc/<pid>/stat says: state letter, parent, start time (seconds
 * since the epoch).  Returns 0, or -1 if the process is gone. */
static int proc_stat(long pid, char *state, long *ppid, double *start_epoch)
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
    long parent = 0;
    unsigned long long ticks = 0;
    /* fields after comm: 3 state, 4 ppid, ..., 22 starttime */
    if (sscanf(p + 1,
               " %c %ld %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d "
               "%*d %*d %*d %*d %llu",
               &st, &parent, &ticks) != 3)
        return -1;
    if (state)
        *state = st;
    if (ppid)
        *ppid = parent;
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
    return pid > 0 && proc_stat(pid, &state, NULL, NULL) == 0 &&
           state != 'Z' && state != 'X';
}

long fb_run_pidfile_master(const char *run_dir)
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
    if (pid <= 0 || proc_stat(pid, &state, NULL, &started) != 0 ||
        state == 'Z' || state == 'X')
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
    int is_job;      /* has FIBER_BOOT_ADDR: a job; else a launched master */
    char run[64];
    char name[64];
};

struct proc_table {
    struct run_proc *items;
    size_t n, cap;
};

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
 * are the containers' business: fiber ps lists the containers instead. */
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
        if (read_small_file(path, block, ENV_READ_MAX, &len) != 0)
            continue;
        const char *run = env_find(block, len, "FIBER_BOOT_RUN");
        if (!run || !fb_run_id_valid(run) ||
            (our_ns[0] && !same_mount_ns(pid, our_ns)))
            continue;
        if (t->n == t->cap) {
            size_t cap = t->cap ? 2 * t->cap : 16;
            struct run_proc *items = realloc(t->items, cap * sizeof *items);
            if (!items) {
                rc = fb_err(FIBER_ENOMEM, "out of memory");
                break;
            }
            t->items = items;
            t->cap = cap;
        }
        struct run_proc *p = &t->items[t->n];
        memset(p, 0, sizeof *p);
        p->pid = pid;
        if (proc_stat(pid, &p->state, NULL, NULL) != 0)
            continue;
        p->is_job = env_find(block, len, "FIBER_BOOT_ADDR") != NULL;
        const char *name = env_find(block, len, "FIBER_BOOT_NAME");
        fb_strlcpy(p->run, run, sizeof p->run);
        fb_strlcpy(p->name, name ? name : p->is_job ? "job" : "master",
                   sizeof p->name);
        t->n++;
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
        if (*end || pid <= 0)
            continue;
        char dir[64];
        snprintf(dir, sizeof dir, "/proc/%ld/fd", pid);
        DIR *fds = opendir(dir);
        if (!fds)
            continue;
        struct dirent *f;
        while (owner < 0 && (f = readdir(fds))) {
            char link[PATH_MAX], target[80];
            snprintf(link, sizeof link, "%s/%s", dir, f->d_name);
            ssize_t n = readlink(link, target, sizeof target - 1);
            if (n > 0) {
                target[n] = '\0';
                if (strcmp(target, want) == 0)
                    owner = pid;
            }
        }
        closedir(fds);
    }
    closedir(d);
    return owner;
}

/* Is <run_dir>/master.lock locked?  A master that holds an flock on it
 * for its lifetime (proposed for the runtime; the kernel drops the lock
 * when the process dies, SIGKILL included, and across containers that
 * mount the directory) is alive exactly while the lock is held.  Returns
 * 1 held, 0 not held, -1 no such file. */
static int lock_held(const char *run_dir)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/master.lock", run_dir);
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
 * Building the list
 * ====================================================================== */

static fiber_run_info *find_run(fiber_run_list *l, const char *run)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->runs[i].run, run) == 0)
            return &l->runs[i];
    return NULL;
}

static fiber_run_info *get_run(fiber_run_list *l, const char *run,
                               const char *backend)
{
    fiber_run_info *r = find_run(l, run);
    if (r)
        return r;
    fiber_run_info *runs = realloc(l->runs, (l->n + 1) * sizeof *runs);
    if (!runs) {
        fb_err(FIBER_ENOMEM, "out of memory");
        return NULL;
    }
    l->runs = runs;
    r = &runs[l->n++];
    memset(r, 0, sizeof *r);
    fb_strlcpy(r->run, run, sizeof r->run);
    fb_strlcpy(r->backend, backend, sizeof r->backend);
    r->master_pid = -1;
    return r;
}

static fiber_job_info *add_job(fiber_run_info *r)
{
    fiber_job_info *jobs = realloc(r->jobs, (r->n_jobs + 1) * sizeof *jobs);
    if (!jobs) {
        fb_err(FIBER_ENOMEM, "out of memory");
        return NULL;
    }
    r->jobs = jobs;
    fiber_job_info *j = &jobs[r->n_jobs++];
    memset(j, 0, sizeof *j);
    j->pid = -1;
    return j;
}

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
    fiber_job_info *j = add_job(r);
    if (!j)
        return FIBER_ENOMEM;
    fb_strlcpy(j->name, name, sizeof j->name);
    fb_strlcpy(j->role, role, sizeof j->role);
    fb_strlcpy(j->state, state == 'Z' ? "zombie" : "running", sizeof j->state);
    snprintf(j->status, sizeof j->status, "pid %ld", pid);
    j->pid = pid;
    return 0;
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
        if (e->d_name[0] == '.' || n < 5 || n - 4 >= 64 ||
            strcmp(e->d_name + n - 4, ".log") != 0)
            continue;
        char name[64];
        memcpy(name, e->d_name, n - 4);
        name[n - 4] = '\0';
        if (has_job(r, name))
            continue;
        fiber_job_info *j = add_job(r);
        if (!j) {
            rc = FIBER_ENOMEM;
            break;
        }
        fb_strlcpy(j->name, name, sizeof j->name);
        fb_strlcpy(j->role, strcmp(name, "master") ? "job" : "master",
                   sizeof j->role);
        fb_strlcpy(j->state, "ended", sizeof j->state);
        fb_strlcpy(j->status, "ended; log kept", sizeof j->status);
    }
    closedir(d);
    return rc;
}

/* One local run directory. */
static int list_local_run(fiber_run_list *l, const char *base,
                          const char *run, const struct proc_table *procs)
{
    fiber_run_info *r = get_run(l, run, "local");
    if (!r)
        return FIBER_ENOMEM;
    if ((size_t)snprintf(r->dir, sizeof r->dir, "%s/%s", base, run) >=
        sizeof r->dir)
        return fb_err(FIBER_EINVAL, "run directory path too long");
    char sock[PATH_MAX];
    snprintf(sock, sizeof sock, "%s/master.sock", r->dir);
    int listening = socket_alive(sock);
    long pid = fb_run_pidfile_master(r->dir);
    if (pid < 0 && listening)
        pid = socket_owner(sock);
    r->master_pid = pid;
    r->alive = listening || pid > 0 || lock_held(r->dir) == 1;
    int rc = 0;
    if (pid > 0) {
        char state = 'R';
        proc_stat(pid, &state, NULL, NULL);
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
    return rc;
}

static int list_local(fiber_run_list *l, const char *only)
{
    char base[PATH_MAX];
    int rc = fb_runs_base(base, sizeof base);
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
        rc = list_local_run(l, base, e->d_name, &procs);
    }
    if (d)
        closedir(d);
    free(procs.items);
    return rc;
}

/* The containers labelled fiber.run (=only, when given), as parsed JSON. */
static int docker_containers(struct fb_engine *e, const char *only,
                             json_t **out)
{
    char filter[256], escaped[768], path[1024];
    if (only)
        snprintf(filter, sizeof filter, "{\"label\":[\"fiber.run=%s\"]}",
                 only);
    else
        snprintf(filter, sizeof filter, "{\"label\":[\"fiber.run\"]}");
    int rc = fb_engine_escape(filter, escaped, sizeof escaped);
    if (rc)
        return rc;
    snprintf(path, sizeof path, "/containers/json?all=1&filters=%s", escaped);
    return fb_engine_json(e, "GET", path, NULL, out, "listing containers");
}

static const char *label_of(json_t *c, const char *key)
{
    const char *v = json_string_value(
        json_object_get(json_object_get(c, "Labels"), key));
    return v ? v : "";
}

static int add_container_job(fiber_run_info *r, json_t *c)
{
    fiber_job_info *j = add_job(r);
    if (!j)
        return FIBER_ENOMEM;
    const char *name = label_of(c, "fiber.name");
    if (!*name) {
        const char *cname = json_string_value(
            json_array_get(json_object_get(c, "Names"), 0));
        name = cname ? cname + (cname[0] == '/') : "?";
    }
    const char *role = label_of(c, "fiber.role");
    const char *state = json_string_value(json_object_get(c, "State"));
    const char *status = json_string_value(json_object_get(c, "Status"));
    const char *id = json_string_value(json_object_get(c, "Id"));
    fb_strlcpy(j->name, name, sizeof j->name);
    fb_strlcpy(j->role, *role ? role : "job", sizeof j->role);
    fb_strlcpy(j->state, state ? state : "?", sizeof j->state);
    fb_strlcpy(j->status, status ? status : "", sizeof j->status);
    snprintf(j->container, sizeof j->container, "%.12s", id ? id : "");
    return 0;
}

/* Adds containers to the list; a docker-only run is alive while its master
 * container (or, without one, any of its containers) runs. */
static int list_docker(fiber_run_list *l, const char *only)
{
    struct stat st;
    struct fb_engine e;
    int rc = fb_engine_open(&e);
    if (rc) {
        /* No daemon here at all is normal: say nothing.  A daemon that is
         * there but unusable deserves a word. */
        if (!(rc == FIBER_EUNREACHABLE && e.socket[0] &&
              stat(e.socket, &st) != 0 && errno == ENOENT))
            snprintf(l->warning, sizeof l->warning,
                     "containers not listed: %s", fiber_last_error());
        return 0;
    }
    json_t *list = NULL;
    rc = docker_containers(&e, only, &list);
    fb_engine_close(&e);
    if (rc) {
        snprintf(l->warning, sizeof l->warning, "containers not listed: %s",
                 fiber_last_error());
        return 0;
    }
    size_t i;
    json_t *c;
    json_array_foreach(list, i, c)
    {
        const char *run = label_of(c, "fiber.run");
        if (!fb_run_id_valid(run))
            continue;
        int known = find_run(l, run) != NULL;
        fiber_run_info *r = get_run(l, run, "docker");
        if (!r || add_container_job(r, c) != 0) {
            rc = FIBER_ENOMEM;
            break;
        }
        if (known)
            fb_strlcpy(r->backend, "docker", sizeof r->backend);
        /* A running container of the run: its master (fiber.role master)
         * or a job, which lives only as long as its master. */
        if (strcmp(r->jobs[r->n_jobs - 1].state, "running") == 0)
            r->alive = 1;
    }
    json_decref(list);
    return rc;
}

/* A run directory with no sign of life is not always dead:
 *   - a master that listens on TCP (container backends) and has no job
 *     running right now leaves no socket file; the docker backend keeps a
 *     secrets/ directory in the run directory while its master lives (and
 *     a crashed one leaves it behind);
 *   - a master creates its run directory a moment before its socket.
 * Such runs are "cannot tell" (-1), never "dead", so that fiber clean
 * leaves them alone.  A stale socket file is the sign of a dead master. */
#define YOUNG_RUN_DIR_S 10
static void mark_undecided(fiber_run_list *l)
{
    time_t now = time(NULL);
    for (size_t i = 0; i < l->n; i++) {
        fiber_run_info *r = &l->runs[i];
        char path[PATH_MAX];
        struct stat st;
        if (r->alive || !r->dir[0])
            continue;
        snprintf(path, sizeof path, "%s/master.sock", r->dir);
        if (lstat(path, &st) == 0 || lock_held(r->dir) == 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", r->dir, FB_RUN_PIDFILE);
        if (lstat(path, &st) == 0)
            continue; /* its recorded master has ended */
        snprintf(path, sizeof path, "%s/secrets", r->dir);
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
            r->alive = -1;
        else if (lstat(r->dir, &st) == 0 &&
                 now - st.st_mtime < YOUNG_RUN_DIR_S)
            r->alive = -1;
    }
}

/* A job that left a log and also runs (a container) is listed once, as
 * the running one. */
static void drop_shadowed_logs(fiber_run_info *r)
{
    size_t k = 0;
    for (size_t i = 0; i < r->n_jobs; i++) {
        const fiber_job_info *j = &r->jobs[i];
        int shadowed = 0;
        if (strcmp(j->state, "ended") == 0)
            for (size_t m = 0; m < r->n_jobs && !shadowed; m++)
                shadowed = m != i && strcmp(r->jobs[m].name, j->name) == 0 &&
                           strcmp(r->jobs[m].state, "ended") != 0;
        if (!shadowed)
            r->jobs[k++] = *j;
    }
    r->n_jobs = k;
}

static int job_cmp(const void *a, const void *b)
{
    const fiber_job_info *x = a, *y = b;
    int xm = strcmp(x->role, "master") == 0;
    int ym = strcmp(y->role, "master") == 0;
    if (xm != ym)
        return ym - xm;
    return strverscmp(x->name, y->name);
}

static int run_cmp(const void *a, const void *b)
{
    return strcmp(((const fiber_run_info *)a)->run,
                  ((const fiber_run_info *)b)->run);
}

FIBER_API void fiber_run_list_free(fiber_run_list *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        free(l->runs[i].jobs);
    free(l->runs);
    memset(l, 0, sizeof *l);
}

FIBER_API int fiber_runs_list(const char *run, fiber_run_list *out)
{
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_runs_list: out is NULL");
    if (run && !fb_run_id_valid(run))
        return fb_err(FIBER_EINVAL, "'%.80s' is not a run id (like "
                                    "fiber-3f9a1c2e)",
                      run);
    fiber_run_list l;
    memset(&l, 0, sizeof l);
    int rc = list_local(&l, run);
    if (rc == 0)
        rc = list_docker(&l, run);
    if (rc == 0)
        mark_undecided(&l);
    for (size_t i = 0; rc == 0 && i < l.n; i++)
        drop_shadowed_logs(&l.runs[i]);
    if (rc == 0 && run && l.n == 0)
        rc = fb_err(FIBER_ENOKEY,
                    "no run %s on this host: no run directory and no "
                    "container labelled fiber.run=%s; fiber ps lists runs",
                    run, run);
    if (rc) {
        fiber_run_list_free(&l);
        return rc;
    }
    /* (qsort's pointer must not be NULL, even for no elements.) */
    for (size_t i = 0; i < l.n; i++)
        if (l.runs[i].n_jobs > 1)
            qsort(l.runs[i].jobs, l.runs[i].n_jobs, sizeof *l.runs[i].jobs,
                  job_cmp);
    if (l.n > 1)
        qsort(l.runs, l.n, sizeof *l.runs, run_cmp);
    *out = l;
    return 0;
}

/* ======================================================================
 * Logs
 * ====================================================================== */

static int append_str(fiber_buf *b, const char *s)
{
    return fiber_buf_append(b, s, strlen(s)) ? fb_err(FIBER_ENOMEM,
                                                      "out of memory")
                                             : 0;
}

static int append_heading(fiber_buf *out, const char *name)
{
    if (out->len && out->data[out->len - 1] != '\n' && append_str(out, "\n"))
        return FIBER_ENOMEM;
    char line[128];
    snprintf(line, sizeof line, "==> %s <==\n", name);
    return append_str(out, line);
}

static int append_file(fiber_buf *out, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fb_err_errno(FIBER_ESYS, "cannot read %s", path);
    char chunk[65536];
    ssize_t n;
    int rc = 0;
    while (rc == 0 && (n = read(fd, chunk, sizeof chunk)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = fb_err_errno(FIBER_ESYS, "cannot read %s", path);
        else if (fiber_buf_append(out, chunk, (size_t)n))
            rc = fb_err(FIBER_ENOMEM, "out of memory");
    }
    close(fd);
    return rc;
}

static int name_cmp(const void *a, const void *b)
{
    return strverscmp(*(char *const *)a, *(char *const *)b);
}

/* The local log files of run (one, when job is given). */
static int local_logs(const fiber_run_info *r, const char *job, int headings,
                      fiber_buf *out, int *found)
{
    char dir[PATH_MAX];
    if (fb_run_log_dir(r->run, r->dir, dir, sizeof dir) != 0)
        return FIBER_ECONFIG;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    char *names[4096];
    size_t n = 0;
    struct dirent *e;
    while (n < FB_ARRAY_LEN(names) && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || len < 5 ||
            strcmp(e->d_name + len - 4, ".log") != 0)
            continue;
        if (job && (len - 4 != strlen(job) ||
                    strncmp(e->d_name, job, len - 4) != 0))
            continue;
        if ((names[n] = strdup(e->d_name)) != NULL)
            n++;
    }
    closedir(d);
    if (n > 1)
        qsort(names, n, sizeof *names, name_cmp);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX * 2], name[256];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        snprintf(name, sizeof name, "%.*s", (int)(strlen(names[i]) - 4),
                 names[i]);
        if (rc == 0 && headings)
            rc = append_heading(out, name);
        if (rc == 0)
            rc = append_file(out, path);
        (*found)++;
        free(names[i]);
    }
    return rc;
}

static int to_buf(void *ud, int stream, const void *data, size_t len)
{
    FB_UNUSED(stream);
    return fiber_buf_append(ud, data, len) ? fb_err(FIBER_ENOMEM,
                                                    "out of memory")
                                           : 0;
}

static int demux_to_buf(void *ud, const void *data, size_t len)
{
    struct {
        struct fb_demux d;
        fiber_buf *out;
    } *s = ud;
    return fb_demux_feed(&s->d, data, len, to_buf, s->out);
}

static int container_logs(struct fb_engine *e, const fiber_job_info *j,
                          fiber_buf *out)
{
    char path[256], what[128];
    snprintf(path, sizeof path,
             "/containers/%s/logs?stdout=1&stderr=1&timestamps=0",
             j->container);
    snprintf(what, sizeof what, "logs of container %s", j->container);
    struct {
        struct fb_demux d;
        fiber_buf *out;
    } s = {{{0}, 0, 0, 0}, out};
    return fb_engine_stream(e, "GET", path, demux_to_buf, &s, what);
}

FIBER_API int fiber_run_logs(const char *run, const char *job, fiber_buf *out)
{
    if (!run || !out)
        return fb_err(FIBER_EINVAL, "fiber_run_logs: run or out is NULL");
    fiber_run_list l = {0};
    int rc = fiber_runs_list(run, &l);
    if (rc)
        return rc;
    const fiber_run_info *r = &l.runs[0];
    int found = 0, headings = job == NULL;
    size_t before = out->len;
    if (r->dir[0])
        rc = local_logs(r, job, headings, out, &found);
    struct fb_engine e = {0};
    int engine_open = 0;
    for (size_t i = 0; rc == 0 && i < r->n_jobs; i++) {
        const fiber_job_info *j = &r->jobs[i];
        if (!j->container[0] || (job && strcmp(job, j->name) != 0))
            continue;
        if (!engine_open && (rc = fb_engine_open(&e)) != 0)
            break;
        engine_open = 1;
        if (headings)
            rc = append_heading(out, j->name);
        if (rc == 0)
            rc = container_logs(&e, j, out);
        found++;
    }
    if (engine_open)
        fb_engine_close(&e);
    if (rc == 0 && !found)
        rc = job ? fb_err(FIBER_ENOKEY,
                          "run %s has no job %s with logs (fiber ps %s "
                          "lists its jobs)",
                          run, job, run)
                 : fb_err(FIBER_ENOKEY,
                          "run %s has no logs: local children write a log "
                          "file only when they log, and an attached "
                          "master's output went to its terminal",
                          run);
    if (rc)
        out->len = before;
    fiber_run_list_free(&l);
    return rc;
}

/* ======================================================================
 * Kill
 * ====================================================================== */

static void report(fiber_buf *b, const char *fmt, ...) FIBER_PRINTF(2, 3);
static void report(fiber_buf *b, const char *fmt, ...)
{
    if (!b)
        return;
    char line[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fiber_buf_append(b, line, strlen(line));
    fiber_buf_append(b, "\n", 1);
}

static int grace_ms(void)
{
    char text[32];
    if (fiber_config_get("terminate_grace_ms", text, sizeof text) != 0)
        return 2000;
    return atoi(text);
}

/* SIGTERM, then SIGKILL for those still alive after the grace period. */
static int stop_pids(const long *pids, const char *const *names, size_t n,
                     fiber_buf *rep)
{
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        if (kill((pid_t)pids[i], SIGTERM) != 0 && errno != ESRCH) {
            report(rep, "cannot signal %s (pid %ld): %s", names[i], pids[i],
                   strerror(errno));
            failed = 1;
        }
    }
    uint64_t deadline = fb_deadline_ms(grace_ms());
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
            report(rep, "killed %s (pid %ld) with SIGKILL after the grace "
                        "period",
                   names[i], pids[i]);
        } else {
            report(rep, "stopped %s (pid %ld)", names[i], pids[i]);
        }
    }
    return failed;
}

static int kill_local(const fiber_run_info *r, fiber_buf *rep, int *stopped)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n_jobs; i++)
        n += r->jobs[i].pid > 0 && strcmp(r->jobs[i].state, "running") == 0;
    if (n == 0)
        return 0;
    long *pids = calloc(n, sizeof *pids);
    const char **names = calloc(n, sizeof *names);
    if (!pids || !names) {
        free(pids);
        free(names);
        return fb_err(FIBER_ENOMEM, "out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < r->n_jobs; i++) {
        if (r->jobs[i].pid > 0 && strcmp(r->jobs[i].state, "running") == 0) {
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

static int container_running(struct fb_engine *e, const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/containers/%s/json", id);
    json_t *j = NULL;
    if (fb_engine_json(e, "GET", path, NULL, &j, "inspecting a container"))
        return 0;
    int running = json_is_true(
        json_object_get(json_object_get(j, "State"), "Running"));
    json_decref(j);
    return running;
}

static int kill_docker(const fiber_run_info *r, fiber_buf *rep, int *stopped)
{
    struct fb_engine e;
    int rc = 0, any = 0;
    for (size_t i = 0; i < r->n_jobs; i++)
        any |= r->jobs[i].container[0] &&
               strcmp(r->jobs[i].state, "running") == 0;
    if (!any)
        return 0;
    if ((rc = fb_engine_open(&e)) != 0)
        return rc;
    char path[160];
    for (size_t i = 0; i < r->n_jobs; i++) {
        const fiber_job_info *j = &r->jobs[i];
        if (!j->container[0] || strcmp(j->state, "running") != 0)
            continue;
        snprintf(path, sizeof path, "/containers/%s/kill?signal=SIGTERM",
                 j->container);
        int k = fb_engine_json(&e, "POST", path, NULL, NULL, "stopping a "
                                                             "container");
        if (k && k != FIBER_ENOKEY) {
            report(rep, "cannot stop container %s (%s): %s", j->container,
                   j->name, fiber_last_error());
            rc = k;
        }
    }
    uint64_t deadline = fb_deadline_ms(grace_ms());
    for (size_t i = 0; i < r->n_jobs; i++) {
        const fiber_job_info *j = &r->jobs[i];
        if (!j->container[0] || strcmp(j->state, "running") != 0)
            continue;
        while (container_running(&e, j->container) && fb_ms_left(deadline)) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (container_running(&e, j->container)) {
            snprintf(path, sizeof path, "/containers/%s/kill?signal=SIGKILL",
                     j->container);
            fb_engine_json(&e, "POST", path, NULL, NULL, "killing a container");
            report(rep, "killed container %s (%s) with SIGKILL after the "
                        "grace period",
                   j->container, j->name);
        } else {
            report(rep, "stopped container %s (%s)", j->container, j->name);
        }
        (*stopped)++;
    }
    fb_engine_close(&e);
    return rc;
}

FIBER_API int fiber_run_kill(const char *run, fiber_buf *rep)
{
    if (!run)
        return fb_err(FIBER_EINVAL, "fiber_run_kill: run is NULL");
    fiber_run_list l = {0};
    int rc = fiber_runs_list(run, &l);
    if (rc)
        return rc;
    const fiber_run_info *r = &l.runs[0];
    int stopped = 0;
    int master_unknown = r->dir[0] && r->alive && r->master_pid < 0;
    for (size_t i = 0; i < r->n_jobs; i++)
        if (r->jobs[i].container[0] && !strcmp(r->jobs[i].role, "master"))
            master_unknown = 0; /* the master is a container */
    rc = kill_docker(r, rep, &stopped);
    int rc2 = kill_local(r, rep, &stopped);
    if (rc == 0)
        rc = rc2;
    if (rc == 0 && master_unknown) {
        report(rep, "could not find the master of run %s among this "
                    "user's processes on this host",
               run);
        rc = fb_err(FIBER_ESTATE,
                    "run %s is alive but its master could not be found (in "
                    "a container started by another run? another user's?); "
                    "stop it where it runs",
                    run);
    } else if (rc == 0 && stopped == 0) {
        rc = fb_err(FIBER_ENOKEY, "nothing of run %s is running%s", run,
                    r->alive ? "" : "; fiber clean removes what it left");
    }
    fiber_run_list_free(&l);
    return rc;
}

/* ======================================================================
 * Clean
 * ====================================================================== */

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw)
{
    FB_UNUSED(st);
    FB_UNUSED(ftw);
    int rc = flag == FTW_DP ? rmdir(path) : unlink(path);
    return rc != 0 && errno != ENOENT ? -1 : 0;
}

static int remove_tree(const char *dir)
{
    if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return fb_err_errno(FIBER_ESYS, "cannot remove %s", dir);
    return 0;
}

/* Removes the run's containers that have stopped.  A container that was
 * created but not started yet is left alone unless the run was named: a
 * master elsewhere may be about to start it. */
static int clean_docker(const fiber_run_info *r, int named, fiber_buf *rep,
                        struct fb_engine *e, int *engine_open)
{
    int rc = 0;
    for (size_t i = 0; i < r->n_jobs && rc == 0; i++) {
        const fiber_job_info *j = &r->jobs[i];
        if (!j->container[0])
            continue;
        if (!named && strcmp(j->state, "created") == 0) {
            report(rep, "left container %s (%s) of run %s: created, not "
                        "started yet",
                   j->container, j->name, r->run);
            continue;
        }
        if (strcmp(j->state, "running") == 0 ||
            strcmp(j->state, "paused") == 0 ||
            strcmp(j->state, "restarting") == 0) {
            report(rep, "left container %s (%s) of run %s: it still runs; "
                        "fiber kill %s stops it",
                   j->container, j->name, r->run, r->run);
            continue;
        }
        if (!*engine_open && (rc = fb_engine_open(e)) != 0)
            break;
        *engine_open = 1;
        char path[128];
        snprintf(path, sizeof path, "/containers/%s?v=1", j->container);
        int k = fb_engine_json(e, "DELETE", path, NULL, NULL,
                               "removing a container");
        if (k == 0 || k == FIBER_ENOKEY)
            report(rep, "removed container %s (%s) of run %s", j->container,
                   j->name, r->run);
        else
            rc = k;
    }
    return rc;
}

FIBER_API int fiber_run_clean(const char *run, fiber_buf *rep)
{
    fiber_run_list l = {0};
    int rc = fiber_runs_list(run, &l);
    if (rc)
        return rc;
    if (run && l.runs[0].alive > 0) {
        fiber_run_list_free(&l);
        return fb_err(FIBER_ESTATE,
                      "run %s is alive; stop it first (fiber kill %s)", run,
                      run);
    }
    if (run && l.runs[0].alive < 0)
        report(rep, "run %s: cannot tell whether its master lives (it "
                    "would listen on TCP, with no job running now); "
                    "cleaning it as asked",
               run);
    struct fb_engine e = {0};
    int engine_open = 0;
    for (size_t i = 0; rc == 0 && i < l.n; i++) {
        const fiber_run_info *r = &l.runs[i];
        if (!run && r->alive < 0)
            report(rep, "left %s: cannot tell whether run %s is alive; "
                        "fiber clean %s removes it if you know it ended",
                   r->dir, r->run, r->run);
        if (r->alive > 0 || (!run && r->alive < 0))
            continue;
        rc = clean_docker(r, run != NULL, rep, &e, &engine_open);
        if (rc == 0 && r->dir[0]) {
            rc = remove_tree(r->dir);
            if (rc == 0)
                report(rep, "removed %s", r->dir);
        }
    }
    if (engine_open)
        fb_engine_close(&e);
    fiber_run_list_free(&l);
    return rc;
}

/* ======================================================================
 * Backends
 * ====================================================================== */

FIBER_API int fiber_backend_check(const char *backend, char *detail,
                                  size_t size)
{
    char scratch[8];
    if (!detail || size == 0) {
        detail = scratch;
        size = sizeof scratch;
    }
    detail[0] = '\0';
    if (!backend)
        return fb_err(FIBER_EINVAL, "fiber_backend_check: backend is NULL");
    int built = fb_backend_find(backend) != NULL;
    int rc;
    if (strcmp(backend, "local") == 0) {
        snprintf(detail, size, "processes on this host (%ld CPUs online)",
                 sysconf(_SC_NPROCESSORS_ONLN));
        rc = 0;
    } else if (strcmp(backend, "docker") == 0) {
        rc = fb_engine_describe(detail, size);
        if (rc == 0 && !built) {
            size_t n = strlen(detail);
            snprintf(detail + n, size - n,
                     "; but this build of fiber has no docker backend yet "
                     "(images and runs work; jobs cannot start)");
            rc = fb_err(FIBER_ENOTSUP, "%s", detail);
        }
    } else if (strcmp(backend, "slurm") == 0) {
        rc = fb_slurm_describe(detail, size);
    } else if (strcmp(backend, "kubernetes") == 0) {
        if (built) {
            rc = fb_k8s_describe(detail, size);
        } else {
            snprintf(detail, size, "not built yet");
            rc = fb_err(FIBER_ENOTSUP, "the %s backend is not built yet",
                        backend);
        }
    } else {
        snprintf(detail, size,
                 "unknown backend (known: local, docker, slurm, kubernetes)");
        rc = fb_err(FIBER_EINVAL, "unknown backend '%.40s'; known: local, "
                                  "docker, slurm, kubernetes",
                    backend);
    }
    if (rc == 0)
        fb_err_clear();
    return rc;
}
