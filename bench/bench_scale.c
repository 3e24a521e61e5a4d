/*
 * bench_scale.c -- a pool of many local workers: how long until all are
 * connected, how long 100 short tasks per worker take, and how much memory
 * a worker costs; fiber against Python's multiprocessing.Pool.
 *
 * --workers N (default 1024; the Fiber paper used 2048) workers on this
 * machine's 2 cores:
 *
 *   connect_s  from just before fiber_pool_create until the LAST worker has
 *              connected, proved itself and received its pool assignment.
 *              The pool API has no "connected" count (workers_alive counts
 *              jobs started, connected or not), and tasks cannot probe
 *              every worker (a connected worker may hold several tasks, so
 *              N tasks need not reach N workers).  So the pool is given an
 *              initializer, which every worker runs right after it is
 *              admitted and just before it reports ready: it appends its
 *              pid and a CLOCK_MONOTONIC timestamp (shared by all
 *              processes) to a file.  The master polls that file until N
 *              records are there; connect_s is the latest timestamp minus
 *              the start.  The initializer costs one open/write/close.
 *   total_s    then one fiber_pool_map of 100 * N tasks that each sleep
 *              10 ms and return their pid (ideal 1.0 s), with automatic
 *              chunking (which picks 1 for tasks this long; --chunksize
 *              sets another).
 *   rss_per_worker_kib
 *              the sum of VmRSS (/proc/<pid>/status) over the N worker
 *              pids divided by N, read after the map while the pool is
 *              alive.  VmRSS counts shared pages (the binary, libc) in
 *              every process; Pss, which shares them out, is reported too.
 *
 * sleep_floor_s (extra) is what the machine itself needs for the same
 * sleeps: N processes forked without any framework, each sleeping 100
 * times 10 ms, released together, timed until the last one exits.  On 2
 * cores, 1024 processes waking 100 times a second each are already a load;
 * no pool can beat this floor.
 *
 * The master raises its soft descriptor limit to the hard limit (it holds
 * a socket and a pidfd per worker); if fiber still fails, the benchmark
 * prints the limits and which one it most likely hit.
 *
 * The peer (peer/scale_peer.py) does the same with
 * multiprocessing.Pool(N, initializer=...) and pool.map with its default
 * chunking; --peer-workers runs it with another N when Python cannot cope.
 * Output: a table on stdout, then as the LAST line one JSON object:
 * workers, connect_s, total_s, rss_per_worker_kib (and extras), the peer's
 * under "peer".
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <fiber/fiber.h>

#include "bench_common.h"

#define PROG "bench-scale"
#define DEFAULT_WORKERS 1024
#define TASKS_PER_WORKER 100
#define TASK_MS 10
/* One initializer record: "<pid> <ns>\n", padded to a fixed width so the
 * master can count records from the file's size. */
#define REC_LEN 40

struct options {
    long workers, peer_workers, timeout_s, chunksize;
    int no_peer;
};

struct result {
    double create_s, connect_s, total_s, rss_kib, pss_kib, free_s;
    double master_rss_kib;
    double master_cpu_s; /* user + system CPU of the master during the map */
    double workers_cpu_s; /* of all the workers, from start to exit */
    double map_workers_cpu_s; /* of all the workers during the map */
    double map_runs_per_task; /* times a worker was put on a CPU, a task */
    long workers, ran_tasks_min, ran_tasks_max, distinct;
};

/* The figures both sides report, in this order, after "workers". */
static const struct bench_figure figure_keys[] = {
    {"connect_s", offsetof(struct result, connect_s), 4, 0},
    {"total_s", offsetof(struct result, total_s), 4, 0},
    {"rss_per_worker_kib", offsetof(struct result, rss_kib), 1, 0},
    {"pss_per_worker_kib", offsetof(struct result, pss_kib), 1, 1},
    {"create_s", offsetof(struct result, create_s), 4, 1},
};
#define N_FIGURES (sizeof figure_keys / sizeof figure_keys[0])

/* A process's user + system CPU seconds (all threads), from
 * /proc/<pid>/stat ("self" for pid 0); -1 when it cannot be read. */
