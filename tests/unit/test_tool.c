/*
 * test_tool.c -- the `fiber` command, run as a user runs it: each case
 * starts the built tool (FIBER_TOOL_PATH) with arguments and environment
 * and checks its exit status and what it printed.
 *
 * Local runs live in a scratch TMPDIR, so the cases never see (or clean)
 * anybody else's runs.  Docker cases need the daemon at docker_socket
 * (/var/run/docker.sock): without it they are skipped (exit 77; a failure
 * under CI).
 * They remove the images and containers they make; they never run
 * `fiber clean` without naming their run, since other tests' containers
 * may share the daemon.
 *
 * This program is also what the docker cases put in an image and run in a
 * container: main() answers "hello-from-image" and "exit-with N" before
 * fiber_init().
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
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

#include "backend/docker/image.h"
#include "harness.h"

#ifndef FIBER_TOOL_PATH
#error "FIBER_TOOL_PATH must name the built fiber command"
#endif

extern char **environ;

#define OUT_MAX (256 * 1024)

struct result {
    int code; /* exit status, or 128 + signal */
    char out[OUT_MAX];
    char err[OUT_MAX];
};

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Runs the tool with args (NULL-terminated, without "fiber") and the extra
 * environment entries env (NULL-terminated; may be NULL), collecting its
 * output.  Fails the test if it cannot be run or takes over a minute. */
