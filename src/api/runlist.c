/*
 * runlist.c -- the helpers a backend's list op (backend/runops.h) builds
 * a fiber_run_list with: find or add a run, add a job, add a warning.
 *
 * Strings are copied into the list's fixed-size fields (truncated where
 * a field is shorter: fiber_job_info.name holds 63 bytes).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/runops.h"
#include "core/common.h"

fiber_run_info *fb_runs_add_run(fiber_run_list *l, const char *run,
                                const char *backend)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->runs[i].run, run) == 0)
            return &l->runs[i];
    fiber_run_info *runs = realloc(l->runs, (l->n + 1) * sizeof *runs);
    if (!runs) {
        fb_err(FIBER_ENOMEM, "out of memory");
        return NULL;
    }
    l->runs = runs;
    fiber_run_info *r = &runs[l->n++];
    memset(r, 0, sizeof *r);
    fb_strlcpy(r->run, run, sizeof r->run);
    fb_strlcpy(r->backend, backend, sizeof r->backend);
    r->master_pid = -1;
    return r;
}

fiber_job_info *fb_runs_add_job(fiber_run_info *r, const char *name,
                                const char *role, const char *state,
                                const char *status, long pid,
                                const char *engine_id)
{
    fiber_job_info *jobs = realloc(r->jobs, (r->n_jobs + 1) * sizeof *jobs);
    if (!jobs) {
        fb_err(FIBER_ENOMEM, "out of memory");
        return NULL;
    }
    r->jobs = jobs;
    fiber_job_info *j = &jobs[r->n_jobs++];
    memset(j, 0, sizeof *j);
    fb_strlcpy(j->name, name ? name : "", sizeof j->name);
    fb_strlcpy(j->role, role ? role : "", sizeof j->role);
    fb_strlcpy(j->state, state ? state : "", sizeof j->state);
    fb_strlcpy(j->status, status ? status : "", sizeof j->status);
    fb_strlcpy(j->container, engine_id ? engine_id : "", sizeof j->container);
    j->pid = pid;
    return j;
}

void fb_runs_warn(fiber_run_list *l, const char *fmt, ...)
{
    size_t used = strlen(l->warning);
    if (used + 3 >= sizeof l->warning)
        return;
    if (used) {
        memcpy(l->warning + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->warning + used, sizeof l->warning - used, fmt, ap);
    va_end(ap);
}
