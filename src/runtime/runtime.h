/*
 * runtime.h -- the runtime object: roles, the run's identity and secret,
 * the master's listener, its jobs, and the service thread.
 *
 * There is one runtime per process (struct fb_runtime, defined in
 * runtime.c).  It holds most of the library's global mutable state, not
 * all: the task registry, the log's settings, and a few servers, clients
 * and tables of other folders keep their own, each behind its own lock
 * (docs/architecture.md, "The runtime", lists them).
 *
 * Jobs.  Every job the master starts has a record (struct fb_jobrec) owned
 * by the API object that started it (a fiber_process today).  The record
 * links the backend's job, the child's connection once it has dialed in and
 * proved itself, and what the child reported.  The owner reacts to the
 * job's life through fb_owner_ops callbacks, which the service thread calls
 * with the runtime lock held.
 *
 * The service thread (service.c) is started by the master with its first
 * job and stopped by fiber_shutdown().  It owns the listening socket and
 * the connections that have not yet authenticated; it reaps ended jobs and
 * escalates SIGTERM to SIGKILL.  It is not on any task's data path.
 */
#ifndef FB_RUNTIME_H
#define FB_RUNTIME_H

#include <pthread.h>
#include <stdint.h>

#include "backend/backend.h"
#include "net/gate.h"
#include "net/net.h"
#include "runtime/config.h"
#include "runtime/runid.h"
#include "wire/wire.h"

/* Exit codes of a child that fails before or outside its task. */
#define FB_EXIT_BOOT 120        /* bootstrap environment or secret unusable */
#define FB_EXIT_UNREACHABLE 121 /* could not dial the master */
#define FB_EXIT_REJECTED 122    /* the master refused it (token, build id) */
#define FB_EXIT_PROTO 123       /* the master sent something unexpected */
#define FB_EXIT_MASTER_LOST 124 /* the connection to the master ended */
#define FB_EXIT_NOTASK 125      /* asked to run a task it does not have */

struct fb_jobrec;

struct fb_owner_ops {
    const char *kind; /* "process", "pool" */
    /* If set, connected() takes the connection: it moves j->conn (its fd
     * and buffers, WELCOME queued in out) to the owner, which then drives
     * it; the service thread no longer watches it and message() is not
     * called. */
    int takes_conn;
    /* The child authenticated; j->conn is live.  The owner may append
     * frames to j->conn.out: the service thread flushes them. */
    void (*connected)(struct fb_jobrec *j);
    /* A frame arrived on j->conn.  Returns 0, or nonzero to drop the
     * connection and terminate the job (a confused child). */
    int (*message)(struct fb_jobrec *j, const struct fb_wire_hdr *h,
                   const uint8_t *payload);
    /* The job ended; j->job->exit_status is valid. */
    void (*ended)(struct fb_jobrec *j);
};

struct fb_jobrec {
    uint64_t id;
    char name[64];
    struct fb_job *job; /* the backend's; NULL once released */
    const struct fb_owner_ops *ops;
    void *owner;

    struct fb_conn conn; /* valid while connected */
    int connected;       /* authenticated connection live */
    int ever_connected;
    int ended;           /* job has exited and been reaped */
    long pid;            /* the backend's pid for the job, or -1 */
    int exit_status;     /* once ended: the backend's exit status */
    int event_fd;        /* registered backend event fd, or -1 */

    int reported;        /* child sent EXIT */
    int reported_code;
    char failure[512];   /* why it failed, if known (EXIT text, REJECT) */
    char note[600];      /* the last NOTE its target sent */
    int has_note;

    uint64_t kill_at_ms; /* SIGKILL if still running then; 0 = none */

    struct fb_jobrec *hash_next;
    struct fb_jobrec *prev, *next;
};

/* fiber_init's work, once the API layer has registered its hooks
 * (init/init.c, runtime/hooks.h): in a child it never returns. */
int fb_rt_init(int *argc, char ***argv);

/* Returns 1 in the master after fiber_init(). */
int fb_rt_is_master(void);

/* The runtime lock, held around every jobrec access and backend call. */
void fb_rt_lock(void);
void fb_rt_unlock(void);

/* Waits on the runtime's condition (signalled whenever any job changes
 * state) until deadline_ms.  Lock held.  Returns 0 or FIBER_ETIMEDOUT. */
int fb_rt_wait(uint64_t deadline_ms);

/* The configuration in force (lock held, or read-only fields). */
const struct fb_config *fb_rt_config(void);
/* Hands what net/ uses of the configuration down to it (fb_net_configure):
 * called wherever the configuration in force is loaded or changed. */
void fb_rt_config_changed(void);

/* Makes a process in which fiber_init was never called (a child that
 * multiprocessing or another program started, which was handed a
 * serialised queue or pipe end) able to use a handle on a run's object
 * server: loads the configuration (defaults, .fiberconfig, FIBER_*
 * environment), libsodium and the program's build id, which a HELLO must
 * carry.  Nothing else of a run (no role, no listener, no jobs).  A no-op
 * once done, or after fiber_init.  Returns 1 when it set the process up
 * now, 0 when there was nothing to do, or a negative code. */
int fb_rt_client_setup(void);

/* Bracket a series of fb_rt_launch calls whose jobs the backend may submit
 * together (a pool's workers: one Slurm array job).  Lock NOT held by the
 * caller.  fb_rt_batch_end returns 0 or the code of a submission that
 * failed (its jobs then end with status 127, and the message says why). */
void fb_rt_batch_begin(void);
int fb_rt_batch_end(void);

