/*
 * runops.h -- run-level operations: what the `fiber` command (and
 * fiber_run_start, fiber_runs_list, fiber_run_logs, fiber_run_kill,
 * fiber_run_clean, fiber_backend_check) does to a whole run, one table per
 * backend, each in its backend's folder (backend/<name>/runs.c).
 *
 * backend.h's fb_backend_ops start and watch the jobs of a running master;
 * these act from outside a run, in a process that need not be its master
 * (the fiber command), and need no fiber_init().  runs/ dispatches to them
 * through the registry (backend.c) and names no backend itself.  An op
 * may be NULL where a backend cannot do that yet: runs/ then answers
 * FIBER_ENOTSUP naming the backend.
 *
 * Threading: called from the caller's thread, no lock held; each op may
 * block for as long as its engine takes to answer (a few seconds), except
 * follow and wait, which block as their comments say.
 *
 * Errors: every op returns 0 or a FIBER_E* code with fiber_last_error()
 * saying what failed and what to do.
 */
#ifndef FB_RUNOPS_H
#define FB_RUNOPS_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "fiber/fiber.h"

/* What fiber_run_start hands a backend's start op. */
struct fb_run_start {
    const char *run;             /* the new run's id (runtime/runid.h) */
    const char *const *argv;     /* argv[0] as the caller gave it */
    const fiber_run_opts *opts;  /* never NULL */
    const char *const *vars;     /* "NAME=value" for the master: the run id
                                    (FIBER_BOOT_RUN), FIBER_BACKEND and the
                                    caller's env; a backend adds its own
                                    (FIBER_IMAGE) */
    size_t n_vars;
};

/* The handle behind fiber_run; runs/ allocates and frees it, the backend's
 * start op fills it in. */
struct fiber_run {
    unsigned magic;
    char name[64];                   /* the run id */
    const struct fb_run_ops *ops;    /* the backend it runs on */
    long pid;                        /* the master's pid on this host, or -1 */
    char engine_id[256];             /* container id, pod name, Slurm job
                                        id; "" when none */
    char dir[PATH_MAX];              /* local run directory, or "" */
    int detached, reaped, exit_code; /* local bookkeeping */
    char where[300];                 /* fiber_run_where()'s text */
    char noun[16];                   /* what engine_id names, when not
                                        ops->job_noun ("job": a Kubernetes
                                        Job); "" = job_noun */
    void *priv;                      /* the backend's; freed by release */
};

struct fb_run_ops {
    const char *name; /* "local", "docker", "slurm", "kubernetes" */
    /* What the engine ids of this backend's jobs name ("container",
     * "pod"), for fiber_job_info.engine_kind; NULL reads as "job". */
    const char *job_noun;
    /* 1 when start honours fiber_run_opts.signal_s and .requeue (a
     * warning before the master is ended: Slurm's signal before the time
     * limit, a pod's termination grace period; a requeueable master);
     * fiber_run_start refuses them elsewhere. */
    int can_requeue;

    /* fiber_backend_check: one line saying what was found (engine,
     * version, reachable) into detail.  0 when usable. */
    int (*describe)(char *detail, size_t size);

    /* Starts the master of a new run (fiber_run_start); NULL: this
     * backend cannot start runs (FIBER_ENOTSUP naming the backends that
     * can).  Nothing runs after a failure. */
    int (*start)(const struct fb_run_start *s, struct fiber_run *r);
    /* Copies the master's output to out_fd / err_fd until it ends (0 at
     * once when it already goes there). */
    int (*follow)(struct fiber_run *r, int out_fd, int err_fd);
    /* Waits up to timeout_ms (negative: forever) for the master to end;
     * its exit code (or -signal) in *exit_code.  FIBER_ETIMEDOUT. */
    int (*wait)(struct fiber_run *r, int timeout_ms, int *exit_code);
    /* Frees r->priv (may be NULL). */
    void (*release)(struct fiber_run *r);

    /* Adds this backend's runs (only == NULL) or run only to l, through
     * fb_runs_add_run / fb_runs_add_job (below).  Sets r->alive = 1 for a
     * run it sees running (never lowers it: another backend may know
     * better).  An engine that
     * cannot be reached or is not configured is not an error: it returns
     * 0 and says why in l->warning (appending, "; "-separated). */
    int (*list)(fiber_run_list *l, const char *only);
    /* Appends the logs of r's job named job (NULL: all, each headed by
     * "==> <name> <==" when headings) to out.  FIBER_ENOKEY: no such
     * job or nothing logged (out unchanged; runs/ then tries the run's
     * other backend and says what is missing in its own words). */
    int (*logs)(const fiber_run_info *r, const char *job, int headings,
                fiber_buf *out);
    /* Stops what of r runs (politely, then by force after
     * terminate_grace_ms), a line per action in report (may be NULL);
     * *stopped counts what was stopped. */
    int (*kill)(const fiber_run_info *r, fiber_buf *report, int *stopped);
    /* Removes what the dead run r left in the engine (stopped containers,
     * ended pods, job records, files); named: the user asked for this run
     * by name.  A line per removal in report. */
    int (*clean)(const fiber_run_info *r, int named, fiber_buf *report);

