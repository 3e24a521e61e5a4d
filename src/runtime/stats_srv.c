/*
 * stats_srv.c -- the master's side of `fiber top` (stats_srv.h): the
 * files that tell a monitor where the master is, the monitors'
 * connections, and the snapshot each STATS is answered with.
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "backend/backend.h"
#include "base/common.h"
#include "base/log.h"
#include "runtime/runtime.h"
#include "runtime/stats_srv.h"

/* At most this many monitors at once; more are refused. */
#define MAX_MONITORS 16
/* A monitor sends only STATS, which is empty. */
#define MONITOR_MAX_PAYLOAD 64u

struct fb_monitor {
    struct fb_conn conn;
    int want_out;
    struct fb_monitor *prev, *next;
};

static struct fb_monitor *monitors;
static int n_monitors;
static fb_monitor_pools_fn pools_fn;
static pthread_mutex_t pools_fn_mu = PTHREAD_MUTEX_INITIALIZER;

void fb_stats_set_pools(fb_monitor_pools_fn fn)
{
    pthread_mutex_lock(&pools_fn_mu);
    pools_fn = fn;
    pthread_mutex_unlock(&pools_fn_mu);
}

/* ---- published files -------------------------------------------------- */

/* Writes text to dir/name, mode 0600, through a temporary file renamed
 * into place, so a reader sees all of it or nothing. */
static int write_private(const char *dir, const char *name, const char *text)
{
    char path[700], tmp[720];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return fb_err_errno(FIBER_ESYS, "cannot create %s", tmp);
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        int rc = fb_err_errno(FIBER_ESYS, "cannot write %s", path);
        unlink(tmp);
        return rc;
    }
    return 0;
}

void fb_stats_publish(void)
{
    struct fb_runtime *R = fb_rt();
    if (!R->run_dir[0] || !R->address[0])
        return;
    char line[2 * FB_WIRE_TOKEN_LEN + 2];
    for (size_t i = 0; i < FB_WIRE_TOKEN_LEN; i++)
        snprintf(line + 2 * i, 3, "%02x", R->token[i]);
    strcat(line, "\n");
    char addr[sizeof R->address + 16];
    snprintf(addr, sizeof addr, "%s\n%s\n", R->address,
             fb_net_encrypts(R->address) ? "encrypted" : "plain");
    /* The token first: a monitor that finds the address finds it too. */
    int rc = write_private(R->run_dir, FB_MONITOR_TOKEN_FILE, line);
    if (rc == 0)
        rc = write_private(R->run_dir, FB_MONITOR_ADDR_FILE, addr);
    sodium_memzero(line, sizeof line);
    if (rc)
        fb_log_warn("fiber top will not find this run: %s",
                    fiber_last_error());
}

static void unpublish(void)
{
    struct fb_runtime *R = fb_rt();
    if (!R->run_dir[0])
        return;
    char path[700];
    snprintf(path, sizeof path, "%s/%s", R->run_dir, FB_MONITOR_ADDR_FILE);
    unlink(path);
    snprintf(path, sizeof path, "%s/%s", R->run_dir, FB_MONITOR_TOKEN_FILE);
    unlink(path);
}

/* ---- the snapshot ----------------------------------------------------- */

/* The process's age, from its start time in /proc/self/stat (clock ticks
 * since boot) and /proc/uptime. */
static uint64_t uptime_ms(void)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "re");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command may hold anything */
    unsigned long long start = 0;
    if (!p || sscanf(p + 1,
                     " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u "
                     "%*d %*d %*d %*d %*d %*d %llu",
                     &start) != 1)
        return 0;
    double up = 0;
    f = fopen("/proc/uptime", "re");
    if (!f)
        return 0;
    if (fscanf(f, "%lf", &up) != 1)
        up = 0;
    fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    double age = up - (double)start / (double)(hz > 0 ? hz : 100);
    return age > 0 ? (uint64_t)(age * 1000.0) : 0;
}

