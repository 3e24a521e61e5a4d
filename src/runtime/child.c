/*
 * child.c -- the child role: what fiber_init() does in a job a backend
 * started.  It never returns.
 *
 * 1. Read the bootstrap: the master's address, the job id and name from
 *    FIBER_BOOT_* variables; the run's token from the secret descriptor
 *    (local backend) or a file only this user can read (cluster backends).
 * 2. Dial the master (over TCP with `encryption` on, the connection is
 *    encrypted with the token as its key: net/secure.c) and send HELLO;
 *    wait for WELCOME (or REJECT: log why, exit FB_EXIT_REJECTED).
 * 3. Start the watchdog thread, then receive the assignment and run it.
 *
 * The watchdog is the one thread a child adds.  It waits for the master's
 * end of the connection to close and then ends the process at once
 * (_exit(FB_EXIT_MASTER_LOST)), so a child never outlives its master,
 * whatever its task is doing.  It stops only with the process.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/thread.h"
#include "runtime/child.h"
#include "runtime/hooks.h"
#include "runtime/runid.h"
#include "runtime/runtime.h"
#include "runtime/task.h"

extern char **environ;

struct boot {
    const char *addr;
    uint64_t job_id;
    char name[FB_WIRE_NAME_MAX + 1];
    uint8_t token[FB_WIRE_TOKEN_LEN];
};

#define die fb_child_die

void fb_child_die(int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fiber_log(FIBER_LOG_ERROR, "%s", msg);
    _exit(code);
}

static int read_full(int fd, uint8_t *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r > 0)
            got += (size_t)r;
        else if (r < 0 && errno == EINTR)
            continue;
        else
            return -1;
    }
    return 0;
}

static void read_secret(struct boot *b)
{
    const char *fd_s = getenv(FB_ENV_SECRET_FD);
    const char *file = getenv(FB_ENV_SECRET_FILE);
    int fd = -1;
    if (fd_s)
        fd = atoi(fd_s);
    else if (file)
        fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        die(FB_EXIT_BOOT, "no readable bootstrap secret (FIBER_BOOT_SECRET_FD "
                          "or FIBER_BOOT_SECRET_FILE)");
    if (read_full(fd, b->token, sizeof b->token) != 0)
        die(FB_EXIT_BOOT, "bootstrap secret is shorter than %u bytes",
            FB_WIRE_TOKEN_LEN);
    close(fd);
}

/* Reads the bootstrap and removes it from the environment, so that the
 * task and anything it starts do not mistake themselves for fiber jobs. */
static void read_boot(struct boot *b)
{
    static char addr[600];
    const char *a = getenv(FB_ENV_ADDR);
    const char *job = getenv("FIBER_BOOT_JOB");
    const char *name = getenv(FB_ENV_NAME);
    if (!a || !job || !name)
        die(FB_EXIT_BOOT, "incomplete bootstrap environment");
    fb_strlcpy(addr, a, sizeof addr);
    b->addr = addr;
    b->job_id = strtoull(job, NULL, 10);
    fb_strlcpy(b->name, name, sizeof b->name);
    read_secret(b);
    const char *run = getenv(FB_ENV_RUN);
    if (run)
        fb_strlcpy(fb_rt()->run_id, run, sizeof fb_rt()->run_id);
    fb_rt_api()->objects_master(getenv("FIBER_BOOT_OBJECTS"));
    unsetenv("FIBER_BOOT_OBJECTS");
    unsetenv(FB_ENV_ADDR);
    unsetenv("FIBER_BOOT_JOB");
    unsetenv(FB_ENV_NAME);
    unsetenv(FB_ENV_RUN);
    unsetenv(FB_ENV_SECRET_FD);
    unsetenv(FB_ENV_SECRET_FILE);
}

static void setup_config_and_log(struct fb_runtime *rt, const struct boot *b)
{
    fb_config_defaults(&rt->cfg);
    int rc = fb_config_load_env(&rt->cfg, environ);
    fb_rt_config_changed();
    fb_log_setup(rt->cfg.log_level, b->name);
    /* log_file arrives absolute (the master resolved it). */
    if (rt->cfg.log_file[0]) {
        if (fb_log_to_prefix(rt->cfg.log_file, b->name, 0) != 0)
            fb_log_warn("logging to stderr: %s", fiber_last_error());
    } else if (rt->cfg.log_dir[0] &&
               fb_log_to_dir(rt->cfg.log_dir, b->name) != 0) {
        fb_log_warn("logging to stderr: %s", fiber_last_error());
    }
    if (rc)
        die(FB_EXIT_BOOT, "bad configuration from the master: %s",
            fiber_last_error());
}

