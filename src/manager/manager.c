/*
 * manager.c -- fiber_manager: a job of the configured backend whose main
 * thread runs an object server hosting shared objects (mobj_srv.c, mobj.c) and
 * queues (queue.c), the analogue of multiprocessing.Manager().
 *
 * Starting one: the master picks an address for it (a unix socket in the
 * run directory, or tcp:<listen_host>:0), launches a job that runs the
 * built-in task fiber_manager_serve with that address as its argument,
 * and waits for the job to report, in a NOTE, the address it is actually
 * listening on.  Clients (the master and any child holding a serialised
 * handle) then talk to the manager directly, proving themselves with the
 * run's token as they do to the master's own object server.
 *
 * Lifetime: the manager serves until its connection to the master hangs
 * up (fiber_manager_free terminates it; a master that dies takes it
 * along, through the child's watchdog).  A manager that dies makes every
 * call on its objects fail with FIBER_ECLOSED: each client's connection to
 * it hangs up, which objclient.c turns into FIBER_ECLOSED for calls
 * waiting and calls to come.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "objsrv/objsrv.h"
#include "runtime/child.h"
#include "runtime/runtime.h"

#define MANAGER_MAGIC 0x4d475252u /* "MGRR" */
#define SERVE_TASK "fiber_manager_serve"
#define NOTE_ADDRESS 1
/* Starting a job and its handshake take milliseconds locally; a cluster
 * backend may need to pull an image first. */
#define START_TIMEOUT_MS 30000

/* process.c (no header declares them). */
int fb_process_start_program(fiber_process **out, const char *task,
                             const void *arg, size_t len,
                             const fiber_job_opts *opts, const char *program);
int fb_process_wait_note(fiber_process *p, char *buf, size_t size,
                         int timeout_ms);

struct fiber_manager {
    uint32_t magic;
    fiber_process *proc;
    char listen[700]; /* what it is told to listen on (its argument) */
    char addr[600];   /* where it listens: what it reported */
    uint8_t token[FB_WIRE_TOKEN_LEN];
    /* Keeps this process's connection to the manager open between calls
     * that open objects, which would otherwise dial each time. */
    struct fb_oclient *c;
};

/* ---- inside the manager job ---------------------------------------------- */

/* The manager's body: serve objects on the address in arg until the
 * master's connection hangs up.  Internal: fiber_manager_start runs it. */
FIBER_TASK(fiber_manager_serve)
{
    char addr[700];
    int master_fd = fb_child_master_fd();
    if (len == 0 || len >= sizeof addr || master_fd < 0)
        return fiber_task_fail(SERVE_TASK " is started by "
                               "fiber_manager_start(), with an address");
    memcpy(addr, arg, len);
    addr[len] = '\0';
    struct fb_objsrv *s;
    if (fb_objsrv_start(&s, addr, fb_rt_token(), fb_rt_build_id(), 0) != 0)
        return fiber_task_fail("manager cannot listen on %s: %s", addr,
                               fiber_last_error());
    if (fb_child_note(NOTE_ADDRESS, fb_objsrv_address(s)) != 0) {
        fb_objsrv_stop(s);
        return fiber_task_fail("manager cannot report its address: %s",
                               fiber_last_error());
    }
    fb_log_info("manager serving on %s", fb_objsrv_address(s));
    fb_objsrv_run(s, master_fd);
    fb_objsrv_stop(s);
    return 0;
}

/* ---- starting and stopping ----------------------------------------------- */

static int check(const fiber_manager *m, const char *fn)
{
    if (!m || m->magic != MANAGER_MAGIC)
        return fb_err(FIBER_EINVAL, "%s: not a valid fiber_manager handle",
                      fn);
    return 0;
}

/* Picks where manager n listens: like the master's object server, a
 * socket in the run directory, or TCP on listen_host. */
