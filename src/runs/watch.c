/*
 * watch.c -- watching a live run: fiber_run_watch_open / _read / _close
 * (what `fiber top` is built on).  The master's side is
 * runtime/stats_srv.c; the messages are STATS and SNAPSHOT (wire.h).
 *
 * Finding the master: its run directory holds master.addr and
 * master.token (stats_srv.h), written by the master itself, readable by
 * this user only.  A run with no run directory here may have its master
 * where a backend's engine knows it (a Kubernetes run: its job pods'
 * environment gives the address and its Secret the token): the backends'
 * contact ops are asked (backend/runops.h).  The connection is a job's:
 * dial, encrypt over TCP (net/secure.c, keyed with the token), HELLO with
 * the token and job id 0, WELCOME.  Then one STATS, one SNAPSHOT per
 * read.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "backend/runops.h"
#include "base/common.h"
#include "net/net.h"
#include "runtime/runid.h"
#include "runtime/runtime.h"
#include "runtime/stats_srv.h"
#include "wire/wire.h"

#define WATCH_MAGIC 0x57415443u /* "WATC" */
#define DEFAULT_TIMEOUT_MS 10000
/* A snapshot of FB_WIRE_SNAPSHOT_POOLS_MAX pools is under 40 KiB. */
#define WATCH_MAX_PAYLOAD (256u * 1024u)

struct fiber_run_watch {
    uint32_t magic;
    struct fb_conn conn;
    uint64_t next_id;
    char run[64];
};

/* Reads dir/name (at most size - 1 bytes) into out, cut at its first
 * newline; the second line goes to rest (may be NULL).  Returns 0, or -1
 * with errno set. */
static int read_line(const char *dir, const char *name, char *out,
                     size_t size, char *rest, size_t rest_size)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, out, size - 1);
    int saved = errno;
    close(fd);
    if (n < 0) {
        errno = saved;
        return -1;
    }
    out[n] = '\0';
    char *nl = strchr(out, '\n');
    if (nl) {
        *nl = '\0';
        if (rest)
            snprintf(rest, rest_size, "%.*s", (int)strcspn(nl + 1, "\n"),
                     nl + 1);
    } else if (rest) {
        rest[0] = '\0';
    }
    return 0;
}

static int hex_token(const char *hex, uint8_t token[FB_WIRE_TOKEN_LEN])
{
    size_t bin_len = 0;
    if (strlen(hex) != 2 * FB_WIRE_TOKEN_LEN ||
        sodium_hex2bin(token, FB_WIRE_TOKEN_LEN, hex, strlen(hex), NULL,
                       &bin_len, NULL) != 0 ||
        bin_len != FB_WIRE_TOKEN_LEN)
        return -1;
    return 0;
}

/* A run without a run directory here may have its master where a
 * backend's engine knows it (a Kubernetes pod): each backend with a
 * contact op is asked (backend/runops.h).  Returns 0 (found), 1 (no
 * backend is configured to know), or the error. */
static int remote_locate(const char *run, char *addr, size_t addr_size,
                         int *encrypted, uint8_t token[FB_WIRE_TOKEN_LEN])
{
    const struct fb_run_ops *ops;
    for (size_t i = 0; (ops = fb_run_ops_at(i)) != NULL; i++) {
        if (!ops->contact)
            continue;
        int rc = ops->contact(run, addr, addr_size, encrypted, token,
                              FB_WIRE_TOKEN_LEN);
        if (rc == 1)
            continue;
        if (rc)
            return fb_err(rc, "no run '%s' on this host, and %s: %s", run,
                          ops->contact_where, fiber_last_error());
        return 0;
    }
    return 1;
}

/* The run ops of the backend named name, or NULL (no message set). */
static const struct fb_run_ops *ops_named(const char *name)
{
    const struct fb_run_ops *ops;
    for (size_t i = 0; (ops = fb_run_ops_at(i)) != NULL; i++)
        if (strcmp(ops->name, name) == 0)
            return ops;
    return NULL;
}

