/*
 * runops.c -- what the run ops of every backend share: building the list
 * of runs and jobs, reports, the grace period, and for container backends
 * where the program is in the image and the master's variables.  See
 * runops.h.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/runops.h"
#include "base/common.h"

fiber_run_info *fb_runs_find(fiber_run_list *l, const char *run)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->runs[i].run, run) == 0)
            return &l->runs[i];
    return NULL;
}

fiber_run_info *fb_runs_add_run(fiber_run_list *l, const char *run,
                                const char *backend)
{
    fiber_run_info *r = fb_runs_find(l, run);
    if (r)
        return r;
    fiber_run_info *runs = realloc(l->runs, (l->n + 1) * sizeof *runs);
    if (!runs) {
        fb_err(FIBER_ENOMEM, "out of memory");
        return NULL;
    }
    l->runs = runs;
    r = &runs[l->n++];
    memset(r, 0, sizeof *r);
    fb_strlcpy(r->run, run, sizeof r->run);
    fb_strlcpy(r->backend, backend, sizeof r->backend);
    r->master_pid = -1;
    return r;
}

void fb_runs_free_job(fiber_job_info *j)
{
    free(j->name);
    free(j->status);
    free(j->engine_id);
    j->name = j->status = j->engine_id = NULL;
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
    fiber_job_info *j = &jobs[r->n_jobs];
    memset(j, 0, sizeof *j);
    j->name = strdup(name ? name : "");
    j->status = strdup(status ? status : "");
    j->engine_id = strdup(engine_id ? engine_id : "");
    if (!j->name || !j->status || !j->engine_id) {
        fb_runs_free_job(j);
        fb_err(FIBER_ENOMEM, "out of memory");
        return NULL;
    }
    fb_strlcpy(j->role, role ? role : "", sizeof j->role);
    fb_strlcpy(j->state, state ? state : "", sizeof j->state);
    j->pid = pid;
    r->n_jobs++;
    return j;
}

void fb_runs_warn(fiber_run_list *l, const char *fmt, ...)
{
    size_t used = strlen(l->warning);
    if (used && used + 2 < sizeof l->warning) {
        memcpy(l->warning + used, "; ", 3);
        used += 2;
    }
    if (used + 1 >= sizeof l->warning)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->warning + used, sizeof l->warning - used, fmt, ap);
    va_end(ap);
}

void fb_runs_report(fiber_buf *b, const char *fmt, ...)
{
    if (!b)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    char *line = malloc((size_t)n + 1);
    if (!line)
        return;
    va_start(ap, fmt);
    vsnprintf(line, (size_t)n + 1, fmt, ap);
    va_end(ap);
    fiber_buf_append(b, line, (size_t)n);
    fiber_buf_append(b, "\n", 1);
    free(line);
}

int fb_runs_heading(fiber_buf *out, const char *name)
{
    int rc = 0;
    if (out->len && out->data[out->len - 1] != '\n')
        rc = fiber_buf_append(out, "\n", 1);
    if (rc == 0)
        rc = fiber_buf_append(out, "==> ", 4);
    if (rc == 0)
        rc = fiber_buf_append(out, name, strlen(name));
    if (rc == 0)
        rc = fiber_buf_append(out, " <==\n", 5);
    return rc ? fb_err(FIBER_ENOMEM, "out of memory") : 0;
}

int fb_runs_grace_ms(void)
{
    char text[32];
    if (fiber_config_get("terminate_grace_ms", text, sizeof text) != 0)
        return 2000;
    return atoi(text);
}

int fb_runs_job_running(const fiber_job_info *j)
{
    return strcmp(j->state, "running") == 0;
}

/* The first executable argv0 in PATH, or "". */
static void search_path(const char *argv0, char *out, size_t size)
{
    const char *path = getenv("PATH");
    out[0] = '\0';
    while (path && *path && !out[0]) {
        const char *end = strchr(path, ':');
        size_t n = end ? (size_t)(end - path) : strlen(path);
        char cand[PATH_MAX];
        snprintf(cand, sizeof cand, "%.*s/%s", (int)n, n ? path : ".", argv0);
        if (cand[0] == '/' && access(cand, X_OK) == 0)
            fb_strlcpy(out, cand, size);
        path = end ? end + 1 : NULL;
    }
}

int fb_run_program_in_image(const char *argv0, const fiber_image_info *img,
                            char *out, size_t size)
{
    if (argv0[0] == '/') {
        fb_strlcpy(out, argv0, size);
        return 0;
    }
    if (strchr(argv0, '/')) {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd))
            return fb_err_errno(FIBER_ESYS, "getcwd");
        if ((size_t)snprintf(out, size, "%s/%s", cwd, argv0) >= size)
            return fb_err(FIBER_EINVAL, "program path too long");
        return 0;
    }
    search_path(argv0, out, size);
    if (!out[0] && img->program[0])
        fb_strlcpy(out, img->program, size);
    if (!out[0])
        return fb_err(FIBER_EINVAL,
                      "cannot tell where %s is in image %s: give its "
                      "absolute path",
                      argv0, img->tag);
    return 0;
}

const char **fb_run_vars_with(const struct fb_run_start *s,
                              const char *extra, size_t *n)
{
    const char **vars = calloc(s->n_vars + 2, sizeof *vars);
    if (!vars) {
        fb_err(FIBER_ENOMEM, "out of memory");
        return NULL;
    }
    size_t k = 0;
    if (extra)
        vars[k++] = extra;
    for (size_t i = 0; i < s->n_vars; i++)
        vars[k++] = s->vars[i];
    *n = k;
    return vars;
}
