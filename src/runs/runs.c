/*
 * runs.c -- finding runs and what they left behind: fiber_runs_list,
 * fiber_run_logs, fiber_run_kill, fiber_run_clean and fiber_backend_check.
 *
 * What is generic lives here: merging what every backend's list op found
 * (backend/runops.h, through the registry in backend.c), sorting, the
 * "no such run" errors, clean's alive checks, and sending logs, kill and
 * clean to the backends of a run.  A run's backends are its own
 * (fiber_run_info.backend) and, when it has a run directory on this host
 * that another backend's run left (a docker master mounts it), the local
 * backend's, which owns run directories.  Nothing here names a backend
 * but that one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/runops.h"
#include "base/common.h"
#include "runtime/runid.h"

/* ======================================================================
 * Listing
 * ====================================================================== */

/* A job that left a log and also runs (a container) is listed once, as
 * the running one. */
static void drop_shadowed_logs(fiber_run_info *r)
{
    /* First decide for every job, against the list as it is; then free
     * and compact (freeing while comparing would compare freed names). */
    unsigned char *drop = r->n_jobs ? calloc(r->n_jobs, 1) : NULL;
    if (!drop)
        return; /* nothing to drop, or no memory: keep the duplicates */
    for (size_t i = 0; i < r->n_jobs; i++) {
        const fiber_job_info *j = &r->jobs[i];
        if (strcmp(j->state, "ended") != 0)
            continue;
        for (size_t m = 0; m < r->n_jobs && !drop[i]; m++)
            drop[i] = m != i && strcmp(r->jobs[m].name, j->name) == 0 &&
                      strcmp(r->jobs[m].state, "ended") != 0;
    }
    size_t k = 0;
    for (size_t i = 0; i < r->n_jobs; i++) {
        if (drop[i])
            fb_runs_free_job(&r->jobs[i]);
        else
            r->jobs[k++] = r->jobs[i];
    }
    r->n_jobs = k;
    free(drop);
}

static int job_cmp(const void *a, const void *b)
{
    const fiber_job_info *x = a, *y = b;
    int xm = strcmp(x->role, "master") == 0;
    int ym = strcmp(y->role, "master") == 0;
    if (xm != ym)
        return ym - xm;
    return strverscmp(x->name, y->name);
}

static int run_cmp(const void *a, const void *b)
{
    return strcmp(((const fiber_run_info *)a)->run,
                  ((const fiber_run_info *)b)->run);
}

FIBER_API void fiber_run_list_free(fiber_run_list *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++) {
        for (size_t j = 0; j < l->runs[i].n_jobs; j++)
            fb_runs_free_job(&l->runs[i].jobs[j]);
        free(l->runs[i].jobs);
    }
    free(l->runs);
    memset(l, 0, sizeof *l);
}

static int check_run_id(const char *run)
{
    if (fb_run_id_valid(run))
        return 0;
    return fb_err(FIBER_EINVAL, "'%.80s' is not a run id (1 to %d of A-Z a-z "
                                "0-9 _ . -, like fiber-3f9a1c2e)",
                  run, FB_RUN_ID_MAX);
}

/* Says what each job's engine id names, in its run's backend's words. */
static void name_engine_ids(fiber_run_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        const struct fb_run_ops *ops = fb_run_ops_find(l->runs[i].backend);
        const char *noun = ops && ops->job_noun ? ops->job_noun : "job";
        for (size_t j = 0; j < l->runs[i].n_jobs; j++) {
            fiber_job_info *job = &l->runs[i].jobs[j];
            fb_strlcpy(job->engine_kind, job->engine_id[0] ? noun : "",
                       sizeof job->engine_kind);
        }
    }
    fb_err_clear();
}

static void sort_list(fiber_run_list *l)
{
    /* (qsort's pointer must not be NULL, even for no elements.) */
    for (size_t i = 0; i < l->n; i++)
        if (l->runs[i].n_jobs > 1)
            qsort(l->runs[i].jobs, l->runs[i].n_jobs,
                  sizeof *l->runs[i].jobs, job_cmp);
    if (l->n > 1)
        qsort(l->runs, l->n, sizeof *l->runs, run_cmp);
}

