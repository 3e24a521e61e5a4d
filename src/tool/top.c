/*
 * top.c -- `fiber top [RUN]`: a live view of a running run, refreshed
 * every second, from the snapshots its master sends
 * (fiber_run_watch_read).
 *
 * On a terminal it takes the alternate screen, hides the cursor and reads
 * keys unbuffered (termios, ANSI escapes; no curses), and puts all of it
 * back however it ends: q, Ctrl-C, SIGTERM, SIGHUP, the run ending, an
 * error; and while it is stopped by Ctrl-Z.  When stdout is not a terminal (or with --plain) it prints one
 * line per pool per refresh instead, for logs and scripts.
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "tool.h"

static const char top_help[] =
    "usage: fiber top [options] [RUN]\n"
    "\n"
    "Shows a live run: for each of its master's pools the workers alive,\n"
    "starting and lost, the tasks done (in all and per second), queued, in\n"
    "flight, retried and crashed; and the master's CPU use and resident\n"
    "memory.  It refreshes every second until you press q or Ctrl-C.\n"
    "\n"
    "RUN is a run id (fiber ps lists them); without it, fiber top watches the\n"
    "only live run, or lists the live runs and asks you to name one.  It\n"
    "reads the master over its own socket, proving itself with the run's\n"
    "token as the run's jobs do; the master publishes both in its run\n"
    "directory, so fiber top works for masters whose run directory is on\n"
    "this host (local, docker, slurm), as the run's user; for a master in a\n"
    "Kubernetes pod it asks the configured cluster instead (a job pod's\n"
    "environment for the address, the run's Secret for the token).\n"
    "\n"
    "When standard output is not a terminal it prints one line per pool per\n"
    "refresh instead of a screen.\n"
    "\n"
    "options:\n"
    "  -d, --delay MS        time between refreshes (default 1000; 100..60000)\n"
    "  -n, --iterations N    stop after N refreshes (default: until q)\n"
    "      --plain           print lines even on a terminal\n"
    "  -h, --help            this text\n"
    "\n"
    "Exit status: 0 quit (q, Ctrl-C, or the run ended), 1 failure (no such\n"
    "run, it cannot be reached, the master refused us), 2 usage error (also\n"
    "when several runs are live and none is named).\n";

struct top_opts {
    int delay_ms;
    int iterations; /* 0: forever */
    int plain;
};

/* ---- the terminal ------------------------------------------------------- */

static volatile sig_atomic_t quit_signal;
static volatile sig_atomic_t resized;
static volatile sig_atomic_t suspended;
static struct termios saved_tio;
static int tio_saved;
static int screen_on;

static void on_quit(int sig) { quit_signal = sig; }
static void on_winch(int sig)
{
    (void)sig;
    resized = 1;
}
static void on_tstp(int sig)
{
    (void)sig;
    suspended = 1;
}

/* Handlers without SA_RESTART, so that poll() returns at once. */
static void catch_signals(int screen)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_quit;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sa.sa_handler = on_winch;
    sigaction(SIGWINCH, &sa, NULL);
    if (screen) { /* in plain mode Ctrl-Z stops it as any command */
        sa.sa_handler = on_tstp;
        sigaction(SIGTSTP, &sa, NULL);
    }
    signal(SIGPIPE, SIG_IGN);
}

static void screen_leave(void)
{
    if (screen_on) {
        fputs("\033[?25h\033[?1049l", stdout); /* cursor, main screen */
        fflush(stdout);
        screen_on = 0;
    }
    if (tio_saved) {
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_tio);
        tio_saved = 0;
    }
}

/* Keys without Enter and without echo; Ctrl-C still signals (ISIG). */
static void screen_enter(void)
{
    if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved_tio) == 0) {
        struct termios raw = saved_tio;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw) == 0)
            tio_saved = 1;
    }
    fputs("\033[?1049h\033[?25l\033[H\033[2J", stdout);
    fflush(stdout);
    screen_on = 1;
    static int registered;
    if (!registered++)
        atexit(screen_leave);
}