static void tool(struct result *r, const char *const *env,
                 const char *const *args)
{
    const char *argv[64] = {FIBER_TOOL_PATH};
    size_t n = 1;
    for (; args[n - 1]; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    size_t n_env = 0, n_extra = 0;
    while (environ[n_env])
        n_env++;
    while (env && env[n_extra])
        n_extra++;
    char **envp = calloc(n_env + n_extra + 1, sizeof *envp);
    CHECK(envp != NULL);
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++) {
        int replaced = 0;
        for (size_t j = 0; j < n_extra && !replaced; j++) {
            size_t nl = strcspn(env[j], "=");
            replaced = strncmp(environ[i], env[j], nl + 1) == 0;
        }
        if (!replaced)
            envp[k++] = environ[i];
    }
    for (size_t j = 0; j < n_extra; j++)
        envp[k++] = (char *)env[j];
    int out[2], err[2];
    CHECK(pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, FIBER_TOOL_PATH, &fa, NULL,
                         (char *const *)argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    free(envp);
    close(out[1]);
    close(err[1]);
    CHECK(rc == 0);
    size_t have[2] = {0, 0};
    char *bufs[2] = {r->out, r->err};
    struct pollfd pfd[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    int open_fds = 2;
    time_t start = time(NULL);
    while (open_fds > 0) {
        CHECK(time(NULL) - start < 120);
        if (poll(pfd, 2, 1000) < 0 && errno != EINTR)
            TH_FAIL("poll: %s", strerror(errno));
        for (int i = 0; i < 2; i++) {
            if (pfd[i].fd < 0 || !pfd[i].revents)
                continue;
            char chunk[4096];
            ssize_t got = read(pfd[i].fd, chunk, sizeof chunk);
            if (got <= 0) {
                close(pfd[i].fd);
                pfd[i].fd = -1;
                open_fds--;
                continue;
            }
            size_t take = (size_t)got;
            if (have[i] + take >= OUT_MAX)
                take = OUT_MAX - 1 - have[i];
            memcpy(bufs[i] + have[i], chunk, take);
            have[i] += take;
        }
    }
    r->out[have[0]] = '\0';
    r->err[have[1]] = '\0';
    int status;
    while (waitpid(pid, &status, 0) < 0)
        CHECK(errno == EINTR);
    r->code = WIFEXITED(status) ? WEXITSTATUS(status)
                                : 128 + WTERMSIG(status);
    fprintf(stderr, "$ fiber");
    for (size_t i = 1; argv[i]; i++)
        fprintf(stderr, " %s", argv[i]);
    fprintf(stderr, "   -> %d\n%s%s", r->code, r->out, r->err);
}

#define TOOL(r, env, ...)                                                      \
    tool((r), (env), (const char *const[]){__VA_ARGS__, NULL})

/* A private TMPDIR for this case's local runs; removed at exit. */
static char scratch[64];
static char tmpdir_var[96];

static void remove_scratch(void)
{
    if (scratch[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", scratch);
    }
}

static const char *make_scratch(void)
{
    snprintf(scratch, sizeof scratch, "/tmp/fiber-tool-XXXXXX");
    CHECK(mkdtemp(scratch) != NULL);
    atexit(remove_scratch);
    snprintf(tmpdir_var, sizeof tmpdir_var, "TMPDIR=%s", scratch);
    return tmpdir_var;
}

/* $TMPDIR/fiber-<uid> for the scratch TMPDIR. */
static void runs_base(char *out, size_t size)
{
    snprintf(out, size, "%s/fiber-%u", scratch, (unsigned)geteuid());
}

/* Creates a run directory the way a master that was killed leaves it: a
 * socket file nobody listens on, and a log. */
static void fabricate_dead_run(const char *run, const char *log_text)
{
    char base[128], dir[256], path[320];
    runs_base(base, sizeof base);
    mkdir(base, 0700);
    CHECK((size_t)snprintf(dir, sizeof dir, "%s/%s", base, run) < sizeof dir);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/logs", dir);
    CHECK(mkdir(path, 0700) == 0);
    snprintf(path, sizeof path, "%s/logs/Process-1.log", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(log_text, f);
    fclose(f);
    /* Bound, then closed: the file stays, connecting is refused. */
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    CHECK((size_t)snprintf(sa.sun_path, sizeof sa.sun_path, "%s/master.sock",
                           dir) < sizeof sa.sun_path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    CHECK(listen(fd, 1) == 0);
    close(fd);
}

static int dir_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The run name in "fiber: run fiber-xxxxxxxx..." lines of stderr. */
static void run_name_from(const char *text, char *out, size_t size)
{
    const char *p = strstr(text, "fiber: run fiber-");
    CHECK(p != NULL);
    p += strlen("fiber: run ");
    size_t n = strcspn(p, ": \n");
    CHECK(n < size);
    memcpy(out, p, n);
    out[n] = '\0';
}

/* ---- the command line ---------------------------------------------------- */

TEST(version)
{
    static struct result r;
    TOOL(&r, NULL, "version");
    CHECK_EQ(r.code, 0);
    CHECK_STR(r.out, "fiber " FIBER_VERSION_STRING "\n");
    TOOL(&r, NULL, "--version");
    CHECK_EQ(r.code, 0);
    CHECK_STR(r.out, "fiber " FIBER_VERSION_STRING "\n");
    TOOL(&r, NULL, "version", "extra");
    CHECK_EQ(r.code, 2);
    CHECK_CONTAINS(r.err, "unexpected argument 'extra'");
}

TEST(help_and_usage_errors)
{
    static struct result r;
    TOOL(&r, NULL, "--help");
    CHECK_EQ(r.code, 0);
    CHECK_CONTAINS(r.out, "usage: fiber <command>");
    CHECK_CONTAINS(r.out, "image build PROGRAM");

    tool(&r, NULL, (const char *const[]){NULL});
    CHECK_EQ(r.code, 2);
    CHECK_CONTAINS(r.err, "usage: fiber <command>");

    TOOL(&r, NULL, "frobnicate");
    CHECK_EQ(r.code, 2);
    CHECK_CONTAINS(r.err, "unknown command 'frobnicate'");
    CHECK_CONTAINS(r.err, "Try 'fiber --help'");

    static const char *const cmds[][3] = {
        {"run", "--help", NULL},   {"ps", "--help", NULL},
        {"logs", "--help", NULL},  {"kill", "--help", NULL},
        {"clean", "--help", NULL}, {"image", "build", "--help"},
        {"doctor", "-h", NULL},    {"version", "--help", NULL},
        {"help", "ps", NULL}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        tool(&r, NULL, cmds[i]);
        CHECK_EQ(r.code, 0);
        CHECK_CONTAINS(r.out, "usage: fiber ");
        CHECK_CONTAINS(r.out, "xit status");
    }

    TOOL(&r, NULL, "ps", "--bogus");
    CHECK_EQ(r.code, 2);
    CHECK_CONTAINS(r.err, "unknown option --bogus");
    TOOL(&r, NULL, "image", "build", "--tag");
    CHECK_EQ(r.code, 2);
    CHECK_CONTAINS(r.err, "option --tag needs a value");
    TOOL(&r, NULL, "image", "frob");
    CHECK_EQ(r.code, 2);
    TOOL(&r, NULL, "logs");
    CHECK_EQ(r.code, 2);
    CHECK_CONTAINS(r.err, "which run?");
    TOOL(&r, NULL, "run");
    CHECK_EQ(r.code, 2);
    CHECK_CONTAINS(r.err, "which program?");
    TOOL(&r, NULL, "run", "--cpu", "lots", "--", "/bin/true");
    CHECK_EQ(r.code, 2);
    CHECK_CONTAINS(r.err, "--cpu wants a positive whole number");
    TOOL(&r, NULL, "run", "--backend", "mesos", "--", "/bin/true");
    CHECK_EQ(r.code, 2);
    CHECK_CONTAINS(r.err, "backend 'mesos'");
}

TEST(doctor_names_an_unreachable_socket)
{
    static struct result r;
    char sock[96], var[128];
    snprintf(sock, sizeof sock, "/tmp/nowhere-%d.sock", (int)getpid());
    snprintf(var, sizeof var, "FIBER_DOCKER_SOCKET=%s", sock);
    const char *env[] = {var, "FIBER_BACKEND=local",
                         "SLURM_CONF=/nonexistent/slurm.conf", NULL};
    TOOL(&r, env, "doctor");
    CHECK_EQ(r.code, 0); /* local is configured and always usable */
    CHECK_CONTAINS(r.out, "local       ok");
    CHECK_CONTAINS(r.out, "docker      unreachable");
    CHECK_CONTAINS(r.out, sock);
    CHECK_CONTAINS(r.out, "no such socket");
    /* Without its tools, or with a config that names no controller. */
    CHECK(strstr(r.out, "slurm       unavailable  Slurm's client tools") ||
          strstr(r.out, "slurm       unreachable  the controller does not"));
    CHECK_CONTAINS(r.out, "configured backend: local (usable)");

    const char *env_docker[] = {var, "FIBER_BACKEND=docker", NULL};
    TOOL(&r, env_docker, "doctor");
    CHECK_EQ(r.code, 1);
    CHECK_CONTAINS(r.out, "configured backend: docker (NOT usable");

    /* A socket file that nobody listens on is refused, not missing. */
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    close(fd);
    TOOL(&r, env, "doctor");
    unlink(sock);
    CHECK_CONTAINS(r.out, "connection refused");

    TOOL(&r, env, "image", "build", "/proc/self/exe");
    CHECK_EQ(r.code, 1);
    CHECK_CONTAINS(r.err, sock);
}

/* ---- local runs ---------------------------------------------------------- */

TEST(ps_logs_clean_dead_run)
{
    static struct result r;
    const char *tmp = make_scratch();
    const char *env[] = {tmp, "FIBER_DOCKER_SOCKET=/tmp/no-docker-here.sock",
                         NULL};
    TOOL(&r, env, "ps");
    CHECK_EQ(r.code, 0);
    CHECK_STR(r.out, "no runs\n");

    fabricate_dead_run("fiber-deadbeef", "a line from Process-1\n");
    TOOL(&r, env, "ps");
    CHECK_EQ(r.code, 0);
    CHECK_CONTAINS(r.out, "fiber-deadbeef     local    dead");
    CHECK_CONTAINS(r.out, "Process-1");
    CHECK_CONTAINS(r.out, "ended");

    TOOL(&r, env, "logs", "fiber-deadbeef");
    CHECK_EQ(r.code, 0);
    CHECK_STR(r.out, "==> Process-1 <==\na line from Process-1\n");
    TOOL(&r, env, "logs", "fiber-deadbeef", "Process-1");
    CHECK_EQ(r.code, 0);
    CHECK_STR(r.out, "a line from Process-1\n");
    TOOL(&r, env, "logs", "fiber-deadbeef", "Process-9");
    CHECK_EQ(r.code, 1);
    CHECK_CONTAINS(r.err, "has no job Process-9");

    TOOL(&r, env, "kill", "fiber-deadbeef");
    CHECK_EQ(r.code, 1);
    CHECK_CONTAINS(r.err, "nothing of run fiber-deadbeef is running");

    TOOL(&r, env, "clean", "fiber-deadbeef");
    CHECK_EQ(r.code, 0);
    CHECK_CONTAINS(r.out, "removed ");
    char base[PATH_MAX], dir[PATH_MAX + 32];
    runs_base(base, sizeof base);
    snprintf(dir, sizeof dir, "%s/fiber-deadbeef", base);
    CHECK(!dir_exists(dir));
    TOOL(&r, env, "ps", "fiber-deadbeef");
    CHECK_EQ(r.code, 1);
    CHECK_CONTAINS(r.err, "no run fiber-deadbeef");
    TOOL(&r, env, "ps", "../etc");
    CHECK_EQ(r.code, 1);
    CHECK_CONTAINS(r.err, "is not a run id");
}

/* A name longer than any fixed field once held (64 bytes). */
static const char long_name[] =
    "PoolWorker-with-a-name-much-longer-than-sixty-four-bytes-of-the-old-"
    "fixed-field-0123456789";

/* Job names of any length come back whole, in ps and logs. */
TEST(long_job_names_are_listed_and_logged)
{
    CHECK(strlen(long_name) > 64);
    static struct result r;
    const char *tmp = make_scratch();
    const char *env[] = {tmp, "FIBER_DOCKER_SOCKET=/tmp/no-docker-here.sock",
                         NULL};
    fabricate_dead_run("fiber-10e9a4e5", "short\n");
    char base[128], path[512];
    runs_base(base, sizeof base);
    snprintf(path, sizeof path, "%s/fiber-10e9a4e5/logs/%s.log", base,
             long_name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs("a line from the long one\n", f);
    fclose(f);
    TOOL(&r, env, "ps", "fiber-10e9a4e5");
    CHECK_EQ(r.code, 0);
    CHECK_CONTAINS(r.out, long_name);
    TOOL(&r, env, "logs", "fiber-10e9a4e5", long_name);
    CHECK_EQ(r.code, 0);
    CHECK_STR(r.out, "a line from the long one\n");
    TOOL(&r, env, "logs", "fiber-10e9a4e5");
    CHECK_EQ(r.code, 0);
    char want[256];
    snprintf(want, sizeof want, "==> %s <==\na line from the long one\n",
             long_name);
    CHECK_CONTAINS(r.out, want);
    CHECK_CONTAINS(r.out, "==> Process-1 <==\nshort\n");

    /* The library's list holds the whole name too. */
    setenv("TMPDIR", scratch, 1);
    fiber_run_list l = {0};
    CHECK_OK(fiber_runs_list("fiber-10e9a4e5", &l));
    CHECK_EQ(l.n, 1);
    CHECK_EQ(l.runs[0].n_jobs, 2);
    CHECK_STR(l.runs[0].jobs[0].name, long_name); /* before Process-1 */
    CHECK_STR(l.runs[0].jobs[0].engine_id, "");
    CHECK_STR(l.runs[0].jobs[0].engine_kind, "");
    fiber_run_list_free(&l);
    CHECK(l.runs == NULL && l.n == 0);
    fiber_run_list_free(NULL);
}

/* Run ids are checked once, with one limit, before anything is looked
 * up; unknown backends are named with the ones that exist. */
TEST(bad_run_ids_and_backends_are_refused)
{
    static struct result r;
    const char *tmp = make_scratch();
    const char *env[] = {tmp, "FIBER_DOCKER_SOCKET=/tmp/no-docker-here.sock",
                         NULL};
    static const char *const bad[] = {
        "../etc", "a/b", ".hidden", "fiber-0123456789abcdef0123456789"};
    CHECK_EQ(strlen(bad[3]), 32); /* one over the limit of 31 */
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        TOOL(&r, env, "ps", bad[i]);
        CHECK_EQ(r.code, 1);
        CHECK_CONTAINS(r.err, "is not a run id (1 to 31 of");
        TOOL(&r, env, "logs", bad[i]);
        CHECK_CONTAINS(r.err, "is not a run id");
        TOOL(&r, env, "kill", bad[i]);
        CHECK_CONTAINS(r.err, "is not a run id");
        TOOL(&r, env, "clean", bad[i]);
        CHECK_CONTAINS(r.err, "is not a run id");
    }
    /* 31 bytes is a run id: looked up, and not found. */
    TOOL(&r, env, "ps", "fiber-0123456789abcdef012345678");
    CHECK_EQ(r.code, 1);
    CHECK_CONTAINS(r.err, "no run fiber-0123456789abcdef012345678: no run "
                          "directory on this host");

    setenv("TMPDIR", scratch, 1);
    fiber_run_list l = {0};
    CHECK_ERR(fiber_runs_list("a/b", &l), FIBER_EINVAL);
    CHECK_ERR(fiber_runs_list(NULL, NULL), FIBER_EINVAL);
    fiber_buf out = {0};
    CHECK_ERR(fiber_run_logs(NULL, NULL, &out), FIBER_EINVAL);
    CHECK_ERR(fiber_run_kill(NULL, NULL), FIBER_EINVAL);

    char detail[256];
    CHECK_ERR(fiber_backend_check("nosuch", detail, sizeof detail),
              FIBER_EINVAL);
    CHECK_CONTAINS(detail, "known: local, docker, slurm, kubernetes");
    CHECK_CONTAINS(fiber_last_error(), "unknown backend 'nosuch'");
    /* The registry answers without asking any engine. */
    CHECK_EQ(fiber_backend_known("nosuch"), 0);
    CHECK_CONTAINS(fiber_last_error(), "unknown backend 'nosuch'; known: "
                                       "local, docker, slurm, kubernetes");
    CHECK_EQ(fiber_backend_known(NULL), 0);
    CHECK_EQ(fiber_backend_known("slurm"), 1);
    CHECK_EQ(fiber_backend_known("local"), 1);
    /* The registry's names in order, as fiber doctor lists them. */
    CHECK_STR(fiber_backend_name(0), "local");
    CHECK_STR(fiber_backend_name(3), "kubernetes");
    CHECK(fiber_backend_name(4) == NULL);
    CHECK_STR(fiber_run_where(NULL), "");
    TOOL(&r, env, "run", "--backend", "nosuch", "--", "/bin/true");
    CHECK_EQ(r.code, 2);
    CHECK_CONTAINS(r.err, "unknown backend 'nosuch'; known: local");
    fiber_run *run = NULL;
    const char *argv[] = {"/bin/true", NULL};
    fiber_run_opts o = {.backend = "nosuch"};
    CHECK_ERR(fiber_run_start(&run, argv, &o), FIBER_EINVAL);
    CHECK_CONTAINS(fiber_last_error(), "unknown backend 'nosuch'; known: "
                                       "local, docker, slurm, kubernetes");
    CHECK(run == NULL);
    o.backend = "local";
    o.cpu = -1;
    CHECK_ERR(fiber_run_start(&run, argv, &o), FIBER_EINVAL);
    CHECK_CONTAINS(fiber_last_error(), "cannot be negative");
    /* A time-limit warning and a requeue are for Slurm masters. */
    o.cpu = 0;
    o.signal_s = 70000;
    CHECK_ERR(fiber_run_start(&run, argv, &o), FIBER_EINVAL);
    CHECK_CONTAINS(fiber_last_error(), "want 1 to 65535");
    o.signal_s = 0;
    o.requeue = 1;
    CHECK_ERR(fiber_run_start(&run, argv, &o), FIBER_ENOTSUP);
    CHECK_CONTAINS(fiber_last_error(), "the local backend has no time limit");
    CHECK(run == NULL);
    TOOL(&r, env, "run", "--signal", "0", "--", "/bin/true");
    CHECK_EQ(r.code, 2);
    CHECK_CONTAINS(r.err, "--signal wants the seconds before the time "
                          "limit, 1 to 65535, not '0'");
    TOOL(&r, env, "run", "--backend", "local", "--requeue", "--",
         "/bin/true");
    CHECK_EQ(r.code, 1);
    CHECK_CONTAINS(r.err, "--signal and --requeue are for a master that is "
                          "a Slurm batch job (--backend slurm) or a "
                          "Kubernetes Job (--backend kubernetes); the local "
                          "backend");
    /* fiber_run_where names a local master by its pid. */
    fiber_run_opts here = {.backend = "local"};
    CHECK_OK(fiber_run_start(&run, argv, &here));
    char want[64];
    snprintf(want, sizeof want, "pid %ld", fiber_run_pid(run));
    CHECK(fiber_run_pid(run) > 0);
    CHECK_STR(fiber_run_where(run), want);
    int code = -1;
    CHECK_OK(fiber_run_wait(run, 10000, &code));
    CHECK_EQ(code, 0);
    fiber_run_free(run);
}

/* A master that holds an flock on master.lock (no socket: it listens on
 * TCP) is alive exactly while it holds it. */
TEST(lock_file_decides_liveness)
{
    static struct result r;
    const char *tmp = make_scratch();
    const char *env[] = {tmp, "FIBER_DOCKER_SOCKET=/tmp/no-docker-here.sock",
                         NULL};
    char base[128], dir[256], path[320];
    runs_base(base, sizeof base);
    mkdir(base, 0700);
    snprintf(dir, sizeof dir, "%s/fiber-10c4ed00", base);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/master.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    CHECK(fd >= 0 && flock(fd, LOCK_EX) == 0);
    TOOL(&r, env, "ps", "fiber-10c4ed00");
    CHECK_CONTAINS(r.out, "fiber-10c4ed00     local    alive");
    TOOL(&r, env, "clean");
    CHECK(dir_exists(dir));
    close(fd); /* as when the master dies */
    TOOL(&r, env, "ps", "fiber-10c4ed00");
    CHECK_CONTAINS(r.out, "fiber-10c4ed00     local    dead");
    TOOL(&r, env, "clean");
    CHECK_EQ(r.code, 0);
    CHECK(!dir_exists(dir));
}

FIBER_TASK(hold)
{
    sleep_ms(len == sizeof(int) ? *(const int *)arg : 10000);
    return 0;
}

/* A live run (this test program is the master) next to a dead one:
 * ps tells them apart, clean removes only the dead one. */
TEST(live_run_is_listed_and_kept)
{
    static struct result r;
    const char *tmp = make_scratch();
    setenv("TMPDIR", scratch, 1); /* this master's run directory too */
    fabricate_dead_run("fiber-0000dead", "old\n");
    int ms = 20000;
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "hold", &ms, sizeof ms, NULL));
    const char *env[] = {tmp, "FIBER_DOCKER_SOCKET=/tmp/no-docker-here.sock",
                         NULL};
    /* The job shows up once it has started. */
    for (int i = 0; i < 100; i++) {
        TOOL(&r, env, "ps", fiber_run_id());
        if (strstr(r.out, "Process-1"))
            break;
        sleep_ms(50);
    }
    CHECK_EQ(r.code, 0);
    char line[128];
    snprintf(line, sizeof line, "%-18s %-8s %-8s", fiber_run_id(), "local",
             "alive");
    CHECK_CONTAINS(r.out, line);
    snprintf(line, sizeof line, "pid %ld", (long)getpid());
    CHECK_CONTAINS(r.out, line); /* the master, found by its socket */
    snprintf(line, sizeof line, "pid %ld", fiber_process_pid(p));
    CHECK_CONTAINS(r.out, line); /* the job, found by its environment */

    TOOL(&r, env, "clean");
    CHECK_EQ(r.code, 0);
    CHECK_CONTAINS(r.out, "fiber-0000dead");
    CHECK(strstr(r.out, fiber_run_id()) == NULL);
    TOOL(&r, env, "clean", fiber_run_id());
    CHECK_EQ(r.code, 1);
    CHECK_CONTAINS(r.err, "is alive; stop it first");
    TOOL(&r, env, "ps");
    CHECK(strstr(r.out, "fiber-0000dead") == NULL);
    CHECK_CONTAINS(r.out, fiber_run_id());

    CHECK_OK(fiber_process_terminate(p));
    CHECK_OK(fiber_process_join(p, 10000));
    fiber_process_free(p);
}

TEST(run_local_passes_status_and_environment)
{
    static struct result r;
    const char *tmp = make_scratch();
    const char *env[] = {tmp, NULL};
    TOOL(&r, env, "run", "--", "/bin/sh", "-c",
         "echo backend=$FIBER_BACKEND run=$FIBER_BOOT_RUN extra=$EXTRA; "
         "exit 3",
         "ignored");
    CHECK_EQ(r.code, 3);
    char run[64], want[160];
    run_name_from(r.err, run, sizeof run);
    snprintf(want, sizeof want, "backend=local run=%s extra=\n", run);
    CHECK_STR(r.out, want);
    CHECK_CONTAINS(r.err, "master pid");
    CHECK_CONTAINS(r.err, "exited with status 3");
    /* Nothing was worth keeping: the run directory is gone. */
    char base[PATH_MAX], dir[PATH_MAX + 80];
    runs_base(base, sizeof base);
    snprintf(dir, sizeof dir, "%s/%s", base, run);
    CHECK(!dir_exists(dir));

    TOOL(&r, env, "run", "-e", "EXTRA=yes", "/bin/sh", "-c",
         "echo extra=$EXTRA");
    CHECK_EQ(r.code, 0);
    CHECK_STR(r.out, "extra=yes\n");

    TOOL(&r, env, "run", "--", "/bin/sh", "-c", "kill -TERM $$");
    CHECK_EQ(r.code, 128 + SIGTERM);
    CHECK_CONTAINS(r.err, "killed by signal 15");

    TOOL(&r, env, "run", "--", "/no/such/program");
    CHECK_EQ(r.code, 1);
    CHECK_CONTAINS(r.err, "cannot start /no/such/program");

    TOOL(&r, env, "run", "--memory", "64", "--", "/bin/true");
    CHECK_EQ(r.code, 1);
    CHECK_CONTAINS(r.err, "local backend runs the program on this host");
}

TEST(run_detached_then_logs_kill_clean)
{
    static struct result r;
    const char *tmp = make_scratch();
    const char *env[] = {tmp, "FIBER_DOCKER_SOCKET=/tmp/no-docker-here.sock",
                         "FIBER_TERMINATE_GRACE_MS=3000", NULL};
    TOOL(&r, env, "run", "--detach", "--", "/bin/sh", "-c",
         "echo started; exec sleep 30");
    CHECK_EQ(r.code, 0);
    char run[64];
    snprintf(run, sizeof run, "%.*s", (int)strcspn(r.out, "\n"), r.out);
    CHECK(strncmp(run, "fiber-", 6) == 0);

    TOOL(&r, env, "ps", run);
    CHECK_EQ(r.code, 0);
    CHECK_CONTAINS(r.out, "alive");
    CHECK_CONTAINS(r.out, "master");
    for (int i = 0; i < 100; i++) {
        TOOL(&r, env, "logs", run);
        if (strstr(r.out, "started"))
            break;
        sleep_ms(50);
    }
    CHECK_STR(r.out, "==> master <==\nstarted\n");

    TOOL(&r, env, "clean", run);
    CHECK_EQ(r.code, 1);
    CHECK_CONTAINS(r.err, "is alive; stop it first");

    TOOL(&r, env, "kill", run);
    CHECK_EQ(r.code, 0);
    CHECK_CONTAINS(r.out, "stopped master (pid ");
    TOOL(&r, env, "ps", run);
    CHECK_CONTAINS(r.out, "dead");
    TOOL(&r, env, "logs", run, "master"); /* the log outlives the run */
    CHECK_STR(r.out, "started\n");
    TOOL(&r, env, "clean", run);
    CHECK_EQ(r.code, 0);
    TOOL(&r, env, "ps", run);
    CHECK_EQ(r.code, 1);
}

/* ---- docker -------------------------------------------------------------- */

/* Skips the case (a failure under CI) where there is no Docker Engine. */
static void need_docker(void)
{
    char sock[512];
    if (fiber_config_get("docker_socket", sock, sizeof sock) != 0)
        snprintf(sock, sizeof sock, "/var/run/docker.sock");
    if (access(sock, F_OK) != 0)
        TH_SKIP_ENGINE("no Docker Engine socket at %s", sock);
}

static char image_tag[128];

static void remove_image(void)
{
    if (image_tag[0] && fiber_image_remove(image_tag) != 0)
        fprintf(stderr, "could not remove image %s: %s\n", image_tag,
                fiber_last_error());
}

/* "size   19.6 MiB (20545293 bytes)" */
static long long printed_size(const char *out)
{
    const char *p = strstr(out, "size ");
    CHECK(p != NULL);
    p = strchr(p, '(');
    CHECK(p != NULL);
    return atoll(p + 1);
}

static long long file_size(const char *path)
{
    struct stat st;
    CHECK(stat(path, &st) == 0);
    return (long long)st.st_size;
}

/* A container of a run whose fiber.name is longer than 64 bytes (as a
 * master of another tool may label one): listed, logged and cleaned by
 * its whole name. */
static void docker_job_of_a_long_name(const char *self)
{
    static struct result r;
    char run[32], path[256];
    snprintf(run, sizeof run, "fiber-long%d", (int)getpid());
    struct fb_engine e;
    CHECK_OK(fb_engine_open(&e));
    json_t *spec = json_pack("{s:s, s:[s,s], s:{s:s, s:s, s:s, s:s}}",
                             "Image", image_tag, "Cmd", self,
                             "hello-from-image", "Labels", "fiber.run", run,
                             "fiber.role", "job", "fiber.name", long_name,
                             "fiber.job", "1");
    json_t *created = NULL;
    CHECK_OK(fb_engine_json(&e, "POST", "/containers/create", spec, &created,
                            "creating"));
    json_decref(spec);
    char id[80];
    snprintf(id, sizeof id, "%s",
             json_string_value(json_object_get(created, "Id")));
    json_decref(created);
    snprintf(path, sizeof path, "/containers/%s/start", id);
    CHECK_OK(fb_engine_json(&e, "POST", path, NULL, NULL, "starting"));
    snprintf(path, sizeof path, "/containers/%s/wait", id);
    CHECK_OK(fb_engine_json(&e, "POST", path, NULL, NULL, "waiting"));
    fb_engine_close(&e);

    TOOL(&r, NULL, "ps", run);
    CHECK_EQ(r.code, 0);
    CHECK_CONTAINS(r.out, "docker   dead");
    char want[300];
    snprintf(want, sizeof want, "%s job      exited   container %.12s",
             long_name, id);
    CHECK_CONTAINS(r.out, want);
    TOOL(&r, NULL, "logs", run, long_name);
    CHECK_EQ(r.code, 0);
    CHECK_CONTAINS(r.out, "hello from the image\n");
    fiber_run_list l = {0};
    CHECK_OK(fiber_runs_list(run, &l));
    CHECK_STR(l.runs[0].backend, "docker");
    CHECK_STR(l.runs[0].jobs[0].name, long_name);
    CHECK_STR(l.runs[0].jobs[0].engine_kind, "container");
    CHECK_EQ(strlen(l.runs[0].jobs[0].engine_id), 12);
    fiber_run_list_free(&l);
    TOOL(&r, NULL, "clean", run);
    CHECK_EQ(r.code, 0);
    snprintf(want, sizeof want, "removed container %.12s (%s) of run %s", id,
             long_name, run);
    CHECK_CONTAINS(r.out, want);
    TOOL(&r, NULL, "ps", run);
    CHECK_EQ(r.code, 1);
}

TEST(image_build_then_run_in_docker)
{
    need_docker();
    static struct result r;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    self[n] = '\0';
    snprintf(image_tag, sizeof image_tag, "fiber-test-tool:p%d",
             (int)getpid());
    atexit(remove_image);

    TOOL(&r, NULL, "image", "build", self, "--tag", image_tag);
    CHECK_EQ(r.code, 0);
    CHECK_CONTAINS(r.out, "image  sha256:");
    char want[PATH_MAX + 200];
    snprintf(want, sizeof want, "tag    %s\n", image_tag);
    CHECK_CONTAINS(r.out, want);
    /* A line per stage on stderr, in order: the program, the libraries,
     * the archive, the import, the result. */
    snprintf(want, sizeof want, "fiber: program %s (build id ", self);
    const char *at = strstr(r.err, want);
    CHECK(at != NULL);
    static const char *const stages[] = {
        "fiber: libraries: ", "fiber: archive: ", " files, ",
        " MB of content, ", "fiber: importing ", "into the Docker Engine at ",
        "fiber: built ", ": sha256:"};
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
        const char *next = strstr(at, stages[i]);
        if (!next)
            fprintf(stderr, "no '%s' after: %s\n", stages[i], at);
        CHECK(next != NULL);
        at = next;
    }
    CHECK(strstr(r.out, "fiber:") == NULL); /* stdout stays the result */
    long long size = printed_size(r.out);
    /* It holds this program and libc (and the rest it links), and is
     * minimal: no distribution underneath. */
    CHECK(size >= file_size(self) +
                      file_size("/lib/x86_64-linux-gnu/libc.so.6"));
    CHECK(size < 64ll << 20);
    fiber_image_info info;
    CHECK_OK(fiber_image_inspect(image_tag, &info));
    CHECK_EQ(info.size_bytes, size);
    CHECK_STR(info.program, self);

    /* A container of it runs the program: both streams come back, and
     * its exit status is fiber run's. */
    TOOL(&r, NULL, "run", "--backend", "docker", "--image", image_tag, "--",
         self, "hello-from-image");
    CHECK_EQ(r.code, 0);
    CHECK_STR(r.out, "hello from the image\n");
    CHECK_CONTAINS(r.err, "and from its stderr\n");
    char run[64];
    run_name_from(r.err, run, sizeof run);

    TOOL(&r, NULL, "ps", run);
    CHECK_EQ(r.code, 0);
    CHECK_CONTAINS(r.out, "docker   dead");
    CHECK_CONTAINS(r.out, "master   exited");
    TOOL(&r, NULL, "logs", run, "master");
    CHECK_EQ(r.code, 0);
    CHECK_CONTAINS(r.out, "hello from the image\n");
    CHECK_CONTAINS(r.out, "and from its stderr\n");
    TOOL(&r, NULL, "clean", run);
    CHECK_EQ(r.code, 0);
    CHECK_CONTAINS(r.out, "removed container");

    TOOL(&r, NULL, "run", "--backend", "docker", "--image", image_tag, "--",
         self, "exit-with", "7");
    CHECK_EQ(r.code, 7);
    run_name_from(r.err, run, sizeof run);
    TOOL(&r, NULL, "clean", run);
    CHECK_EQ(r.code, 0);

    /* Detached, then stopped with fiber kill. */
    TOOL(&r, NULL, "run", "--detach", "--backend", "docker", "--image",
         image_tag, "--", self, "exit-with", "0", "sleep");
    CHECK_EQ(r.code, 0);
    snprintf(run, sizeof run, "%.*s", (int)strcspn(r.out, "\n"), r.out);
    TOOL(&r, NULL, "ps", run);
    CHECK_CONTAINS(r.out, "docker   alive");
    TOOL(&r, NULL, "kill", run);
    CHECK_EQ(r.code, 0);
    CHECK_CONTAINS(r.out, "stopped container");
    TOOL(&r, NULL, "clean", run);
    CHECK_EQ(r.code, 0);

    docker_job_of_a_long_name(self);

    CHECK_OK(fiber_image_remove(image_tag));
    CHECK_ERR(fiber_image_inspect(image_tag, &info), FIBER_ENOKEY);
    image_tag[0] = '\0';
}

/* A program at a path too long for ustar's name field (prefix/name, then
 * a pax header), reached through a symbolic link whose target is longer
 * than ustar's link field: the image holds both, and runs it. */
TEST(image_of_a_long_path_through_a_symlink)
{
    need_docker();
    static struct result r;
    make_scratch();
    char dir[600], prog[700], link[700];
    snprintf(dir, sizeof dir, "%s", scratch);
    for (int i = 0; i < 6; i++) {
        size_t n = strlen(dir);
        snprintf(dir + n, sizeof dir - n, "/%d%.*s", i, 50,
                 "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz");
        CHECK(mkdir(dir, 0755) == 0);
    }
    CHECK(strlen(dir) > 300);
    snprintf(prog, sizeof prog, "%s/test_tool_copy", dir);
    snprintf(link, sizeof link, "%s/run-me", scratch);
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "cp /proc/%d/exe '%s'", (int)getpid(), prog);
    CHECK(system(cmd) == 0);
    CHECK(symlink(prog, link) == 0);
    chmod(scratch, 0755);

    snprintf(image_tag, sizeof image_tag, "fiber-test-tool:long%d",
             (int)getpid());
    atexit(remove_image);
    TOOL(&r, NULL, "image", "build", link, "--tag", image_tag);
    CHECK_EQ(r.code, 0);
    TOOL(&r, NULL, "run", "--backend", "docker", "--image", image_tag, "--",
         link, "hello-from-image");
    CHECK_EQ(r.code, 0);
    CHECK_STR(r.out, "hello from the image\n");
    char run[64];
    run_name_from(r.err, run, sizeof run);
    TOOL(&r, NULL, "clean", run);
    CHECK_EQ(r.code, 0);
    CHECK_OK(fiber_image_remove(image_tag));
    image_tag[0] = '\0';
}

struct demux_out {
    char streams[3][128 * 1024];
    size_t len[3];
};

static int collect(void *ud, int stream, const void *data, size_t len)
{
    struct demux_out *o = ud;
    CHECK(stream == 1 || stream == 2);
    CHECK(o->len[stream] + len <= sizeof o->streams[stream]);
    memcpy(o->streams[stream] + o->len[stream], data, len);
    o->len[stream] += len;
    return 0;
}

static size_t frame(unsigned char *p, int stream, const char *data,
                    size_t len)
{
    p[0] = (unsigned char)stream;
    p[1] = p[2] = p[3] = 0;
    p[4] = (unsigned char)(len >> 24);
    p[5] = (unsigned char)(len >> 16);
    p[6] = (unsigned char)(len >> 8);
    p[7] = (unsigned char)len;
    memcpy(p + 8, data, len);
    return 8 + len;
}

/* The log stream's 8-byte frame headers, split anywhere by the transport. */
TEST(demux_reassembles_frames_split_anywhere)
{
    static unsigned char stream[200 * 1024];
    static char big[70000];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (char)('a' + i % 26);
    size_t n = 0;
    n += frame(stream + n, 1, "hello\n", 6);
    n += frame(stream + n, 2, "err\n", 4);
    n += frame(stream + n, 1, "", 0);
    n += frame(stream + n, 1, big, sizeof big);
    n += frame(stream + n, 2, "tail", 4);
    static const size_t pieces[] = {1, 3, 7, 8, 9, 4096, sizeof stream};
    for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
        static struct demux_out out;
        memset(&out, 0, sizeof out);
        struct fb_demux d = {{0}, 0, 0, 0};
        for (size_t off = 0; off < n; off += pieces[k]) {
            size_t take = n - off < pieces[k] ? n - off : pieces[k];
            CHECK_EQ(fb_demux_feed(&d, stream + off, take, collect, &out), 0);
        }
        CHECK_EQ(out.len[1], 6 + sizeof big);
        CHECK(memcmp(out.streams[1], "hello\n", 6) == 0);
        CHECK(memcmp(out.streams[1] + 6, big, sizeof big) == 0);
        CHECK_EQ(out.len[2], 8);
        CHECK(memcmp(out.streams[2], "err\ntail", 8) == 0);
    }
}

