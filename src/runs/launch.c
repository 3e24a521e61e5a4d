/*
 * launch.c -- fiber_run_start and friends: starting a program's master as
 * a run on a backend, following its output and waiting for it.  The
 * backend's run ops (backend/runops.h) do the work; this file checks the
 * arguments, names the run and prepares the master's variables.
 *
 * The launcher names the run itself (runtime/runid.h) and hands the name to
 * the program in FIBER_BOOT_RUN, so that what it prints, the run
 * directory it records the master's pid in, and the labels of the
 * master's container or pod agree with the run id the program's jobs
 * carry (the runtime adopts a name given this way).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/runops.h"
#include "base/common.h"
#include "runtime/runid.h"

#define RUN_MAGIC 0x6e75722bu /* "+run" */

static int valid(const fiber_run *r)
{
    return r && r->magic == RUN_MAGIC;
}

FIBER_API const char *fiber_run_name(const fiber_run *r)
{
    return valid(r) ? r->name : "";
}

FIBER_API long fiber_run_pid(const fiber_run *r)
{
    return valid(r) ? r->pid : -1;
}

FIBER_API const char *fiber_run_container(const fiber_run *r)
{
    return valid(r) ? r->engine_id : "";
}

FIBER_API const char *fiber_run_where(const fiber_run *rc)
{
    if (!valid(rc))
        return "";
    fiber_run *r = (fiber_run *)rc; /* fills its own text buffer */
    const char *noun = r->noun[0]                   ? r->noun
                       : r->ops && r->ops->job_noun ? r->ops->job_noun
                                                    : "job";
    if (r->engine_id[0])
        snprintf(r->where, sizeof r->where, "%s %.*s", noun,
                 strcmp(noun, "container") == 0 ? 12 : 256, r->engine_id);
    else if (r->pid > 0)
        snprintf(r->where, sizeof r->where, "pid %ld", r->pid);
    else
        snprintf(r->where, sizeof r->where, "%s (not known yet)", noun);
    return r->where;
}

FIBER_API void fiber_run_free(fiber_run *r)
{
    if (!valid(r))
        return;
    if (r->ops->release)
        r->ops->release(r);
    r->magic = 0;
    free(r);
}

static int check_env(const char *const *env, size_t *n)
{
    *n = 0;
    for (; env && env[*n]; (*n)++)
        if (!strchr(env[*n], '=') || env[*n][0] == '=')
            return fb_err(FIBER_EINVAL,
                          "environment entry '%.80s' is not NAME=value",
                          env[*n]);
    return 0;
}

/* The variables the master gets: the run's name and the backend, then
 * the caller's (which win).  storage holds the first two. */
static const char **master_vars(const char *run, const char *backend,
                                const char *const *user, size_t n_user,
                                char *storage, size_t size, size_t *n)
{
    const char **vars = calloc(n_user + 2, sizeof *vars);
    if (!vars)
        return NULL;
    int w = snprintf(storage, size, "%s=%s", FB_ENV_RUN, run);
    vars[0] = storage;
    vars[1] = storage + w + 1;
    snprintf(storage + w + 1, size - (size_t)w - 1, "FIBER_BACKEND=%s",
             backend);
    for (size_t i = 0; i < n_user; i++)
        vars[2 + i] = user[i];
    *n = n_user + 2;
    return vars;
}

/* The backend's run ops, from the options or the configuration. */
static int choose_backend(const fiber_run_opts *o,
                          const struct fb_run_ops **ops)
{
    char name[64];
    int rc = 0;
    if (o->backend)
        fb_strlcpy(name, o->backend, sizeof name);
    else
        rc = fiber_config_get("backend", name, sizeof name);
    if (rc == 0 && !(*ops = fb_run_ops_find(name)))
        rc = FIBER_EINVAL;
    return rc;
}