/* Ctrl-Z: gives the terminal back, stops, and takes it again on fg. */
static void suspend(void)
{
    suspended = 0;
    screen_leave();
    raise(SIGSTOP);
    screen_enter();
}

static int screen_width(void)
{
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    return 80;
}

/* Waits up to ms for a key; returns 1 when it asks to quit. */
static int wait_for_key(int ms)
{
    struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
    int use_keys = tio_saved;
    if (poll(&p, use_keys ? 1 : 0, ms) <= 0 || !use_keys)
        return 0;
    char keys[32];
    ssize_t n = read(STDIN_FILENO, keys, sizeof keys);
    for (ssize_t i = 0; i < n; i++)
        if (keys[i] == 'q' || keys[i] == 'Q' || keys[i] == 3 /* ^C */)
            return 1;
    return 0;
}

/* ---- figures ------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* What the previous refresh saw, for rates. */
struct previous {
    int have;
    double at;
    uint64_t cpu_us;
    size_t n;
    char (*names)[64];
    uint64_t *done;
};

/* Tasks per second of pool name since the last refresh (-1: unknown). */
static double done_rate(const struct previous *prev, const fiber_pool_row *r,
                        double at)
{
    if (!prev->have || at <= prev->at)
        return -1;
    for (size_t i = 0; i < prev->n; i++)
        if (strcmp(prev->names[i], r->name) == 0 &&
            r->st.tasks_done >= prev->done[i])
            return (double)(r->st.tasks_done - prev->done[i]) /
                   (at - prev->at);
    return -1;
}

static double cpu_percent(const struct previous *prev,
                          const fiber_run_stats *s, double at)
{
    uint64_t cpu = s->cpu_user_us + s->cpu_sys_us;
    if (!prev->have || at <= prev->at || cpu < prev->cpu_us)
        return -1;
    return (double)(cpu - prev->cpu_us) / 1e4 / (at - prev->at);
}

static void remember(struct previous *prev, const fiber_run_stats *s,
                     double at)
{
    free(prev->names);
    free(prev->done);
    prev->n = s->n_pools;
    prev->names = calloc(s->n_pools + 1, sizeof *prev->names);
    prev->done = calloc(s->n_pools + 1, sizeof *prev->done);
    prev->have = prev->names && prev->done;
    for (size_t i = 0; prev->have && i < s->n_pools; i++) {
        memcpy(prev->names[i], s->pools[i].name, sizeof prev->names[i]);
        prev->done[i] = s->pools[i].st.tasks_done;
    }
    prev->at = at;
    prev->cpu_us = s->cpu_user_us + s->cpu_sys_us;
}