/* Why a run without a run directory here cannot be watched. */
static int no_run_dir(const char *run)
{
    fiber_run_list l = {0};
    int rc = fiber_runs_list(run, &l);
    const struct fb_run_ops *remote =
        rc == 0 && l.n == 1 ? ops_named(l.runs[0].backend) : NULL;
    const char *missing = remote ? remote->contact_missing : NULL;
    int found = rc == 0 && l.n > 0;
    fiber_run_list_free(&l);
    if (missing)
        return fb_err(FIBER_ENOTSUP, "run '%s' %s", run, missing);
    if (found)
        return fb_err(FIBER_ESTATE,
                      "run '%s' has no run directory on this host, so its "
                      "master cannot be watched from here",
                      run);
    return fb_err(FIBER_ENOKEY,
                  "no run '%s' on this host ('fiber ps' lists the runs)",
                  run);
}

/* Finds the master's address and the token in the run's directory. */
static int locate(const char *run, char *addr, size_t addr_size,
                  int *encrypted, uint8_t token[FB_WIRE_TOKEN_LEN])
{
    if (!fb_run_id_valid(run))
        return fb_err(FIBER_EINVAL,
                      "'%s' is not a run id (1..%d of [A-Za-z0-9_.-], not "
                      "starting with '.')",
                      run ? run : "(null)", FB_RUN_ID_MAX);
    char dir[600], hex[2 * FB_WIRE_TOKEN_LEN + 8];
    int rc = fb_run_dir(run, dir, sizeof dir);
    if (rc)
        return rc;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        rc = remote_locate(run, addr, addr_size, encrypted, token);
        return rc == 1 ? no_run_dir(run) : rc;
    }
    char mode[32];
    if (read_line(dir, FB_MONITOR_ADDR_FILE, addr, addr_size, mode,
                  sizeof mode) != 0) {
        if (errno != ENOENT)
            return fb_err_errno(FIBER_ESYS, "cannot read %s/%s", dir,
                                FB_MONITOR_ADDR_FILE);
        return fb_err(FIBER_ESTATE,
                      "run '%s' has no live master to watch: %s/%s is "
                      "absent (the master has ended, or has not started a "
                      "job yet)",
                      run, dir, FB_MONITOR_ADDR_FILE);
    }
    *encrypted = strcmp(mode, "encrypted") == 0;
    if (!*encrypted && strcmp(mode, "plain") != 0)
        return fb_err(FIBER_EPROTO,
                      "%s/%s says neither encrypted nor plain on its second "
                      "line",
                      dir, FB_MONITOR_ADDR_FILE);
    if (read_line(dir, FB_MONITOR_TOKEN_FILE, hex, sizeof hex, NULL, 0) != 0)
        return fb_err_errno(errno == ENOENT ? FIBER_ESTATE : FIBER_ESYS,
                            "cannot read the run's token in %s/%s", dir,
                            FB_MONITOR_TOKEN_FILE);
    rc = hex_token(hex, token);
    sodium_memzero(hex, sizeof hex);
    if (rc)
        return fb_err(FIBER_EPROTO,
                      "%s/%s does not hold a token (64 hex digits)", dir,
                      FB_MONITOR_TOKEN_FILE);
    return 0;
}