TEST(image_build_errors)
{
    static struct result r;
    TOOL(&r, NULL, "image", "build", "/no/such/program");
    CHECK_EQ(r.code, 1);
    CHECK_CONTAINS(r.err, "/no/such/program");
    CHECK(strstr(r.err, "fiber: program ") == NULL); /* nothing was built */
    TOOL(&r, NULL, "image", "build", "/etc/hostname");
    CHECK_EQ(r.code, 1);
    TOOL(&r, NULL, "image", "build", "/bin/true", "--tag", "Bad Name");
    CHECK_EQ(r.code, 1);
    CHECK_CONTAINS(r.err, "invalid image name");
    char tag[320];
    CHECK_OK(fiber_image_default_tag("/bin/true", tag, sizeof tag));
    CHECK(strncmp(tag, "fiber/true:", 11) == 0);
    CHECK_EQ(strlen(tag), 11 + 12);
}

/* What the image's container runs, before fiber_init: this program plays
 * a tiny master that prints to both streams and exits as asked. */
int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "hello-from-image") == 0) {
        printf("hello from the image\n");
        fflush(stdout);
        fprintf(stderr, "and from its stderr\n");
        return 0;
    }
    if (argc > 2 && strcmp(argv[1], "exit-with") == 0) {
        if (argc > 3 && strcmp(argv[3], "sleep") == 0)
            sleep(60);
        return atoi(argv[2]);
    }
    return th_main(argc, argv);
}