/* Resident memory, from /proc/self/statm (its second field, in pages). */
static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "re");
    unsigned long long size = 0, resident = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%llu %llu", &size, &resident) != 2)
        resident = 0;
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return resident * (uint64_t)(page > 0 ? page : 4096);
}

static uint64_t tv_us(struct timeval tv)
{
    return (uint64_t)tv.tv_sec * 1000000u + (uint64_t)tv.tv_usec;
}

/* The pools' rows, as names and counters; called without the runtime
 * lock. */
static size_t collect_pools(struct fb_monitor_pool *rows, size_t max)
{
    pthread_mutex_lock(&pools_fn_mu);
    fb_monitor_pools_fn fn = pools_fn;
    pthread_mutex_unlock(&pools_fn_mu);
    return fn ? fn(rows, max) : 0;
}

static void to_wire(const struct fb_monitor_pool *row,
                    struct fb_msg_snapshot_pool *w)
{
    const fiber_pool_stats *s = &row->st;
    int starting = s->workers_starting;
    if (starting > s->workers_alive)
        starting = s->workers_alive;
    *w = (struct fb_msg_snapshot_pool){
        .name = row->name,
        .name_len = (uint8_t)strlen(row->name),
        .workers_alive = (uint32_t)(s->workers_alive > 0 ? s->workers_alive
                                                         : 0),
        .workers_starting = (uint32_t)(starting > 0 ? starting : 0),
        .workers_target = (uint32_t)(s->workers_target > 0
                                         ? s->workers_target
                                         : 0),
        .workers_started = s->workers_started,
        .workers_lost = s->workers_lost,
        .tasks_submitted = s->tasks_submitted,
        .tasks_done = s->tasks_done,
        .tasks_failed = s->tasks_failed,
        .tasks_retried = s->tasks_retried,
        .tasks_crashed = s->tasks_crashed,
        .tasks_queued = s->tasks_queued,
        .tasks_in_flight = s->tasks_in_flight};
}

/* Appends the answer to STATS request id to out.  Releases the runtime
 * lock while it reads the pools (see stats_srv.h). */
static int put_snapshot(fiber_buf *out, uint64_t id)
{
    struct fb_runtime *R = fb_rt();
    const char *backend = R->backend ? R->backend->ops->name : "none";
    struct fb_msg_snapshot m = {.pid = (uint32_t)getpid(),
                                .backend = backend,
                                .backend_len = (uint8_t)strlen(backend)};
    size_t max = FB_WIRE_SNAPSHOT_POOLS_MAX;
    struct fb_monitor_pool *rows = calloc(max, sizeof *rows);
    struct fb_msg_snapshot_pool *wire = calloc(max, sizeof *wire);
    int rc = rows && wire ? 0 : FIBER_ENOMEM;
    size_t n = 0;
    fb_rt_unlock();
    if (rc == 0)
        n = collect_pools(rows, max);
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        m.cpu_user_us = tv_us(ru.ru_utime);
        m.cpu_sys_us = tv_us(ru.ru_stime);
    }
    m.rss_bytes = rss_bytes();
    m.uptime_ms = uptime_ms();
    fb_rt_lock();
    for (size_t i = 0; i < n; i++)
        to_wire(&rows[i], &wire[i]);
    if (rc == 0)
        rc = fb_wire_put_snapshot(out, id, &m, wire, n);
    free(rows);
    free(wire);
    return rc;
}

/* ---- monitors --------------------------------------------------------- */

static void monitor_drop(struct fb_monitor *m, const char *why)
{
    struct fb_runtime *R = fb_rt();
    fb_log_debug("monitor on fd %d closed: %s", fb_conn_fd(&m->conn), why);
    if (R->epoll_fd >= 0)
        epoll_ctl(R->epoll_fd, EPOLL_CTL_DEL, fb_conn_fd(&m->conn), NULL);
    if (m->prev)
        m->prev->next = m->next;
    else
        monitors = m->next;
    if (m->next)
        m->next->prev = m->prev;
    n_monitors--;
    fb_conn_close(&m->conn);
    free(m);
}