static int listen_address(char *buf, size_t size, unsigned long n)
{
    const char *run_addr = fb_rt_address(); /* makes the run directory */
    if (!run_addr[0])
        return fb_err(FIBER_ESYS, "cannot set up the run's directory");
    if (fb_rt_config()->transport == FB_TRANSPORT_TCP)
        snprintf(buf, size, "tcp:%s:0", fb_rt_config()->listen_host);
    else
        snprintf(buf, size, "unix:%s/manager-%lu.sock", fb_rt()->run_dir, n);
    return 0;
}

/* Stops the job (SIGTERM, SIGKILL after the grace period) and waits. */
static void stop_job(fiber_manager *m)
{
    fiber_process_free(m->proc);
    m->proc = NULL;
    /* A killed server leaves its socket file behind. */
    if (strncmp(m->listen, "unix:", 5) == 0)
        unlink(m->listen + 5);
}

static int start(fiber_manager *m, const fiber_job_opts *opts)
{
    static unsigned long seq;
    unsigned long n = __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED);
    char name[64];
    fiber_job_opts o = opts ? *opts : (fiber_job_opts){0};
    if (!o.name) {
        snprintf(name, sizeof name, "Manager-%lu", n);
        o.name = name;
    }
    int rc = listen_address(m->listen, sizeof m->listen, n);
    if (rc == 0)
        rc = fb_process_start_program(&m->proc, SERVE_TASK, m->listen,
                                      strlen(m->listen), &o, NULL);
    if (rc == 0) {
        rc = fb_process_wait_note(m->proc, m->addr, sizeof m->addr,
                                  START_TIMEOUT_MS);
        if (rc)
            rc = fb_err(FIBER_ESPAWN, "manager '%s' did not start: %s",
                        o.name, fiber_last_error());
    }
    if (rc == 0)
        rc = fb_oclient_get(m->addr, m->token, &m->c);
    return rc;
}

FIBER_API int fiber_manager_start(fiber_manager **out,
                                  const fiber_job_opts *opts)
{
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_manager_start: out is NULL");
    if (fiber_is_master() < 0)
        return fb_err(FIBER_ENOTINIT, "call fiber_init() first");
    if (!fiber_is_master())
        return fb_err(FIBER_ENOTSUP, "only the master starts managers; pass "
                                     "a serialised fiber_mobj to a child");
    fiber_manager *m = calloc(1, sizeof *m);
    if (!m)
        return fb_err(FIBER_ENOMEM, "out of memory");
    m->magic = MANAGER_MAGIC;
    memcpy(m->token, fb_rt_token(), sizeof m->token);
    int rc = start(m, opts);
    if (rc) {
        char why[FB_WIRE_TEXT_MAX + 1];
        fb_strlcpy(why, fiber_last_error(), sizeof why);
        stop_job(m); /* may overwrite the message */
        free(m);
        return fb_err(rc, "%s", why);
    }
    *out = m;
    return 0;
}

FIBER_API void fiber_manager_free(fiber_manager *m)
{
    if (!m || m->magic != MANAGER_MAGIC)
        return;
    m->magic = 0;
    fb_oclient_release(m->c);
    stop_job(m);
    free(m);
}

/* The manager's connection (a new reference the caller releases), its
 * address and token; FIBER_ECLOSED once it has ended. */
static int endpoint(fiber_manager *m, const char *fn, struct fb_oclient **c)
{
    int rc = check(m, fn);
    if (rc)
        return rc;
    if (fiber_process_is_alive(m->proc) != 1)
        return fb_err(FIBER_ECLOSED, "%s: the manager at %s has ended", fn,
                      m->addr);
    return fb_oclient_get(m->addr, m->token, c);
}

FIBER_API int fiber_manager_queue(fiber_manager *m, const char *name,
                                  size_t capacity, fiber_queue **out)
{
    struct fb_oclient *c;
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_manager_queue: out is NULL");
    int rc = endpoint(m, __func__, &c);
    if (rc)
        return rc;
    rc = fb_queue_create_on(out, m->addr, m->token, name, capacity);
    fb_oclient_release(c);
    return rc;
}

