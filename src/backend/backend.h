/*
 * backend.h -- the ops table every cluster-manager backend fills in.
 *
 * A backend turns a job spec into a running job (a local process, a
 * container, a Slurm job, a pod), reports when it ends and how, stops it,
 * and reads its logs.  fiber has no scheduler of its own: the backend's
 * engine decides where jobs run.
 *
 * Threading: the runtime calls every op with its lock held, so ops on one
 * backend are never concurrent and a backend needs no locking of its own.
 * An op never releases that lock, not even around a slow step: another
 * thread would find the runtime half-changed (a backend being opened, a
 * job half-made).  So an op calls nothing that takes the lock
 * (fiber_config_get and the other public calls do): it reads its
 * configuration from be->cfg.  Ops must not block for long; the comment
 * on each says how long it may.  What must take longer (an image build)
 * runs where no runtime loop waits on it: in init, which is called from
 * fb_service_start before the service thread exists, or in a thread of
 * the backend's own that touches no runtime state (say so where it is
 * started, and join it in fini).
 *
 * Ownership: the runtime allocates struct fb_backend (with state_size bytes
 * of private state at ->state) and each struct fb_job (with job_size bytes
 * at ->priv), zeroed, and frees them after fini / release_job.  A backend
 * never frees them itself.
 *
 * Core code calls the small fb_backend_* wrappers at the end of this file,
 * never the table directly.
 */
#ifndef FB_BACKEND_H
#define FB_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "fiber/fiber.h"
#include "runtime/config.h"

enum fb_job_state {
    FB_JOB_RUNNING = 0, /* created; may still be queued by the engine */
    FB_JOB_EXITED = 1,  /* ended; exit_status is valid */
};

/* The local backend hands the bootstrap secret to the child on this
 * descriptor (a pipe holding exactly the secret, then EOF). */
#define FB_SECRET_FD 3

struct fb_job_spec {
    const char *program;   /* absolute path of the executable */
    char *const *argv;     /* NULL-terminated; argv[0] is what ps shows */
    char *const *env;      /* NULL-terminated NAME=value strings added to
                              (and overriding) the master's environment */
    const void *secret;    /* bootstrap secret, delivered so that only the
                              job (and its user) can read it; the backend
                              tells the child where in env
                              (FIBER_BOOT_SECRET_FD or _FILE) */
    size_t secret_len;
    const char *name;      /* job name, unique within the run */
    const fiber_job_opts *opts; /* resources, image, workdir; may be NULL */
    uint64_t job_id;
    const char *run_dir;   /* the run's private directory (mode 0700) on
                              this host; container backends mount it and
                              keep their per-job files there */
    const char *log_dir;   /* where the job writes its log file (may lie
                              outside run_dir, may not exist yet) */
    char *const *forkserver_argv; /* NULL, or the job command's fork server
                              (fiber_job_forkserver_set), which a backend
                              may ask to fork this job instead of starting
                              program; the same for every job of a run */
    char *const *forkserver_env; /* what it adds to the master's environment
                              (the job command's); may be NULL */
};

struct fb_job {
    uint64_t id;          /* the runtime's job id */
    long pid;             /* OS pid where the backend has one, else -1 */
    int state;            /* enum fb_job_state */
    int exit_status;      /* when EXITED: exit code >= 0, or -signal */
    char engine_id[64];   /* the engine's name for the job (a container id,
                             a Slurm job id "1234_7"), for messages; "" when
                             it has none (yet) */
    uint64_t end_by_ms;   /* when (fb_now_ms) the engine will end the job
                             for its time limit, estimated early; 0 = no
                             limit known.  A backend whose engine has time
                             limits sets it from poll_job once the job
                             runs (slurm: squeue's time left) */
    void *priv;           /* job_size bytes for the backend */
};

struct fb_backend {
    const struct fb_backend_ops *ops;
    const struct fb_config *cfg; /* valid from init to fini */
    const char *run_id;          /* the run's id (runtime/runid.h); valid
                                    from init to fini */
    void *state;                 /* state_size bytes for the backend */
};