/* Dials the master and proves who we are; returns the heartbeat interval
 * the master asked for.  A master over max_pending_connections closes
 * the connection that has waited longest: a connection cut before the
 * answer is dialed again while connect_timeout_ms allows (fb_dial_again). */
static uint32_t handshake(struct fb_runtime *rt, const struct boot *b,
                          struct fb_conn *c)
{
    uint64_t deadline = fb_deadline_ms(rt->cfg.connect_timeout_ms);
    unsigned attempt = 0;
    struct fb_wire_hdr hdr;
    const uint8_t *p;
    for (;;) {
        int fd;
        if (fb_sock_dial(b->addr, deadline, &fd) != 0)
            die(FB_EXIT_UNREACHABLE, "cannot reach the master: %s",
                fiber_last_error());
        fb_conn_init(c, fd, rt->cfg.max_message_bytes);
        if (fb_conn_secure_for(c, b->addr, FB_SEC_CLIENT, b->token) != 0)
            die(FB_EXIT_UNREACHABLE, "cannot encrypt the connection to the "
                                     "master: %s", fiber_last_error());
        struct fb_msg_hello h = {.build_id = rt->build_id,
                                 .build_id_len = (uint8_t)strlen(rt->build_id),
                                 .job_id = b->job_id,
                                 .pid = (uint32_t)getpid(),
                                 .name = b->name,
                                 .name_len = (uint8_t)strlen(b->name)};
        memcpy(h.token, b->token, sizeof h.token);
        if (fb_wire_put_hello(fb_conn_out(c), &h) != 0)
            die(FB_EXIT_UNREACHABLE, "cannot send HELLO: %s", fb_conn_err(c));
        int sent = fb_conn_flush_wait(c, deadline);
        int rc = sent == 0 ? fb_conn_recv_wait(c, &hdr, &p, deadline) : sent;
        if (rc == 1)
            break;
        if (rc == FIBER_ECLOSED && fb_dial_again(&attempt, deadline)) {
            fb_log_info("the master cut the handshake (%s); dialing again",
                        fb_conn_err(c));
            fb_conn_close(c);
            continue;
        }
        if (sent != 0)
            die(FB_EXIT_UNREACHABLE, "cannot send HELLO: %s", fb_conn_err(c));
        die(FB_EXIT_REJECTED, "no WELCOME from the master: %s", fb_conn_err(c));
    }
    if (hdr.type == FB_MSG_REJECT) {
        struct fb_msg_text t;
        fb_wire_get_text(p, hdr.len, &t, NULL, 0);
        die(FB_EXIT_REJECTED, "the master refused this job: %.*s",
            (int)t.len, t.text);
    }
    if (hdr.type != FB_MSG_WELCOME)
        die(FB_EXIT_PROTO, "expected WELCOME, got %s",
            fb_msg_type_name(hdr.type));
    struct fb_msg_welcome w;
    fb_wire_get_welcome(p, hdr.len, &w, NULL, 0);
    return w.heartbeat_ms;
}

/* Sends one heartbeat unless output is already pending (which tells the
 * master as much). */
static void send_heartbeat(struct fb_child *ch)
{
    pthread_mutex_lock(&ch->write_mu);
    if (fb_conn_unsent(&ch->conn) == 0 &&
        fb_wire_put_empty(fb_conn_out(&ch->conn), FB_MSG_HEARTBEAT, 0) == 0)
        fb_conn_flush(&ch->conn);
    pthread_mutex_unlock(&ch->write_mu);
}