/* ---- opening objects (kinds: mobj_srv.c, handles: mobj.c) --------------- */

/* Opens (creating it if new) the object name of kind on m; params only
 * matter when it is created. */
static int open_obj(fiber_manager *m, const char *fn, const char *kind,
                    const char *name, const fiber_iov *params, size_t n,
                    fiber_mobj **out)
{
    static unsigned long seq;
    struct fb_oclient *c;
    if (!out)
        return fb_err(FIBER_EINVAL, "%s: out is NULL", fn);
    int rc = endpoint(m, fn, &c);
    if (rc)
        return rc;
    char fresh[64];
    if (!name) { /* only the master holds a manager: unique names */
        snprintf(fresh, sizeof fresh, "%s-%lu", kind,
                 __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED));
        name = fresh;
    }
    rc = fb_mobj_create(out, c, m->addr, m->token, kind, name, params, n);
    fb_oclient_release(c);
    return rc;
}

FIBER_API int fiber_manager_dict(fiber_manager *m, const char *name,
                                 fiber_mobj **out)
{
    return open_obj(m, __func__, "dict", name, NULL, 0, out);
}

FIBER_API int fiber_manager_list(fiber_manager *m, const char *name,
                                 fiber_mobj **out)
{
    return open_obj(m, __func__, "list", name, NULL, 0, out);
}

FIBER_API int fiber_manager_value(fiber_manager *m, const char *name,
                                  int64_t initial, fiber_mobj **out)
{
    fiber_iov p = {&initial, 8};
    return open_obj(m, __func__, "value", name, &p, 1, out);
}

FIBER_API int fiber_manager_lock(fiber_manager *m, const char *name,
                                 fiber_mobj **out)
{
    return open_obj(m, __func__, "lock", name, NULL, 0, out);
}

FIBER_API int fiber_manager_rlock(fiber_manager *m, const char *name,
                                  fiber_mobj **out)
{
    return open_obj(m, __func__, "rlock", name, NULL, 0, out);
}

FIBER_API int fiber_manager_event(fiber_manager *m, const char *name,
                                  fiber_mobj **out)
{
    return open_obj(m, __func__, "event", name, NULL, 0, out);
}

FIBER_API int fiber_manager_semaphore(fiber_manager *m, const char *name,
                                      int64_t initial, fiber_mobj **out)
{
    if (initial < 0)
        return fb_err(FIBER_EINVAL, "fiber_manager_semaphore: initial "
                                    "value %lld < 0", (long long)initial);
    fiber_iov p = {&initial, 8};
    return open_obj(m, __func__, "semaphore", name, &p, 1, out);
}

FIBER_API int fiber_manager_barrier(fiber_manager *m, const char *name,
                                    unsigned parties, fiber_mobj **out)
{
    if (parties == 0)
        return fb_err(FIBER_EINVAL, "fiber_manager_barrier: parties must "
                                    "be at least 1");
    uint32_t n = parties;
    fiber_iov p = {&n, 4};
    return open_obj(m, __func__, "barrier", name, &p, 1, out);
}

FIBER_API int fiber_manager_condition(fiber_manager *m, const char *name,
                                      fiber_mobj **out)
{
    return open_obj(m, __func__, "condition", name, NULL, 0, out);
}

FIBER_API int fiber_manager_custom(fiber_manager *m, const char *name,
                                   const void *state, size_t len,
                                   fiber_mobj **out)
{
    if (len && !state)
        return fb_err(FIBER_EINVAL, "fiber_manager_custom: state is NULL "
                                    "with a length");
    fiber_iov p = {state, len};
    return open_obj(m, __func__, "custom", name, &p, 1, out);
}

/* ---- for the tests -------------------------------------------------------- */

fiber_process *fb_manager_process(fiber_manager *m)
{
    return check(m, __func__) ? NULL : m->proc;
}

const char *fb_manager_address(fiber_manager *m)
{
    return check(m, __func__) ? "" : m->addr;
}