struct fb_backend_ops {
    /* The name used in configuration ("local"). */
    const char *name;

    /* FB_CAP_* bits. */
    unsigned caps;
#define FB_CAP_SAME_HOST 0x1u /* jobs run on this host: ipc sockets work */
#define FB_CAP_LOOPBACK 0x2u  /* jobs share this host's network: they can
                                 dial the master on 127.0.0.1 */
#define FB_CAP_OWN_GRACE 0x4u /* the engine itself kills a job
                                 terminate_grace_ms after signal_job asked
                                 it to stop (the kubelet), and reports the
                                 end seconds later: the runtime forces only
                                 FB_OWN_GRACE_SLACK_MS after that grace.
                                 90 s: a CI run's kubelet, beside image
                                 imports into the same Docker Engine,
                                 reported a SIGTERM'd container's end more
                                 than 32 s after the deletion */
#define FB_OWN_GRACE_SLACK_MS 90000

    size_t state_size;
    size_t job_size;

    /* Prepares the backend (checks that its engine is reachable).  May
     * block for a few seconds talking to the engine, and for as long as a
     * preparation the configuration asks for takes (docker_build_image:
     * building the program's image, a second or more): it runs before the
     * service thread starts, so only other threads' fiber calls wait for
     * it, as they would for the backend anyway.  Returns 0 or a FIBER_E*
     * code with fiber_last_error() saying what is wrong and what to do; on
     * failure fini is not called. */
    int (*init)(struct fb_backend *be);

    /* Releases what init acquired.  Every job has been released before.
     * Must not fail. */
    void (*fini)(struct fb_backend *be);

    /* Starts a job.  May block briefly (a fork/exec, one engine request).
     * On success fills job->pid and sets job->state = FB_JOB_RUNNING; the
     * backend keeps no pointer to spec.  On failure returns FIBER_ESPAWN
     * (or another code) with a message saying why (an exec failure is such
     * an error, never a silent exit), and nothing is left running. */
    int (*create_job)(struct fb_backend *be, const struct fb_job_spec *spec,
                      struct fb_job *job);

    /* Returns a descriptor that becomes readable when the job may have
     * changed state (a pidfd), owned by the backend; or -1 if the backend
     * has none, in which case the runtime calls poll_job periodically.
     * Does not block. */
    int (*event_fd)(struct fb_backend *be, struct fb_job *job);

    /* Refreshes job->state and, once the job has ended, job->exit_status,
     * reaping whatever the engine keeps (no zombies).  Does not block.
     * Returns 0, or a code if the engine could not be asked (state
     * unchanged). */
    int (*poll_job)(struct fb_backend *be, struct fb_job *job);

    /* Asks the job to stop: force = 0 politely (SIGTERM), force = 1 at once
     * (SIGKILL).  Does not wait for it to end.  Signalling an ended job is
     * not an error.  Returns 0 or a code. */
    int (*signal_job)(struct fb_backend *be, struct fb_job *job, int force);

    /* Appends what the job wrote to its output, as far as the backend keeps
     * it, to out.  May be NULL when the backend keeps no logs (the local
     * backend's children write to the master's terminal).  Returns 0,
     * FIBER_ENOTSUP, or another code. */
    int (*logs)(struct fb_backend *be, struct fb_job *job, fiber_buf *out);

    /* Optional (NULL: each job is submitted by create_job).  The runtime
     * calls begin_batch before creating several jobs that may go to the
     * engine together (a pool's workers) and end_batch after them; in
     * between, create_job may only record a job (state RUNNING, no engine
     * id yet) and end_batch submits what was recorded (one Slurm array
     * job).  end_batch may block like create_job.  If it fails, each job
     * it could not submit reads as EXITED with status 127 from poll_job,
     * and it returns the first failure's code with its message.  A job
     * signalled or released before end_batch is never submitted. */
    void (*begin_batch)(struct fb_backend *be);
    int (*end_batch)(struct fb_backend *be);

    /* Frees the job's backend resources.  Called once, after the job ended
     * or after a forced stop.  Must not fail. */
    void (*release_job)(struct fb_backend *be, struct fb_job *job);