FIBER_API int fiber_runs_list(const char *run, fiber_run_list *out)
{
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_runs_list: out is NULL");
    if (run && check_run_id(run))
        return FIBER_EINVAL;
    fiber_run_list l;
    memset(&l, 0, sizeof l);
    int rc = 0;
    const struct fb_run_ops *ops;
    for (size_t i = 0; rc == 0 && (ops = fb_run_ops_at(i)) != NULL; i++)
        if (ops->list)
            rc = ops->list(&l, run);
    for (size_t i = 0; rc == 0 && i < l.n; i++)
        drop_shadowed_logs(&l.runs[i]);
    if (rc == 0 && run && l.n == 0)
        rc = fb_err(FIBER_ENOKEY,
                    "no run %s: no run directory on this host and no "
                    "container or pod labelled %s=%s; fiber ps lists "
                    "runs%s%s",
                    run, FB_LABEL_RUN, run, l.warning[0] ? "; " : "",
                    l.warning);
    if (rc) {
        fiber_run_list_free(&l);
        return rc;
    }
    name_engine_ids(&l);
    sort_list(&l);
    *out = l;
    return 0;
}

/* The backends whose ops act on r: its own first, then the local one (the
 * registry's first) for a run directory another backend's run left.
 * Returns how many (1 or 2), or 0 with a message when r's backend is
 * unknown. */
static size_t run_backends(const fiber_run_info *r,
                           const struct fb_run_ops *ops[2])
{
    const struct fb_run_ops *local = fb_run_ops_at(0);
    ops[0] = fb_run_ops_find(r->backend);
    if (!ops[0])
        return 0;
    if (ops[0] == local || !r->dir[0])
        return 1;
    ops[1] = local;
    return 2;
}

/* One run found by name: the list holding it, its entry, its backends. */
struct one_run {
    fiber_run_list l;
    const fiber_run_info *r;
    const struct fb_run_ops *ops[2];
    size_t n_ops;
};

/* Finds run, which must exist, into *o (fiber_run_list_free(&o->l) when
 * done). */
static int find_one(const char *run, struct one_run *o)
{
    memset(o, 0, sizeof *o);
    int rc = fiber_runs_list(run, &o->l);
    if (rc)
        return rc;
    o->r = &o->l.runs[0];
    o->n_ops = run_backends(o->r, o->ops);
    if (o->n_ops == 0) {
        fiber_run_list_free(&o->l);
        return FIBER_EINVAL;
    }
    return 0;
}

/* The error for a run op a backend does not have yet. */
static int not_yet(const struct fb_run_ops *ops, const char *what,
                   const char *run)
{
    return fb_err(FIBER_ENOTSUP,
                  "the %s backend cannot %s its runs yet (run %s)",
                  ops->name, what, run);
}

/* ======================================================================
 * Logs
 * ====================================================================== */

FIBER_API int fiber_run_logs(const char *run, const char *job, fiber_buf *out)
{
    if (!run || !out)
        return fb_err(FIBER_EINVAL, "fiber_run_logs: run or out is NULL");
    struct one_run o;
    int rc = find_one(run, &o);
    if (rc)
        return rc;
    const fiber_run_info *r = o.r;
    size_t before = out->len;
    int found = 0;
    for (size_t i = 0; rc == 0 && i < o.n_ops; i++) {
        if (!o.ops[i]->logs) {
            rc = not_yet(o.ops[i], "read the logs of", run);
            break;
        }
        int k = o.ops[i]->logs(r, job, job == NULL, out);
        if (k == 0)
            found++;
        else if (k != FIBER_ENOKEY)
            rc = k;
    }
    if (rc == 0 && !found)
        rc = job ? fb_err(FIBER_ENOKEY,
                          "run %s has no job %s with logs (fiber ps %s "
                          "lists its jobs)",
                          run, job, run)
                 : fb_err(FIBER_ENOKEY,
                          "run %s has no logs: local children write a log "
                          "file only when they log, and an attached "
                          "master's output went to its terminal",
                          run);
    if (rc)
        out->len = before;
    fiber_run_list_free(&o.l);
    return rc;
}

/* ======================================================================
 * Kill
 * ====================================================================== */

/* A live run with a run directory whose master no backend found: not a
 * process of this host, not a container or pod of the run. */
static int master_unknown(const fiber_run_info *r)
{
    if (!r->dir[0] || r->alive <= 0 || r->master_pid >= 0)
        return 0;
    for (size_t i = 0; i < r->n_jobs; i++)
        if (r->jobs[i].engine_id[0] && !strcmp(r->jobs[i].role, "master"))
            return 0;
    return 1;
}

