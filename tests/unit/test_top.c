/*
 * test_top.c -- `fiber top`, run as a user runs it: on a terminal (a tmux
 * pane, whose screen the case reads with `tmux capture-pane`), with its
 * output a pipe, and against runs that do not exist or refuse it.
 *
 * The run it watches is this program again (helper_serve): a master
 * that maps tasks on a pool of two workers until it is stopped, in a
 * scratch TMPDIR of the case's own, so that the case sees no other run.
 * The backend is whatever the environment says: tests/docker/run.sh and
 * tests/slurm/run.sh run the same cases with every worker a container or
 * a Slurm job; docker_master_in_a_container runs the master itself in a
 * container (fiber run --backend docker).
 *
 * The tmux cases need tmux (scripts/deps.sh installs it): without it they
 * are skipped (exit 77), which CI=true turns into a failure.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/kubernetes/k8s_api.h"
#include "base/common.h"
#include "runtime/stats_srv.h"
#include "harness.h"
#include "net/net.h"
#include "wire/wire.h"

#ifndef FIBER_TOOL_PATH
#error "FIBER_TOOL_PATH must name the built fiber command"
#endif

extern char **environ;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ---- the watched run ------------------------------------------------------ */

FIBER_TASK(slow_square)
{
    int x = 0;
    if (len == sizeof x)
        memcpy(&x, arg, sizeof x);
    sleep_ms(5);
    x *= x;
    return fiber_buf_append(out, &x, sizeof x);
}

/* The master `fiber top` watches: a pool of 2 mapping tasks, round after
 * round, for at most five minutes. */
TEST(helper_serve)
{
    fiber_pool *p;
    fiber_pool_opts o = {.workers = 2};
    CHECK_OK(fiber_pool_create(&p, &o));
    int in[20], out[20];
    for (int i = 0; i < 20; i++)
        in[i] = i;
    time_t end = time(NULL) + 300;
    while (time(NULL) < end)
        CHECK_OK(fiber_pool_map(p, "slow_square", in, sizeof in[0], 20, out,
                                sizeof out[0], 0));
    fiber_pool_free(p);
}

static char scratch[64];
static char tmpdir_var[96];
static char self_path[PATH_MAX];
static pid_t server = -1;

static void stop_server(void)
{
    if (server > 0) {
        kill(server, SIGTERM);
        int st;
        waitpid(server, &st, 0);
        server = -1;
    }
}

static void remove_scratch(void)
{
    stop_server();
    if (scratch[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", scratch);
    }
}

static void make_scratch(void)
{
    snprintf(scratch, sizeof scratch, "/tmp/fiber-top-%d", (int)getpid());
    CHECK(mkdir(scratch, 0700) == 0 || errno == EEXIST);
    snprintf(tmpdir_var, sizeof tmpdir_var, "TMPDIR=%s", scratch);
    setenv("TMPDIR", scratch, 1); /* the tool and the helpers see it */
    atexit(remove_scratch);
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    CHECK(n > 0);
    self_path[n] = '\0';
}

/* The scratch TMPDIR's run directories' parent. */
static void runs_base(char *out, size_t size)
{
    snprintf(out, size, "%s/fiber-%u", scratch, (unsigned)geteuid());
}

/* Waits until a run of the scratch TMPDIR has published master.addr; its
 * id goes to run. */
static void wait_for_run(char *run, size_t size, int timeout_s)
{
    char base[128];
    runs_base(base, sizeof base);
    time_t end = time(NULL) + timeout_s;
    while (time(NULL) < end) {
        DIR *d = opendir(base);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s/%s", base, e->d_name,
                     FB_MONITOR_ADDR_FILE);
            if (e->d_name[0] != '.' && strlen(e->d_name) < size &&
                access(path, R_OK) == 0) {
                memcpy(run, e->d_name, strlen(e->d_name) + 1);
                closedir(d);
                return;
            }
        }
        if (d)
            closedir(d);
        sleep_ms(100);
    }
    TH_FAIL("no run published %s under %s within %d s",
            FB_MONITOR_ADDR_FILE, base, timeout_s);
}

