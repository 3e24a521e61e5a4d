/*
 * local.c -- the local backend: every job is a process on this host.
 *
 * Jobs are started with posix_spawn (glibc's uses clone(CLONE_VFORK), so an
 * exec failure comes back as posix_spawn's return value rather than as a
 * child that exits silently).  The child gets a clean descriptor table
 * (everything from fd 4 up is closed; fiber's own descriptors are
 * close-on-exec anyway), default signal handling, and the bootstrap secret
 * on FB_SECRET_FD through a pipe that holds exactly the secret.
 *
 * Exits are noticed through a pidfd, which the runtime's service thread
 * polls; poll_job reaps with waitpid(WNOHANG), so no zombie is left.
 *
 * A job whose spec names a fork server (a Python program's jobs) is forked
 * from it instead, unless the configuration's fork_server is off
 * (forkserver.c).  Such a job is the server's child, not ours: it is
 * watched and signalled through the pidfd the server hands over, and its
 * exit status is the one the server reports.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/local/local.h"
#include "base/common.h"
#include "base/log.h"
#include "runtime/runid.h"

extern char **environ;

struct local_job {
    int pidfd;  /* -1 when the kernel has no pidfd_open */
    int forked; /* forked by the fork server: not our child */
};

struct local_state {
    struct fb_forksrv forksrv;
};

static int local_init(struct fb_backend *be)
{
    struct local_state *st = be->state;
    st->forksrv.fd = -1;
    return 0;
}

static void local_fini(struct fb_backend *be)
{
    struct local_state *st = be->state;
    fb_forksrv_stop(&st->forksrv);
}

/* NAME=value entries: does entry set the variable that var sets? */
static int same_var(const char *entry, const char *var)
{
    size_t n = strcspn(var, "=");
    return strncmp(entry, var, n) == 0 && entry[n] == '=';
}

char **fb_local_env(const char *const *set, size_t n_set)
{
    size_t n_base = 0;
    while (environ && environ[n_base])
        n_base++;
    char **env = calloc(n_base + n_set + 1, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n_base; i++) {
        int replaced = 0;
        for (size_t j = 0; j < n_set && !replaced; j++)
            replaced = same_var(environ[i], set[j]);
        if (!replaced)
            env[k++] = environ[i];
    }
    for (size_t j = 0; j < n_set; j++) {
        int later = 0; /* the last setting of a name wins */
        for (size_t m = j + 1; m < n_set && !later; m++)
            later = same_var(set[m], set[j]);
        if (!later)
            env[k++] = (char *)set[j];
    }
    return env;
}

/* Builds the child's environment: the master's, with spec->env and the
 * secret's descriptor added (they override variables of the same name).
 * The strings are borrowed; only the array is allocated. */
static char **build_env(char *const *extra, char *secret_var)
{
    size_t n_extra = 0;
    while (extra && extra[n_extra])
        n_extra++;
    const char **set = calloc(n_extra + 1, sizeof *set);
    if (!set)
        return NULL;
    for (size_t j = 0; j < n_extra; j++)
        set[j] = extra[j];
    set[n_extra] = secret_var;
    char **env = fb_local_env(set, n_extra + 1);
    free(set);
    return env;
}

/* Creates a pipe holding exactly the secret; returns its read end (never
 * FB_SECRET_FD itself, so the dup2 in the child clears close-on-exec). */
static int secret_pipe(const void *secret, size_t len, int *read_fd)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return fb_err_errno(FIBER_ESYS, "pipe2");
    if (len > 0 && write(p[1], secret, len) != (ssize_t)len) {
        close(p[0]);
        close(p[1]);
        return fb_err_errno(FIBER_ESYS, "writing the job's secret");
    }
    close(p[1]);
    if (p[0] == FB_SECRET_FD) {
        int moved = fcntl(p[0], F_DUPFD_CLOEXEC, FB_SECRET_FD + 1);
        close(p[0]);
        if (moved < 0)
            return fb_err_errno(FIBER_ESYS, "fcntl(F_DUPFD_CLOEXEC)");
        p[0] = moved;
    }
    *read_fd = p[0];
    return 0;
}

static int setup_actions(posix_spawn_file_actions_t *fa, int secret_fd,
                         const fiber_job_opts *opts)
{
    if (posix_spawn_file_actions_adddup2(fa, secret_fd, FB_SECRET_FD) != 0)
        return -1;
    if (posix_spawn_file_actions_addclosefrom_np(fa, FB_SECRET_FD + 1) != 0)
        return -1;
    if (opts && opts->workdir &&
        posix_spawn_file_actions_addchdir_np(fa, opts->workdir) != 0)
        return -1;
    return 0;
}