    /* Optional (NULL: this backend's masters keep their run directory on
     * the host that started them).  For fiber top (runs/watch.c), on a run
     * with no run directory here: where its master listens, whether its
     * connections are encrypted, and the run's token (token_len bytes), as
     * the engine knows them.  Returns 0, 1 (this backend is not configured
     * here: not its run to find), or the code of what failed. */
    int (*contact)(const char *run, char *addr, size_t size, int *encrypted,
                   uint8_t *token, size_t token_len);
    /* With contact: where it looked, for a message ("on the Kubernetes
     * cluster"), and why a run of this backend whose contact found nothing
     * cannot be watched (the rest of "run 'R' ..."). */
    const char *contact_where;
    const char *contact_missing;
};

/* The registry (backend.c): the run ops of backend name, or NULL with a
 * message listing the backends that exist; and every backend's in turn
 * (i = 0, 1, ... until NULL). */
const struct fb_run_ops *fb_run_ops_find(const char *name);
const struct fb_run_ops *fb_run_ops_at(size_t i);

/* ---- Helpers for run ops (backend/runops.c) ---------------------------- */

/* For list ops: the entry of run in l, added (backend set, master_pid -1,
 * alive 0) when missing; NULL on ENOMEM.  A run found by two backends (a
 * local run directory of a docker run) keeps the first backend's name
 * unless the later one sets r->backend itself (the docker and kubernetes
 * list ops do: the run directory is a trace, the containers are the
 * run). */
fiber_run_info *fb_runs_add_run(fiber_run_list *l, const char *run,
                                const char *backend);
/* The entry of run in l, or NULL. */
fiber_run_info *fb_runs_find(fiber_run_list *l, const char *run);
/* Appends a job to r, copying every string (any length; NULL reads as
 * ""); pid -1 when none.  Returns the job, or NULL on ENOMEM (message
 * set). */
fiber_job_info *fb_runs_add_job(fiber_run_info *r, const char *name,
                                const char *role, const char *state,
                                const char *status, long pid,
                                const char *engine_id);
/* Frees what a job's strings hold (fiber_run_list_free does it for every
 * job). */
void fb_runs_free_job(fiber_job_info *j);
/* Appends "; "-separated text to l->warning (truncated to its size). */
void fb_runs_warn(fiber_run_list *l, const char *fmt, ...)
    FIBER_PRINTF(2, 3);
/* Appends a line (printf-style, newline added) to report; NULL is a
 * no-op. */
void fb_runs_report(fiber_buf *report, const char *fmt, ...)
    FIBER_PRINTF(2, 3);
/* Appends "==> name <==\n" to out, after a newline if out does not end
 * with one.  Returns 0 or FIBER_ENOMEM. */
int fb_runs_heading(fiber_buf *out, const char *name);
/* terminate_grace_ms from the caller's configuration (2000 when it cannot
 * be read). */
int fb_runs_grace_ms(void);
/* Is j running (state "running")? */
int fb_runs_job_running(const fiber_job_info *j);

/* For start ops of container backends: where the program argv0 lives in
 * image img: argv0 made absolute as on this host (a bare name searched in
 * PATH), or the image's fiber.program label for a bare name this host
 * does not have.  Returns 0 or FIBER_EINVAL / FIBER_ESYS. */
int fb_run_program_in_image(const char *argv0, const fiber_image_info *img,
                            char *out, size_t size);
/* s->vars with extra ("NAME=value", not copied) put first, so that the
 * caller's own settings still win: a calloc'd array of *n entries the
 * caller frees (the strings are not copied), or NULL on ENOMEM. */
const char **fb_run_vars_with(const struct fb_run_start *s,
                              const char *extra, size_t *n);

extern const struct fb_run_ops fb_run_ops_local;
extern const struct fb_run_ops fb_run_ops_docker;
extern const struct fb_run_ops fb_run_ops_slurm;
extern const struct fb_run_ops fb_run_ops_kubernetes;

#endif /* FB_RUNOPS_H */
