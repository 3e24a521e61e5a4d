/*
 * runid.h -- a run's identity, written once: what a run id may be, how a
 * new one is made, where its run directory and logs are, what its
 * bootstrap secret is, and the names under which the runtime, the
 * backends and the `fiber` command find a run's parts (environment
 * variables, files of the run directory, container and pod labels).
 *
 * Users: runtime/runtime.c and runtime/service.c (a master's own id and
 * directory), the backends (labels, secret variables) and their run ops
 * (backend/<name>/runs.c), runs/runs.c and runs/launch.c.
 */
#ifndef FB_RUNID_H
#define FB_RUNID_H

#include <stddef.h>

/* A run id: 1..FB_RUN_ID_MAX bytes of [A-Za-z0-9_.-], not starting with
 * '.', so that it is a file name that cannot escape the base directory,
 * a Docker label value and (lower-cased) part of a pod name.  The ids
 * fiber makes are "fiber-" and 8 lower-case hex digits. */
#define FB_RUN_ID_MAX 31
#define FB_RUN_ID_SIZE (FB_RUN_ID_MAX + 1)

/* Returns 1 if run is a valid run id (above), else 0 (NULL included). */
int fb_run_id_valid(const char *run);

/* Writes a new random run id ("fiber-3f9a1c2e") to out (at least
 * FB_RUN_ID_SIZE bytes).  Returns 0 or FIBER_ESYS. */
int fb_run_id_new(char *out, size_t size);

/* The directory that holds this user's run directories:
 * $TMPDIR/fiber-<euid>, where a TMPDIR that is unset, empty or longer than
 * 60 bytes means /tmp (so that socket paths under it stay short).  Does
 * not create it.  Returns 0 or FIBER_EINVAL (does not fit). */
int fb_run_base(char *out, size_t size);

/* run's directory, <fb_run_base()>/<run>.  Does not create it.  Returns 0
 * or FIBER_EINVAL (invalid id, does not fit). */
int fb_run_dir(const char *run, char *out, size_t size);

/* The directory holding run's job logs: <log_dir>/<run> when log_dir
 * (configured; "" when not) is set, else <run_dir>/logs.  Returns 0 or
 * FIBER_ECONFIG (does not fit). */
int fb_run_log_dir_of(const char *run, const char *run_dir,
                      const char *log_dir, char *out, size_t size);
/* The same, with log_dir read from the caller's configuration
 * (fiber_config_get), for processes that are not the run's master. */
int fb_run_log_dir(const char *run, const char *run_dir, char *out,
                   size_t size);

/* The files of a run directory. */
#define FB_RUN_SOCKET "master.sock"   /* the master's unix listener */
#define FB_RUN_PIDFILE "master.pid"   /* the master's pid */
#define FB_RUN_LOCKFILE "master.lock" /* flocked for the master's life */
#define FB_RUN_OBJSOCKET "objects.sock"

/* The bootstrap secret: the random token a run's processes prove they
 * belong with (FB_WIRE_TOKEN_LEN bytes); fills out with fresh random
 * bytes. */
void fb_run_secret_new(void *out, size_t len);

/* The environment variables that carry a run's identity to its
 * processes. */
#define FB_ENV_RUN "FIBER_BOOT_RUN"         /* the run id */
#define FB_ENV_ADDR "FIBER_BOOT_ADDR"       /* where a job dials */
#define FB_ENV_NAME "FIBER_BOOT_NAME"       /* a job's name */
#define FB_ENV_SECRET_FD "FIBER_BOOT_SECRET_FD"     /* local: the pipe */
#define FB_ENV_SECRET_FILE "FIBER_BOOT_SECRET_FILE" /* containers, Slurm */

/* The labels on a run's containers and pods (and Kubernetes Secrets): the
 * run id, the role ("master", "job", "secret"), the job's name and its
 * runtime job id ("0" for the master). */
#define FB_LABEL_RUN "fiber.run"
#define FB_LABEL_ROLE "fiber.role"
#define FB_LABEL_NAME "fiber.name"
#define FB_LABEL_JOB "fiber.job"

#endif /* FB_RUNID_H */