/* Starts helper_serve and waits for its run. */
static void start_server(char *run, size_t size)
{
    char *argv[] = {self_path, "helper_serve", NULL};
    CHECK(posix_spawn(&server, self_path, NULL, NULL, argv, environ) == 0);
    wait_for_run(run, size, 120);
}

/* ---- running things ------------------------------------------------------- */

/* Runs cmd with sh, its output (stdout and stderr) into out; returns its
 * exit status. */
static int sh(char *out, size_t size, const char *fmt, ...) FIBER_PRINTF(3, 4);
static int sh(char *out, size_t size, const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[4200];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *f = popen(full, "r");
    CHECK(f != NULL);
    size_t n = fread(out, 1, size - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    fprintf(stderr, "$ %s   -> %d\n%s", cmd,
            WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static char tmux_sock[64];

static void tmux_kill(void)
{
    if (tmux_sock[0]) {
        char out[256];
        sh(out, sizeof out, "tmux -L %s kill-server", tmux_sock);
        tmux_sock[0] = '\0';
    }
}

static void need_tmux(void)
{
    char out[256];
    if (sh(out, sizeof out, "command -v tmux") != 0)
        TH_SKIP_ENGINE("tmux is not installed (scripts/deps.sh installs it)");
    snprintf(tmux_sock, sizeof tmux_sock, "fiber-top-%d", (int)getpid());
    atexit(tmux_kill);
}

/* Starts `fiber top RUN` in a 150x40 tmux pane, in a shell that first
 * prints BEFORE and afterwards, on one line, top's exit status and the
 * terminal's icanon and echo modes, then waits. */
static void tmux_start(const char *run)
{
    char script[128], out[512];
    snprintf(script, sizeof script, "%s/pane.sh", scratch);
    FILE *f = fopen(script, "w");
    CHECK(f != NULL);
    fprintf(f,
            "TMPDIR=%s; export TMPDIR\n"
            "trap : INT\n" /* Ctrl-C is top's to handle, not the shell's */
            "echo BEFORE\n"
            "%s top %s\n"
            "code=$?\n"
            "modes=$(stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon "
            "-e -icanon -e echo -e -echo | tr '\\n' ' ')\n"
            "echo \"top-exit=$code tty: $modes.\"\n"
            "sleep 600\n",
            scratch, FIBER_TOOL_PATH, run);
    fclose(f);
    CHECK_EQ(sh(out, sizeof out,
                "tmux -L %s -f /dev/null new-session -d -s top -x 150 -y 40 "
                "'sh %s'",
                tmux_sock, script),
             0);
}

static void tmux_screen(char *out, size_t size)
{
    sh(out, size, "tmux -L %s capture-pane -p -t top", tmux_sock);
}

/* The number in the DONE column of pool's row on the screen, or -1. */
static long long done_on_screen(const char *screen, const char *pool,
                                int *alive)
{
    const char *row = strstr(screen, pool);
    while (row && row != screen && row[-1] != '\n')
        row = strstr(row + 1, pool);
    if (!row)
        return -1;
    char name[64];
    int al, start, target;
    unsigned long long lost, done;
    if (sscanf(row, "%63s %d %d %llu %d %llu", name, &al, &start, &lost,
               &target, &done) != 6)
        return -1;
    *alive = al;
    return (long long)done;
}

/* Waits for the pool's row to show both workers alive and a done count
 * above `above`; returns that count. */
static long long wait_for_row(long long above, int timeout_s)
{
    static char screen[16384];
    time_t end = time(NULL) + timeout_s;
    while (time(NULL) < end) {
        tmux_screen(screen, sizeof screen);
        int alive = 0;
        long long done = done_on_screen(screen, "Pool1", &alive);
        if (alive == 2 && done > above)
            return done;
        sleep_ms(300);
    }
    TH_FAIL("the screen never showed Pool1 with 2 workers alive and more "
            "than %lld tasks done",
            above);
    return -1;
}

/* Waits until the pane's shell printed top-exit=; returns that line's
 * screen. */
static void wait_for_exit(char *screen, size_t size)
{
    for (int i = 0; i < 100; i++) {
        tmux_screen(screen, size);
        if (strstr(screen, "top-exit="))
            return;
        sleep_ms(100);
    }
    TH_FAIL("fiber top did not exit");
}

static void check_terminal_restored(const char *screen)
{
    CHECK_CONTAINS(screen, "BEFORE");     /* the main screen is back */
    CHECK_CONTAINS(screen, "tty: icanon echo ."); /* and the line mode */
    CHECK(strstr(screen, "POOL") == NULL); /* top's screen is gone */
    char out[64];
    sh(out, sizeof out, "tmux -L %s display -p -t top "
                        "'#{alternate_on} #{cursor_flag}'",
       tmux_sock);
    CHECK_STR(out, "0 1\n"); /* not on the alternate screen; cursor shown */
}

/* ---- cases ------------------------------------------------------------- */

TEST(screen_shows_the_pool_and_q_quits)
{
    make_scratch();
    need_tmux();
    char run[64];
    start_server(run, sizeof run);
    tmux_start(run);
    long long first = wait_for_row(0, 120);
    long long later = wait_for_row(first, 30); /* it refreshes */
    CHECK(later > first);
    static char screen[16384];
    tmux_screen(screen, sizeof screen);
    CHECK_CONTAINS(screen, run);
    CHECK_CONTAINS(screen, "master  cpu");
    CHECK_CONTAINS(screen, "rss");
    char out[256];
    CHECK_EQ(sh(out, sizeof out, "tmux -L %s send-keys -t top q", tmux_sock),
             0);
    wait_for_exit(screen, sizeof screen);
    CHECK_CONTAINS(screen, "top-exit=0");
    check_terminal_restored(screen);
    tmux_kill();
    /* The run goes on, unharmed by its watcher. */
    CHECK(kill(server, 0) == 0);
}

TEST(ctrl_c_quits_and_restores_the_terminal)
{
    make_scratch();
    need_tmux();
    char run[64];
    start_server(run, sizeof run);
    tmux_start(run);
    wait_for_row(0, 120);
    char out[256];
    CHECK_EQ(sh(out, sizeof out, "tmux -L %s send-keys -t top C-c", tmux_sock),
             0);
    static char screen[16384];
    wait_for_exit(screen, sizeof screen);
    CHECK_CONTAINS(screen, "top-exit=0");
    check_terminal_restored(screen);
}

/* Counts the lines of text holding needle. */
static int lines_with(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* With stdout a pipe: one line per pool per refresh, no escapes, and the
 * done count grows from line to line. */
TEST(plain_lines_when_stdout_is_a_pipe)
{
    make_scratch();
    char run[64];
    start_server(run, sizeof run);
    static char out[65536];
    long long done[2] = {-1, -1};
    int ok = 0;
    /* Until the three lines show both workers up and the count growing
     * (the workers take a moment to start, longer on a cluster). */
    for (int attempt = 0; attempt < 60 && !ok; attempt++) {
        int rc = sh(out, sizeof out,
                    "{ %s top -n 3 -d 500 %s; echo top-exit=$?; } | cat",
                    FIBER_TOOL_PATH, run);
        CHECK_EQ(rc, 0);
        CHECK_CONTAINS(out, "top-exit=0\n");
        CHECK(strchr(out, '\033') == NULL); /* no escapes in lines */
        CHECK_EQ(lines_with(out, run), 3);  /* one line per refresh */
        const char *d1 = strstr(out, " done="), *d3 = d1;
        for (const char *p = d1; p; p = strstr(p + 1, " done="))
            d3 = p;
        if (lines_with(out, " pool=Pool1 alive=2 ") == 3) {
            done[0] = atoll(d1 + 6);
            done[1] = atoll(d3 + 6);
            ok = done[1] > done[0];
        }
        if (!ok)
            sleep_ms(500);
    }
    CHECK(ok);
    CHECK_CONTAINS(out, "done_per_s=");
    CHECK_CONTAINS(out, "rss_bytes=");
}

TEST(without_a_run_it_picks_the_only_live_one)
{
    make_scratch();
    char out[4096];
    /* None yet. */
    /* Only the scratch TMPDIR's runs: the Docker Engine's may be anybody's. */
    setenv("FIBER_DOCKER_SOCKET", "/tmp/no-docker-here.sock", 1);
    CHECK_EQ(sh(out, sizeof out, "%s top -n 1", FIBER_TOOL_PATH), 1);
    CHECK_CONTAINS(out, "no live run on this host");
    char run[64];
    start_server(run, sizeof run);
    static char big[65536];
    CHECK_EQ(sh(big, sizeof big, "{ %s top -n 1; echo top-exit=$?; } | cat",
                FIBER_TOOL_PATH),
             0);
    CHECK_CONTAINS(big, "top-exit=0\n");
    CHECK_CONTAINS(big, run);
    unsetenv("FIBER_DOCKER_SOCKET");
}

TEST(a_run_that_does_not_exist_is_a_clear_error)
{
    make_scratch();
    char out[4096];
    CHECK_EQ(sh(out, sizeof out, "%s top fiber-00000000", FIBER_TOOL_PATH), 1);
    CHECK_CONTAINS(out, "no run 'fiber-00000000' on this host");
    CHECK_EQ(sh(out, sizeof out, "%s top ../etc", FIBER_TOOL_PATH), 1);
    CHECK_CONTAINS(out, "is not a run id");
    CHECK_EQ(sh(out, sizeof out, "%s top -n 0 x", FIBER_TOOL_PATH), 2);
    CHECK_CONTAINS(out, "--iterations");
    CHECK_EQ(sh(out, sizeof out, "%s top a b", FIBER_TOOL_PATH), 2);
    /* A run directory whose master published nothing (it ended). */
    char base[128], dir[256];
    runs_base(base, sizeof base);
    CHECK(mkdir(base, 0700) == 0 || errno == EEXIST);
    snprintf(dir, sizeof dir, "%s/fiber-0000dead", base);
    CHECK(mkdir(dir, 0700) == 0);
    CHECK_EQ(sh(out, sizeof out, "%s top fiber-0000dead", FIBER_TOOL_PATH), 1);
    CHECK_CONTAINS(out, "has no live master to watch");
}

/* Whether run's master listens on a unix socket (else TCP). */
static int unix_socket(const char *run)
{
    char base[128], path[512], addr[600] = "";
    runs_base(base, sizeof base);
    snprintf(path, sizeof path, "%s/%s/%s", base, run, FB_MONITOR_ADDR_FILE);
    FILE *f = fopen(path, "r");
    CHECK(f && fgets(addr, sizeof addr, f));
    fclose(f);
    return strncmp(addr, "unix:", 5) == 0;
}

/* A token other than the run's: the master refuses it, and the run goes
 * on; the right one is let in again. */
TEST(a_bad_token_is_refused)
{
    make_scratch();
    char run[64];
    start_server(run, sizeof run);
    char base[128], path[512], good[80] = "";
    runs_base(base, sizeof base);
    snprintf(path, sizeof path, "%s/%s/%s", base, run, FB_MONITOR_TOKEN_FILE);
    FILE *f = fopen(path, "r");
    CHECK(f && fgets(good, sizeof good, f));
    fclose(f);
    f = fopen(path, "w");
    CHECK(f != NULL);
    fprintf(f, "%064d\n", 0);
    fclose(f);
    char out[4096];
    CHECK_EQ(sh(out, sizeof out, "%s top -n 1 %s", FIBER_TOOL_PATH, run), 1);
    /* Over a unix socket the master says why; over TCP with encryption,
     * whose key is the token, it cannot even read the HELLO and just
     * closes. */
    if (unix_socket(run))
        CHECK_CONTAINS(out, "refused us: authentication failed: wrong token");
    else
        CHECK_CONTAINS(out, "closed the connection instead of accepting it");
    f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(good, f);
    fclose(f);
    static char big[65536];
    CHECK_EQ(sh(big, sizeof big, "{ %s top -n 1 %s; echo top-exit=$?; } | cat",
                FIBER_TOOL_PATH, run),
             0);
    CHECK_CONTAINS(big, "top-exit=0\n");
    CHECK_CONTAINS(big, "pool=Pool1");
}

/* Straight at the master's socket: STATS without HELLO is dropped with no
 * snapshot, and so is a HELLO with a wrong token (after a REJECT). */
TEST(a_peer_without_the_token_gets_no_snapshot)
{
    make_scratch();
    char run[64];
    start_server(run, sizeof run);
    char base[128], path[512], addr[600];
    runs_base(base, sizeof base);
    snprintf(path, sizeof path, "%s/%s/%s", base, run, FB_MONITOR_ADDR_FILE);
    FILE *f = fopen(path, "r");
    CHECK(f && fgets(addr, sizeof addr, f));
    fclose(f);
    addr[strcspn(addr, "\n")] = '\0';
    uint8_t wrong[FB_WIRE_TOKEN_LEN] = {0};
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd;
        CHECK_OK(fb_sock_dial(addr, fb_deadline_ms(5000), &fd));
        struct fb_conn c;
        fb_conn_init(&c, fd, 1 << 20);
        CHECK_OK(fb_conn_secure_for(&c, addr, FB_SEC_CLIENT, wrong));
        if (attempt == 1) {
            struct fb_msg_hello h = {.build_id = "ab", .build_id_len = 2,
                                     .job_id = 0, .pid = 1, .name = "x",
                                     .name_len = 1};
            CHECK_OK(fb_wire_put_hello(fb_conn_out(&c), &h));
        }
        CHECK_OK(fb_wire_put_empty(fb_conn_out(&c), FB_MSG_STATS, 1));
        CHECK_OK(fb_conn_flush_wait(&c, fb_deadline_ms(5000)));
        int rejects = 0, snapshots = 0;
        for (;;) {
            struct fb_wire_hdr h;
            const uint8_t *p;
            int rc = fb_conn_recv_wait(&c, &h, &p, fb_deadline_ms(10000));
            CHECK(rc != FIBER_ETIMEDOUT); /* the master closes, at once */
            if (rc != 1)
                break;
            rejects += h.type == FB_MSG_REJECT;
            snapshots += h.type == FB_MSG_SNAPSHOT;
        }
        fb_conn_close(&c);
        CHECK_EQ(snapshots, 0);
        /* Over a unix socket the REJECT arrives; over TCP with encryption
         * a wrong token cannot even decrypt it. */
        if (attempt == 1 && strncmp(addr, "unix:", 5) == 0)
            CHECK_EQ(rejects, 1);
    }
    CHECK(kill(server, 0) == 0); /* the run goes on */
    static char big[65536];
    CHECK_EQ(sh(big, sizeof big, "{ %s top -n 1 %s; echo top-exit=$?; } | cat",
                FIBER_TOOL_PATH, run),
             0);
    CHECK_CONTAINS(big, "top-exit=0\n");
    CHECK_CONTAINS(big, "pool=Pool1");
}

/* The master in a container of the Docker Engine (host networking, the
 * run directory mounted): fiber top reads it as it reads a local one. */
static char image_tag[128];

static void remove_image(void)
{
    if (image_tag[0]) {
        fiber_image_remove(image_tag);
        image_tag[0] = '\0';
    }
}

TEST(docker_master_in_a_container)
{
    const char *sock = getenv("FIBER_DOCKER_SOCKET");
    if (access(sock ? sock : "/var/run/docker.sock", F_OK) != 0)
        TH_SKIP_ENGINE("no Docker Engine socket on this machine");
    make_scratch();
    snprintf(image_tag, sizeof image_tag, "fiber-test-top:p%d", (int)getpid());
    atexit(remove_image);
    static char out[65536];
    CHECK_EQ(sh(out, sizeof out, "%s image build %s --tag %s",
                FIBER_TOOL_PATH, self_path, image_tag),
             0);
    CHECK_EQ(sh(out, sizeof out,
                "FIBER_IMAGE=%s %s run --detach --backend docker --image %s "
                "-- %s helper_serve",
                image_tag, FIBER_TOOL_PATH, image_tag, self_path),
             0);
    /* It prints the run id alone on a line of its standard output. */
    char run[64] = "";
    for (const char *l = out; *l; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != 0))
        if (strncmp(l, "fiber-", 6) == 0)
            snprintf(run, sizeof run, "%.*s", (int)strcspn(l, "\n"), l);
    CHECK(run[0] != '\0');
    char expect[64];
    wait_for_run(expect, sizeof expect, 120);
    CHECK_STR(expect, run);
    long long done[2] = {-1, -1};
    for (int attempt = 0; attempt < 60 && done[1] <= done[0]; attempt++) {
        CHECK_EQ(sh(out, sizeof out,
                    "{ %s top -n 3 -d 500 %s; echo top-exit=$?; } | cat",
                    FIBER_TOOL_PATH, run),
                 0);
        CHECK_CONTAINS(out, "top-exit=0\n");
        CHECK_CONTAINS(out, "pool=Pool1");
        const char *d1 = strstr(out, " done="), *d3 = d1;
        for (const char *p = d1; p; p = strstr(p + 1, " done="))
            d3 = p;
        if (lines_with(out, "alive=2 ") == 3) {
            done[0] = atoll(d1 + 6);
            done[1] = atoll(d3 + 6);
        }
        if (done[1] <= done[0])
            sleep_ms(1000);
    }
    CHECK(done[1] > done[0]);
    CHECK(strstr(out, " docker ") == NULL); /* lines name pools, not this */
    /* Stopping it is fiber kill's business (test_tool checks it): here it
     * is only cleaned up after. */
    /* A master in a container records its pid as its own PID namespace
     * numbers it (1 or so) in master.pid, which fiber kill and fiber ps
     * would take for the host's process of that number (a kernel thread,
     * which never ends, so the run would look alive forever): drop it. */
    char base[128], pidfile[512];
    runs_base(base, sizeof base);
    snprintf(pidfile, sizeof pidfile, "%s/%s/master.pid", base, run);
    unlink(pidfile);
    char kill_out[4096];
    sh(kill_out, sizeof kill_out, "%s kill %s", FIBER_TOOL_PATH, run);
    for (int i = 0; i < 60; i++) {
        if (sh(kill_out, sizeof kill_out, "%s clean %s", FIBER_TOOL_PATH,
               run) == 0)
            break;
        sleep_ms(500); /* the container is still stopping */
    }
    CHECK_OK(fiber_image_remove(image_tag));
    image_tag[0] = '\0';
}

/* The master itself a Slurm batch job, on a node of the test cluster
 * (which is this host): it makes its run directory under the TMPDIR that
 * sbatch hands it, as fiber run --backend slurm's master does, and fiber
 * top reads it there.  Only under tests/slurm/run.sh (FIBER_BACKEND=slurm,
 * the cluster's SLURM_CONF): named helper_ so that the plain run's list
 * (--list) leaves it out, and registered as test_top.slurm.<name> only. */
static char batch_job[32];

static void cancel_batch_job(void)
{
    if (batch_job[0]) {
        char out[256];
        sh(out, sizeof out, "scancel %s", batch_job);
        batch_job[0] = '\0';
    }
}

TEST(helper_slurm_master_in_a_batch_job)
{
    const char *backend = getenv("FIBER_BACKEND");
    if (!backend || strcmp(backend, "slurm") != 0 || !getenv("SLURM_CONF"))
        TH_SKIP_ENGINE("not on the Slurm test cluster (tests/slurm/run.sh)");
    make_scratch();
    static char out[65536];
    CHECK_EQ(sh(out, sizeof out,
                "sbatch --parsable --job-name=fiber-top-master "
                "--output=%s/master.out --wrap='exec %s helper_serve'",
                scratch, self_path),
             0);
    snprintf(batch_job, sizeof batch_job, "%.*s",
             (int)strcspn(out, ";\n"), out);
    atexit(cancel_batch_job);
    char run[64];
    wait_for_run(run, sizeof run, 120);
    int ok = 0;
    for (int attempt = 0; attempt < 60 && !ok; attempt++) {
        CHECK_EQ(sh(out, sizeof out,
                    "{ %s top -n 3 -d 500 %s; echo top-exit=$?; } | cat",
                    FIBER_TOOL_PATH, run),
                 0);
        CHECK_CONTAINS(out, "top-exit=0\n");
        const char *d1 = strstr(out, " done="), *d3 = d1;
        for (const char *p = d1; p; p = strstr(p + 1, " done="))
            d3 = p;
        ok = lines_with(out, " pool=Pool1 alive=2 ") == 3 &&
             atoll(d3 + 6) > atoll(d1 + 6);
        if (!ok)
            sleep_ms(500);
    }
    CHECK(ok);
    /* The master is the batch job's process, not one of ours. */
    char pid_line[64];
    snprintf(pid_line, sizeof pid_line, "pid %ld", (long)getpid());
    CHECK(strstr(out, pid_line) == NULL);
    cancel_batch_job();
}

/* The master in a pod of the Kubernetes test cluster (fiber run --backend
 * kubernetes): its run directory is inside the pod, so fiber top finds
 * the master's address in a job pod's environment and the token in the
 * run's Secret, through the API server.  Only under tests/k8s/run.sh
 * (helper_: left out of the plain run's list). */
static struct fb_k8s admin;
static char master_pod[128];

static void delete_master_pod(void)
{
    if (!master_pod[0])
        return;
    char path[400];
    snprintf(path, sizeof path,
             "/api/v1/namespaces/%s/pods/%s?gracePeriodSeconds=0", admin.ns,
             master_pod);
    long status = 0;
    json_t *r = NULL;
    fb_k8s_json(&admin, "DELETE", path, NULL, NULL, 20000, &status, &r);
    json_decref(r);
    master_pod[0] = '\0';
}

TEST(helper_kubernetes_master_in_a_pod)
{
    const char *backend = getenv("FIBER_BACKEND");
    if (!backend || strcmp(backend, "kubernetes") != 0 ||
        !getenv("FIBER_IMAGE") || !getenv("K8S_ADMIN_TOKEN_FILE"))
        TH_SKIP_ENGINE("not on the Kubernetes test cluster (tests/k8s/run.sh)");
    make_scratch();
    struct fb_config c;
    fb_config_defaults(&c);
    fb_strlcpy(c.k8s_server, getenv("FIBER_K8S_SERVER"), sizeof c.k8s_server);
    fb_strlcpy(c.k8s_ca_file, getenv("FIBER_K8S_CA_FILE"),
               sizeof c.k8s_ca_file);
    fb_strlcpy(c.k8s_token_file, getenv("K8S_ADMIN_TOKEN_FILE"),
               sizeof c.k8s_token_file);
    fb_strlcpy(c.k8s_namespace, getenv("FIBER_K8S_NAMESPACE"),
               sizeof c.k8s_namespace);
    CHECK_OK(fb_k8s_open(&admin, &c));
    static char out[65536];
    CHECK_EQ(sh(out, sizeof out,
                "%s run --detach --backend kubernetes --image '%s' -- %s "
                "helper_serve",
                FIBER_TOOL_PATH, getenv("FIBER_IMAGE"), self_path),
             0);
    char run[64] = "";
    for (const char *l = out; *l;
         l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != 0))
        if (strncmp(l, "fiber-", 6) == 0)
            snprintf(run, sizeof run, "%.*s", (int)strcspn(l, "\n"), l);
    CHECK(run[0] != '\0');
    snprintf(master_pod, sizeof master_pod, "%s-master", run);
    atexit(delete_master_pod);
    int ok = 0;
    /* Until the pod runs, its workers' pods are up, and the count grows. */
    for (int attempt = 0; attempt < 120 && !ok; attempt++) {
        sh(out, sizeof out,
           "{ %s top -n 3 -d 500 %s; echo top-exit=$?; } | cat",
           FIBER_TOOL_PATH, run);
        const char *d1 = strstr(out, " done="), *d3 = d1;
        for (const char *p = d1; p; p = strstr(p + 1, " done="))
            d3 = p;
        ok = strstr(out, "top-exit=0\n") &&
             lines_with(out, " pool=Pool1 alive=2 ") == 3 &&
             atoll(d3 + 6) > atoll(d1 + 6);
        if (!ok)
            sleep_ms(1000);
    }
    CHECK(ok);
    delete_master_pod();
}

int main(int argc, char **argv) { return th_main(argc, argv); }