static void *watchdog(void *arg)
{
    struct fb_child *ch = arg;
    struct pollfd p = {.fd = fb_conn_fd(&ch->conn), .events = POLLRDHUP};
    int timeout = ch->heartbeat_ms ? (int)ch->heartbeat_ms : -1;
    for (;;) {
        int n = poll(&p, 1, timeout);
        if (n > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            die(FB_EXIT_MASTER_LOST, "lost the connection to the master; "
                                     "exiting");
        if (n < 0 && errno != EINTR)
            die(FB_EXIT_MASTER_LOST, "watchdog poll failed: %s",
                strerror(errno));
        if (n == 0)
            send_heartbeat(ch);
    }
    return NULL;
}

static void start_watchdog(struct fb_child *ch)
{
    pthread_t t;
    if (fb_thread_start(&t, watchdog, ch, "the watchdog thread") != 0)
        die(FB_EXIT_BOOT, "%s", fiber_last_error());
    pthread_detach(t);
}

/* Runs a process target and reports its return value. */
static void run_process(struct fb_child *ch, const struct fb_wire_hdr *hdr,
                        const uint8_t *p)
{
    struct fb_conn *c = &ch->conn;
    struct fb_msg_run m;
    fb_wire_get_run(p, hdr->len, &m, NULL, 0);
    char task[FB_WIRE_NAME_MAX + 1];
    memcpy(task, m.task, m.task_len);
    task[m.task_len] = '\0';
    fiber_task_fn fn;
    if (fiber_task_lookup(task, &fn) != 0) {
        const char *why = fiber_last_error();
        pthread_mutex_lock(&ch->write_mu);
        fb_wire_put_exit(fb_conn_out(c), FB_EXIT_NOTASK, why, strlen(why));
        fb_conn_flush_wait(c, fb_deadline_ms(5000));
        pthread_mutex_unlock(&ch->write_mu);
        die(FB_EXIT_NOTASK, "%s", why);
    }
    /* The argument is copied so the task gets an aligned buffer of its
     * own that outlives any further reads on the connection. */
    void *arg = malloc(m.arg_len ? m.arg_len : 1);
    if (!arg)
        die(FB_EXIT_BOOT, "out of memory for a %u-byte argument", m.arg_len);
    memcpy(arg, m.arg, m.arg_len);
    fiber_buf out = {0};
    fb_task_failure_clear();
    fb_log_debug("running task '%s' (%u argument bytes)", task, m.arg_len);
    int rc = fn(arg, m.arg_len, &out);
    /* Pipelined queue puts of handles the target did not free. */
    fb_rt_api()->drain(fb_deadline_ms(30000));
    const char *why = fb_task_failure();
    /* A target that failed through fiber_task_fail() exits with 1, as a
     * Python process whose target raised does; its message travels in
     * EXIT.  (FIBER_ETASK itself, -15, would read as "killed by
     * SIGTERM".) */
    if (rc == FIBER_ETASK)
        rc = 1;
    pthread_mutex_lock(&ch->write_mu);
    fb_wire_put_exit(fb_conn_out(c), rc, why, strnlen(why, FB_WIRE_TEXT_MAX));
    fb_conn_flush_wait(c, fb_deadline_ms(5000));
    pthread_mutex_unlock(&ch->write_mu);
    free(arg);
    fiber_buf_free(&out);
    /* The connection stays open until the process ends: closing it under
     * the watchdog would only make the watchdog spin. */
    exit(rc & 0xff);
}

/* ch.conn starts zeroed: a closed conn until fb_child_main dials. */
static struct fb_child ch = {.write_mu = PTHREAD_MUTEX_INITIALIZER};

int fb_child_note(int32_t kind, const char *text)
{
    if (fb_conn_fd(&ch.conn) < 0)
        return fb_err(FIBER_ESTATE, "not a child job");
    pthread_mutex_lock(&ch.write_mu);
    int rc = fb_wire_put_note(fb_conn_out(&ch.conn), kind, text, strlen(text));
    if (rc == 0)
        rc = fb_conn_flush_wait(&ch.conn, fb_deadline_ms(10000));
    pthread_mutex_unlock(&ch.write_mu);
    return rc;
}

int fb_child_master_fd(void) { return fb_conn_fd(&ch.conn); }

void fb_child_main(void)
{
    struct fb_runtime *rt = fb_rt();
    static struct boot b;
    read_boot(&b);
    setup_config_and_log(rt, &b);
    if (fb_build_id(rt->build_id, sizeof rt->build_id) != 0)
        die(FB_EXIT_BOOT, "%s", fiber_last_error());
    rt->master = 0;
    memcpy(rt->token, b.token, sizeof rt->token);
    ch.cfg = &rt->cfg;
    ch.heartbeat_ms = handshake(rt, &b, &ch.conn);
    start_watchdog(&ch);
    struct fb_wire_hdr hdr;
    const uint8_t *p;
    int rc = fb_conn_recv_wait(&ch.conn, &hdr, &p, UINT64_MAX);
    if (rc != 1)
        die(FB_EXIT_MASTER_LOST, "no assignment from the master: %s",
            fb_conn_err(&ch.conn));
    if (hdr.type == FB_MSG_RUN)
        run_process(&ch, &hdr, p);
    if (hdr.type == FB_MSG_POOL)
        fb_worker_main(&ch, &hdr, p);
    die(FB_EXIT_PROTO, "unexpected %s from the master",
        fb_msg_type_name(hdr.type));
}