/* Writes the engine's name for j's job (its fiber name when the engine
 * has none) to id, and the last max_lines lines of its output, as far as
 * the backend keeps it, to lines, joined by " | ".  Returns 1 when there
 * was output, else 0 (lines = "").  Lock NOT held; may ask the engine
 * (one request). */
int fb_rt_job_output_tail(struct fb_jobrec *j, char *id, size_t id_size,
                          char *lines, size_t lines_size, int max_lines);

/* Starts a job running this program (program == NULL) or another one (for
 * tests), owned by owner.  name NULL picks "<prefix>-<n>".  On success
 * *out is a new record, registered with the service thread.  Lock NOT
 * held by the caller.  Returns 0 or a code; nothing runs on failure. */
int fb_rt_launch(struct fb_jobrec **out, const char *prefix, const char *name,
                 const fiber_job_opts *opts, const struct fb_owner_ops *ops,
                 void *owner, const char *program);

/* Asks the job to stop; SIGKILL follows after terminate_grace_ms (plus
 * FB_OWN_GRACE_SLACK_MS where the engine kills on its own and reports
 * the end late, so that the job's own end is what it reads).  Lock
 * held.  Returns 0 or a code. */
int fb_rt_terminate(struct fb_jobrec *j);

/* As fb_rt_terminate, for a job nobody will read the end of (a pool
 * worker retired before it connected): the forced end comes right after
 * terminate_grace_ms, without the engine's slack.  A pod deleted while
 * the kubelet was still creating its container can stay Terminating
 * until forced (its container stuck in CreateContainerConfigError, its
 * volumes torn down): 90 s of a retired worker counted alive. */
int fb_rt_terminate_unread(struct fb_jobrec *j);

/* Kills the job if it still runs, waits for it, releases its backend
 * resources, unregisters and frees the record.  Lock NOT held. */
void fb_rt_forget(struct fb_jobrec *j);

/* Queues a frame already appended to j->conn.out for sending (wakes the
 * service thread if it could not all be written).  Lock held. */
void fb_rt_kick(struct fb_jobrec *j);

/* ---- for tests ---- */
/* The run's token and the program's build id. */
const uint8_t *fb_rt_token(void);
const char *fb_rt_build_id(void);
/* The address children dial ("unix:/..." or "tcp:..."), starting the
 * listener if needed.  Returns "" if it cannot start. */
const char *fb_rt_address(void);
/* Connections dropped for failing authentication or sending garbage. */
uint64_t fb_rt_dropped_peers(void);
/* Unauthenticated connections closed to make room because
 * max_pending_connections were waiting (also counted as dropped). */
uint64_t fb_rt_refused_peers(void);

/* ---- between runtime.c, service.c and child.c ---- */
#define FB_MAX_OVERRIDES 64
#define FB_HASH_BUCKETS 4096

struct fb_runtime {
    int initialized;
    int master;     /* 1 master, 0 child */
    int client;     /* fb_rt_client_setup ran (not a job of any run) */
    int shut_down;
    pthread_mutex_t lock;
    pthread_cond_t changed; /* any job ended, reported, connected */

    struct fb_config cfg;
    char *override_key[FB_MAX_OVERRIDES]; /* fiber_config_set, in order */
    char *override_val[FB_MAX_OVERRIDES];
    int n_overrides;

    uint8_t token[FB_WIRE_TOKEN_LEN];
    char build_id[FB_WIRE_BUILD_ID_MAX + 1];
    char run_id[FB_RUN_ID_SIZE];
    char argv0[256];
    char **job_argv;    /* fiber_job_command_set: program and arguments */
    char **job_env;     /* and extra NAME=value strings; NULL: none */
    char **forkserver_argv; /* fiber_job_forkserver_set; NULL: none */
    char run_dir[512];  /* "" until the listener starts */
    char log_dir[512];  /* effective log directory for children */
    char log_file[512]; /* the log_file key made absolute; "" when unset */
    char address[600];  /* what children dial */

    /* master: service state (service.c) */
    struct fb_backend *backend;
    int listen_fd, epoll_fd, wake_fd;
    pthread_t service_thread;
    int service_running, service_stop;
    struct fb_gate gate;        /* connections not yet authenticated */

    /* master: jobs */
    uint64_t next_job_id;
    uint64_t next_proc_num;
    struct fb_jobrec *jobs; /* all live records */
    struct fb_jobrec *hash[FB_HASH_BUCKETS];
    int n_polled_jobs;      /* jobs without an event fd */
};

struct fb_runtime *fb_rt(void);
int fb_service_start(void);    /* lock held */
void fb_service_stop(void);    /* lock NOT held */
void fb_service_wake(void);
int fb_service_watch_job(struct fb_jobrec *j);  /* lock held */
void fb_service_unwatch_job(struct fb_jobrec *j); /* lock held */
struct fb_jobrec *fb_rt_find_job(uint64_t id); /* lock held */
void fb_rt_job_ended(struct fb_jobrec *j);     /* lock held */

/* Computes this program's build id (hex) into out (>= 65 bytes). */
int fb_build_id(char *out, size_t size);

/* Ends the stop event (stop.c): waits for stop callbacks still running,
 * stops the stop thread, gives SIGTERM and SIGUSR1 their default actions
 * back.  Called first by fiber_shutdown(); lock NOT held. */
void fb_stop_shutdown(void);
void fb_stop_await_requeue_exit(void);

/* The child role: never returns. */
void fb_child_main(void) __attribute__((noreturn));

#endif /* FB_RUNTIME_H */
