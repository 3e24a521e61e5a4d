/*
 * runs.h -- what runs.c (listing, logs, kill, clean) and launch.c
 * (fiber_run_start) share: where local runs live and how they are named.
 */
#ifndef FB_RUNS_H
#define FB_RUNS_H

#include <stddef.h>

/* The directory that holds this user's run directories:
 * $TMPDIR/fiber-<euid>, with the runtime's rule for TMPDIR (core/service.c:
 * unset, empty or longer than 60 bytes means /tmp, so that socket paths
 * stay short).  Returns 0 or FIBER_EINVAL (does not fit). */
int fb_runs_base(char *out, size_t size);

/* Returns 1 if run can name a run: 1..63 of [A-Za-z0-9_.-], not starting
 * with '.'.  Anything else could escape the base directory. */
int fb_run_id_valid(const char *run);

/* The directory holding run's job logs: <log_dir>/<run> when log_dir is
 * configured, else <run_dir>/logs.  Returns 0 or FIBER_ECONFIG. */
int fb_run_log_dir(const char *run, const char *run_dir, char *out,
                   size_t size);

/* Reads <run_dir>/master.pid and returns the pid if that process still
 * runs and is the one that was recorded (it started before the file was
 * written), else -1. */
long fb_run_pidfile_master(const char *run_dir);

/* The name of the file fiber_run_start writes; a future runtime may write
 * it too. */
#define FB_RUN_PIDFILE "master.pid"

#endif /* FB_RUNS_H */
