/*
 * process.c -- fiber_process: one task run as one job, the analogue of
 * multiprocessing.Process.
 *
 * The job's record is driven by the runtime's service thread: when the
 * child has proved itself, connected() sends it RUN with the task and its
 * argument; message() takes its EXIT report.  The caller's thread only
 * waits on the runtime's condition.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "runtime/runtime.h"
#include "runtime/task.h"

#define PROCESS_MAGIC 0x50524f43u /* "PROC" */

struct fiber_process {
    uint32_t magic;
    struct fb_jobrec *job;
    char task[FB_WIRE_NAME_MAX + 1];
    unsigned char *arg; /* sent once the child connects, then freed */
    size_t arg_len;
    char name[64];
};

static void proc_connected(struct fb_jobrec *j)
{
    struct fiber_process *p = j->owner;
    struct fb_msg_run m = {.task = p->task,
                           .task_len = (uint8_t)strlen(p->task),
                           .arg = p->arg,
                           .arg_len = (uint32_t)p->arg_len};
    if (fb_wire_put_run(fb_conn_out(&j->conn), j->id, &m) != 0) {
        fb_log_error("cannot queue the assignment of '%s': %s", j->name,
                     fiber_last_error());
        fb_rt_terminate(j);
    }
    free(p->arg);
    p->arg = NULL;
}

static int proc_message(struct fb_jobrec *j, const struct fb_wire_hdr *h,
                        const uint8_t *payload)
{
    if (h->type == FB_MSG_EXIT && !j->reported) {
        struct fb_msg_text t;
        fb_wire_get_text(payload, h->len, &t, NULL, 0);
        j->reported = 1;
        j->reported_code = h->code;
        if (t.len)
            snprintf(j->failure, sizeof j->failure, "%.*s", (int)t.len,
                     t.text);
        return 0;
    }
    if (h->type == FB_MSG_NOTE) {
        struct fb_msg_text t;
        fb_wire_get_text(payload, h->len, &t, NULL, 0);
        snprintf(j->note, sizeof j->note, "%.*s", (int)t.len, t.text);
        j->has_note = 1;
        pthread_cond_broadcast(&fb_rt()->changed);
        return 0;
    }
    if (h->type == FB_MSG_HEARTBEAT)
        return 0; /* every child's watchdog sends them */
    if (h->type == FB_MSG_PING) {
        fb_wire_put_pong(fb_conn_out(&j->conn), h->id);
        fb_rt_kick(j);
        return 0;
    }
    return -1;
}

static const struct fb_owner_ops process_ops = {
    .kind = "process",
    .connected = proc_connected,
    .message = proc_message,
    .ended = NULL,
};

static int check(const fiber_process *p)
{
    if (!p || p->magic != PROCESS_MAGIC)
        return fb_err(FIBER_EINVAL, "not a valid fiber_process handle");
    return 0;
}

/* Starts task as a job of `program` (NULL: this program). */
int fb_process_start_program(fiber_process **out, const char *task,
                             const void *arg, size_t len,
                             const fiber_job_opts *opts, const char *program)
{
    if (!out || !task || (len && !arg))
        return fb_err(FIBER_EINVAL,
                      "fiber_process_start: out, task or arg is NULL");
    int rc = fiber_task_lookup(task, NULL);
    if (rc)
        return rc;
    if (fb_rt_is_master() && len > fb_rt_config()->max_message_bytes - 128)
        return fb_err(FIBER_ETOOBIG,
                      "argument of %zu bytes exceeds max_message_bytes (%u)",
                      len, fb_rt_config()->max_message_bytes);
    struct fiber_process *p = calloc(1, sizeof *p);
    if (!p || !(p->arg = malloc(len ? len : 1))) {
        free(p);
        return fb_err(FIBER_ENOMEM, "out of memory");
    }
    p->magic = PROCESS_MAGIC;
    fb_strlcpy(p->task, task, sizeof p->task);
    if (len)
        memcpy(p->arg, arg, len);
    p->arg_len = len;
    rc = fb_rt_launch(&p->job, "Process", NULL, opts, &process_ops, p,
                      program);
    if (rc) {
        free(p->arg);
        free(p);
        return rc;
    }
    fb_strlcpy(p->name, p->job->name, sizeof p->name);
    *out = p;
    return 0;
}