/* HELLO with the token, then WELCOME or REJECT. */
static int handshake(struct fiber_run_watch *w, const char *addr,
                     int encrypted, const uint8_t token[FB_WIRE_TOKEN_LEN],
                     uint64_t deadline)
{
    struct fb_conn *c = &w->conn;
    char build_id[FB_WIRE_BUILD_ID_MAX + 1];
    if (fb_build_id(build_id, sizeof build_id) != 0 || !build_id[0])
        fb_strlcpy(build_id, "0", sizeof build_id);
    static const char name[] = "fiber-top";
    struct fb_msg_hello h = {.build_id = build_id,
                             .build_id_len = (uint8_t)strlen(build_id),
                             .job_id = FB_MONITOR_JOB_ID,
                             .pid = (uint32_t)getpid(),
                             .name = name,
                             .name_len = (uint8_t)(sizeof name - 1)};
    memcpy(h.token, token, sizeof h.token);
    int rc = encrypted ? fb_conn_secure(c, FB_SEC_CLIENT, token) : 0;
    if (rc == 0)
        rc = fb_wire_put_hello(fb_conn_out(c), &h);
    sodium_memzero(h.token, sizeof h.token);
    if (rc == 0 && fb_conn_flush_wait(c, deadline) != 0)
        return fb_err(FIBER_EUNREACHABLE,
                      "cannot send HELLO to the master of run '%s' at %s: %s",
                      w->run, addr, fb_conn_err(c));
    if (rc)
        return rc;
    struct fb_wire_hdr hdr;
    const uint8_t *p;
    rc = fb_conn_recv_wait(c, &hdr, &p, deadline);
    if (rc == FIBER_ETIMEDOUT)
        return fb_err(FIBER_ETIMEDOUT,
                      "the master of run '%s' did not answer HELLO in time",
                      w->run);
    if (rc != 1)
        return fb_err(FIBER_EAUTH,
                      "the master of run '%s' closed the connection instead "
                      "of accepting it (%s): is master.token this run's?",
                      w->run, fb_conn_err_or(c, "no reason given"));
    if (hdr.type == FB_MSG_REJECT) {
        struct fb_msg_text t = {0};
        fb_wire_get_text(p, hdr.len, &t, NULL, 0);
        return fb_err(FIBER_EAUTH, "the master of run '%s' refused us: %.*s",
                      w->run, (int)t.len, t.text ? t.text : "");
    }
    struct fb_msg_welcome wel;
    if (hdr.type != FB_MSG_WELCOME ||
        fb_wire_get_welcome(p, hdr.len, &wel, NULL, 0) != 0)
        return fb_err(FIBER_EPROTO, "the master of run '%s' answered HELLO "
                      "with %s, not WELCOME", w->run,
                      fb_msg_type_name(hdr.type));
    return 0;
}

FIBER_API int fiber_run_watch_open(fiber_run_watch **out, const char *run,
                                   int timeout_ms)
{
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_run_watch_open: out is NULL");
    *out = NULL;
    char addr[600];
    uint8_t token[FB_WIRE_TOKEN_LEN];
    int encrypted = 0;
    int rc = locate(run, addr, sizeof addr, &encrypted, token);
    if (rc)
        return rc;
    struct fiber_run_watch *w = calloc(1, sizeof *w);
    if (!w) {
        sodium_memzero(token, sizeof token);
        return fb_err(FIBER_ENOMEM, "out of memory");
    }
    w->magic = WATCH_MAGIC;
    fb_strlcpy(w->run, run, sizeof w->run);
    uint64_t deadline =
        fb_deadline_ms(timeout_ms < 0 ? DEFAULT_TIMEOUT_MS : timeout_ms);
    int fd;
    rc = fb_sock_dial(addr, deadline, &fd);
    if (rc)
        rc = fb_err(rc, "the master of run '%s' does not answer at %s (%s): "
                    "has it ended?",
                    run, addr, fiber_last_error());
    if (rc == 0) {
        fb_conn_init(&w->conn, fd, WATCH_MAX_PAYLOAD);
        rc = handshake(w, addr, encrypted, token, deadline);
    }
    sodium_memzero(token, sizeof token);
    if (rc) {
        fiber_run_watch_close(w);
        return rc;
    }
    *out = w;
    return 0;
}