static double proc_cpu_s(long pid)
{
    char path[64];
    if (pid)
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    else
        snprintf(path, sizeof path, "/proc/self/stat");
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[2048];
    size_t n = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[n] = '\0';
    const char *p = strrchr(line, ')'); /* the name may hold spaces */
    unsigned long long ut, st;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
                     "%llu %llu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Ours, from getrusage (microseconds rather than /proc's ticks). */
static double self_cpu_s(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return proc_cpu_s(0);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* The CPU seconds of the main threads of the n processes in pids,
 * summed, from /proc/<pid>/schedstat (nanoseconds: /proc/<pid>/stat
 * counts whole clock ticks, and a worker's share of a map is a few ms);
 * *runs gets the sum of its third field, how many times those threads
 * were put on a CPU (each wake-up from a sleep or a poll is one). */
static double procs_cpu_s(const long *pids, long n, double *runs)
{
    double sum = 0;
    *runs = 0;
    for (long i = 0; i < n; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%ld/schedstat", pids[i]);
        FILE *f = fopen(path, "r");
        unsigned long long ns, wait_ns, slices;
        if (f && fscanf(f, "%llu %llu %llu", &ns, &wait_ns, &slices) == 3) {
            sum += (double)ns / 1e9;
            *runs += (double)slices;
        }
        if (f)
            fclose(f);
    }
    return sum;
}

/* CPU seconds of the children this process has waited for. */
static double children_cpu_s(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_CHILDREN, &ru) != 0)
        return -1;
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* The initializer: records this worker's pid and the time. */
FIBER_TASK(bench_scale_init)
{
    char path[4096];
    if (len == 0 || len >= sizeof path)
        return fiber_task_fail("bench_scale_init wants a path");
    memcpy(path, arg, len);
    path[len] = '\0';
    char rec[REC_LEN + 1];
    snprintf(rec, sizeof rec, "%-12ld %-25" PRIu64, (long)getpid(),
             bench_now_ns());
    rec[REC_LEN - 1] = '\n';
    int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0)
        return fiber_task_fail("open %s: %s", path, strerror(errno));
    ssize_t w = write(fd, rec, REC_LEN);
    close(fd);
    return w == REC_LEN ? 0 : fiber_task_fail("short write to %s", path);
}

/* Sleeps TASK_MS and returns the worker's pid. */
FIBER_TASK(bench_scale_task)
{
    struct timespec req = {0, TASK_MS * 1000000L};
    while (nanosleep(&req, &req) != 0 && errno == EINTR)
        continue;
    int64_t pid = getpid();
    return fiber_buf_append(out, &pid, sizeof pid);
}

/* ---- limits ------------------------------------------------------------- */

static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t was = rl.rlim_cur;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            fprintf(stderr, PROG ": cannot raise RLIMIT_NOFILE from %llu: "
                    "%s\n", (unsigned long long)was, strerror(errno));
    }
    getrlimit(RLIMIT_NOFILE, &rl);
    printf(PROG ": descriptor limit (RLIMIT_NOFILE) soft %llu, hard %llu "
           "(was soft %llu)\n", (unsigned long long)rl.rlim_cur,
           (unsigned long long)rl.rlim_max, (unsigned long long)was);
}

/* Says which system limit a failure most likely hit. */
static void diagnose_limits(const char *err, long n)
{
    struct rlimit nofile, nproc;
    getrlimit(RLIMIT_NOFILE, &nofile);
    getrlimit(RLIMIT_NPROC, &nproc);
    long pid_max = bench_read_long_file("/proc/sys/kernel/pid_max");
    long threads = bench_read_long_file("/proc/sys/kernel/threads-max");
    fprintf(stderr,
            PROG ": limits: RLIMIT_NOFILE soft %llu hard %llu (open now: "
            "%ld); RLIMIT_NPROC soft %llu; kernel.pid_max %ld; "
            "kernel.threads-max %ld; workers wanted %ld\n",
            (unsigned long long)nofile.rlim_cur,
            (unsigned long long)nofile.rlim_max, bench_count_open_fds(),
            (unsigned long long)nproc.rlim_cur, pid_max, threads, n);
    if (strstr(err, "Too many open files") || strstr(err, "EMFILE"))
        fprintf(stderr, PROG ": LIMIT HIT: the master ran out of file "
                "descriptors (RLIMIT_NOFILE %llu; it needs about 2 per "
                "worker): raise the hard limit (ulimit -Hn) and run again\n",
                (unsigned long long)nofile.rlim_cur);
    else if (strstr(err, "Resource temporarily unavailable") ||
             strstr(err, "EAGAIN"))
        fprintf(stderr, PROG ": LIMIT HIT: no more processes could be "
                "created (RLIMIT_NPROC %llu, pid_max %ld): raise ulimit -u "
                "or kernel.pid_max\n", (unsigned long long)nproc.rlim_cur,
                pid_max);
    else if (strstr(err, "Cannot allocate memory") || strstr(err, "ENOMEM"))
        fprintf(stderr, PROG ": LIMIT HIT: out of memory starting workers\n");
    else if (strstr(err, "File table overflow") || strstr(err, "ENFILE"))
        fprintf(stderr, PROG ": LIMIT HIT: the system-wide file table is "
                "full (fs.file-max)\n");
}