FIBER_API int fiber_process_start(fiber_process **out, const char *task,
                                  const void *arg, size_t len,
                                  const fiber_job_opts *opts)
{
    return fb_process_start_program(out, task, arg, len, opts, NULL);
}

FIBER_API int fiber_process_join(fiber_process *p, int timeout_ms)
{
    int rc = check(p);
    if (rc)
        return rc;
    uint64_t deadline = fb_deadline_ms(timeout_ms);
    fb_rt_lock();
    while (!p->job->ended && rc == 0)
        rc = fb_rt_wait(deadline);
    if (!p->job->ended)
        rc = fb_err(FIBER_ETIMEDOUT, "process '%s' still runs after %d ms",
                    p->name, timeout_ms);
    else
        rc = 0;
    fb_rt_unlock();
    return rc;
}

FIBER_API int fiber_process_terminate(fiber_process *p)
{
    int rc = check(p);
    if (rc)
        return rc;
    fb_rt_lock();
    rc = fb_rt_terminate(p->job);
    fb_rt_unlock();
    return rc;
}

FIBER_API int fiber_process_kill(fiber_process *p)
{
    int rc = check(p);
    if (rc)
        return rc;
    fb_rt_lock();
    rc = p->job->ended || !p->job->job
             ? 0
             : fb_backend_signal_job(fb_rt()->backend, p->job->job, 1);
    fb_rt_unlock();
    return rc;
}

FIBER_API int fiber_process_is_alive(fiber_process *p)
{
    int rc = check(p);
    if (rc)
        return rc;
    fb_rt_lock();
    int alive = !p->job->ended;
    fb_rt_unlock();
    return alive;
}

FIBER_API int fiber_process_exitcode(fiber_process *p, int *code)
{
    int rc = check(p);
    if (rc)
        return rc;
    if (!code)
        return fb_err(FIBER_EINVAL, "fiber_process_exitcode: code is NULL");
    fb_rt_lock();
    if (!p->job->ended) {
        rc = fb_err(FIBER_ESTATE, "process '%s' is still running", p->name);
    } else if (p->job->reported) {
        *code = p->job->reported_code;
    } else {
        *code = p->job->exit_status;
    }
    fb_rt_unlock();
    return rc;
}

FIBER_API long fiber_process_pid(fiber_process *p)
{
    if (check(p))
        return -1;
    return p->job->pid;
}

FIBER_API const char *fiber_process_name(fiber_process *p)
{
    if (check(p))
        return "";
    return p->name;
}

/* The reason the job failed outside its task, if known (for tests). */
const char *fb_process_failure(fiber_process *p)
{
    return check(p) ? "" : p->job->failure;
}

FIBER_API void fiber_process_free(fiber_process *p)
{
    if (!p || check(p))
        return;
    if (fiber_process_is_alive(p) == 1) {
        fiber_process_terminate(p);
        fiber_process_join(p, fb_rt_config()->terminate_grace_ms + 1000);
    }
    fb_rt_forget(p->job); /* kills and reaps whatever is left */
    p->magic = 0;
    free(p->arg);
    free(p);
}

/* Waits up to timeout_ms for the process's target to send a NOTE; copies
 * it into buf.  Returns 0, FIBER_ETIMEDOUT, or FIBER_ECLOSED if the job
 * ended first (its failure in fiber_last_error()). */
int fb_process_wait_note(fiber_process *p, char *buf, size_t size,
                         int timeout_ms)
{
    int rc = check(p);
    if (rc)
        return rc;
    uint64_t deadline = fb_deadline_ms(timeout_ms);
    fb_rt_lock();
    while (!p->job->has_note && !p->job->ended && rc == 0)
        rc = fb_rt_wait(deadline);
    if (p->job->has_note)
        rc = (int)fb_strlcpy(buf, p->job->note, size) >= 0 ? 0 : 0;
    else if (p->job->ended)
        rc = fb_err(FIBER_ECLOSED, "job '%s' ended (exit %d)%s%s", p->name,
                    p->job->reported ? p->job->reported_code
                                     : p->job->exit_status,
                    p->job->failure[0] ? ": " : "", p->job->failure);
    else
        rc = fb_err(FIBER_ETIMEDOUT, "job '%s' sent nothing in %d ms",
                    p->name, timeout_ms);
    fb_rt_unlock();
    return rc;
}