int fb_local_spawn_attr(posix_spawnattr_t *attr)
{
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    if (posix_spawnattr_setsigmask(attr, &none) != 0 ||
        posix_spawnattr_setsigdefault(attr, &all) != 0 ||
        posix_spawnattr_setflags(attr,
                                 POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        return -1;
    return 0;
}

/* The file to execute.  "/proc/self/exe" is this very program, even if its
 * file was replaced since it started.  Under valgrind, though, it is
 * valgrind's tool, which cannot be run directly: there the path that
 * valgrind's (virtualised) readlink gives is used, so that a child is this
 * program again (checked by valgrind too with --trace-children=yes, as
 * `make valgrind` runs it).  Valgrind is known by its preloaded library. */
static const char *program_file(const char *program, char *buf, size_t size)
{
    const char *preload = getenv("LD_PRELOAD");
    if (strcmp(program, "/proc/self/exe") != 0 || !preload ||
        !strstr(preload, "/vgpreload_"))
        return program;
    ssize_t n = readlink(program, buf, size - 1);
    if (n <= 0)
        return program;
    buf[n] = '\0';
    return buf;
}

static int spawn(const struct fb_job_spec *spec, int secret_fd, pid_t *pid)
{
    char exe[PATH_MAX];
    const char *program = program_file(spec->program, exe, sizeof exe);
    char secret_var[] = FB_ENV_SECRET_FD "=3";
    char **env = build_env(spec->env, secret_var);
    if (!env)
        return fb_err(FIBER_ENOMEM, "out of memory building the environment");
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    int rc = 0;
    if (setup_actions(&fa, secret_fd, spec->opts) != 0 ||
        fb_local_spawn_attr(&attr) != 0) {
        rc = fb_err(FIBER_ENOMEM, "cannot prepare posix_spawn");
    } else {
        int err = posix_spawn(pid, program, &fa, &attr, spec->argv, env);
        const char *wd = spec->opts ? spec->opts->workdir : NULL;
        if (err != 0 && wd && access(wd, X_OK) != 0) {
            /* The chdir failed in the child, not the exec. */
            rc = fb_err_errno(FIBER_ESPAWN,
                              "cannot start job '%s' in working directory %s",
                              spec->name, wd);
        } else if (err != 0) {
            errno = err;
            rc = fb_err_errno(FIBER_ESPAWN, "cannot start job '%s': exec %s",
                              spec->name, spec->program);
        }
    }
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    return rc;
}

/* Asks the fork server for the job.  0 (lj->pidfd and ->forked set),
 * FB_FORKSRV_SPAWN or a code, as fb_forksrv_fork. */
static int fork_job(struct fb_backend *be, const struct fb_job_spec *spec,
                    int secret_fd, pid_t *pid, struct local_job *lj)
{
    struct local_state *st = be->state;
    if (st->forksrv.broken)
        return FB_FORKSRV_SPAWN;
    if (spec->opts && spec->opts->workdir &&
        access(spec->opts->workdir, X_OK) != 0)
        return fb_err_errno(FIBER_ESPAWN,
                            "cannot start job '%s' in working directory %s",
                            spec->name, spec->opts->workdir);
    char secret_var[] = FB_ENV_SECRET_FD "=3";
    char **env = build_env(spec->env, secret_var);
    if (!env)
        return fb_err(FIBER_ENOMEM, "out of memory building the environment");
    int rc = fb_forksrv_fork(&st->forksrv, spec, env, secret_fd,
                             be->cfg->connect_timeout_ms, pid, &lj->pidfd);
    free(env);
    lj->forked = rc == 0;
    return rc;
}

static int local_create_job(struct fb_backend *be,
                            const struct fb_job_spec *spec, struct fb_job *job)
{
    FB_UNUSED(be);
    struct local_job *lj = job->priv;
    const fiber_job_opts *o = spec->opts;
    if (o && (o->gpu > 0 || o->image))
        return fb_err(FIBER_ENOTSUP,
                      "job '%s': the local backend cannot %s; use a "
                      "container or cluster backend",
                      spec->name, o->gpu > 0 ? "reserve GPUs" : "run images");
    int secret_fd = -1;
    int rc = secret_pipe(spec->secret, spec->secret_len, &secret_fd);
    if (rc)
        return rc;
    pid_t pid;
    rc = spec->forkserver_argv ? fork_job(be, spec, secret_fd, &pid, lj)
                               : FB_FORKSRV_SPAWN;
    if (rc == FB_FORKSRV_SPAWN)
        rc = spawn(spec, secret_fd, &pid);
    close(secret_fd);
    if (rc)
        return rc;
    job->pid = pid;
    job->state = FB_JOB_RUNNING;
    if (lj->forked)
        return 0;
    lj->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (lj->pidfd < 0)
        fb_log_debug("pidfd_open(%d) failed; polling for exits instead",
                     (int)pid);
    return 0;
}

static int local_event_fd(struct fb_backend *be, struct fb_job *job)
{
    FB_UNUSED(be);
    return ((struct local_job *)job->priv)->pidfd;
}

static int status_to_exit(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return -WTERMSIG(status);
    return 255;
}

/* How long poll_job waits for the fork server's report of a forked job
 * whose pidfd says it has ended (the report follows within moments; a
 * loaded machine may delay the server a little). */
#define FORK_REPORT_WAIT_MS 3000

/* Has the process behind pidfd ended?  (Not our child: no waitpid.) */
static int pidfd_ended(int pidfd, int timeout_ms)
{
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    int r;
    while ((r = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR)
        ;
    return r > 0;
}

/* A forked job: ended when its pidfd says so; its status is the fork
 * server's report, which follows the end by moments (waited for up to
 * wait_ms), and is lost if the server has gone. */
static int poll_forked(struct fb_backend *be, struct fb_job *job, int wait_ms)
{
    struct local_state *st = be->state;
    struct local_job *lj = job->priv;
    int status;
    if (fb_forksrv_exit(&st->forksrv, job->id, 0, &status) == 1) {
        fb_job_exited(job, status);
        return 0;
    }
    if (!pidfd_ended(lj->pidfd, 0))
        return 0;
    int r = fb_forksrv_exit(&st->forksrv, job->id, wait_ms, &status);
    if (r != 1) {
        fb_log_warn("job %llu (pid %ld) ended but %s; its exit status is "
                    "unknown",
                    (unsigned long long)job->id, job->pid,
                    r < 0 ? "its fork server has gone"
                          : "its fork server did not report it");
        status = 255;
    }
    fb_job_exited(job, status);
    return 0;
}

static int local_poll_job(struct fb_backend *be, struct fb_job *job)
{
    if (((struct local_job *)job->priv)->forked)
        return poll_forked(be, job, FORK_REPORT_WAIT_MS);
    int status;
    pid_t r = waitpid((pid_t)job->pid, &status, WNOHANG);
    if (r == 0)
        return 0;
    if (r < 0) {
        if (errno == EINTR)
            return 0;
        /* Someone else reaped it (the program set SIGCHLD to SIG_IGN or
         * waits for any child).  It has ended; its status is lost. */
        fb_log_warn("job %llu (pid %ld) was reaped by someone else; its "
                    "exit status is unknown",
                    (unsigned long long)job->id, job->pid);
        status = 255 << 8;
    }
    job->state = FB_JOB_EXITED;
    job->exit_status = status_to_exit(status);
    return 0;
}

static int local_signal_job(struct fb_backend *be, struct fb_job *job,
                            int force)
{
    FB_UNUSED(be);
    struct local_job *lj = job->priv;
    int sig = force ? SIGKILL : SIGTERM;
    /* A forked job's pidfd names it for as long as we hold the pidfd. */
    if (lj->forked) {
        if (syscall(SYS_pidfd_send_signal, lj->pidfd, sig, NULL, 0) != 0 &&
            errno != ESRCH)
            return fb_err_errno(FIBER_ESYS, "pidfd_send_signal(%ld)",
                                job->pid);
        return 0;
    }
    /* Until poll_job reaps it, the pid cannot be reused, so kill() reaches
     * the right process. */
    if (kill((pid_t)job->pid, sig) != 0 &&
        errno != ESRCH)
        return fb_err_errno(FIBER_ESYS, "kill(%ld)", job->pid);
    return 0;
}

static void local_release_job(struct fb_backend *be, struct fb_job *job)
{
    struct local_job *lj = job->priv;
    if (job->state != FB_JOB_EXITED && lj->forked) {
        local_signal_job(be, job, 1);
        pidfd_ended(lj->pidfd, 5000); /* SIGKILL: moments */
        poll_forked(be, job, FORK_REPORT_WAIT_MS);
        if (job->state != FB_JOB_EXITED)
            fb_job_exited(job, -SIGKILL);
    } else if (job->state != FB_JOB_EXITED && job->pid > 0) {
        local_signal_job(be, job, 1);
        int status = 0;
        pid_t r;
        while ((r = waitpid((pid_t)job->pid, &status, 0)) < 0 && errno == EINTR)
            ;
        if (r < 0)
            status = 255 << 8; /* reaped elsewhere: status lost */
        job->state = FB_JOB_EXITED;
        job->exit_status = status_to_exit(status);
    }
    if (lj->pidfd >= 0)
        close(lj->pidfd);
    lj->pidfd = -1;
}

const struct fb_backend_ops fb_backend_local = {
    .name = "local",
    .caps = FB_CAP_SAME_HOST | FB_CAP_LOOPBACK,
    .state_size = sizeof(struct local_state),
    .job_size = sizeof(struct local_job),
    .init = local_init,
    .fini = local_fini,
    .create_job = local_create_job,
    .event_fd = local_event_fd,
    .poll_job = local_poll_job,
    .signal_job = local_signal_job,
    .logs = NULL,
    .release_job = local_release_job,
};
