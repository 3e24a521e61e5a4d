/*
 * backend.c -- the registry of backends and the thin wrappers core code
 * calls instead of touching an ops table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/runops.h"
#include "base/common.h"

/* The registry: every backend's two tables, its job ops (backend.h) and
 * its run ops (runops.h), under the same name.  Adding a backend is one
 * folder and one line here.  local comes first: it owns the run
 * directories of this host, and its list op runs before the others
 * (runs/runs.c relies on both). */
static const struct {
    const struct fb_backend_ops *jobs;
    const struct fb_run_ops *runs;
} registry[] = {
    {&fb_backend_local, &fb_run_ops_local},
    {&fb_backend_docker, &fb_run_ops_docker},
    {&fb_backend_slurm, &fb_run_ops_slurm},
    {&fb_backend_kubernetes, &fb_run_ops_kubernetes},
};

const char *fb_backend_names(void)
{
    static char names[128];
    if (!names[0]) {
        size_t used = 0;
        for (size_t i = 0; i < FB_ARRAY_LEN(registry); i++)
            used += (size_t)snprintf(names + used, sizeof names - used,
                                     "%s%s", i ? ", " : "",
                                     registry[i].runs->name);
    }
    return names;
}

/* The registry's line for backend name, or -1 with code's message. */
static int registry_line(const char *name, int code)
{
    for (size_t i = 0; name && i < FB_ARRAY_LEN(registry); i++)
        if (strcmp(registry[i].runs->name, name) == 0)
            return (int)i;
    fb_err(code, "%s '%.40s'%s%s", code == FIBER_ECONFIG ? "backend"
                                                         : "unknown backend",
           name ? name : "(null)",
           code == FIBER_ECONFIG ? " does not exist; backends: " : "; known: ",
           fb_backend_names());
    return -1;
}

const struct fb_backend_ops *fb_backend_find(const char *name)
{
    int i = registry_line(name, FIBER_ECONFIG);
    return i < 0 ? NULL : registry[i].jobs;
}

const struct fb_run_ops *fb_run_ops_find(const char *name)
{
    int i = registry_line(name, FIBER_EINVAL);
    return i < 0 ? NULL : registry[i].runs;
}

const struct fb_run_ops *fb_run_ops_at(size_t i)
{
    return i < FB_ARRAY_LEN(registry) ? registry[i].runs : NULL;
}

int fb_backend_restarts(void)
{
    for (size_t i = 0; i < FB_ARRAY_LEN(registry); i++) {
        const struct fb_backend_ops *ops = registry[i].jobs;
        int n = ops->restarts ? ops->restarts() : 0;
        if (n > 0)
            return n;
    }
    return 0;
}

int fb_backend_master_boot(struct fb_config *cfg)
{
    const struct fb_backend_ops *ops = fb_backend_find(cfg->backend);
    int resumed = 0;
    int rc = !ops ? FIBER_ECONFIG
             : ops->master_boot ? ops->master_boot(cfg, &resumed)
                                : 0;
    if (rc == 0 && resumed > cfg->resumed)
        cfg->resumed = resumed;
    return rc;
}

int fb_job_program(const struct fb_job_spec *spec, char *out, size_t size)
{
    if (strcmp(spec->program, "/proc/self/exe") == 0) {
        ssize_t n = readlink("/proc/self/exe", out, size - 1);
        if (n <= 0)
            return fb_err_errno(FIBER_ESYS, "readlink(/proc/self/exe)");
        out[n] = '\0';
    } else if (fb_strlcpy(out, spec->program, size) >= size - 1) {
        return fb_err(FIBER_EINVAL, "program path is too long");
    }
    return 0;
}

int fb_exit_status_of_code(long long code)
{
    if (code > 128 && code < 128 + 65)
        return -(int)(code - 128);
    if (code < 0 || code > 255)
        return 255;
    return (int)code;
}

int fb_backend_open(struct fb_backend **out, const char *name,
                    const struct fb_config *cfg, const char *run_id)
{
    const struct fb_backend_ops *ops = fb_backend_find(name);
    if (!ops)
        return FIBER_ECONFIG;
    struct fb_backend *be = calloc(1, sizeof *be);
    if (!be)
        return fb_err(FIBER_ENOMEM, "out of memory opening backend");
    be->ops = ops;
    be->cfg = cfg;
    be->run_id = run_id;
    if (ops->state_size) {
        be->state = calloc(1, ops->state_size);
        if (!be->state) {
            free(be);
            return fb_err(FIBER_ENOMEM, "out of memory opening backend");
        }
    }
    int rc = ops->init(be);
    if (rc) {
        free(be->state);
        free(be);
        return rc;
    }
    *out = be;
    return 0;
}

void fb_backend_close(struct fb_backend *be)
{
    if (!be)
        return;
    be->ops->fini(be);
    free(be->state);
    free(be);
}

int fb_backend_create_job(struct fb_backend *be,
                          const struct fb_job_spec *spec, struct fb_job **out)
{
    struct fb_job *job = calloc(1, sizeof *job);
    if (!job)
        return fb_err(FIBER_ENOMEM, "out of memory creating a job");
    job->id = spec->job_id;
    job->pid = -1;
    if (be->ops->job_size) {
        job->priv = calloc(1, be->ops->job_size);
        if (!job->priv) {
            free(job);
            return fb_err(FIBER_ENOMEM, "out of memory creating a job");
        }
    }
    int rc = be->ops->create_job(be, spec, job);
    if (rc) {
        free(job->priv);
        free(job);
        return rc;
    }
    *out = job;
    return 0;
}

int fb_backend_event_fd(struct fb_backend *be, struct fb_job *job)
{
    return be->ops->event_fd ? be->ops->event_fd(be, job) : -1;
}

int fb_backend_poll_job(struct fb_backend *be, struct fb_job *job)
{
    if (job->state == FB_JOB_EXITED)
        return 0;
    return be->ops->poll_job(be, job);
}

int fb_backend_signal_job(struct fb_backend *be, struct fb_job *job,
                          int force)
{
    if (job->state == FB_JOB_EXITED)
        return 0;
    return be->ops->signal_job(be, job, force);
}

int fb_backend_release_job(struct fb_backend *be, struct fb_job *job)
{
    if (!job)
        return 0;
    be->ops->release_job(be, job);
    int status = job->exit_status;
    free(job->priv);
    free(job);
    return status;
}

void fb_backend_begin_batch(struct fb_backend *be)
{
    if (be->ops->begin_batch)
        be->ops->begin_batch(be);
}

int fb_backend_end_batch(struct fb_backend *be)
{
    return be->ops->end_batch ? be->ops->end_batch(be) : 0;
}

int fb_backend_logs(struct fb_backend *be, struct fb_job *job, fiber_buf *out)
{
    if (!be->ops->logs)
        return fb_err(FIBER_ENOTSUP, "the %s backend keeps no job output",
                      be->ops->name);
    return be->ops->logs(be, job, out);
}