/* ---- the machine's floor -------------------------------------------------- */

/* Forks n plain processes that each sleep TASKS_PER_WORKER times TASK_MS
 * once released, and times them from release until the last has exited
 * (seen as EOF on a pipe whose write end each holds).  Returns the
 * seconds, or -1; *runs_per_sleep gets how many times a process was put
 * on a CPU a sleep (its start and exit included). */
static double sleep_floor(long n, double *runs_per_sleep)
{
    int start[2], done[2];
    if (pipe2(start, O_CLOEXEC) != 0 || pipe2(done, O_CLOEXEC) != 0) {
        fprintf(stderr, PROG ": pipe: %s\n", strerror(errno));
        return -1;
    }
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    long made = 0;
    fflush(stdout);
    fflush(stderr);
    for (; pids && made < n; made++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, PROG ": fork (sleep floor, process %ld): %s\n",
                    made + 1, strerror(errno));
            break;
        }
        if (pid == 0) {
            char c;
            close(start[1]);
            close(done[0]);
            while (read(start[0], &c, 1) < 0 && errno == EINTR)
                continue;
            volatile int64_t mine = 0;
            for (int k = 0; k < TASKS_PER_WORKER; k++) {
                struct timespec req = {0, TASK_MS * 1000000L};
                while (nanosleep(&req, &req) != 0 && errno == EINTR)
                    continue;
                mine = getpid(); /* as the task does */
            }
            (void)mine;
            _exit(0);
        }
        pids[made] = pid;
    }
    close(start[0]);
    close(done[1]);
    struct timespec settle = {0, 300 * 1000000L}; /* all block in read */
    nanosleep(&settle, NULL);
    double t0 = bench_now_s();
    close(start[1]); /* EOF: every child starts sleeping */
    char c;
    for (;;) {
        ssize_t k = read(done[0], &c, 1);
        if (k == 0 || (k < 0 && errno != EINTR))
            break;
    }
    double t = bench_now_s() - t0;
    close(done[0]);
    /* Exited but not yet waited for, their schedstat is still there. */
    double runs = 0;
    long *lp = calloc((size_t)n, sizeof *lp);
    if (lp) {
        for (long i = 0; i < made; i++)
            lp[i] = pids[i];
        procs_cpu_s(lp, made, &runs);
        free(lp);
    }
    *runs_per_sleep = runs / ((double)n * TASKS_PER_WORKER);
    for (long i = 0; i < made; i++)
        waitpid(pids[i], NULL, 0);
    free(pids);
    return made == n ? t : -1;
}

/* The floor is run by a helper forked at the start, while this process
 * is still small: forked from the master after its run (three threads,
 * 18 MiB resident), the same 2,048 processes cost 15-30 % more CPU (their
 * fork copies the master's page tables), which would flatter fiber. */
struct floor_figures {
    double s, cpu_s, runs;
};
static int floor_cmd = -1, floor_ans = -1;