    /* Optional (NULL: nothing to do).  In a master that `fiber run
     * --requeue` started on this backend (FIBER_BOOT_REQUEUE=1), at
     * fiber_init, before the backend opens: what the engine needs done
     * at each start of a requeueable master, and how many times the run
     * was restarted before this start (*resumed, for fiber_resumed()).
     * May block on the engine for a while (kubernetes: waits for the
     * previous master's pod to end).  0 or a code: fiber_init fails. */
    int (*master_boot)(const struct fb_config *cfg, int *resumed);

    /* Optional (NULL: never).  In any master, whatever backend it is
     * configured for: how many times its engine says it restarted the
     * program (Slurm's SLURM_RESTART_COUNT of a requeued job), from the
     * environment, or 0.  For fiber_resumed() when the configuration's
     * `resumed` is 0.  Must not block. */
    int (*restarts)(void);
};

/* Writes the path of the program spec runs to out: spec->program, with
 * "/proc/self/exe" (the runtime's default) replaced by the file it links
 * to, which a job on another host or in a container can execute at the
 * same path.  Returns 0, FIBER_ESYS or FIBER_EINVAL (too long). */
int fb_job_program(const struct fb_job_spec *spec, char *out, size_t size);

/* Marks job as ended with status (an exit code >= 0, or -signal). */
static inline void fb_job_exited(struct fb_job *job, int status)
{
    job->state = FB_JOB_EXITED;
    job->exit_status = status;
}

/* Turns an engine's exit code into fiber's status: an init process or a
 * shell reports a program killed by signal n as 128 + n, which fiber
 * reports as -n, as the local backend does (a program that calls
 * exit(128 + n) itself reads the same; fiber's children report their
 * task's code over the connection, which takes precedence); a code
 * outside 0..255 reads as 255. */
int fb_exit_status_of_code(long long code);

/* Returns the ops table of the backend named name, or NULL with a message
 * listing the backends that exist. */
const struct fb_backend_ops *fb_backend_find(const char *name);

/* "local, docker, slurm, kubernetes": the registry's backends, for
 * messages. */
const char *fb_backend_names(void);

/* The wrappers core code uses.  fb_backend_master_boot calls the
 * backend's master_boot, if it has one, and raises cfg->resumed to what
 * it says. */
int fb_backend_master_boot(struct fb_config *cfg);
/* The first positive count a backend's restarts op gives, in the
 * registry's order, else 0. */
int fb_backend_restarts(void);
/* Opens backend name for the run run_id with the configuration cfg (both
 * must outlive it: they are be->run_id and be->cfg). */
int fb_backend_open(struct fb_backend **out, const char *name,
                    const struct fb_config *cfg, const char *run_id);
void fb_backend_close(struct fb_backend *be);
int fb_backend_create_job(struct fb_backend *be,
                          const struct fb_job_spec *spec, struct fb_job **out);
int fb_backend_event_fd(struct fb_backend *be, struct fb_job *job);
int fb_backend_poll_job(struct fb_backend *be, struct fb_job *job);
int fb_backend_signal_job(struct fb_backend *be, struct fb_job *job,
                          int force);
/* Releases the job (killing it first if it still runs) and frees it;
 * returns its final exit status. */
int fb_backend_release_job(struct fb_backend *be, struct fb_job *job);
/* Brackets the creation of several jobs that may be submitted together
 * (see begin_batch); no-ops for backends without batches. */
void fb_backend_begin_batch(struct fb_backend *be);
int fb_backend_end_batch(struct fb_backend *be);
/* Appends the job's output to out; FIBER_ENOTSUP when the backend keeps
 * none. */
int fb_backend_logs(struct fb_backend *be, struct fb_job *job,
                    fiber_buf *out);

extern const struct fb_backend_ops fb_backend_local;
extern const struct fb_backend_ops fb_backend_docker;
extern const struct fb_backend_ops fb_backend_slurm;
extern const struct fb_backend_ops fb_backend_kubernetes;

#endif /* FB_BACKEND_H */