/* The backends that can start runs, for a message. */
static void starters(char *out, size_t size)
{
    const struct fb_run_ops *ops;
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; (ops = fb_run_ops_at(i)) != NULL && used < size; i++)
        if (ops->start)
            used += (size_t)snprintf(out + used, size - used, "%s%s",
                                     used ? ", " : "", ops->name);
}

static int start_on(const struct fb_run_ops *ops, const char *const *argv,
                    const fiber_run_opts *o, size_t n_user, fiber_run **out)
{
    fiber_run *r = calloc(1, sizeof *r);
    if (!r)
        return fb_err(FIBER_ENOMEM, "out of memory");
    r->magic = RUN_MAGIC;
    r->pid = -1;
    r->ops = ops;
    int rc = fb_run_id_new(r->name, sizeof r->name);
    char storage[128];
    size_t n_vars = 0;
    const char **vars = NULL;
    if (rc == 0 && !(vars = master_vars(r->name, ops->name, o->env, n_user,
                                        storage, sizeof storage, &n_vars)))
        rc = fb_err(FIBER_ENOMEM, "out of memory");
    struct fb_run_start s = {.run = r->name, .argv = argv, .opts = o,
                             .vars = vars, .n_vars = n_vars};
    if (rc == 0)
        rc = ops->start(&s, r);
    free(vars);
    if (rc) {
        if (ops->release)
            ops->release(r);
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

FIBER_API int fiber_run_start(fiber_run **out, const char *const *argv,
                              const fiber_run_opts *opts)
{
    fiber_run_opts none = {0};
    const fiber_run_opts *o = opts ? opts : &none;
    if (!out || !argv || !argv[0] || !argv[0][0])
        return fb_err(FIBER_EINVAL, "fiber_run_start: no program to run");
    size_t n_user;
    int rc = check_env(o->env, &n_user);
    if (rc)
        return rc;
    if (o->cpu < 0 || o->memory_mb < 0 || o->gpu < 0)
        return fb_err(FIBER_EINVAL, "cpu, memory and gpu cannot be negative");
    if (o->signal_s < 0 || o->signal_s > 65535)
        return fb_err(FIBER_EINVAL, "signal: %d seconds; want 1 to 65535 "
                                    "(or 0: no warning)",
                      o->signal_s);
    const struct fb_run_ops *ops = NULL;
    if ((rc = choose_backend(o, &ops)) != 0)
        return rc;
    if ((o->signal_s || o->requeue) && !ops->can_requeue)
        return fb_err(FIBER_ENOTSUP,
                      "--signal and --requeue are for a master that is a "
                      "Slurm batch job (--backend slurm) or a Kubernetes "
                      "Job (--backend kubernetes); the %s backend has no "
                      "time limit to warn of and no queue to requeue in",
                      ops->name);
    if (!ops->start) {
        char can[128];
        starters(can, sizeof can);
        return fb_err(FIBER_ENOTSUP,
                      "fiber cannot start runs on the %s backend yet: use "
                      "%s",
                      ops->name, can);
    }
    rc = start_on(ops, argv, o, n_user, out);
    if (rc == 0)
        fb_err_clear();
    return rc;
}

FIBER_API int fiber_run_follow(fiber_run *r, int out_fd, int err_fd)
{
    if (!valid(r))
        return fb_err(FIBER_EINVAL, "fiber_run_follow: invalid handle");
    if (!r->ops->follow)
        return fb_err(FIBER_ENOTSUP, "the %s backend cannot follow a run's "
                                     "output yet",
                      r->ops->name);
    return r->ops->follow(r, out_fd, err_fd);
}

FIBER_API int fiber_run_wait(fiber_run *r, int timeout_ms, int *exit_code)
{
    if (!valid(r))
        return fb_err(FIBER_EINVAL, "fiber_run_wait: invalid handle");
    if (!r->ops->wait)
        return fb_err(FIBER_ENOTSUP, "the %s backend cannot wait for a run "
                                     "yet",
                      r->ops->name);
    return r->ops->wait(r, timeout_ms, exit_code);
}
