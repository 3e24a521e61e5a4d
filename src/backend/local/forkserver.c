/*
 * forkserver.c -- the local backend's client of a job command's fork
 * server (fiber_job_forkserver_set): one helper process per run that has
 * prepared an interpreter once and forks each job from it.
 *
 * The server is our child, started with posix_spawn the first time a job
 * asks for it, and holds the other end of a SOCK_SEQPACKET socket on the
 * descriptor FIBER_FORKSERVER_FD names.  Every message is one datagram of
 * NUL-terminated text fields, the first the message's kind:
 *
 *   server -> us   ready                       prepared; jobs may come
 *                  unusable <why>              cannot serve; it exits
 *   us -> server   start <job> <name> <dir> <n> <env 1> ... <env n>
 *                  with SCM_RIGHTS: the secret's pipe, stdin, stdout,
 *                  stderr (the job gets them on 3, 0, 1, 2); <dir> is
 *                  where it starts (its workdir, else our working
 *                  directory), <env> its whole environment
 *   server -> us   started <job> <pid>         with SCM_RIGHTS: its pidfd
 *                  failed <job> <why>          nothing was started
 *                  exited <job> <status>       reaped: code, or -signal
 *
 * The server answers each start before it reads the next, so at most one
 * answer is awaited at a time; exit reports may come at any moment and
 * are kept until the job's poll claims them.  A forked job is not our
 * child: its pidfd (made by its parent, the server, before it could be
 * reaped, so it names the right process) is what we poll and signal.
 *
 * Whatever goes wrong with the server itself (it does not start, says it
 * is unusable, dies, garbles, stops answering within connect_timeout_ms)
 * makes it "broken": logged once, killed, and every later job spawned.
 * A job it forked before keeps running; if its exit report is lost with
 * the server, the job ends with status 255 and a warning, as a job reaped
 * by someone else does.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/local/local.h"
#include "base/common.h"
#include "base/log.h"
#include "runtime/runid.h"

#define MSG_MAX (256 * 1024) /* the largest datagram either side sends */
#define MAX_FDS 4
#define SERVER_NAME "forkserver"
/* Room in the server's initial environment block that each forked job
 * rewrites with its own FIBER_BOOT_* variables, so that `fiber ps` (which
 * reads /proc/<pid>/environ) finds the job under its name. */
#define ENV_ROOM 2048
/* Room for "--fiber-job=<name>" (names are at most 63 bytes). */
#define ARG_ROOM 80

struct srv_msg {
    char text[1024];
    const char *field[4]; /* kind and up to three more fields */
    int n_fields;
    int fds[MAX_FDS];
    int n_fds;
};

static void msg_close_fds(struct srv_msg *m)
{
    for (int i = 0; i < m->n_fds; i++)
        close(m->fds[i]);
    m->n_fds = 0;
}