FIBER_API int fiber_run_kill(const char *run, fiber_buf *rep)
{
    if (!run)
        return fb_err(FIBER_EINVAL, "fiber_run_kill: run is NULL");
    struct one_run o;
    int rc = find_one(run, &o);
    if (rc)
        return rc;
    const fiber_run_info *r = o.r;
    int stopped = 0;
    for (size_t i = 0; i < o.n_ops; i++) {
        int k = o.ops[i]->kill ? o.ops[i]->kill(r, rep, &stopped)
                               : not_yet(o.ops[i], "stop", run);
        if (rc == 0)
            rc = k;
    }
    if (rc == 0 && master_unknown(r)) {
        fb_runs_report(rep, "could not find the master of run %s among this "
                            "user's processes on this host",
                       run);
        rc = fb_err(FIBER_ESTATE,
                    "run %s is alive but its master could not be found (in "
                    "a container started by another run? another user's?); "
                    "stop it where it runs",
                    run);
    } else if (rc == 0 && stopped == 0) {
        rc = fb_err(FIBER_ENOKEY, "nothing of run %s is running%s", run,
                    r->alive ? "" : "; fiber clean removes what it left");
    }
    fiber_run_list_free(&o.l);
    return rc;
}

/* ======================================================================
 * Clean
 * ====================================================================== */

/* Removes what the dead run r left, engine first, then its directory. */
static int clean_run(const fiber_run_info *r, int named, fiber_buf *rep)
{
    const struct fb_run_ops *ops[2];
    size_t n = run_backends(r, ops);
    int rc = n ? 0 : FIBER_EINVAL;
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = ops[i]->clean ? ops[i]->clean(r, named, rep)
                           : not_yet(ops[i], "clean up after", r->run);
    return rc;
}

FIBER_API int fiber_run_clean(const char *run, fiber_buf *rep)
{
    fiber_run_list l = {0};
    int rc = fiber_runs_list(run, &l);
    if (rc)
        return rc;
    if (run && l.runs[0].alive > 0) {
        fiber_run_list_free(&l);
        return fb_err(FIBER_ESTATE,
                      "run %s is alive; stop it first (fiber kill %s)", run,
                      run);
    }
    if (run && l.runs[0].alive < 0)
        fb_runs_report(rep, "run %s: cannot tell whether its master lives "
                            "(it would listen on TCP, with no job running "
                            "now); cleaning it as asked",
                       run);
    for (size_t i = 0; rc == 0 && i < l.n; i++) {
        const fiber_run_info *r = &l.runs[i];
        if (!run && r->alive < 0)
            fb_runs_report(rep, "left %s: cannot tell whether run %s is "
                                "alive; fiber clean %s removes it if you "
                                "know it ended",
                           r->dir[0] ? r->dir : r->run, r->run, r->run);
        if (r->alive > 0 || (!run && r->alive < 0))
            continue;
        rc = clean_run(r, run != NULL, rep);
    }
    fiber_run_list_free(&l);
    return rc;
}

/* ======================================================================
 * Backends
 * ====================================================================== */

FIBER_API int fiber_backend_known(const char *backend)
{
    if (!backend)
        return fb_err(FIBER_EINVAL, "fiber_backend_known: backend is NULL"),
               0;
    return fb_run_ops_find(backend) != NULL;
}

FIBER_API const char *fiber_backend_name(size_t i)
{
    const struct fb_run_ops *ops = fb_run_ops_at(i);
    return ops ? ops->name : NULL;
}

FIBER_API int fiber_backend_check(const char *backend, char *detail,
                                  size_t size)
{
    char scratch[8];
    if (!detail || size == 0) {
        detail = scratch;
        size = sizeof scratch;
    }
    detail[0] = '\0';
    if (!backend)
        return fb_err(FIBER_EINVAL, "fiber_backend_check: backend is NULL");
    const struct fb_run_ops *ops = fb_run_ops_find(backend);
    int rc;
    if (!ops) {
        snprintf(detail, size, "unknown backend (known: %s)",
                 fb_backend_names());
        rc = FIBER_EINVAL;
    } else if (!ops->describe) {
        snprintf(detail, size, "fiber cannot check the %s backend yet",
                 ops->name);
        rc = fb_err(FIBER_ENOTSUP, "%s", detail);
    } else {
        rc = ops->describe(detail, size);
    }
    if (rc == 0)
        fb_err_clear();
    return rc;
}