static int fill(fiber_run_stats *out, const struct fb_msg_snapshot *m)
{
    fiber_run_stats s = {.pid = (long)m->pid,
                         .uptime_ms = m->uptime_ms,
                         .cpu_user_us = m->cpu_user_us,
                         .cpu_sys_us = m->cpu_sys_us,
                         .rss_bytes = m->rss_bytes,
                         .n_pools = m->n_pools};
    snprintf(s.backend, sizeof s.backend, "%.*s", (int)m->backend_len,
             m->backend);
    if (m->n_pools) {
        s.pools = calloc(m->n_pools, sizeof *s.pools);
        if (!s.pools)
            return fb_err(FIBER_ENOMEM, "out of memory");
    }
    const uint8_t *cur = m->pools;
    for (uint32_t i = 0; i < m->n_pools; i++) {
        struct fb_msg_snapshot_pool p;
        fb_wire_snapshot_next(&cur, &p);
        fiber_pool_row *r = &s.pools[i];
        snprintf(r->name, sizeof r->name, "%.*s", (int)p.name_len, p.name);
        r->st = (fiber_pool_stats){
            .tasks_submitted = p.tasks_submitted,
            .tasks_done = p.tasks_done,
            .tasks_failed = p.tasks_failed,
            .tasks_retried = p.tasks_retried,
            .tasks_crashed = p.tasks_crashed,
            .workers_started = p.workers_started,
            .workers_lost = p.workers_lost,
            .workers_alive = p.workers_alive > INT32_MAX ? INT32_MAX
                                                         : (int)p.workers_alive,
            .workers_target = p.workers_target > INT32_MAX
                                  ? INT32_MAX
                                  : (int)p.workers_target,
            .tasks_queued = (size_t)p.tasks_queued,
            .tasks_in_flight = (size_t)p.tasks_in_flight,
            .workers_starting = p.workers_starting > INT32_MAX
                                    ? INT32_MAX
                                    : (int)p.workers_starting};
    }
    *out = s;
    return 0;
}

FIBER_API int fiber_run_watch_read(fiber_run_watch *w, fiber_run_stats *out,
                                   int timeout_ms)
{
    if (!w || w->magic != WATCH_MAGIC)
        return fb_err(FIBER_EINVAL, "not a valid fiber_run_watch handle");
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_run_watch_read: out is NULL");
    fiber_run_stats_free(out);
    uint64_t deadline =
        fb_deadline_ms(timeout_ms < 0 ? DEFAULT_TIMEOUT_MS : timeout_ms);
    uint64_t id = ++w->next_id;
    int rc = fb_wire_put_empty(fb_conn_out(&w->conn), FB_MSG_STATS, id);
    if (rc == 0 && fb_conn_flush_wait(&w->conn, deadline) != 0)
        return fb_err(FIBER_ECLOSED, "the master of run '%s' went away (%s)",
                      w->run, fb_conn_err(&w->conn));
    for (; rc == 0;) {
        struct fb_wire_hdr h;
        const uint8_t *p;
        int got = fb_conn_recv_wait(&w->conn, &h, &p, deadline);
        if (got == FIBER_ETIMEDOUT)
            return fb_err(FIBER_ETIMEDOUT,
                          "the master of run '%s' sent no snapshot in time",
                          w->run);
        if (got == FIBER_EPROTO)
            return fb_err(FIBER_EPROTO, "the master of run '%s': %s", w->run,
                          fb_conn_err(&w->conn));
        if (got != 1)
            return fb_err(FIBER_ECLOSED,
                          "the master of run '%s' went away (%s)", w->run,
                          fb_conn_err_or(&w->conn, "closed"));
        if (h.type != FB_MSG_SNAPSHOT || h.id != id)
            continue; /* an answer to an earlier request that timed out */
        struct fb_msg_snapshot m;
        char why[256];
        rc = fb_wire_get_snapshot(p, h.len, &m, why, sizeof why);
        if (rc)
            return fb_err(FIBER_EPROTO, "the master of run '%s': %s", w->run,
                          why);
        return fill(out, &m);
    }
    return rc;
}

FIBER_API void fiber_run_stats_free(fiber_run_stats *s)
{
    if (!s)
        return;
    free(s->pools);
    memset(s, 0, sizeof *s);
}

FIBER_API void fiber_run_watch_close(fiber_run_watch *w)
{
    if (!w || w->magic != WATCH_MAGIC)
        return;
    w->magic = 0;
    fb_conn_close(&w->conn);
    free(w);
}
