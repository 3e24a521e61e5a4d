/*
 * local.h -- what the local backend's job ops (local.c) and run ops
 * (runs.c) share.
 */
#ifndef FB_LOCAL_H
#define FB_LOCAL_H

#include <spawn.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct fb_job_spec;

/* This process's environment with each of set[] ("NAME=value") added or
 * replacing the variable of the same name; when set names one twice, the
 * last wins.  A calloc'd NULL-terminated array the caller frees (the
 * strings are borrowed), or NULL on ENOMEM. */
char **fb_local_env(const char *const *set, size_t n_set);

/* Sets attr so that a spawned child starts with no signal blocked and
 * every signal at its default disposition.  0, or -1. */
int fb_local_spawn_attr(posix_spawnattr_t *attr);

/* ---- the fork server's client (forkserver.c) ---- */

struct fb_forksrv_exit {
    uint64_t job_id;
    int status; /* exit code, or -signal */
};

struct fb_forksrv {
    int fd;     /* our end of its socket; -1 before it starts */
    pid_t pid;  /* the server, our child; 0 when none */
    int broken; /* gave up on it: every job is spawned */
    struct fb_forksrv_exit *exits; /* reported, not yet claimed */
    size_t n_exits, cap_exits;
};

/* Returned by fb_forksrv_fork when the job must be spawned instead. */
#define FB_FORKSRV_SPAWN 1

/* Asks the server (started on first use, from spec's forkserver_argv) to
 * fork the job whose full environment is env, handing it secret_fd and
 * our standard descriptors.  Blocks until it answers, at most timeout_ms
 * (and as long again for the server to get ready the first time).
 * Returns 0 with the job's *pid and *pidfd (ours to close);
 * FB_FORKSRV_SPAWN when the server cannot do it (it is unusable or broke:
 * logged; spawn the job instead); or FIBER_ESPAWN with the reason the
 * job cannot start (nothing started). */
int fb_forksrv_fork(struct fb_forksrv *fs, const struct fb_job_spec *spec,
                    char *const *env, int secret_fd, int timeout_ms,
                    pid_t *pid, int *pidfd);

/* The exit status the server reported for job, waiting up to timeout_ms
 * for the report.  Returns 1 with *status, 0 when none came, -1 when the
 * server has gone (the report will never come). */
int fb_forksrv_exit(struct fb_forksrv *fs, uint64_t job, int timeout_ms,
                    int *status);

/* Ends the server (it exits when its socket closes) and reaps it. */
void fb_forksrv_stop(struct fb_forksrv *fs);

#endif /* FB_LOCAL_H */