static void floor_helper_start(long n)
{
    int cmd[2], ans[2];
    if (pipe2(cmd, O_CLOEXEC) != 0 || pipe2(ans, O_CLOEXEC) != 0) {
        fprintf(stderr, PROG ": pipe: %s\n", strerror(errno));
        return;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, PROG ": fork (floor helper): %s\n", strerror(errno));
        return;
    }
    if (pid == 0) {
        close(cmd[1]);
        close(ans[0]);
        char c;
        while (read(cmd[0], &c, 1) == 1) {
            struct floor_figures f;
            double kids0 = children_cpu_s();
            f.s = sleep_floor(n, &f.runs);
            f.cpu_s = children_cpu_s() - kids0;
            if (write(ans[1], &f, sizeof f) != (ssize_t)sizeof f)
                _exit(1);
        }
        _exit(0);
    }
    close(cmd[0]);
    close(ans[1]);
    floor_cmd = cmd[1];
    floor_ans = ans[0];
}

/* The floor, timed by the helper and printed ("before" or "after" fiber's
 * run).  Returns its seconds, or -1. */
static double measure_floor(long n, const char *when)
{
    struct floor_figures f = {.s = -1};
    char c = 'f';
    if (floor_cmd < 0 || write(floor_cmd, &c, 1) != 1 ||
        read(floor_ans, &f, sizeof f) != (ssize_t)sizeof f || f.s < 0) {
        fprintf(stderr, PROG ": the sleep floor (%s) could not be measured\n",
                when);
        return -1;
    }
    printf("floor  (%s) %ld plain processes sleeping %d x %d ms: %.3f s "
           "(their CPU: %.3f s, %.1f us a sleep; put on a CPU %.2f times a "
           "sleep)\n", when, n, TASKS_PER_WORKER, TASK_MS, f.s, f.cpu_s,
           f.cpu_s * 1e6 / ((double)n * TASKS_PER_WORKER), f.runs);
    fflush(stdout);
    return f.s;
}

static void floor_helper_stop(void)
{
    if (floor_cmd < 0)
        return;
    close(floor_cmd); /* EOF: the helper exits */
    close(floor_ans);
    wait(NULL);
}

/* ---- fiber side ---------------------------------------------------------- */

/* Reads the initializer records: pids into pids[] (up to max) and the
 * latest timestamp.  Returns the number of records. */
static long read_records(const char *path, long *pids, long max,
                         uint64_t *latest)
{
    FILE *f = fopen(path, "r");
    long n = 0;
    *latest = 0;
    if (!f)
        return 0;
    char line[REC_LEN + 8];
    while (n < max && fgets(line, sizeof line, f)) {
        long pid;
        uint64_t ns;
        if (sscanf(line, "%ld %" SCNu64, &pid, &ns) != 2)
            continue;
        pids[n++] = pid;
        if (ns > *latest)
            *latest = ns;
    }
    fclose(f);
    return n;
}

static long file_records(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 ? (long)(st.st_size / REC_LEN) : 0;
}

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* How many tasks each worker ran: min, max and distinct workers. */
static void spread(const int64_t *pids, size_t n, struct result *r)
{
    long *v = malloc(n * sizeof *v);
    r->distinct = 0;
    r->ran_tasks_min = r->ran_tasks_max = 0;
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        v[i] = (long)pids[i];
    qsort(v, n, sizeof *v, cmp_long);
    long lo = -1, hi = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && v[j] == v[i])
            j++;
        long c = (long)(j - i);
        lo = lo < 0 || c < lo ? c : lo;
        hi = c > hi ? c : hi;
        r->distinct++;
        i = j;
    }
    r->ran_tasks_min = lo < 0 ? 0 : lo;
    r->ran_tasks_max = hi;
    free(v);
}