/* Gives up on the server: says why (once), kills and reaps it. */
static void srv_break(struct fb_forksrv *fs, const char *why)
{
    if (fs->broken)
        return;
    fs->broken = 1;
    fb_log_warn("fork server (pid %d) %s; starting jobs with posix_spawn "
                "from now on",
                (int)fs->pid, why);
    if (fs->fd >= 0)
        close(fs->fd);
    fs->fd = -1;
    if (fs->pid > 0) {
        kill(fs->pid, SIGKILL);
        while (waitpid(fs->pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    fs->pid = 0;
}

/* Splits a datagram into its NUL-terminated fields. */
static int msg_parse(struct srv_msg *m, size_t len)
{
    if (len == 0 || m->text[len - 1] != '\0')
        return -1;
    m->n_fields = 0;
    for (size_t off = 0; off < len && m->n_fields < 4;) {
        m->field[m->n_fields++] = m->text + off;
        off += strlen(m->text + off) + 1;
    }
    return 0;
}

/* Reads one message, waiting up to timeout_ms (-1: no limit).  Returns 1
 * with *m filled, 0 when none came in time, -1 when the server has gone
 * or sent garbage (it is then broken). */
static int srv_read(struct fb_forksrv *fs, int timeout_ms, struct srv_msg *m)
{
    if (fs->fd < 0)
        return -1;
    struct pollfd p = {.fd = fs->fd, .events = POLLIN};
    int r;
    while ((r = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR)
        ;
    if (r == 0)
        return 0;
    union {
        char buf[CMSG_SPACE(MAX_FDS * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = m->text, .iov_len = sizeof m->text};
    struct msghdr h = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = ctl.buf,
                       .msg_controllen = sizeof ctl.buf};
    ssize_t n;
    while ((n = recvmsg(fs->fd, &h, MSG_CMSG_CLOEXEC | MSG_DONTWAIT)) < 0 &&
           errno == EINTR)
        ;
    m->n_fds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int *fds = (int *)(void *)CMSG_DATA(c);
        for (size_t i = 0; i < k; i++) {
            if (m->n_fds < MAX_FDS)
                m->fds[m->n_fds++] = fds[i];
            else
                close(fds[i]);
        }
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    if (n <= 0 || (h.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
        msg_parse(m, (size_t)n) != 0) {
        msg_close_fds(m);
        srv_break(fs, n == 0  ? "ended"
                      : n < 0 ? "could not be read from"
                              : "sent a malformed message");
        return -1;
    }
    return 1;
}

static int note_exit(struct fb_forksrv *fs, const struct srv_msg *m)
{
    if (m->n_fields < 3)
        return -1;
    if (fs->n_exits == fs->cap_exits) {
        size_t cap = fs->cap_exits ? 2 * fs->cap_exits : 16;
        struct fb_forksrv_exit *e = realloc(fs->exits, cap * sizeof *e);
        if (!e)
            return -1;
        fs->exits = e;
        fs->cap_exits = cap;
    }
    fs->exits[fs->n_exits].job_id = strtoull(m->field[1], NULL, 10);
    fs->exits[fs->n_exits].status = atoi(m->field[2]);
    fs->n_exits++;
    return 0;
}

/* Reads messages until one that is not an exit report comes (returned as
 * 1), none is left within timeout_ms (0), or the server breaks (-1). */
static int srv_next(struct fb_forksrv *fs, int timeout_ms, struct srv_msg *m)
{
    for (;;) {
        int r = srv_read(fs, timeout_ms, m);
        if (r <= 0)
            return r;
        if (strcmp(m->field[0], "exited") != 0)
            return 1;
        msg_close_fds(m);
        if (note_exit(fs, m) != 0) {
            srv_break(fs, "sent a malformed exit report");
            return -1;
        }
    }
}

/* The server's environment: ours, the job command's variables, the
 * socket's descriptor, the run's identity for `fiber ps` (copied from
 * the first job's) and the room its jobs rewrite. */
static char **server_env(const struct fb_job_spec *spec, char *fd_var,
                         char *name_var, char *room_var)
{
    size_t n_cmd = 0, n_id = 0;
    while (spec->forkserver_env && spec->forkserver_env[n_cmd])
        n_cmd++;
    const char **set = calloc(n_cmd + 6, sizeof *set);
    if (!set)
        return NULL;
    for (size_t i = 0; i < n_cmd; i++)
        set[i] = spec->forkserver_env[i];
    /* The room comes before the server's own FIBER_BOOT_ variables:
     * `fiber ps` takes the first of each name. */
    set[n_cmd] = room_var;
    for (size_t i = 0; spec->env && spec->env[i] && n_id < 2; i++)
        if (strncmp(spec->env[i], FB_ENV_RUN "=", sizeof FB_ENV_RUN) == 0 ||
            strncmp(spec->env[i], FB_ENV_ADDR "=", sizeof FB_ENV_ADDR) == 0)
            set[n_cmd + 1 + n_id++] = spec->env[i];
    size_t n = n_cmd + 1 + n_id;
    set[n++] = fd_var;
    set[n++] = name_var;
    char **env = fb_local_env(set, n);
    free(set);
    return env;
}

static int server_spawn(struct fb_forksrv *fs, const struct fb_job_spec *spec,
                        int their_end)
{
    char fd_var[] = "FIBER_FORKSERVER_FD=3";
    char name_var[] = FB_ENV_NAME "=" SERVER_NAME;
    char room_var[sizeof "FIBER_FORKSERVER_ROOM=" + ENV_ROOM];
    memcpy(room_var, "FIBER_FORKSERVER_ROOM=", 22);
    memset(room_var + 22, '.', ENV_ROOM);
    room_var[sizeof room_var - 1] = '\0';
    char **env = server_env(spec, fd_var, name_var, room_var);
    if (!env)
        return fb_err(FIBER_ENOMEM, "out of memory");
    /* Its argv, then "--fiber-job=forkserver" padded with spaces: the room
     * in which each forked job writes "--fiber-job=<its name>", which is
     * how a spawned job shows in ps (and /proc/<pid>/cmdline). */
    char *argv[40];
    size_t argc = 0;
    while (spec->forkserver_argv[argc] && argc < 38) {
        argv[argc] = spec->forkserver_argv[argc];
        argc++;
    }
    char flag[ARG_ROOM + 1];
    memset(flag, ' ', ARG_ROOM);
    memcpy(flag, "--fiber-job=" SERVER_NAME, 22);
    flag[ARG_ROOM] = '\0';
    argv[argc++] = flag;
    argv[argc] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    int err = ENOMEM;
    if (posix_spawn_file_actions_adddup2(&fa, their_end, 3) == 0 &&
        posix_spawn_file_actions_addclosefrom_np(&fa, 4) == 0 &&
        fb_local_spawn_attr(&attr) == 0)
        err = posix_spawn(&fs->pid, spec->forkserver_argv[0], &fa, &attr,
                          argv, env);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    if (err) {
        fs->pid = 0;
        errno = err;
        return fb_err_errno(FIBER_ESPAWN, "exec %s",
                            spec->forkserver_argv[0]);
    }
    return 0;
}

/* Starts the server and waits until it is ready.  Returns 0, or -1 with
 * the server broken. */
static int srv_start(struct fb_forksrv *fs, const struct fb_job_spec *spec,
                     int timeout_ms)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        fs->broken = 1;
        fb_log_warn("fork server: socketpair: %s; starting jobs with "
                    "posix_spawn",
                    strerror(errno));
        return -1;
    }
    int size = MSG_MAX;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    int rc = server_spawn(fs, spec, sv[1]);
    close(sv[1]);
    fs->fd = sv[0];
    if (rc) {
        char why[300];
        snprintf(why, sizeof why, "could not start: %s", fiber_last_error());
        fb_err_clear();
        srv_break(fs, why);
        return -1;
    }
    struct srv_msg m;
    int r = srv_next(fs, timeout_ms, &m);
    if (r == 1)
        msg_close_fds(&m);
    if (r == 1 && strcmp(m.field[0], "ready") == 0) {
        fb_log_info("fork server started (pid %d)", (int)fs->pid);
        return 0;
    }
    if (r == 0)
        srv_break(fs, "did not get ready in time");
    else if (r == 1 && strcmp(m.field[0], "unusable") == 0) {
        char why[700];
        snprintf(why, sizeof why, "cannot serve: %s",
                 m.n_fields > 1 ? m.field[1] : "(no reason)");
        srv_break(fs, why);
    } else if (r == 1)
        srv_break(fs, "sent an unexpected message");
    return -1;
}

/* Appends a NUL-terminated field to buf at *len; -1 when it does not fit. */
static int put_field(char *buf, size_t *len, const char *text)
{
    size_t n = strlen(text) + 1;
    if (*len + n > MSG_MAX)
        return -1;
    memcpy(buf + *len, text, n);
    *len += n;
    return 0;
}

static int build_start(char *buf, size_t *len, const struct fb_job_spec *spec,
                       char *const *env)
{
    char id[32], count[32];
    size_t n_env = 0;
    while (env[n_env])
        n_env++;
    snprintf(id, sizeof id, "%llu", (unsigned long long)spec->job_id);
    snprintf(count, sizeof count, "%zu", n_env);
    /* A job starts where the master is now, as a spawned one would, not
     * where the server was started. */
    char cwd[4096];
    const char *wd = spec->opts && spec->opts->workdir ? spec->opts->workdir
                     : getcwd(cwd, sizeof cwd)         ? cwd
                                                       : "";
    *len = 0;
    if (put_field(buf, len, "start") || put_field(buf, len, id) ||
        put_field(buf, len, spec->name) || put_field(buf, len, wd) ||
        put_field(buf, len, count))
        return -1;
    for (size_t i = 0; i < n_env; i++)
        if (put_field(buf, len, env[i]))
            return -1;
    return 0;
}

static int send_start(struct fb_forksrv *fs, const char *buf, size_t len,
                      int secret_fd)
{
    /* A closed standard descriptor cannot be passed: the job gets
     * /dev/null there instead. */
    int fds[MAX_FDS] = {secret_fd, STDIN_FILENO, STDOUT_FILENO,
                        STDERR_FILENO};
    int opened[MAX_FDS] = {-1, -1, -1, -1};
    for (int i = 1; i < MAX_FDS; i++)
        if (fcntl(fds[i], F_GETFD) < 0)
            fds[i] = opened[i] = open("/dev/null", O_RDWR | O_CLOEXEC);
    union {
        char buf[CMSG_SPACE(sizeof fds)];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr h = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = ctl.buf,
                       .msg_controllen = sizeof ctl.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    ssize_t n;
    while ((n = sendmsg(fs->fd, &h, MSG_NOSIGNAL)) < 0 && errno == EINTR)
        ;
    int err = errno;
    for (int i = 1; i < MAX_FDS; i++)
        if (opened[i] >= 0)
            close(opened[i]);
    errno = err;
    return n == (ssize_t)len ? 0 : -1;
}

/* Waits for the answer to job's start.  Returns 0 with *pid and *pidfd,
 * FIBER_ESPAWN when the server says the job cannot start, or
 * FB_FORKSRV_SPAWN when the server broke. */
static int await_started(struct fb_forksrv *fs, const struct fb_job_spec *spec,
                         int timeout_ms, pid_t *pid, int *pidfd)
{
    uint64_t job = spec->job_id;
    struct srv_msg m;
    int r = srv_next(fs, timeout_ms, &m);
    if (r == 0)
        srv_break(fs, "did not answer a start in time");
    if (r != 1)
        return FB_FORKSRV_SPAWN;
    int ok = m.n_fields >= 3 && strtoull(m.field[1], NULL, 10) == job;
    if (ok && strcmp(m.field[0], "started") == 0 && m.n_fds == 1) {
        *pid = (pid_t)atol(m.field[2]);
        *pidfd = m.fds[0];
        return 0;
    }
    msg_close_fds(&m);
    if (ok && strcmp(m.field[0], "failed") == 0)
        return fb_err(FIBER_ESPAWN, "cannot start job '%s': %s", spec->name,
                      m.field[2]);
    srv_break(fs, "answered a start with an unexpected message");
    return FB_FORKSRV_SPAWN;
}

int fb_forksrv_fork(struct fb_forksrv *fs, const struct fb_job_spec *spec,
                    char *const *env, int secret_fd, int timeout_ms,
                    pid_t *pid, int *pidfd)
{
    if (fs->broken)
        return FB_FORKSRV_SPAWN;
    if (fs->fd < 0 && srv_start(fs, spec, timeout_ms) != 0)
        return FB_FORKSRV_SPAWN;
    char *buf = malloc(MSG_MAX);
    if (!buf)
        return fb_err(FIBER_ENOMEM, "out of memory");
    size_t len;
    int rc = FB_FORKSRV_SPAWN;
    if (build_start(buf, &len, spec, env) != 0)
        fb_log_info("job '%s': its environment is too large for the fork "
                    "server; spawning it", spec->name);
    else if (send_start(fs, buf, len, secret_fd) != 0)
        srv_break(fs, errno == EPIPE ? "ended" : "could not be written to");
    else
        rc = await_started(fs, spec, timeout_ms, pid, pidfd);
    free(buf);
    return rc;
}

int fb_forksrv_exit(struct fb_forksrv *fs, uint64_t job, int timeout_ms,
                    int *status)
{
    uint64_t deadline = fb_deadline_ms(timeout_ms);
    for (;;) {
        for (size_t i = 0; i < fs->n_exits; i++) {
            if (fs->exits[i].job_id == job) {
                *status = fs->exits[i].status;
                fs->exits[i] = fs->exits[--fs->n_exits];
                return 1;
            }
        }
        struct srv_msg m;
        int r = srv_read(fs, fb_ms_left(deadline), &m);
        if (r <= 0)
            return r;
        msg_close_fds(&m);
        /* Nothing but exit reports is expected between starts. */
        if (strcmp(m.field[0], "exited") != 0 || note_exit(fs, &m) != 0) {
            srv_break(fs, "sent an unexpected message");
            return -1;
        }
    }
}

void fb_forksrv_stop(struct fb_forksrv *fs)
{
    if (fs->fd >= 0)
        close(fs->fd); /* the server sees the end and exits */
    fs->fd = -1;
    if (fs->pid > 0) {
        /* It exits at once; a stuck one is not waited for long. */
        uint64_t deadline = fb_deadline_ms(2000);
        int status;
        pid_t r;
        while ((r = waitpid(fs->pid, &status, WNOHANG)) == 0 &&
               fb_ms_left(deadline) > 0) {
            struct timespec ts = {0, 2 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (r == 0) {
            kill(fs->pid, SIGKILL);
            while (waitpid(fs->pid, &status, 0) < 0 && errno == EINTR)
                ;
        }
    }
    fs->pid = 0;
    free(fs->exits);
    fs->exits = NULL;
    fs->n_exits = fs->cap_exits = 0;
}