static void monitor_arm(struct fb_monitor *m, int want_out)
{
    if (m->want_out == want_out)
        return;
    m->want_out = want_out;
    struct epoll_event ev = {
        .events = EPOLLIN | (want_out ? EPOLLOUT : 0),
        .data.u64 = (uint64_t)(uintptr_t)m | FB_EV_MONITOR};
    epoll_ctl(fb_rt()->epoll_fd, EPOLL_CTL_MOD, fb_conn_fd(&m->conn), &ev);
}

/* Sends what is queued; returns -1 after dropping m. */
static int monitor_flush(struct fb_monitor *m)
{
    int rc = fb_conn_flush(&m->conn);
    if (rc < 0) {
        monitor_drop(m, fb_conn_err(&m->conn));
        return -1;
    }
    monitor_arm(m, rc == 1);
    return 0;
}

void fb_stats_adopt(struct fb_conn *conn)
{
    struct fb_runtime *R = fb_rt();
    struct fb_monitor *m = n_monitors < MAX_MONITORS ? calloc(1, sizeof *m)
                                                     : NULL;
    if (!m) {
        static const char why[] = "too many monitors are watching this run";
        fb_log_warn("refusing a monitor: %s (%d)", why, n_monitors);
        if (fb_wire_put_reject(fb_conn_out(conn), why, sizeof why - 1) == 0)
            fb_conn_flush(conn);
        epoll_ctl(R->epoll_fd, EPOLL_CTL_DEL, fb_conn_fd(conn), NULL);
        fb_conn_close(conn);
        return;
    }
    m->conn = *conn;
    fb_conn_set_max_payload(&m->conn, MONITOR_MAX_PAYLOAD);
    m->want_out = -1;
    m->next = monitors;
    if (monitors)
        monitors->prev = m;
    monitors = m;
    n_monitors++;
    fb_log_info("a monitor (fiber top) is watching this run");
    struct fb_msg_welcome w = {.heartbeat_ms = (uint32_t)R->cfg.heartbeat_ms};
    if (fb_wire_put_welcome(fb_conn_out(&m->conn), &w) != 0) {
        monitor_drop(m, "out of memory");
        return;
    }
    /* A STATS sent right behind HELLO is already in the buffer. */
    if (monitor_flush(m) == 0 && fb_conn_buffered(&m->conn) > 0)
        fb_stats_on_event(m, EPOLLIN);
}

void fb_stats_on_event(void *ptr, unsigned events)
{
    struct fb_monitor *m = ptr;
    if ((events & EPOLLOUT) && monitor_flush(m) != 0)
        return;
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        return;
    int rc = fb_conn_read(&m->conn);
    struct fb_wire_hdr h;
    const uint8_t *payload;
    int got;
    while ((got = fb_conn_next(&m->conn, &h, &payload)) == 1) {
        if (h.type != FB_MSG_STATS) {
            fb_log_warn("monitor on fd %d sent %s, not STATS; dropping it",
                        fb_conn_fd(&m->conn), fb_msg_type_name(h.type));
            monitor_drop(m, "protocol violation");
            return;
        }
        if (put_snapshot(fb_conn_out(&m->conn), h.id) != 0) {
            monitor_drop(m, fiber_last_error());
            return;
        }
    }
    if (got < 0) {
        monitor_drop(m, fb_conn_err(&m->conn));
        return;
    }
    if (rc != 0) {
        monitor_drop(m, fb_conn_err(&m->conn));
        return;
    }
    monitor_flush(m);
}

void fb_stats_stop(void)
{
    while (monitors)
        monitor_drop(monitors, "the master is stopping");
    unpublish();
}