static int wait_connected(fiber_pool *pool, int fd, long n, long timeout_s,
                          uint64_t t0)
{
    double deadline = bench_now_s() + (double)timeout_s, next_note = 5;
    long have = 0;
    uint64_t lost_told = 0;
    while ((have = file_records(fd)) < n) {
        fiber_pool_stats st;
        fiber_pool_stats_get(pool, &st);
        double el = (double)(bench_now_ns() - t0) / 1e9;
        if (el >= next_note) {
            printf("  ... %.0f s: %ld of %ld workers connected (alive %d, "
                   "lost %llu)\n", el, have, n, st.workers_alive,
                   (unsigned long long)st.workers_lost);
            fflush(stdout);
            next_note += 5;
        }
        if (st.workers_lost > lost_told) {
            fprintf(stderr, PROG ": %llu workers lost while starting (the "
                    "pool replaces them)\n",
                    (unsigned long long)st.workers_lost);
            lost_told = st.workers_lost;
        }
        if (bench_now_s() > deadline) {
            fprintf(stderr, PROG ": only %ld of %ld workers connected "
                    "within %ld s (alive %d, started %llu, lost %llu)\n",
                    have, n, timeout_s, st.workers_alive,
                    (unsigned long long)st.workers_started,
                    (unsigned long long)st.workers_lost);
            diagnose_limits("", n);
            return -1;
        }
        struct timespec ts = {0, 2 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static int run_fiber(const struct options *o, struct result *r)
{
    long n = o->workers;
    char path[] = "/tmp/fiber-bench-scale-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        fprintf(stderr, PROG ": mkstemp: %s\n", strerror(errno));
        return -1;
    }
    size_t ntasks = (size_t)n * TASKS_PER_WORKER;
    uint64_t *in = calloc(ntasks, sizeof *in);
    int64_t *out = calloc(ntasks, sizeof *out);
    long *pids = calloc((size_t)n, sizeof *pids);
    int rc = in && out && pids ? 0 : -1;
    if (rc)
        fprintf(stderr, PROG ": out of memory\n");
    memset(r, 0, sizeof *r);
    r->workers = n;
    fiber_pool *pool = NULL;
    fiber_pool_opts po = {.workers = (int)n,
                          .initializer = "bench_scale_init",
                          .initarg = path,
                          .initarg_len = strlen(path)};
    double kids0 = children_cpu_s();
    uint64_t t0 = bench_now_ns();
    if (rc == 0 && fiber_pool_create(&pool, &po) != 0) {
        char err[1024];
        snprintf(err, sizeof err, "%s", fiber_last_error());
        fprintf(stderr, PROG ": fiber_pool_create(%ld workers): %s\n", n,
                err);
        diagnose_limits(err, n);
        rc = -1;
    }
    r->create_s = (double)(bench_now_ns() - t0) / 1e9;
    if (rc == 0) {
        printf("fiber  fiber_pool_create returned after %.3f s\n",
               r->create_s);
        fflush(stdout);
        rc = wait_connected(pool, fd, n, o->timeout_s, t0);
    }
    if (rc == 0) {
        uint64_t latest;
        long got = read_records(path, pids, n, &latest);
        r->connect_s = (double)(latest - t0) / 1e9;
        printf("fiber  %ld workers connected after %.3f s\n", got,
               r->connect_s);
        fflush(stdout);
        double runs0, runs1;
        double wcpu0 = procs_cpu_s(pids, got, &runs0);
        double t1 = bench_now_s(), cpu0 = self_cpu_s();
        int mrc = fiber_pool_map(pool, "bench_scale_task", in, sizeof *in,
                                 ntasks, out, sizeof *out,
                                 (size_t)o->chunksize);
        r->total_s = bench_now_s() - t1;
        r->master_cpu_s = self_cpu_s() - cpu0;
        r->map_workers_cpu_s = procs_cpu_s(pids, got, &runs1) - wcpu0;
        r->map_runs_per_task = (runs1 - runs0) / (double)ntasks;
        if (mrc != 0) {
            char err[1024];
            snprintf(err, sizeof err, "%s", fiber_last_error());
            fprintf(stderr, PROG ": map of %zu tasks: %s\n", ntasks, err);
            diagnose_limits(err, n);
            rc = -1;
        }
    }
    if (rc == 0) {
        spread(out, ntasks, r);
        int read = bench_sum_memory_kib(pids, (size_t)n, "VmRSS:",
                                        &r->rss_kib);
        bench_sum_memory_kib(pids, (size_t)n, "Pss:", &r->pss_kib);
        r->rss_kib /= (double)n;
        r->pss_kib /= (double)n;
        long self = getpid();
        bench_sum_memory_kib(&self, 1, "VmRSS:", &r->master_rss_kib);
        if (read != n)
            fprintf(stderr, PROG ": warning: read the memory of %d of %ld "
                    "workers\n", read, n);
        printf("fiber  %zu tasks of %d ms in %.3f s (ideal %.1f s); %ld "
               "workers ran %ld..%ld tasks each\n", ntasks, TASK_MS,
               r->total_s, TASKS_PER_WORKER * TASK_MS / 1000.0, r->distinct,
               r->ran_tasks_min, r->ran_tasks_max);
        printf("fiber  CPU during the map: master %.3f s (%.4f s per 1,000 "
               "tasks), workers %.3f s (%.1f us a task; put on a CPU %.2f "
               "times a task)\n", r->master_cpu_s,
               r->master_cpu_s * 1000.0 / (double)ntasks,
               r->map_workers_cpu_s, r->map_workers_cpu_s * 1e6 / ntasks,
               r->map_runs_per_task);
        printf("fiber  memory per worker: VmRSS %.0f KiB, Pss %.0f KiB; "
               "master VmRSS %.0f KiB\n", r->rss_kib, r->pss_kib,
               r->master_rss_kib);
        fflush(stdout);
    }
    double t2 = bench_now_s();
    fiber_pool_free(pool);
    r->free_s = bench_now_s() - t2;
    r->workers_cpu_s = children_cpu_s() - kids0;
    if (pool)
        printf("fiber  fiber_pool_free took %.3f s; the workers used %.3f "
               "CPU s in all\n", r->free_s, r->workers_cpu_s);
    close(fd);
    unlink(path);
    free(in);
    free(out);
    free(pids);
    return rc;
}

/* ---- the peer ------------------------------------------------------------ */

static int run_peer(const struct options *o, struct result *pr)
{
    char args[128], last[4096];
    snprintf(args, sizeof args, "--workers %ld --timeout %ld",
             o->peer_workers, o->timeout_s);
    if (bench_run_peer(PROG, "scale_peer.py", args, last, sizeof last))
        return -1;
    double w;
    memset(pr, 0, sizeof *pr);
    if (bench_json_number(last, "workers", &w) != 0) {
        fprintf(stderr, PROG ": peer: no number for \"workers\" in: %s",
                last);
        return -1;
    }
    pr->workers = (long)w;
    return bench_json_read(PROG, last, figure_keys, N_FIGURES, pr);
}

/* ---- main -------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--workers N] [--peer-workers N] [--timeout S] "
            "[--chunksize C] [--no-peer] [--help]\n"
            "A pool of N local workers: seconds until all are connected, "
            "seconds for\n100 tasks per worker that sleep 10 ms (ideal "
            "1.0 s), memory per worker.\n"
            "  --workers N       pool size (default %d)\n"
            "  --peer-workers N  pool size for Python (default: N)\n"
            "  --timeout S       give up connecting after S s (default 300)\n"
            "  --chunksize C     fiber's chunksize for the map (default 0: "
            "automatic)\n"
            "  --no-peer         skip Python multiprocessing "
            "(peer/scale_peer.py)\n"
            "The last line of output is one JSON object.\n",
            DEFAULT_WORKERS);
}

/* One table row; x = mp / fiber (every figure here is lower-is-better). */
static void row(const char *what, double f, double p, int have_peer)
{
    int prec = f >= 100 ? 0 : 3;
    printf("%-22s %12.*f", what, prec, f);
    if (have_peer)
        printf(" %12.*f %9.2fx\n", prec, p, p / f);
    else
        printf(" %12s %10s\n", "-", "-");
}

static void print_json(const struct options *o, const struct result *r,
                       const struct result *p, double floor_s,
                       double floor_before, double floor_after)
{
    bench_json_open(NULL);
    bench_json_long("workers", r->workers);
    bench_json_write(figure_keys, N_FIGURES, r);
    bench_json_num("free_s", 4, r->free_s);
    bench_json_num("master_rss_kib", 0, r->master_rss_kib);
    bench_json_long("tasks_per_worker_min", r->ran_tasks_min);
    bench_json_long("tasks_per_worker_max", r->ran_tasks_max);
    bench_json_long("workers_used", r->distinct);
    bench_json_num("sleep_floor_s", 4, floor_s);
    bench_json_num("sleep_floor_before_s", 4, floor_before);
    bench_json_num("sleep_floor_after_s", 4, floor_after);
    if (floor_s > 0)
        bench_json_num("total_over_floor", 3, r->total_s / floor_s);
    bench_json_num("master_cpu_s", 3, r->master_cpu_s);
    bench_json_num("workers_cpu_s", 3, r->workers_cpu_s);
    bench_json_num("map_workers_cpu_s", 3, r->map_workers_cpu_s);
    bench_json_num("map_runs_per_task", 3, r->map_runs_per_task);
    bench_json_num("master_cpu_s_per_1000_tasks", 5,
                   r->master_cpu_s * 1000.0 /
                       (double)(r->workers * TASKS_PER_WORKER));
    bench_json_long("chunksize", o->chunksize);
    if (bench_json_open_peer(p)) {
        bench_json_long("workers", p->workers);
        bench_json_write(figure_keys, N_FIGURES, p);
        bench_json_close();
    }
    bench_json_close();
}

int main(int argc, char **argv)
{
    if (bench_init(PROG, &argc, &argv) != 0)
        return 1;
    struct options o = {DEFAULT_WORKERS, 0, 300, 0, 0};
    const struct bench_flag flags[] = {
        {"--no-peer", .on = &o.no_peer},
        {"--workers", .value = &o.workers, .lo = 1, .hi = 65536},
        {"--peer-workers", .value = &o.peer_workers, .lo = 1, .hi = 65536},
        {"--chunksize", .value = &o.chunksize, .lo = 0, .hi = 1000000},
        {"--timeout", .value = &o.timeout_s, .lo = 1, .hi = 86400},
        {NULL},
    };
    int rc = bench_parse_args(PROG, argc, argv, flags);
    if (rc != 0)
        return bench_usage_exit(rc, usage);
    if (o.peer_workers == 0)
        o.peer_workers = o.workers;
    printf(PROG ": fiber %s, local backend, %ld workers, %d tasks of %d ms "
           "per worker\n", fiber_version(), o.workers, TASKS_PER_WORKER,
           TASK_MS);
    raise_nofile();
    /* The machine's speed drifts (this VM's floor has moved from 1.4 to
     * 2.2 s within minutes), so the floor is measured on both sides of
     * fiber's run and the ratio taken against their mean. */
    floor_helper_start(o.workers);
    double floor_before = measure_floor(o.workers, "before");
    struct result r, p;
    if (run_fiber(&o, &r) != 0) {
        fprintf(stderr, PROG ": FAILED\n");
        return 1;
    }
    double floor_after = measure_floor(o.workers, "after");
    floor_helper_stop();
    double floor_s = floor_before > 0 && floor_after > 0
                         ? (floor_before + floor_after) / 2
                         : -1;
    int have_peer = !o.no_peer && bench_peer_done(PROG, run_peer(&o, &p));
    if (have_peer && p.workers != r.workers)
        printf("\nNOTE: the peer ran %ld workers, fiber %ld: compare "
               "per-worker figures only\n", p.workers, r.workers);
    printf("\n%-22s %12s %12s %10s\n", "", "fiber", "mp", "x");
    if (have_peer)
        printf("%-22s %12ld %12ld\n", "workers", r.workers, p.workers);
    else
        printf("%-22s %12ld %12s\n", "workers", r.workers, "-");
    row("create (s)", r.create_s, p.create_s, have_peer);
    row("connect_s", r.connect_s, p.connect_s, have_peer);
    row("total_s (ideal 1.0)", r.total_s, p.total_s, have_peer);
    printf("%-22s %12.3f  (no framework: %ld plain processes; mean of "
           "%.3f before and %.3f after)\n", "sleep floor (s)", floor_s,
           o.workers, floor_before, floor_after);
    row("VmRSS/worker (KiB)", r.rss_kib, p.rss_kib, have_peer);
    row("Pss/worker (KiB)", r.pss_kib, p.pss_kib, have_peer);
    printf("(x = mp / fiber: above 1, fiber is faster or smaller; mp = "
           "Python multiprocessing.Pool)\n\n");
    print_json(&o, &r, have_peer ? &p : NULL, floor_s, floor_before,
               floor_after);
    return 0;
}