static void fmt_rate(double v, char *buf, size_t size)
{
    if (v < 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.1f", v);
}

static void fmt_uptime(uint64_t ms, char *buf, size_t size)
{
    unsigned long long s = ms / 1000;
    snprintf(buf, size, "%llu:%02llu:%02llu", s / 3600, s / 60 % 60, s % 60);
}

/* ---- the screen and the lines ---------------------------------------- */

/* Prints one line of the screen, cut to the terminal's width. */
static void screen_line(int width, const char *fmt, ...) FIBER_PRINTF(2, 3);
static void screen_line(int width, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (width > 0 && (size_t)width < sizeof line)
        line[width] = '\0';
    printf("%s\033[K\n", line);
}

static void draw(const char *run, const fiber_run_stats *s,
                 const struct previous *prev, double at)
{
    int w = screen_width();
    char up[32], rss[32], cpu[32], rate[32];
    fmt_uptime(s->uptime_ms, up, sizeof up);
    tool_format_size((int64_t)s->rss_bytes, rss, sizeof rss);
    fmt_rate(cpu_percent(prev, s, at), cpu, sizeof cpu);
    fputs("\033[H", stdout);
    screen_line(w, "fiber top  %s  backend %s  master pid %ld  up %s   "
                   "(q quits)",
                run, s->backend, s->pid, up);
    screen_line(w, "master  cpu %s%%  (user %.2f s, sys %.2f s)  rss %s",
                cpu, (double)s->cpu_user_us / 1e6,
                (double)s->cpu_sys_us / 1e6, rss);
    screen_line(w, "%s", "");
    screen_line(w, "%-20s %6s %6s %6s %7s %10s %9s %8s %9s %8s %8s", "POOL",
                "ALIVE", "START", "LOST", "TARGET", "DONE", "DONE/S",
                "QUEUED", "INFLIGHT", "RETRIED", "CRASHED");
    for (size_t i = 0; i < s->n_pools; i++) {
        const fiber_pool_row *r = &s->pools[i];
        fmt_rate(done_rate(prev, r, at), rate, sizeof rate);
        screen_line(w,
                    "%-20s %6d %6d %6llu %7d %10llu %9s %8zu %9zu %8llu "
                    "%8llu",
                    r->name, r->st.workers_alive - r->st.workers_starting,
                    r->st.workers_starting,
                    (unsigned long long)r->st.workers_lost,
                    r->st.workers_target,
                    (unsigned long long)r->st.tasks_done, rate,
                    r->st.tasks_queued, r->st.tasks_in_flight,
                    (unsigned long long)r->st.tasks_retried,
                    (unsigned long long)r->st.tasks_crashed);
    }
    if (s->n_pools == 0)
        screen_line(w, "(no pool yet)");
    fputs("\033[J", stdout); /* clear what an earlier, longer frame left */
    fflush(stdout);
}

static void print_lines(const char *run, const fiber_run_stats *s,
                        const struct previous *prev, double at)
{
    char stamp[32], cpu[32], rate[32], rss[32];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
    fmt_rate(cpu_percent(prev, s, at), cpu, sizeof cpu);
    snprintf(rss, sizeof rss, "%llu", (unsigned long long)s->rss_bytes);
    if (s->n_pools == 0)
        printf("%s %s pool=- cpu_pct=%s rss_bytes=%s\n", stamp, run, cpu,
               rss);
    for (size_t i = 0; i < s->n_pools; i++) {
        const fiber_pool_row *r = &s->pools[i];
        fmt_rate(done_rate(prev, r, at), rate, sizeof rate);
        printf("%s %s pool=%s alive=%d starting=%d lost=%llu target=%d "
               "done=%llu done_per_s=%s queued=%zu in_flight=%zu "
               "retried=%llu crashed=%llu cpu_pct=%s rss_bytes=%s\n",
               stamp, run, r->name,
               r->st.workers_alive - r->st.workers_starting,
               r->st.workers_starting, (unsigned long long)r->st.workers_lost,
               r->st.workers_target, (unsigned long long)r->st.tasks_done,
               rate, r->st.tasks_queued, r->st.tasks_in_flight,
               (unsigned long long)r->st.tasks_retried,
               (unsigned long long)r->st.tasks_crashed, cpu, rss);
    }
    fflush(stdout);
}

/* ---- choosing the run ------------------------------------------------- */

/* Picks the only live run into out, or says why not.  Returns -1 when a
 * run was chosen, else the exit code. */
static int pick_run(char *out, size_t size)
{
    fiber_run_list l = {0};
    int rc = fiber_runs_list(NULL, &l);
    if (rc) {
        fiber_run_list_free(&l);
        return tool_fail(rc, "cannot list the runs");
    }
    size_t live = 0, last = 0;
    for (size_t i = 0; i < l.n; i++)
        if (l.runs[i].alive == 1) {
            live++;
            last = i;
        }
    int code = -1;
    if (live == 1) {
        snprintf(out, size, "%s", l.runs[last].run);
    } else if (live == 0) {
        tool_say("no live run on this host to watch (fiber ps lists the "
                 "runs)");
        code = TOOL_FAIL;
    } else {
        fprintf(stderr, "fiber top: %zu runs are live:\n", live);
        for (size_t i = 0; i < l.n; i++)
            if (l.runs[i].alive == 1)
                fprintf(stderr, "  %-20s %s\n", l.runs[i].run,
                        l.runs[i].backend);
        fprintf(stderr, "Name one: fiber top RUN\n");
        code = TOOL_USAGE;
    }
    fiber_run_list_free(&l);
    return code;
}

/* ---- the loop ------------------------------------------------------------ */

static int parse_top(int argc, char **argv, struct top_opts *o,
                     const char **run)
{
    enum { OPT_PLAIN = 1000 };
    static const struct option longs[] = {
        {"delay", required_argument, NULL, 'd'},
        {"iterations", required_argument, NULL, 'n'},
        {"plain", no_argument, NULL, OPT_PLAIN},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    tool_getopt_reset();
    int c;
    while ((c = tool_getopt("top", argc, argv, "d:n:h", longs)) != -1) {
        switch (c) {
        case 'h':
            fputs(top_help, stdout);
            return TOOL_OK;
        case 'd':
            if (tool_parse_int(optarg, 100, 60000, &o->delay_ms) != 0)
                return tool_usage("top", "--delay takes milliseconds in "
                                         "100..60000, not '%s'",
                                  optarg);
            break;
        case 'n':
            if (tool_parse_int(optarg, 1, 1000000000, &o->iterations) != 0)
                return tool_usage("top", "--iterations takes a count of at "
                                         "least 1, not '%s'",
                                  optarg);
            break;
        case OPT_PLAIN:
            o->plain = 1;
            break;
        default:
            return TOOL_USAGE;
        }
    }
    if (argc - optind > 1)
        return tool_usage("top", "unexpected argument '%s'",
                          argv[optind + 1]);
    *run = optind < argc ? argv[optind] : NULL;
    return -1;
}

/* Refreshes until asked to stop; returns the exit code. */
static int watch(fiber_run_watch *w, const char *run,
                 const struct top_opts *o)
{
    struct previous prev = {0};
    fiber_run_stats s = {0};
    int code = TOOL_OK;
    for (int i = 0; !quit_signal; i++) {
        int rc = fiber_run_watch_read(w, &s, 10000);
        if (rc == FIBER_ECLOSED) {
            screen_leave();
            tool_say("run '%s' has ended (its master closed the connection)",
                     run);
            break;
        }
        if (rc) {
            screen_leave();
            code = tool_fail(rc, "cannot read the run's snapshot");
            break;
        }
        double at = now_s();
        if (o->plain)
            print_lines(run, &s, &prev, at);
        else
            draw(run, &s, &prev, at);
        remember(&prev, &s, at);
        if (o->iterations && i + 1 >= o->iterations)
            break;
        double until = at + o->delay_ms / 1000.0;
        while (!quit_signal) {
            int left = (int)((until - now_s()) * 1000.0);
            if (left <= 0)
                break;
            if (wait_for_key(left)) {
                quit_signal = SIGINT;
                break;
            }
            if (suspended && !o->plain) {
                suspend();
                resized = 1; /* back from Ctrl-Z: draw it all again */
            }
            if (resized && !o->plain) {
                resized = 0;
                draw(run, &s, &prev, at);
            }
        }
    }
    fiber_run_stats_free(&s);
    free(prev.names);
    free(prev.done);
    return code;
}

int cmd_top(int argc, char **argv)
{
    struct top_opts o = {.delay_ms = 1000};
    const char *run_arg = NULL;
    int code = parse_top(argc, argv, &o, &run_arg);
    if (code >= 0)
        return code;
    char run[128];
    if (run_arg)
        snprintf(run, sizeof run, "%s", run_arg);
    else if ((code = pick_run(run, sizeof run)) >= 0)
        return code;
    fiber_run_watch *w;
    int rc = fiber_run_watch_open(&w, run, -1);
    if (rc) {
        char what[200];
        snprintf(what, sizeof what, "cannot watch run '%s'", run);
        return tool_fail(rc, what);
    }
    if (!isatty(STDOUT_FILENO))
        o.plain = 1;
    catch_signals(!o.plain);
    if (!o.plain)
        screen_enter();
    code = watch(w, run, &o);
    screen_leave();
    fiber_run_watch_close(w);
    return code;
}
