/*
 * fiber.h -- the public API of fiber, a multiprocessing-style library whose
 * every process is a job run by a cluster manager (local processes by
 * default; Docker, Slurm and Kubernetes as backends).
 *
 * This header is the manual.  Every declaration says what it does, what it
 * returns, who owns what, and what a failure leaves behind.
 *
 * Conventions that hold for every function below unless its own comment
 * says otherwise:
 *
 *   - A function returns 0 on success or a negative FIBER_E* code.  On
 *     failure, fiber_last_error() returns a message for the calling thread
 *     that says what went wrong in words ("task 'squre' is not registered;
 *     registered tasks: cube, square").
 *   - A failed call leaves its outputs and the objects it was given as they
 *     were before the call.
 *   - Destructors (fiber_*_free) accept NULL and then do nothing.
 *   - Handles are opaque.  A handle is checked with a magic number, so using
 *     a freed or foreign pointer fails with FIBER_EINVAL where it can be
 *     detected instead of corrupting memory (detection is best effort).
 *   - Timeouts are in milliseconds; a negative timeout waits forever and 0
 *     polls.
 *
 * The process model (SPMD): one executable plays every role.  main() calls
 * fiber_init() first.  In the master it returns; in a job that a backend
 * started it never returns: the child dials the master, proves it belongs
 * (a per-run random token and the program's build id), runs what it is told
 * to run, and exits.  Task functions are found by name, registered at load
 * time with FIBER_TASK().
 */
#ifndef FIBER_FIBER_H
#define FIBER_FIBER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FIBER_VERSION_MAJOR 0
#define FIBER_VERSION_MINOR 1
#define FIBER_VERSION_PATCH 0
#define FIBER_VERSION_STRING "0.1.0"

#if defined(__GNUC__)
#define FIBER_API __attribute__((visibility("default")))
#define FIBER_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define FIBER_API
#define FIBER_PRINTF(f, a)
#endif

/* ------------------------------------------------------------------------
 * Errors
 *
 * One table generates the codes, their names (fiber_errname) and their
 * texts (fiber_strerror), so the three cannot drift apart.
 * X(NAME, value, text)
 * ------------------------------------------------------------------------ */
#define FIBER_ERRNO_MAP(X)                                                     \
    X(EINVAL, -1, "invalid argument")                                          \
    X(ENOMEM, -2, "out of memory")                                             \
    X(ENOTASK, -3, "task is not registered")                                   \
    X(ETIMEDOUT, -4, "timed out")                                              \
    X(ECLOSED, -5, "closed")                                                   \
    X(ECRASHED, -6, "the worker running the task died")                        \
    X(EPROTO, -7, "malformed or unexpected message")                           \
    X(EAUTH, -8, "peer failed authentication")                                 \
    X(EBUILD, -9, "peer was built from a different program")                   \
    X(ECONFIG, -10, "bad configuration")                                       \
    X(ESYS, -11, "system call failed")                                         \
    X(EBACKEND, -12, "backend error")                                          \
    X(ESPAWN, -13, "could not start job")                                      \
    X(ESTATE, -14, "not valid in the object's current state")                  \
    X(ETASK, -15, "task failed")                                               \
    X(ETOOBIG, -16, "message too large")                                       \
    X(ENOTSUP, -17, "not supported")                                           \
    X(ENOTINIT, -18, "fiber_init() has not been called")                       \
    X(EUNREACHABLE, -19, "peer or engine unreachable")                         \
    X(EAGAIN, -20, "would block: empty or full")                               \
    X(ENOKEY, -21, "no such key or index")

enum fiber_error {
    FIBER_OK = 0,
#define FIBER_X_ENUM(name, value, text) FIBER_##name = value,
    FIBER_ERRNO_MAP(FIBER_X_ENUM)
#undef FIBER_X_ENUM
};

/* Returns a static, human-readable text for code ("timed out").  Unknown
 * codes give "unknown error".  Never returns NULL. */
FIBER_API const char *fiber_strerror(int code);

/* Returns the code's symbolic name ("FIBER_ETIMEDOUT", "FIBER_OK"), or
 * "FIBER_E?" for an unknown code.  Never returns NULL. */
FIBER_API const char *fiber_errname(int code);

/* Returns the calling thread's message about its most recent failed fiber
 * call.  The text stays valid until the thread's next fiber call.  When no
 * call has failed on this thread, returns "".  Never returns NULL. */
FIBER_API const char *fiber_last_error(void);

/* ------------------------------------------------------------------------
 * Growable byte buffers: how task results travel.
 *
 * A zero-initialised fiber_buf is an empty buffer ready for use.  data is
 * owned by the buffer; fiber_buf_free releases it and resets the buffer to
 * empty.
 * ------------------------------------------------------------------------ */
typedef struct fiber_buf {
    unsigned char *data; /* len bytes of content; NULL when cap == 0 */
    size_t len;          /* bytes in use */
    size_t cap;          /* bytes allocated */
} fiber_buf;

/* Appends n bytes from p.  Returns 0 or FIBER_ENOMEM (buffer unchanged). */
FIBER_API int fiber_buf_append(fiber_buf *b, const void *p, size_t n);

/* Makes room for at least n more bytes beyond len.  Returns 0 or
 * FIBER_ENOMEM (buffer unchanged). */
FIBER_API int fiber_buf_reserve(fiber_buf *b, size_t n);

/* Releases the buffer's memory and makes it empty.  NULL is a no-op. */
FIBER_API void fiber_buf_free(fiber_buf *b);

/* ------------------------------------------------------------------------
 * Tasks
 *
 * A task is a function found by name in every process of the program:
 *
 *     FIBER_TASK(square) {
 *         int x;
 *         if (len != sizeof x) return fiber_task_fail("want an int");
 *         memcpy(&x, arg, sizeof x);
 *         x *= x;
 *         return fiber_buf_append(out, &x, sizeof x);
 *     }
 *
 * Inside the body, arg/len are the argument bytes (owned by fiber, valid
 * during the call) and out is an empty result buffer the task may append
 * to.  The return value is the task's result code: for a fiber_process it
 * becomes the exit code (a task that returns fiber_task_fail(...) exits
 * with 1, as a Python process whose target raised); elsewhere 0 means
 * success and any other value is a failure whose message fiber_task_fail()
 * sets.
 *
 * FIBER_TASK registers the function from a constructor that runs at load
 * time, so master and workers agree on the names without shipping code.
 * Names must be unique within a program and at most 63 bytes of
 * [A-Za-z0-9_].
 * ------------------------------------------------------------------------ */
typedef int (*fiber_task_fn)(const void *arg, size_t len, fiber_buf *out);

struct fiber_task_def {
    const char *name;
    fiber_task_fn fn;
    struct fiber_task_def *next; /* registry link; owned by fiber */
};

/* Registers def (which must stay valid for the life of the program; the
 * FIBER_TASK macro uses static storage).  A duplicate or invalid name is
 * remembered and reported by fiber_init(), which then fails with
 * FIBER_EINVAL: constructors cannot report errors themselves. */
FIBER_API void fiber_task_register(struct fiber_task_def *def);

/* Sets the calling task's failure message (printf-style) and returns
 * FIBER_ETASK, so a task can write `return fiber_task_fail("...")`. */
FIBER_API int fiber_task_fail(const char *fmt, ...) FIBER_PRINTF(1, 2);

/* Looks up a registered task.  Returns 0 if name is registered, or
 * FIBER_ENOTASK with a message that lists the registered names. */
FIBER_API int fiber_task_lookup(const char *name, fiber_task_fn *fn);

#define FIBER_TASK(tname)                                                      \
    static int fiber_task_body_##tname(const void *arg, size_t len,            \
                                       fiber_buf *out);                        \
    __attribute__((constructor)) static void fiber_task_ctor_##tname(void)     \
    {                                                                          \
        static struct fiber_task_def def = {#tname, fiber_task_body_##tname,   \
                                            NULL};                             \
        fiber_task_register(&def);                                             \
    }                                                                          \
    static int fiber_task_body_##tname(__attribute__((unused)) const void *arg, \
                                       __attribute__((unused)) size_t len,     \
                                       __attribute__((unused)) fiber_buf *out)

/* ------------------------------------------------------------------------
 * Runtime
 * ------------------------------------------------------------------------ */

/* Starts fiber.  Call it first in main(), before any other fiber call
 * except fiber_config_set().
 *
 * In the master (a program a user started), it loads the configuration
 * (code > FIBER_* environment > .fiberconfig in the working directory),
 * creates the run's random token and returns 0.  It may remove fiber's own
 * arguments from argc/argv (there are none today).
 *
 * In a child job started by a backend it never returns: the child dials the
 * master, authenticates, runs its assignment and exits.  A watchdog thread
 * ends the child as soon as its connection to the master closes (tens of
 * milliseconds after a master is killed, in the tests).
 *
 * The master also raises its soft descriptor limit to the hard limit, since
 * it holds a socket per job.
 *
 * Returns 0, FIBER_ECONFIG (bad configuration; the message names the key
 * and where it came from), FIBER_EINVAL (a FIBER_TASK name was invalid or
 * registered twice), FIBER_ESTATE (called twice) or FIBER_ESYS. */
FIBER_API int fiber_init(int *argc, char ***argv);

/* Stops everything fiber started in this process: terminates jobs that are
 * still running, closes sockets, removes the run's socket directory.  It is
 * registered with atexit() by fiber_init(), so calling it is optional.
 * Handles must not be used afterwards, except to free them.  Idempotent. */
FIBER_API void fiber_shutdown(void);

/* Returns 1 in the master, 0 in a child job (whose task code may call it),
 * and -1 before fiber_init(). */
FIBER_API int fiber_is_master(void);

/* Returns the run's name ("fiber-3f9a1c2e"), shared by the master and all
 * its jobs, or "" before fiber_init(). */
FIBER_API const char *fiber_run_id(void);

/* Returns the library version string, "0.1.0". */
FIBER_API const char *fiber_version(void);

/* Sets the command every job of this run starts with, for language
 * bindings whose program is an interpreter and a script (the Python
 * package runs its jobs as `python3 -m fiber._bootstrap`).  argv is
 * NULL-terminated: argv[0] is the absolute path of the executable, which a
 * job on another host or in a container runs at the same path; a job gets
 * these arguments followed by "--fiber-job=<name>".  env (may be NULL) is
 * NULL-terminated "NAME=value" strings added to every job's environment
 * (after the configuration's FIBER_* variables; FIBER_BOOT_* names are
 * refused).  argv NULL restores the default: the master's own executable,
 * as a C program's jobs run.  Both are copied.
 *
 * The job command runs the same fiber code as the master: a child calls
 * fiber_init() like any other, and the build id (see fiber_init) covers
 * both the executable and the shared object libfiber is linked into, so a
 * child with another build of the binding is refused.
 *
 * May be called before or after fiber_init(), in the master, before the
 * first job starts.  Returns 0, FIBER_EINVAL (a relative program path,
 * more than 32 arguments, a malformed env entry), FIBER_ESTATE (a job has
 * already started), FIBER_ENOTSUP (in a child), FIBER_ENOMEM; nothing
 * changes on failure. */
FIBER_API int fiber_job_command_set(const char *const *argv,
                                    const char *const *env);

/* Names a fork server for the job command: a program that prepares an
 * interpreter once (the Python package's `python3 -m fiber._forkserver`
 * imports the master's main module) and then forks each job from it, so
 * a job starts in milliseconds instead of paying the interpreter's start
 * and imports again.  Only the local backend uses it, and only while the
 * configuration's fork_server is on (the default); other backends, and C
 * programs without a job command, start every job as before.
 *
 * The local backend starts the server lazily, with the first job, with
 * the job command's environment and the descriptor of a SOCK_SEQPACKET
 * socket in FIBER_FORKSERVER_FD, and speaks to it in one-datagram
 * messages (docs/architecture.md, "The fork server", has the protocol).
 * The server forks each job, hands back its pidfd and reports its exit
 * status.  When the server cannot start or stops answering, the backend
 * logs why and starts every later job with posix_spawn; a job already
 * forked keeps running.
 *
 * argv is NULL-terminated, argv[0] an absolute path; NULL removes the
 * server.  May be called in the master before the first job starts.
 * Returns 0, FIBER_EINVAL, FIBER_ESTATE (a job has already started),
 * FIBER_ENOTSUP (in a child), FIBER_ENOMEM; nothing changes on failure. */
FIBER_API int fiber_job_forkserver_set(const char *const *argv);

/* ------------------------------------------------------------------------
 * Stop requests and resumption
 *
 * Clusters end jobs for reasons of their own: a Slurm time limit or
 * pre-emption, a Kubernetes eviction or node drain.  Each warns first with
 * a signal to the master:
 *
 *   SIGUSR1  Slurm, a set time before the job's time limit, when the job
 *            asked for it (`fiber run --signal <seconds>`, which is sbatch's
 *            --signal=B:USR1@<seconds>);
 *   SIGTERM  Slurm at the time limit, on pre-emption, on scancel and on
 *            scontrol requeue (SIGKILL follows after the cluster's
 *            KillWait or GraceTime); Kubernetes when the pod is deleted or
 *            evicted (SIGKILL follows after the pod's termination grace
 *            period); `fiber kill` (SIGKILL after terminate_grace_ms).
 *
 * fiber turns the first of these into one event: the callbacks registered
 * with fiber_on_stop_requested() run, and fiber_stop_requested() turns
 * nonzero, so that a program can checkpoint and end before it is killed.
 * ------------------------------------------------------------------------ */

/* A stop callback: user as registered, sig the signal that asked
 * (SIGTERM or SIGUSR1). */
typedef void (*fiber_stop_fn)(void *user, int sig);

/* The exit status of a master that ends to be requeued (EX_TEMPFAIL).  A
 * master started by `fiber run --requeue` ends with it as soon as its
 * stop callbacks have returned (flushing stdio and stopping its jobs
 * first), and the backend's batch script requeues the run under the same
 * name (slurm; on kubernetes the master's Job makes a new pod when the
 * old one is deleted, whatever its status); a program may also exit with
 * it itself to ask for a requeue (slurm). */
#define FIBER_EXIT_REQUEUE 75

/* Registers fn to run once when the master is asked to stop, and arms the
 * stop event.  fn may be NULL: the event is armed, for a program that only
 * polls fiber_stop_requested().  Several callbacks (at most 16) run in the
 * order they were registered.
 *
 * Until the first call, fiber leaves the signals alone: SIGTERM and
 * SIGUSR1 end the program, as their default actions do.  From the first
 * call until fiber_shutdown():
 *   - the first SIGTERM or SIGUSR1 requests the stop: the callbacks run
 *     on fiber's stop thread, not in a signal handler, one after the
 *     other, with no lock of fiber's held, so they may call any fiber
 *     function (run a pool's map, write a checkpoint, call exit());
 *     the program's other threads go on meanwhile;
 *   - a second SIGTERM ends the program as it always did (its default
 *     action is back once the first stop signal arrived), and so does
 *     SIGINT, which fiber never handles; later SIGUSR1s are ignored;
 *   - fiber_shutdown() (and so exit()) waits for a callback that is still
 *     running, then gives both signals their default actions back.
 * A handler the program installed for SIGTERM or SIGUSR1 is replaced.
 *
 * Registered after the stop was requested and delivered, fn runs at once
 * on the caller's thread, before this returns.
 *
 * In a master that `fiber run --requeue` started (FIBER_BOOT_REQUEUE=1 in
 * its environment), the program ends once the last callback returns:
 * fiber_shutdown(), then exit status FIBER_EXIT_REQUEUE, without running
 * atexit handlers (other threads are still running); the callbacks must
 * therefore have saved what the restarted run needs.  Once the callbacks
 * have started, a program that ends by itself meanwhile (its loop saw
 * fiber_stop_requested() and returned from main) still ends with
 * FIBER_EXIT_REQUEUE: its fiber_shutdown() waits for the stop thread's
 * end instead of letting another status through, which would not be
 * requeued.
 *
 * Only in the master.  Returns 0, FIBER_ENOTINIT (before fiber_init()),
 * FIBER_ENOTSUP (in a child job), FIBER_EINVAL (a 17th callback) or
 * FIBER_ESYS. */
FIBER_API int fiber_on_stop_requested(fiber_stop_fn fn, void *user);

/* Returns 0 until a stop was requested, then the signal that asked
 * (SIGTERM, SIGUSR1): a flag to check between iterations.  Always 0 while
 * the event is not armed (see fiber_on_stop_requested).  Async-signal-safe
 * and lock-free. */
FIBER_API int fiber_stop_requested(void);

/* Returns how many times this run was restarted after its master was
 * stopped: the configuration key `resumed` (FIBER_RESUMED=<count>, which
 * `fiber run --requeue` sets in a requeued Slurm master; on kubernetes,
 * the starts the master's Job counted before this one, read at
 * fiber_init), else Slurm's SLURM_RESTART_COUNT in a master that runs as
 * a Slurm batch job, else 0.
 * A program that sees a nonzero count loads its checkpoint.  0 in a child
 * job and before fiber_init(). */
FIBER_API int fiber_resumed(void);

/* ------------------------------------------------------------------------
 * Configuration
 *
 * Keys (the full reference is docs/configuration.md):
 *   backend              local|docker                (default local)
 *   log_level            error|warn|info|debug       (default warn)
 *   log_dir              directory for child logs    (default
 *                        $TMPDIR/fiber-<uid>/<run>/logs)
 *   transport            ipc|tcp  how local children dial (default ipc)
 *   listen_host          address to listen on for tcp (default 127.0.0.1)
 *   connect_timeout_ms   how long a child may take to dial and prove
 *                        itself (default 30000)
 *   terminate_grace_ms   SIGTERM to SIGKILL delay (default 2000)
 *   max_message_bytes    largest frame a peer may send (default 64 MiB)
 *   encryption           encrypt and authenticate tcp connections with
 *                        the run's token (default true)
 *   max_pending_connections  connections that may wait to authenticate
 *                        at once; the oldest makes room (default 256)
 *   heartbeat_ms         children say they are alive this often; a pool
 *                        worker silent for 10 intervals is lost (default
 *                        1000; 0 = off)
 *   image                container image jobs run in, unless a job's
 *                        options name one (docker; default none: make one
 *                        with `fiber image build`)
 *   docker_socket        the Docker engine's unix socket (default
 *                        /var/run/docker.sock)
 *   docker_network       network mode of docker jobs (default host, so
 *                        they reach the master on loopback)
 *   docker_mounts        extra bind mounts for docker jobs,
 *                        "src:dst[:ro],..." (default none)
 *
 * With a backend whose jobs may not share this host's unix sockets
 * (docker), the master uses transport tcp whatever transport says.
 *
 * Each key can be set in .fiberconfig (INI: "key = value", optionally under
 * a [fiber] section), in the environment as FIBER_<KEY> (upper case), or in
 * code with fiber_config_set(); code wins over the environment, which wins
 * over the file.  An unknown key or a bad value is an error naming the key
 * and where it came from.
 * ------------------------------------------------------------------------ */

/* Sets key to value with the highest priority.  May be called before
 * fiber_init().  Returns 0, or FIBER_ECONFIG for an unknown key or a value
 * that does not parse (nothing changes then). */
FIBER_API int fiber_config_set(const char *key, const char *value);

/* Copies the effective value of key into buf (NUL-terminated, truncated to
 * size).  Returns 0 or FIBER_ECONFIG for an unknown key. */
FIBER_API int fiber_config_get(const char *key, char *buf, size_t size);

/* ------------------------------------------------------------------------
 * Logging
 * ------------------------------------------------------------------------ */
enum fiber_log_level {
    FIBER_LOG_ERROR = 0,
    FIBER_LOG_WARN = 1,
    FIBER_LOG_INFO = 2,
    FIBER_LOG_DEBUG = 3,
};

/* Writes one line to fiber's log when level is at or below the configured
 * log_level: stderr in the master, <log_dir>/<run id>/<process name>.log
 * in a child (created with its first line).  Each line carries a timestamp, the level, the process name and pid. */
FIBER_API void fiber_log(int level, const char *fmt, ...) FIBER_PRINTF(2, 3);

/* ------------------------------------------------------------------------
 * Job options: where and how a job runs.
 *
 * Zero-initialise and set what you need; NULL/0 fields take the defaults.
 * The struct is only read during the call it is passed to.
 * ------------------------------------------------------------------------ */
typedef struct fiber_job_opts {
    const char *name;       /* process name; default "Process-<n>" */
    const char *backend;    /* overrides the configured backend */
    const char *image;      /* container image (container backends) */
    int cpu;                /* CPUs to reserve; 0 = backend default */
    int memory_mb;          /* memory limit in MiB; 0 = none */
    int gpu;                /* GPUs; 0 = none */
    const char *const *env; /* extra "NAME=value" strings, NULL-terminated */
    const char *workdir;    /* working directory; default: the master's */
} fiber_job_opts;

/* ------------------------------------------------------------------------
 * Processes: the analogue of multiprocessing.Process.
 * ------------------------------------------------------------------------ */
typedef struct fiber_process fiber_process;

/* Starts a job that runs task `task` with the argument bytes arg/len (copied;
 * the caller keeps its memory).  On success *out is a new handle that the
 * caller frees with fiber_process_free().
 *
 * The task name is checked before any job is launched: an unknown name
 * fails with FIBER_ENOTASK and starts nothing.  Other failures:
 * FIBER_ENOTINIT, FIBER_EINVAL (bad arguments or job name),
 * FIBER_ESPAWN (the backend could not start the job; the message says
 * why), FIBER_ETOOBIG (argument larger than max_message_bytes),
 * FIBER_ENOTSUP (an option the backend cannot honour, another backend than
 * the run's, or a call from a child job), FIBER_ECLOSED (after
 * fiber_shutdown), FIBER_ESYS (the run's socket could not be set up).  On
 * failure *out is left unchanged and no job runs. */
FIBER_API int fiber_process_start(fiber_process **out, const char *task,
                                  const void *arg, size_t len,
                                  const fiber_job_opts *opts);

/* Waits up to timeout_ms for the job to end.  Returns 0 once it has ended
 * (its exit code is then available), FIBER_ETIMEDOUT if it is still
 * running. */
FIBER_API int fiber_process_join(fiber_process *p, int timeout_ms);

/* Asks the job to stop (SIGTERM for local processes) and, if it has not
 * ended after terminate_grace_ms, kills it (SIGKILL).  Does not wait; use
 * fiber_process_join().  Terminating an ended job is a no-op returning 0. */
FIBER_API int fiber_process_terminate(fiber_process *p);

/* Kills the job at once (SIGKILL for local processes; the engine's
 * forced stop elsewhere), as Python's Process.kill().  Does not wait.
 * Killing an ended job is a no-op returning 0. */
FIBER_API int fiber_process_kill(fiber_process *p);

/* Returns 1 while the job runs, 0 once it has ended, or a negative code. */
FIBER_API int fiber_process_is_alive(fiber_process *p);

/* Stores the job's exit code in *code once it has ended: the task's return
 * value as the child reported it; if the child ended without reporting,
 * its exit status, or minus the signal number that killed it (as Python's
 * multiprocessing does).  Returns 0, or FIBER_ESTATE while it still runs. */
FIBER_API int fiber_process_exitcode(fiber_process *p, int *code);

/* Returns the job's operating-system process id as the backend sees it
 * (local: the pid), or -1 if it has none. */
FIBER_API long fiber_process_pid(fiber_process *p);

/* Returns the process name ("Process-1" or the name given in the job
 * options).  The string lives as long as the handle. */
FIBER_API const char *fiber_process_name(fiber_process *p);

/* Frees the handle.  A job that is still running is terminated first and
 * reaped (this may wait up to terminate_grace_ms).  NULL is a no-op. */
FIBER_API void fiber_process_free(fiber_process *p);

/* ------------------------------------------------------------------------
 * Pools: the analogue of multiprocessing.Pool, built for millions of short
 * tasks on many workers.
 *
 * Each worker is a job of the configured backend.  Dispatch is pull-based:
 * idle workers get work first, and a worker holds only as much work as
 * keeps it busy (about a millisecond's worth: at least two short tasks,
 * one task longer than 100 ms), so a slow or stuck worker never hoards tasks
 * that others could run.  Tiny tasks are grouped into chunks automatically,
 * sized from the measured task time.
 *
 * Resilience: when a worker's job ends or it stops heart-beating, the tasks
 * it held go back to the queue one by one and a replacement starts.
 *
 * Time limits: a worker whose job the engine will end at a time limit
 * (Slurm's --time: slurm_time_limit, or sbatch's own default) is retired
 * time_limit_margin_ms before it (by default the larger of 10 s and four
 * times the tasks it holds, at their measured duration): it gets no new
 * task, a replacement starts at once, and it exits once its tasks are
 * answered, so no task is cut off by the limit (workers_retired_at_limit
 * counts them; none of their tasks is retried).  A
 * task that crashes its worker (a fatal signal, or exit()) is named by the
 * worker itself and charged; when a worker vanishes without a word
 * (SIGKILL, the OOM killer) holding several tasks, each of them runs alone
 * next time, so that a second death is charged to the right one.  Once a
 * task has been charged max_task_crashes times (default 3) it fails with
 * FIBER_ECRASHED.  Every result reaches the caller exactly once.
 *
 * Threads: pool calls may be made from any thread.  The thread that waits
 * (map, apply, future_get, imap_next, join) runs the pool's I/O itself, so
 * a result travels from the worker's socket to the caller with no thread
 * hop.  When no caller is waiting and work is outstanding, the pool's own
 * background thread takes over, so asynchronous work progresses and
 * callbacks run while the program does other things.  Callbacks run on
 * whichever of those threads completed the work, without the pool's lock
 * held; they may call pool functions but must not wait on the same pool.
 * ------------------------------------------------------------------------ */
typedef struct fiber_pool fiber_pool;
typedef struct fiber_future fiber_future;
typedef struct fiber_imap fiber_imap;

typedef struct fiber_pool_opts {
    int workers;          /* workers to start; 0 = one per online CPU */
    int min_workers;      /* autoscaling bounds: with max_workers > 0 the */
    int max_workers;      /* pool grows under a backlog and shrinks when idle */
    int idle_ms;          /* autoscaling: idle time before shrinking (2000) */
    const fiber_job_opts *job; /* how each worker job runs; may be NULL */
    const char *initializer;   /* task run once in each worker; may be NULL */
    const void *initarg;       /* its argument (copied) */
    size_t initarg_len;
    int maxtasksperchild;  /* retire a worker after this many tasks; 0 = never */
    int max_task_crashes;  /* 0 = 3 */
} fiber_pool_opts;

typedef struct fiber_pool_stats {
    uint64_t tasks_submitted;
    uint64_t tasks_done;      /* completed, successfully or not */
    uint64_t tasks_failed;    /* completed with an error */
    uint64_t tasks_retried;   /* sent again after their worker was lost */
    uint64_t tasks_crashed;   /* failed with FIBER_ECRASHED */
    uint64_t duplicates_dropped;
    uint64_t workers_started;
    uint64_t workers_lost;    /* ended without being asked to */
    int workers_alive;        /* started and not yet ended */
    int workers_target;
    size_t tasks_queued;      /* submitted, not yet sent to a worker */
    size_t tasks_in_flight;   /* sent, result not yet back */
    int workers_starting;     /* of workers_alive: launched, not yet
                                 connected and initialized */
    uint64_t workers_retired_at_limit; /* drained and replaced ahead of
                                          their job's time limit */
} fiber_pool_stats;

/* One input of fiber_pool_map_bufs. */
typedef struct fiber_iov {
    const void *data;
    size_t len;
} fiber_iov;

/* A completion callback: rc is 0 or the task's failure code
 * (FIBER_ETASK, FIBER_ECRASHED, FIBER_ECLOSED when the pool was
 * terminated, FIBER_ESPAWN when no worker could start, FIBER_ENOMEM);
 * data/len are its result
 * bytes, or its failure message when rc != 0.  The memory is valid only
 * during the call. */
typedef void (*fiber_done_fn)(void *ud, int rc, const void *data, size_t len);

/* Creates a pool and starts its workers (it does not wait for them to
 * connect: tasks queue until they do).  opts may be NULL (one worker per
 * CPU).  The initializer, if any, must be a registered task; a worker whose
 * initializer fails exits, and after three workers in a row fail so, every
 * pending task fails with FIBER_ESPAWN and the initializer's message.
 * Returns 0, FIBER_ENOTINIT, FIBER_EINVAL, FIBER_ENOTASK (initializer) or
 * the backend's error for the first worker. */
FIBER_API int fiber_pool_create(fiber_pool **out, const fiber_pool_opts *opts);

/* Runs task once with arg and waits for it.  On success the result bytes
 * are appended to out (which may be NULL to discard them).  Returns 0,
 * FIBER_ETASK (the task failed; fiber_last_error() has its message),
 * FIBER_ECRASHED, FIBER_ENOTASK, FIBER_ECLOSED (pool closed),
 * FIBER_ESPAWN (no worker could start), FIBER_ETOOBIG (argument over half
 * of max_message_bytes), FIBER_EINVAL. */
FIBER_API int fiber_pool_apply(fiber_pool *p, const char *task,
                               const void *arg, size_t len, fiber_buf *out);

/* Submits task with arg (copied) and returns at once.  *out (if out is not
 * NULL) receives a future the caller frees with fiber_future_free(); cb (if
 * not NULL) is called with ud once the task completes.  At least one of out
 * and cb should be given.  When too much work is already queued the call
 * waits for room (backpressure), so memory stays bounded.  If the call
 * fails, cb is never called. */
FIBER_API int fiber_pool_apply_async(fiber_pool *p, const char *task,
                                     const void *arg, size_t len,
                                     fiber_done_fn cb, void *ud,
                                     fiber_future **out);

/* Runs task over n fixed-size records: in[i] is in + i * in_size bytes,
 * and each task must return exactly out_size bytes, stored at out + i *
 * out_size.  chunksize 0 chooses chunks automatically.  Waits for all n.
 * Returns 0 when every task succeeded; otherwise the code of the failed
 * task with the lowest index (fiber_last_error() names it and gives its
 * message), with the outputs of every successful task filled in.  A task
 * that returns a result of another size fails with FIBER_ETASK. */
FIBER_API int fiber_pool_map(fiber_pool *p, const char *task, const void *in,
                             size_t in_size, size_t n, void *out,
                             size_t out_size, size_t chunksize);

/* fiber_pool_map without waiting: in and out must stay valid until the
 * future is ready.  fiber_future_get() then returns what map would have. */
FIBER_API int fiber_pool_map_async(fiber_pool *p, const char *task,
                                   const void *in, size_t in_size, size_t n,
                                   void *out, size_t out_size,
                                   size_t chunksize, fiber_future **f);

/* Runs task over n variable-size inputs.  out[i] (an array of n buffers,
 * zero-initialised or reused) receives result i, or the failure message
 * of task i; codes (may be NULL) receives each task's code (0,
 * FIBER_ETASK, FIBER_ECRASHED).  Returns as fiber_pool_map does. */
FIBER_API int fiber_pool_map_bufs(fiber_pool *p, const char *task,
                                  const fiber_iov *in, size_t n,
                                  fiber_buf *out, int *codes,
                                  size_t chunksize);

/* fiber_pool_map_bufs without waiting: in (and the bytes it points to),
 * out and codes must stay valid until the future is ready, and the
 * future must not be freed before then (free waits for it).
 * fiber_future_get() then returns what map_bufs would have; the results
 * are in out and codes, not in get's buffer. */
FIBER_API int fiber_pool_map_bufs_async(fiber_pool *p, const char *task,
                                        const fiber_iov *in, size_t n,
                                        fiber_buf *out, int *codes,
                                        size_t chunksize, fiber_future **f);

/* fiber_pool_map_bufs_async over gathered inputs: task i's argument is
 * the bytes of parts[first[i]] .. parts[first[i + 1] - 1] back to back
 * (first has n + 1 entries, first[0] == 0, never decreasing), so that a
 * small header and a large payload (a pickle and a numpy array's data)
 * leave without first being joined into one buffer: each task's bytes
 * are copied once, into the worker's connection, when it is sent.
 * parts, the bytes they point to, first, out and codes must stay valid
 * until the future is ready.  FIBER_EINVAL names a malformed first or a
 * NULL part with a length; FIBER_ETOOBIG an argument over half of
 * max_message_bytes. */
FIBER_API int fiber_pool_map_gather_async(fiber_pool *p, const char *task,
                                          const fiber_iov *parts,
                                          const size_t *first, size_t n,
                                          fiber_buf *out, int *codes,
                                          size_t chunksize, fiber_future **f);

/* Starts task over n fixed-size input records and returns an iterator over
 * the results: in order of input when ordered is 1 (imap), in order of
 * completion when 0 (imap_unordered).  At most a bounded window of results
 * is held at a time, so a slow consumer slows dispatch rather than growing
 * memory.  in must stay valid until the iterator is freed. */
FIBER_API int fiber_pool_imap(fiber_pool *p, const char *task, const void *in,
                              size_t in_size, size_t n, size_t chunksize,
                              int ordered, fiber_imap **it);

/* Starts an imap whose inputs are given one at a time, of any size, with
 * fiber_imap_put (or _put_gather) and ended with fiber_imap_end: a long
 * or endless sequence, or one computed as results come back.  The pool
 * chooses how many inputs travel in one message (chunksize 0: from the
 * tasks' measured times) and retries each input alone.  At most window
 * inputs (0: 4,096) are held whose results were not yet taken; each is
 * copied, and the copy freed once its result is in.  fiber_imap_next
 * takes results as for fiber_pool_imap; it fails with FIBER_ESTATE when
 * every input put so far has been taken and the iterator was not ended,
 * and with FIBER_ECLOSED once it was ended and all were taken.  Inputs
 * may still be put after fiber_pool_close (they belong to this call),
 * not after fiber_pool_terminate.  Returns 0, FIBER_EINVAL,
 * FIBER_ECLOSED, FIBER_ESPAWN, FIBER_ENOTASK or FIBER_ENOMEM. */
FIBER_API int fiber_pool_imap_stream(fiber_pool *p, const char *task,
                                     size_t chunksize, int ordered,
                                     size_t window, fiber_imap **it);

/* Puts one input (copied) of a stream.  Returns 0, FIBER_EAGAIN when the
 * window is full (take a result first), FIBER_ESTATE after
 * fiber_imap_end, FIBER_ETOOBIG (over half of max_message_bytes),
 * FIBER_ECLOSED (terminated pool), FIBER_EINVAL (not a stream). */
FIBER_API int fiber_imap_put(fiber_imap *it, const void *data, size_t len);

/* Puts up to n inputs as fiber_pool_map_gather_async takes them (input
 * i is parts[first[i]] .. parts[first[i + 1] - 1] back to back), as
 * many as the window has room for, and sends them together; *accepted
 * (may be NULL) receives how many.  Returns 0 when at least one was put
 * (or n is 0), else fiber_imap_put's errors; an input refused after
 * others were put ends the call with those put and 0. */
FIBER_API int fiber_imap_put_gather(fiber_imap *it, const fiber_iov *parts,
                                    const size_t *first, size_t n,
                                    size_t *accepted);

/* No more inputs: once every result has been taken, fiber_imap_next
 * fails with FIBER_ECLOSED.  Ending twice is no error. */
FIBER_API int fiber_imap_end(fiber_imap *it);

/* Takes the next result: its input index goes to *index and its bytes are
 * appended to out (the failure message when the task failed).  Returns 0,
 * the task's failure code, FIBER_ECLOSED when all n results have been
 * taken, or FIBER_ETIMEDOUT. */
FIBER_API int fiber_imap_next(fiber_imap *it, size_t *index, fiber_buf *out,
                              int timeout_ms);

/* Frees the iterator; results not yet taken are discarded (tasks already
 * sent still run). NULL is a no-op. */
FIBER_API void fiber_imap_free(fiber_imap *it);

/* Waits up to timeout_ms for the future and takes its result: for an apply,
 * the result bytes are appended to out (may be NULL).  Returns 0, the task's
 * failure code (its message in fiber_last_error()), or FIBER_ETIMEDOUT. May
 * be called again after a timeout. */
FIBER_API int fiber_future_get(fiber_future *f, fiber_buf *out,
                               int timeout_ms);

/* Waits up to timeout_ms for the future.  Returns 0 when ready, else
 * FIBER_ETIMEDOUT. */
FIBER_API int fiber_future_wait(fiber_future *f, int timeout_ms);

/* Returns 1 if the future is ready, 0 if not, or a negative code. */
FIBER_API int fiber_future_ready(fiber_future *f);

/* Returns 1 if the ready future succeeded, 0 if it failed, FIBER_ESTATE if
 * it is not ready. */
FIBER_API int fiber_future_successful(fiber_future *f);

/* Frees the future.  If its task has not finished it still runs; its result
 * is discarded (a callback given to apply_async is still called).  A map
 * future must not be freed before it is ready, since the task writes into
 * the caller's out array: free then waits for it.  NULL is a no-op. */
FIBER_API void fiber_future_free(fiber_future *f);

/* Accepts no more tasks; what was submitted still runs. */
FIBER_API int fiber_pool_close(fiber_pool *p);

/* Waits until every submitted task has completed (and every callback has
 * returned) and, if the pool is closed, until its workers have exited.
 * An iterator is not waited for while the pool is open (its reader paces
 * it); once the pool is closed, an unread iterator is cut: its reader
 * gets the results that came, then FIBER_ECLOSED.  Returns 0 or
 * FIBER_ETIMEDOUT. */
FIBER_API int fiber_pool_join(fiber_pool *p, int timeout_ms);

/* Stops the workers now (SIGTERM, then SIGKILL after the grace period).
 * Tasks not yet completed fail with FIBER_ECLOSED; callbacks are called. */
FIBER_API int fiber_pool_terminate(fiber_pool *p);

/* Changes the number of workers while tasks run.  Growing starts jobs;
 * shrinking retires idle workers first and the others once their current
 * tasks are done (no task is lost).  Takes effect at once, whether or not
 * a call is waiting.  Returns 0, FIBER_EINVAL, or FIBER_ECLOSED (closed
 * pool). */
FIBER_API int fiber_pool_resize(fiber_pool *p, int workers);

/* Fills *st with the pool's counters. */
FIBER_API int fiber_pool_stats_get(fiber_pool *p, fiber_pool_stats *st);

/* Terminates the pool if it is still running and frees it.  Futures and
 * iterators of the pool stay valid (failed with FIBER_ECLOSED if not done)
 * until freed.  NULL is a no-op. */
FIBER_API void fiber_pool_free(fiber_pool *p);

/* Waits until at least n of the pool's workers are connected, have run
 * the initializer and take tasks (Fiber's wait_until_workers_up).
 * Returns 0, FIBER_ETIMEDOUT (fewer after timeout_ms; -1 waits forever),
 * FIBER_EINVAL (n < 0), FIBER_ESPAWN (the workers cannot start: the
 * message says why) or FIBER_ECLOSED (the pool was terminated). */
FIBER_API int fiber_pool_wait_ready(fiber_pool *p, int n, int timeout_ms);

/* ------------------------------------------------------------------------
 * Shared objects: large read-only bytes put once, passed by reference.
 *
 * The master puts a blob and gets a ref: 40 bytes that name the blob by
 * its content (the BLAKE2b-256 hash of the bytes, then their length as a
 * little-endian u64).  A ref is plain bytes: put it in any task argument,
 * queue message or manager value.  A task (or any child) resolves a ref
 * with fiber_object_get: the first use in a process fetches the blob, and
 * later uses, by any task that process runs, read its cache.  The bytes
 * are checked against the hash before they are used.
 *
 * Where the bytes come from.  On one host (the unix transport), the
 * master keeps each blob in shared memory in /dev/shm (files of mode
 * 0600: blobs up to 16 MiB in an arena of 64 MiB files that each child
 * maps once and whose regions the master reuses once no child reads
 * them, larger ones in a file each) and children read that one copy
 * read-only: nothing is sent at all (configuration key `object_shm`,
 * default on; these bytes are not hashed again, since they never left
 * the master's memory).  Otherwise the master serves a blob to the first
 * workers that ask; every worker that holds a blob serves it to others,
 * and the master sends later askers to those holders, so a broadcast
 * spreads as a tree and the master sends only a few copies (at most 4 of
 * each blob while holders remain).  A holder that dies or fails mid-way
 * costs the asker a fetch from someone else (never a wrong byte).  Between
 * hosts this traffic is encrypted like all other (configuration key
 * `encryption`).
 *
 * Each child's cache is bounded (configuration key `object_cache_mb`,
 * default 4096): blobs no task is using are evicted least recently used
 * first, and fetched again if needed.
 *
 * Lifetime: fiber_object_put counts a reference; fiber_object_release
 * drops it.  The master frees the blob when no reference is left and no
 * transfer or pool call (fiber_pool_shared) still uses it; children that
 * cached it keep their copies until evicted.  A ref whose blob is gone
 * fails to resolve with FIBER_ENOKEY.  docs/pool.md#shared-objects has
 * the details and figures.
 * ------------------------------------------------------------------------ */

#define FIBER_REF_LEN 40

typedef struct fiber_ref {
    unsigned char bytes[FIBER_REF_LEN];
} fiber_ref;

/* Master only.  Copies data[0, len) into the run's object store and
 * writes its ref to *ref.  Putting the same bytes again gives the same ref
 * and counts one more reference.  Returns 0, FIBER_EINVAL (NULL ref, or
 * NULL data with len > 0), FIBER_ENOTINIT (before fiber_init, or in a
 * child), FIBER_ENOMEM, or FIBER_ESYS (the object server cannot start). */
FIBER_API int fiber_object_put(const void *data, size_t len, fiber_ref *ref);

/* Resolves ref to its bytes: *data and *len.  In the master, from the
 * store; in a child, from its cache, fetching the blob first if needed
 * (this waits for the transfer).  The bytes are read-only and stay valid:
 * inside a pool task, until the task returns; elsewhere (the master, a
 * process target) until fiber_object_release(ref) by this process.
 * Returns 0, FIBER_EINVAL, FIBER_ENOKEY (no such blob: never put, or
 * released), FIBER_ENOTINIT, FIBER_ENOMEM, FIBER_EPROTO (the master sent
 * bytes that do not match the ref), FIBER_EUNREACHABLE / FIBER_ECLOSED
 * (the master's object server cannot be reached). */
FIBER_API int fiber_object_get(const fiber_ref *ref, const void **data,
                               size_t *len);

/* In a child: as fiber_object_get, but the bytes stay valid until this
 * process calls fiber_object_release(ref), also when called inside a pool
 * task: for values that outlive the task (a binding's arrays that view the
 * bytes, cached from task to task).  Each hold needs its release.  In the
 * master: FIBER_ESTATE (its blobs live while fiber_object_put's
 * references do: read them with fiber_object_get). */
FIBER_API int fiber_object_hold(const fiber_ref *ref, const void **data,
                                size_t *len);

/* In the master: drops one reference that fiber_object_put counted.  In a
 * child: unpins what fiber_object_get pinned outside a task, or what
 * fiber_object_hold pinned (the blob stays cached until evicted).  Returns 0, FIBER_EINVAL or FIBER_ENOKEY
 * (nothing to release). */
FIBER_API int fiber_object_release(const fiber_ref *ref);

/* In a child: 1 when the master has released the blob of ref that this
 * process has cached (what it got stays readable while it is held; the
 * master will not give it to anyone again), 0 when it has not, or when
 * this process cannot tell (a blob fetched over the network) or has no
 * such blob.  Costs a memory read for a blob in the master's arena, an
 * access() for one in a file of its own.  The master: 0.  A binding's
 * cache uses it to let go of values nobody can ask for again. */
FIBER_API int fiber_object_released(const fiber_ref *ref);

/* The calling thread's pool submissions from now on carry ref as their
 * shared argument: every task of each call can read it with
 * fiber_task_shared(), fetched once per worker.  The pool keeps the blob
 * alive until the call is over, whether or not the creator releases it.
 * NULL ends it.  Returns 0 or FIBER_EINVAL.  (Thread-local, so two
 * threads submitting to one pool do not interfere.) */
FIBER_API int fiber_pool_shared(const fiber_ref *ref);

/* Inside a pool task: the shared argument of the call the task belongs
 * to, as fiber_object_get() gives it.  Returns 0, FIBER_ENOKEY (the call
 * has none) or what fiber_object_get returns. */
FIBER_API int fiber_task_shared(const void **data, size_t *len);

/* fiber_pool_map with one shared argument: puts shared[0, shared_len),
 * maps with it as the call's shared argument, releases it.  Returns what
 * fiber_pool_map returns, or what fiber_object_put returns. */
FIBER_API int fiber_pool_map_shared(fiber_pool *p, const char *task,
                                    const void *shared, size_t shared_len,
                                    const void *in, size_t in_size, size_t n,
                                    void *out, size_t out_size,
                                    size_t chunksize);

typedef struct fiber_object_stats {
    uint64_t objects;        /* blobs in this process's store or cache */
    uint64_t bytes_held;     /* their bytes */
    uint64_t bytes_served;   /* blob bytes this process sent to others */
    uint64_t transfers;      /* whole blobs it sent */
    uint64_t redirects;      /* master: askers sent to a holder instead */
    uint64_t fetches;        /* child: blobs it fetched */
    uint64_t fetch_retries;  /* child: fetches that failed at a holder and
                                were asked again */
    uint64_t cache_hits;     /* child: resolves served from its cache */
    uint64_t evictions;      /* child: blobs dropped for room */
    uint64_t shm_bytes;      /* master: bytes it wrote to shared memory for
                                same-host children; child: bytes it mapped
                                from there instead of receiving them */
    uint64_t maps;           /* master: askers told to map its copy */
} fiber_object_stats;

/* This process's shared-object counters.  Returns 0 or FIBER_EINVAL. */
FIBER_API int fiber_object_stats_get(fiber_object_stats *st);

/* ------------------------------------------------------------------------
 * Queues and pipes: byte messages between any processes of a run.
 *
 * A queue lives on an object server: queues the master creates live on
 * the master's own server (a thread of the master, started with the first
 * queue), and a manager can host them too.  A handle is local to a
 * process; to use a queue in a child, serialise the handle into the
 * child's argument (fiber_queue_serialize) and open it there
 * (fiber_queue_open).  The serialised form carries the server's address
 * and the run's token.
 *
 * Delivery: a consumer's handle prefetches a small window of messages (64
 * by default, growing up to 512 only for a consumer that takes them within
 * about 2 ms; fiber_queue_set_prefetch fixes it), so a slow consumer holds
 * at most 64, and waiting consumers are served oldest first.  Nothing is
 * lost when a consumer dies: a message leaves the queue only when an
 * application's get has returned it; the messages a dead consumer had
 * prefetched (SIGKILL, crash, lost connection) go back to the front of
 * the queue, in their order, for the others.  So each message is
 * returned by exactly one get (exactly once to the application); a
 * process killed after its get returned takes that message with it.
 * For work that must be finished, use a lease (fiber_queue_get_lease,
 * fiber_queue_ack): delivery is then at least once.  A handle may be
 * used by several threads at once.
 *
 * Timeouts: a negative timeout waits forever; 0 does not wait and fails
 * with FIBER_EAGAIN when the queue is empty (get) or full (put); a
 * positive one fails with FIBER_ETIMEDOUT when it passes.
 * ------------------------------------------------------------------------ */
typedef struct fiber_queue fiber_queue;
typedef struct fiber_pipe fiber_pipe;

/* Creates a queue holding at most capacity messages (0 = unbounded) on
 * the master's object server.  Only the master creates queues.  The
 * handle is the queue's creator handle: fiber_queue_free on it destroys
 * the queue (fiber_queue_detach drops it without). */
FIBER_API int fiber_queue_create(fiber_queue **out, size_t capacity);

/* Appends a copy of data/len.
 *
 * With timeout_ms >= 0 the call is synchronous: it returns 0 once the
 * server holds the copy, FIBER_EAGAIN (timeout 0) or FIBER_ETIMEDOUT
 * when the queue stayed full, FIBER_ECLOSED (closed queue, or its server
 * is gone).
 *
 * With a negative timeout the put is pipelined: it returns 0 as soon as
 * the message is on its way, with at most 8192 of this handle's puts
 * unanswered (it waits while there are more: the credit window; a full
 * queue holds them on the server, in order, so the capacity still
 * bounds the queue).  Puts in quick succession travel to the server in
 * batches.  The messages arrive in the order they were put.  If one of
 * them fails (the queue was closed, or freed, before it arrived), the
 * next pipelined put, fiber_queue_flush or close returns that failure
 * once (FIBER_ECLOSED); the messages after it are not in the queue
 * either. */
FIBER_API int fiber_queue_put(fiber_queue *q, const void *data, size_t len,
                              int timeout_ms);

/* Appends count messages (msgs[i].data, msgs[i].len), in order, as count
 * pipelined puts (fiber_queue_put with timeout -1) would, but in one
 * call that writes them at once, in one frame (or a few: a frame holds
 * up to 4096 messages or 256 KiB).  For a producer that gathers its
 * messages itself (the Python binding does, to cross from Python to C
 * once a batch): they arrive in order, after this handle's earlier puts,
 * and count against its credit window (the call waits while the window
 * is full, as a pipelined put does).  Returns 0, FIBER_EINVAL (msgs NULL
 * with a count) or FIBER_ETOOBIG (a message exceeds max_message_bytes),
 * in both cases before any is sent, or as fiber_queue_put otherwise. */
FIBER_API int fiber_queue_put_batch(fiber_queue *q, const fiber_iov *msgs,
                                    size_t count);

/* Waits up to timeout_ms until every pipelined put of this handle is in
 * the queue.  Returns 0, the first failure of one of them (as above),
 * FIBER_ETIMEDOUT (also with timeout 0 while some are on their way) or
 * FIBER_ECLOSED (server gone). */
FIBER_API int fiber_queue_flush(fiber_queue *q, int timeout_ms);

/* Takes the oldest message, appending it to out (may be NULL to discard
 * it), waiting up to timeout_ms while the queue is empty.  Returns 0,
 * FIBER_EAGAIN, FIBER_ETIMEDOUT, or FIBER_ECLOSED once the queue is closed
 * and empty (or freed, or its server is gone).  Before it returns, the
 * server is told the message was taken (one small write, no round trip);
 * the handle meanwhile prefetches the next ones. */
FIBER_API int fiber_queue_get(fiber_queue *q, fiber_buf *out, int timeout_ms);

/* As fiber_queue_get with timeout 0, but it never waits and never asks
 * the server: it takes the next message this handle already prefetched,
 * or fails at once with FIBER_EAGAIN when the handle holds none (or
 * another thread of the process is in a get on it); then a
 * fiber_queue_get asks the server.  For callers that must not block
 * where they are (the Python binding calls it holding the interpreter
 * lock, and releases the lock only for a get that may wait).  Returns 0,
 * FIBER_EAGAIN, or a failure of the prefetch (as fiber_queue_get). */
FIBER_API int fiber_queue_try_get(fiber_queue *q, fiber_buf *out);

/* As fiber_queue_get, but the message stays lent to this handle until
 * fiber_queue_ack(q, *lease): if the process dies (or frees the handle)
 * before that, the message goes back to the queue for another consumer.
 * Delivery with leases is at least once: a message can reach a second
 * consumer only when the first died or released it unacknowledged.
 * Leased messages count against the queue's capacity until acknowledged. */
FIBER_API int fiber_queue_get_lease(fiber_queue *q, fiber_buf *out,
                                    uint64_t *lease, int timeout_ms);

/* Acknowledges a lease of this handle: the message is gone for good.
 * Returns 0, FIBER_EINVAL (not a lease this handle holds: acknowledged
 * already, or never given), FIBER_ECLOSED (server gone). */
FIBER_API int fiber_queue_ack(fiber_queue *q, uint64_t lease);

/* Sets how many messages this handle prefetches as a consumer (1..1024;
 * default: 64, adapting between 64 and 512 to the rate the application
 * takes messages, see docs/queue.md).  Setting it fixes the window; 1
 * restores strict one-at-a-time pulling. */
FIBER_API int fiber_queue_set_prefetch(fiber_queue *q, unsigned window);

/* Stores in *n the number of messages in the queue and lent to consumers
 * but not yet taken by an application. */
FIBER_API int fiber_queue_size(fiber_queue *q, size_t *n);

/* Closes the queue for every process: waiting puts and gets fail with
 * FIBER_ECLOSED, further puts fail, and gets drain what is left. */
FIBER_API int fiber_queue_close(fiber_queue *q);

/* Appends the handle's serialised form (tens of bytes) to out. */
FIBER_API int fiber_queue_serialize(fiber_queue *q, fiber_buf *out);

/* Opens a handle from a serialised form, in any process of the run.  A
 * handle opened this way is never the creator's. */
FIBER_API int fiber_queue_open(fiber_queue **out, const void *data,
                               size_t len);

/* Frees the handle.  It first waits until the handle's pipelined puts are
 * in the queue (so a producer may free and exit at once; this waits as
 * long as a full queue stays full), and gives back to the queue what the
 * handle holds as a consumer (prefetched messages and unacknowledged
 * leases).
 *
 * Only the creator's handle (fiber_queue_create) destroys the queue: the
 * server then frees all of it (its messages, those lent to consumers or
 * held under leases, which go with it, and its records), the gets and
 * puts waiting on it in every process fail with FIBER_ECLOSED ("queue
 * 'queue-3' was freed"), and every later call on any other handle fails
 * with FIBER_ECLOSED naming it ("queue 3 on <address> was freed by its
 * creator (fiber_queue_free); this handle is stale").  A consumer handle
 * elsewhere may still return the messages it had prefetched (at most its
 * window) before its gets fail; an ack of a lease after the free does
 * nothing.  Free the creator's handle only when no process needs the
 * queue any more, or use fiber_queue_detach.  Handles opened with
 * fiber_queue_open, or from a manager (fiber_manager_queue), never
 * destroy the queue.  NULL is a no-op. */
FIBER_API void fiber_queue_free(fiber_queue *q);

/* As fiber_queue_free, but never destroys the queue, even on the
 * creator's handle: the queue then lives until its server stops
 * (fiber_shutdown in the master).  NULL is a no-op. */
FIBER_API void fiber_queue_detach(fiber_queue *q);

/* Creates a pipe: with duplex, both ends send and receive; otherwise a
 * sends and b receives.  Only the master creates pipes; either end can be
 * serialised and handed to a child.  When the two ends are first used in
 * two processes, they connect directly (a unix socket on one host, one
 * encrypted TCP connection across hosts; docs/pipe.md): messages then go
 * from end to end, and a send waits while about 1 MiB is unwritten.
 * Until then, and for good when both ends are first used in one process,
 * an end is opened twice, or the other end cannot be dialled, messages
 * go through one queue per direction on the master's object server
 * (capacity 1024 messages; a send with a negative timeout is pipelined as
 * a queue put is).  Either way messages arrive in order, each once.
 * fiber_pipe_free frees an end's handle; the pipe's relayed queues live
 * until the master's server stops. */
FIBER_API int fiber_pipe_create(fiber_pipe **a, fiber_pipe **b, int duplex);

/* Sends a message to the other end (timeouts as for queues).  On a
 * receive-only end: FIBER_ENOTSUP; after this end's close, or once the
 * process holding the other end went away (it died or freed its end; on
 * a pipe that is not connected directly, once the master's rendezvous
 * has seen the only holder of that end go: docs/pipe.md, "A dying
 * peer"): FIBER_ECLOSED. */
FIBER_API int fiber_pipe_send(fiber_pipe *p, const void *data, size_t len,
                              int timeout_ms);

/* Receives the next message from the other end, appending it to out.
 * Returns as fiber_queue_get does: FIBER_ECLOSED once the other end closed
 * and everything sent was received, and also, after what it had sent,
 * when the process holding the other end went away: the connection of a
 * directly connected pipe ended, or (before the link, or relayed) the
 * only process that held or used the other end ended or freed it. */
FIBER_API int fiber_pipe_recv(fiber_pipe *p, fiber_buf *out, int timeout_ms);

/* Closes this end's sending direction: the other end's recv drains what
 * was sent, then gets FIBER_ECLOSED.  It first waits until this end's
 * sends are written (so they are received before the end of the stream,
 * even when the pipe is full and must drain first); their failure, if
 * one failed, is what it returns. */
FIBER_API int fiber_pipe_close(fiber_pipe *p);

/* Serialises an end for fiber_pipe_open in another process.  An end whose
 * handle is connected directly cannot be handed on: FIBER_ESTATE.
 * fiber_pipe_open tells the master's rendezvous which process holds the
 * end (so that its end is noticed even if it never uses it); a process
 * that never called fiber_init (a child another program started) may
 * open ends too, using its own configuration (defaults, .fiberconfig,
 * FIBER_* variables). */
FIBER_API int fiber_pipe_serialize(fiber_pipe *p, fiber_buf *out);
FIBER_API int fiber_pipe_open(fiber_pipe **out, const void *data, size_t len);
/* Frees an end's handle (its pending sends are delivered first; a direct
 * connection then ends, and the other end's recv gets FIBER_ECLOSED after
 * what was sent).  NULL is a no-op. */
FIBER_API void fiber_pipe_free(fiber_pipe *p);

/* ------------------------------------------------------------------------
 * Rings: collectives among N processes (allreduce, broadcast) over float
 * arrays, for data-parallel training.
 *
 * The master creates a ring of n members (fiber_ring_create), serialises
 * it into each member's argument (fiber_ring_serialize) and starts the
 * member processes.  Each member calls fiber_ring_join with its rank,
 * 0..n-1; the call waits until all n have joined (a rendezvous object on
 * the master's object server), then connects the member to its two
 * neighbours, rank+1 and rank-1 modulo n, over sockets of their own: the
 * data of a collective never passes through the master.  Both ends of
 * each link prove that they belong to the run and to this ring; anything
 * else that connects to a member while the ring forms is dropped.  The
 * master may be a member too.  A ring forms once; to form again, create a
 * new ring.
 *
 * Every member makes the same collective calls in the same order with the
 * same sizes, roots, types and operations; a member that does not is
 * detected by its neighbour and the call fails with FIBER_EPROTO.  The
 * algorithm is the ring's: each member sends and receives about twice the
 * array whatever n is, and sends while it receives, so arrays of any size
 * work.  Every member ends with bitwise identical results.  Data travels
 * in the host's byte order: every member runs the same program.
 *
 * Failure: when a member dies, fails or frees its handle, no other member
 * waits for it forever.  Every call that needs data the lost member would
 * have sent or passed on fails, with FIBER_ECLOSED (a link ended) or
 * FIBER_ETIMEDOUT (a member is alive but did not take part in time): in
 * an allreduce the lost member took no part in, that is every member's
 * call.  A member whose part of a call does not depend on it (the root of
 * a broadcast, or one whose neighbour left just after doing its part)
 * completes that call, and a later one fails.  A member that fails closes
 * both its links, so the error travels round the ring within
 * milliseconds.  Once failed, a member stays failed: later calls return
 * FIBER_ESTATE (with the first failure in fiber_last_error()).  A call
 * refused for bad arguments (FIBER_EINVAL) does not break the ring.
 *
 * Threads: a member handle serves one call at a time; a second call made
 * while one runs fails with FIBER_ESTATE.  Different handles may be used
 * by different threads, so one process may hold several members.
 * ------------------------------------------------------------------------ */
typedef struct fiber_ring fiber_ring;

/* The most members a ring may have. */
#define FIBER_RING_MAX_MEMBERS 4096

/* Element types of fiber_ring_allreduce. */
enum fiber_dtype {
    FIBER_FLOAT32 = 1, /* float */
    FIBER_FLOAT64 = 2, /* double */
};

/* Reductions of fiber_ring_allreduce. */
enum fiber_reduce_op {
    FIBER_SUM = 1,  /* elementwise sum */
    FIBER_MEAN = 2, /* elementwise sum divided by the number of members */
    FIBER_MAX = 3,  /* elementwise maximum; a NaN on any member gives NaN */
};

/* Creates a ring of n members (1 to FIBER_RING_MAX_MEMBERS) and its
 * rendezvous on the master's object server, which starts with the first
 * queue, pipe or ring.  On success *out is the creator's handle: it can be
 * serialised and freed, but it is not a member (collectives on it fail
 * with FIBER_ESTATE).  Only the master creates rings (FIBER_ENOTSUP
 * elsewhere).  Returns 0, FIBER_EINVAL, FIBER_ENOTSUP, FIBER_ENOMEM or
 * FIBER_ESYS (the server could not start). */
FIBER_API int fiber_ring_create(fiber_ring **out, int n);

/* Appends the ring's serialised form (tens of bytes: the rendezvous's
 * address, the run's token, n) to out, for a member's task argument.  Any
 * handle of the ring, creator or member, gives the same form.  Returns 0,
 * FIBER_EINVAL or FIBER_ENOMEM. */
FIBER_API int fiber_ring_serialize(fiber_ring *r, fiber_buf *out);

/* Joins the ring whose serialised form is ser/len as member rank, in any
 * process of the run (the master included).  The call listens on a socket
 * of its own (a unix socket in the run's directory, or with transport =
 * tcp a port on listen_host, which the other members must be able to
 * reach), waits until all n members have joined, then links to the
 * neighbours; the listening socket is closed before it returns.
 * timeout_ms bounds the whole join.  On success *member is a new handle
 * that the caller frees with fiber_ring_free().
 *
 * Returns 0; FIBER_EINVAL (not a ring's serialised form, rank out of
 * range, or the rank has already joined); FIBER_ESTATE (this ring has
 * already formed); FIBER_ETIMEDOUT (not every member joined, or a
 * neighbour did not connect, in time); FIBER_ECLOSED (a neighbour left
 * while the ring was being linked, or the master's server is gone);
 * FIBER_EAUTH (a neighbour's address answered as something else);
 * FIBER_ESYS.  On failure *member is unchanged.  A member that fails or
 * dies before the ring forms frees its rank for another process to take. */
FIBER_API int fiber_ring_join(fiber_ring **member, const void *ser,
                              size_t len, int rank, int timeout_ms);

/* Reduces the count elements at data (of type dtype, FIBER_FLOAT32 or
 * FIBER_FLOAT64) over every member with op (FIBER_SUM, FIBER_MEAN,
 * FIBER_MAX), in place: on return, data holds the same result on every
 * member.  Every member must call it with the same count, dtype and op.
 * count may be anything, including 0 and counts smaller than the ring;
 * data may be NULL when count is 0.  With a single member it returns at
 * once.  timeout_ms bounds the whole call.
 *
 * Returns 0; FIBER_EINVAL (bad handle, dtype, op or data; the ring is not
 * affected); FIBER_ESTATE (a creator's handle, a failed ring, or another
 * call on this handle is running); FIBER_ECLOSED (a member died, failed
 * or left); FIBER_ETIMEDOUT; FIBER_EPROTO (the members' calls differ);
 * FIBER_ENOMEM; FIBER_ESYS.  After a failure, data holds partial sums and
 * the ring is broken (see above); the other members' calls fail too. */
FIBER_API int fiber_ring_allreduce(fiber_ring *member, void *data,
                                   size_t count, int dtype, int op,
                                   int timeout_ms);

/* Copies bytes bytes at data on member root to data on every other
 * member.  Every member must call it with the same bytes and root.  The
 * data is passed along the ring in pieces, each forwarded as soon as it
 * arrives, so the time grows little with n.  Returns as
 * fiber_ring_allreduce does (FIBER_EINVAL for a root out of range). */
FIBER_API int fiber_ring_broadcast(fiber_ring *member, void *data,
                                   size_t bytes, int root, int timeout_ms);

/* Returns the member's rank (0..n-1), FIBER_ESTATE for the creator's
 * handle, or FIBER_EINVAL. */
FIBER_API int fiber_ring_rank(fiber_ring *r);

/* Returns the number of members of the ring, or FIBER_EINVAL. */
FIBER_API int fiber_ring_size(fiber_ring *r);

/* Frees the handle.  A member's links close, so the other members' next
 * collective fails with FIBER_ECLOSED (or the current one, if it still
 * needs this member).  The creator's handle does not own the ring: freeing
 * it changes nothing for the members.  NULL is a no-op. */
FIBER_API void fiber_ring_free(fiber_ring *r);

/* ------------------------------------------------------------------------
 * Managers: shared objects served by a process of their own, the analogue
 * of multiprocessing.Manager().
 *
 * A manager is a job of the configured backend whose only work is to host
 * objects: dicts, lists, int64 values, locks, recursive locks, events,
 * semaphores, barriers, conditions, queues, and "custom" objects whose
 * methods are tasks of this program run inside the manager.  Any process
 * of the run can use them: the master opens an object by name, serialises
 * its handle into a child's argument (fiber_mobj_serialize), and the child
 * opens it there (fiber_mobj_open).  Every process talks to the manager
 * directly, over one connection per process that all its handles and
 * threads share.
 *
 * Each object lives in the manager's single serving thread, so every
 * operation is atomic with respect to every other: fiber_value_add from
 * many processes at once loses nothing.
 *
 * Synchronous and asynchronous forms.  Every operation takes a trailing
 * `fiber_future **f`:
 *   - f == NULL: the call waits for the manager's answer, fills its
 *     outputs and returns the status;
 *   - f != NULL: the call sends the request and returns 0 at once with
 *     *f a new future (free it with fiber_future_free); its outputs are
 *     not touched.  A call that cannot be sent fails at once, with no
 *     future: a bad argument, or FIBER_ECLOSED when the manager is already
 *     known to be gone.  fiber_future_get(*f, out, timeout_ms) later returns
 *     the operation's status and appends the answer, if it has one, to
 *     out: the bytes for fiber_dict_get, fiber_list_get/pop and
 *     fiber_custom_call; the keys list for fiber_dict_keys; and for an
 *     operation with a scalar result (a length, a value, an index, is_set)
 *     8 bytes holding an int64_t in host byte order (memcpy them out).
 *     Operations without a result append nothing.
 *   Several calls may be outstanding at once, from any threads; the
 *   manager answers each when it can, in any order (an acquire of a held
 *   lock waits while later calls are answered).  Freeing a future that is
 *   not ready does not cancel its call: an acquire still takes the lock
 *   for the thread that made it.
 *
 * Timeouts (acquire, the waits): a negative timeout waits forever; 0 does
 * not wait and fails with FIBER_EAGAIN when the call would have to; a
 * positive one fails with FIBER_ETIMEDOUT when it passes.  The manager
 * keeps the time.
 *
 * Failures: a missing dict key or an index out of range is FIBER_ENOKEY;
 * an operation on a handle of another kind is FIBER_EINVAL.  A client
 * process that dies does not disturb the manager, and the locks, recursive
 * locks and conditions it held are released to their next waiter
 * (semaphores are not: they have no owner, as in Python).  A manager that
 * dies makes every call on its objects fail with FIBER_ECLOSED, the calls
 * waiting at that moment included, within moments; nothing hangs.
 * ------------------------------------------------------------------------ */
typedef struct fiber_manager fiber_manager;
typedef struct fiber_mobj fiber_mobj;

/* Starts a manager: a job of the configured backend (named "Manager-<n>"
 * unless opts names it; opts may be NULL) that listens on a socket in the
 * run directory, or on TCP when the transport is tcp, and waits up to 30 s
 * until it serves.  Only the master starts managers.  On success *out is a
 * new handle to free with fiber_manager_free().  Returns 0,
 * FIBER_ENOTINIT, FIBER_ENOTSUP (called in a child), FIBER_EINVAL, or
 * FIBER_ESPAWN (the job could not start or did not come up; the message
 * says why); nothing runs after a failure. */
FIBER_API int fiber_manager_start(fiber_manager **out,
                                  const fiber_job_opts *opts);

/* Stops the manager (SIGTERM, then SIGKILL after terminate_grace_ms) and
 * frees the handle.  Its objects go with it: later calls on handles of
 * its objects fail with FIBER_ECLOSED.  The handles themselves must still
 * be freed.  NULL is a no-op. */
FIBER_API void fiber_manager_free(fiber_manager *m);

/* Opening objects.  Each opens the object called name (1..63 bytes) on m,
 * creating it if it does not exist yet, and stores a new handle in *out
 * (free it with fiber_mobj_free).  Opening a name that exists returns that
 * object and ignores the initial values; a name that exists as another
 * kind fails with FIBER_EINVAL.  name NULL creates a new object with a
 * fresh name.  Returns 0, FIBER_EINVAL, FIBER_ENOMEM, or FIBER_ECLOSED
 * (the manager has ended). */

/* A dict: byte-string keys to byte-string values, keys kept in insertion
 * order. */
FIBER_API int fiber_manager_dict(fiber_manager *m, const char *name,
                                 fiber_mobj **out);
/* A list of byte strings. */
FIBER_API int fiber_manager_list(fiber_manager *m, const char *name,
                                 fiber_mobj **out);
/* An int64_t, initially `initial`. */
FIBER_API int fiber_manager_value(fiber_manager *m, const char *name,
                                  int64_t initial, fiber_mobj **out);
/* A lock (Python's Lock): one holder; any thread of any process may
 * release it. */
FIBER_API int fiber_manager_lock(fiber_manager *m, const char *name,
                                 fiber_mobj **out);
/* A recursive lock (RLock): its holder is one thread of one process, who
 * may acquire it again and must release it as many times. */
FIBER_API int fiber_manager_rlock(fiber_manager *m, const char *name,
                                  fiber_mobj **out);
/* An event, initially clear. */
FIBER_API int fiber_manager_event(fiber_manager *m, const char *name,
                                  fiber_mobj **out);
/* A semaphore with value `initial` (>= 0). */
FIBER_API int fiber_manager_semaphore(fiber_manager *m, const char *name,
                                      int64_t initial, fiber_mobj **out);
/* A barrier for `parties` (>= 1) waiters. */
FIBER_API int fiber_manager_barrier(fiber_manager *m, const char *name,
                                    unsigned parties, fiber_mobj **out);
/* A condition variable with its own recursive lock (Python's
 * Condition()). */
FIBER_API int fiber_manager_condition(fiber_manager *m, const char *name,
                                      fiber_mobj **out);
/* A custom object: len bytes of state (copied; may be empty) that tasks
 * of this program read and change inside the manager (fiber_custom_call,
 * fiber_manager_state). */
FIBER_API int fiber_manager_custom(fiber_manager *m, const char *name,
                                   const void *state, size_t len,
                                   fiber_mobj **out);

/* Opens the queue called name (NULL: a new one) on the manager, holding at
 * most capacity messages (0 = unbounded; used only when it is created),
 * and stores a new fiber_queue handle in *out: a queue as in "Queues and
 * pipes" above, living in the manager instead of the master. */
FIBER_API int fiber_manager_queue(fiber_manager *m, const char *name,
                                  size_t capacity, fiber_queue **out);

/* Appends the handle's serialised form (tens of bytes: the manager's
 * address, the run's token, the object and its kind) to out. */
FIBER_API int fiber_mobj_serialize(fiber_mobj *o, fiber_buf *out);

/* Opens a handle from a serialised form, in any process of the run.
 * Returns 0, FIBER_EINVAL (not a serialised fiber_mobj), or the error of
 * connecting to the manager (FIBER_EUNREACHABLE, FIBER_EAUTH, ...). */
FIBER_API int fiber_mobj_open(fiber_mobj **out, const void *data,
                              size_t len);

/* Frees the handle (not the object, which lives until it is released,
 * fiber_mobj_release, or its manager stops).  NULL is a no-op. */
FIBER_API void fiber_mobj_free(fiber_mobj *o);

/* Releases the object for every process, then frees the handle o (in
 * every case but FIBER_EINVAL).  The manager frees the object's state at
 * once (a dict's keys and values, a list's items, a custom object's
 * state; its name becomes free for a new object); the calls waiting on
 * it at that moment, in any process (an acquire of a held lock, an event
 * or condition wait, a barrier wait, a semaphore acquire), fail with
 * FIBER_ECLOSED ("lock 'name' was freed"), and every later call on any
 * other handle of it fails with FIBER_ECLOSED, naming it ("lock 7 on
 * <address> was freed (fiber_mobj_release); this handle is stale").  A
 * lock held at that moment is simply gone: its holder's release fails
 * the same way.
 *
 * Who may release: any handle of the object, in any process: a manager
 * object has no creator (fiber_manager_dict and the others open an
 * existing object of that name as readily as they create one), so the
 * program decides which process ends an object, as it would call
 * unlink() on a shared file.  Release an object only when no process
 * needs it any more; the other handles must still be freed
 * (fiber_mobj_free).  Queues of a manager (fiber_manager_queue) are not
 * released this way: they go with the manager.
 *
 * Returns 0, FIBER_EINVAL (o is not a valid handle; nothing is freed),
 * or FIBER_ECLOSED (the object was released already, or the manager has
 * ended). */
FIBER_API int fiber_mobj_release(fiber_mobj *o);

/* ---- dict ---- */

/* Sets key to a copy of val. */
FIBER_API int fiber_dict_set(fiber_mobj *d, const void *key, size_t klen,
                             const void *val, size_t vlen, fiber_future **f);
/* Appends key's value to out (may be NULL).  FIBER_ENOKEY if absent. */
FIBER_API int fiber_dict_get(fiber_mobj *d, const void *key, size_t klen,
                             fiber_buf *out, fiber_future **f);
/* Removes key.  FIBER_ENOKEY if absent. */
FIBER_API int fiber_dict_del(fiber_mobj *d, const void *key, size_t klen,
                             fiber_future **f);
/* Stores the number of keys in *n (may be NULL). */
FIBER_API int fiber_dict_len(fiber_mobj *d, size_t *n, fiber_future **f);
/* Appends every key, in insertion order, to out as a list of (uint32_t
 * length in host byte order, then the key's bytes). */
FIBER_API int fiber_dict_keys(fiber_mobj *d, fiber_buf *out,
                              fiber_future **f);

/* ---- list ----
 * Indexes are Python's: 0 is the first item, -1 the last. */

/* Appends a copy of val. */
FIBER_API int fiber_list_append(fiber_mobj *l, const void *val, size_t len,
                                fiber_future **f);
/* Appends item index to out (may be NULL).  FIBER_ENOKEY if out of
 * range. */
FIBER_API int fiber_list_get(fiber_mobj *l, int64_t index, fiber_buf *out,
                             fiber_future **f);
/* Replaces item index with a copy of val.  FIBER_ENOKEY if out of range. */
FIBER_API int fiber_list_set(fiber_mobj *l, int64_t index, const void *val,
                             size_t len, fiber_future **f);
/* Stores the number of items in *n (may be NULL). */
FIBER_API int fiber_list_len(fiber_mobj *l, size_t *n, fiber_future **f);
/* Removes item index and appends it to out (may be NULL).  FIBER_ENOKEY
 * if out of range. */
FIBER_API int fiber_list_pop(fiber_mobj *l, int64_t index, fiber_buf *out,
                             fiber_future **f);

/* ---- value ----
 * Arithmetic wraps around (two's complement) instead of overflowing. */

/* Stores the value in *out (may be NULL). */
FIBER_API int fiber_value_get(fiber_mobj *v, int64_t *out, fiber_future **f);
/* Sets the value to x. */
FIBER_API int fiber_value_set(fiber_mobj *v, int64_t x, fiber_future **f);
/* Adds delta and stores the new value in *result (may be NULL). */
FIBER_API int fiber_value_add(fiber_mobj *v, int64_t delta, int64_t *result,
                              fiber_future **f);
/* Compare-and-swap: if the value is expected, sets it to desired.  Stores
 * the value found in *old (may be NULL): the swap happened exactly when
 * *old == expected. */
FIBER_API int fiber_value_cas(fiber_mobj *v, int64_t expected,
                              int64_t desired, int64_t *old,
                              fiber_future **f);

/* ---- lock and rlock ----
 * The holder is the calling thread of the calling process (an
 * asynchronous acquire: the thread that made the call). */

/* Acquires a lock or rlock, waiting up to timeout_ms.  An rlock its caller
 * holds is acquired again at once (it must be released once more).
 * Acquiring a plain lock one already holds waits, as in Python.  Returns
 * 0, FIBER_EAGAIN, FIBER_ETIMEDOUT, FIBER_ECLOSED. */
FIBER_API int fiber_lock_acquire(fiber_mobj *l, int timeout_ms,
                                 fiber_future **f);
/* Releases it; the longest waiter gets it next.  FIBER_ESTATE if it is not
 * held, or, for an rlock, held by another thread or process. */
FIBER_API int fiber_lock_release(fiber_mobj *l, fiber_future **f);

/* ---- event ---- */

/* Sets the flag and wakes every waiter. */
FIBER_API int fiber_event_set(fiber_mobj *e, fiber_future **f);
/* Clears the flag. */
FIBER_API int fiber_event_clear(fiber_mobj *e, fiber_future **f);
/* Stores 1 in *set if the flag is set, else 0 (set may be NULL). */
FIBER_API int fiber_event_is_set(fiber_mobj *e, int *set, fiber_future **f);
/* Waits up to timeout_ms for the flag to be set.  Returns 0 (it is set),
 * FIBER_EAGAIN, FIBER_ETIMEDOUT. */
FIBER_API int fiber_event_wait(fiber_mobj *e, int timeout_ms,
                               fiber_future **f);

/* ---- semaphore ---- */

/* Takes one unit, waiting up to timeout_ms while the value is 0 (waiters
 * are served in order).  Returns 0, FIBER_EAGAIN, FIBER_ETIMEDOUT. */
FIBER_API int fiber_sem_acquire(fiber_mobj *s, int timeout_ms,
                                fiber_future **f);
/* Gives one unit back (any process may, as in Python; there is no upper
 * bound). */
FIBER_API int fiber_sem_release(fiber_mobj *s, fiber_future **f);

/* ---- barrier ---- */

/* Waits up to timeout_ms until `parties` callers are waiting, then all
 * return 0, each with a different *index (may be NULL) from 0 to
 * parties-1 in order of arrival.  As in Python, a wait that gives up
 * breaks the barrier: it returns FIBER_ETIMEDOUT (FIBER_EAGAIN for
 * timeout 0), the others waiting return FIBER_ESTATE, and so does every
 * wait until fiber_barrier_reset(). */
FIBER_API int fiber_barrier_wait(fiber_mobj *b, int timeout_ms, int *index,
                                 fiber_future **f);
/* Returns the barrier to its initial state; callers waiting get
 * FIBER_ESTATE. */
FIBER_API int fiber_barrier_reset(fiber_mobj *b, fiber_future **f);

/* ---- condition ----
 * Its lock is recursive and owned as an rlock's is. */

/* Acquires the condition's lock (as fiber_lock_acquire). */
FIBER_API int fiber_cond_acquire(fiber_mobj *c, int timeout_ms,
                                 fiber_future **f);
/* Releases it (as fiber_lock_release on an rlock). */
FIBER_API int fiber_cond_release(fiber_mobj *c, fiber_future **f);
/* Releases the lock entirely, waits up to timeout_ms for a notify, then
 * takes the lock back (at its former depth) before returning, whatever the
 * outcome: 0 when notified, FIBER_ETIMEDOUT (FIBER_EAGAIN for timeout 0)
 * when not, both with the lock held again.  FIBER_ESTATE (lock not held by
 * the caller) is the only failure that does not hold the lock. */
FIBER_API int fiber_cond_wait(fiber_mobj *c, int timeout_ms,
                              fiber_future **f);
/* Wakes up to n (>= 0) waiters; they return once the caller releases the
 * lock.  FIBER_ESTATE if the caller does not hold the lock. */
FIBER_API int fiber_cond_notify(fiber_mobj *c, int n, fiber_future **f);
/* Wakes every waiter. */
FIBER_API int fiber_cond_notify_all(fiber_mobj *c, fiber_future **f);

/* ---- custom objects ---- */

/* Runs the registered task `task` inside the manager with the argument
 * arg/len, as a method of o: while it runs, fiber_manager_state() gives it
 * o's state, and nothing else runs in the manager (a method is atomic; it
 * should be short, and must not call the same manager, which would wait
 * for itself).  Its result bytes are appended to out (may be NULL).
 * Returns 0, FIBER_ETASK (the task returned nonzero; its
 * fiber_task_fail() message is in fiber_last_error()), FIBER_ENOTASK,
 * FIBER_ECLOSED. */
FIBER_API int fiber_custom_call(fiber_mobj *o, const char *task,
                                const void *arg, size_t len, fiber_buf *out,
                                fiber_future **f);

/* Called by a task running as a custom object's method: stores a pointer
 * to the object's state in *state.  The task may read and change it
 * (append, truncate, rewrite: it is an ordinary fiber_buf owned by the
 * manager) until it returns; the change is what later methods see.
 * Returns 0, or FIBER_ESTATE outside a method. */
FIBER_API int fiber_manager_state(fiber_buf **state);

/* ------------------------------------------------------------------------
 * Images and runs
 *
 * What the `fiber` command (docs/cli.md) is built on, for programs that
 * want to do the same: build a container image of a fiber program, check
 * which backends this host can use, start a program's master as a run, and
 * list, read, stop and clean up runs.  None of these needs fiber_init().
 *
 * A run is a master and the jobs it started, named by its run id
 * (fiber_run_id(), "fiber-3f9a1c2e"; 1 to 31 of A-Z a-z 0-9 _ . -, not
 * starting with '.').  Local runs are found through their
 * run directories, $TMPDIR/fiber-<uid>/<run id>/ (TMPDIR defaults to
 * /tmp), which hold the master's socket (master.sock), the children's logs
 * (logs/, unless log_dir moves them to <log_dir>/<run id>/) and, for runs
 * started by fiber_run_start(), master.pid.  A local run is alive while
 * its master.sock accepts a connection, its recorded master process
 * lives, an flock on its master.lock is held, or a job of it runs.
 * Containers and pods are found by their labels: fiber.run=<run id>,
 * fiber.role, fiber.job, and fiber.name (a pod's is an annotation), in
 * the Kubernetes namespace the k8s_* keys configure.
 *
 * The Docker Engine is reached over the unix socket named by the
 * docker_socket configuration key (default /var/run/docker.sock), speaking
 * the API version the daemon reports on /_ping, at most 1.41.  Every call
 * that talks to it may block for as long as the daemon takes; a daemon
 * that cannot be reached fails the call with FIBER_EUNREACHABLE (one that
 * does not answer in time: FIBER_ETIMEDOUT) and a message that names the
 * socket and says what to do.
 * ------------------------------------------------------------------------ */

/* Builds a container image of program and imports it into the Docker
 * Engine (no registry is involved).
 *
 * The image is FROM scratch and holds only the program, every shared
 * library the dynamic loader resolves for it (asked of the program's own
 * loader, without LD_LIBRARY_PATH), the loader, /etc/ld.so.cache and an
 * empty /tmp (mode 1777), each at the same path as on the host, with the
 * symbolic links met on the way (/lib64 -> usr/lib64 on Debian).  So a
 * backend can start the same program, at the same path, in a container.
 * It also holds libcurl and the libraries it needs, which fiber itself
 * loads at run time for its docker and kubernetes backends, so that a
 * master in a container (fiber_run_start, a pod) can start its jobs.
 * Other libraries the program dlopen()s by itself are not found.
 * The image carries the labels fiber.program (the path) and
 * fiber.build_id.
 *
 * program is a path, or a name searched in PATH.  tag is "NAME[:TAG]"
 * (TAG defaults to "latest"); NULL uses fiber_image_default_tag(), which
 * changes whenever the program is rebuilt.  On success the image id
 * ("sha256:<64 hex>") is appended to id_out, which stays NUL-terminated
 * (id_out->data[id_out->len] == '\0').
 *
 * Returns 0, FIBER_EINVAL (no such program, not an ELF executable, a
 * library the loader cannot find, an invalid tag; the message says which
 * and what to do), FIBER_EUNREACHABLE (no daemon), FIBER_EBACKEND (the
 * daemon refused the image; its message is quoted), FIBER_ESYS,
 * FIBER_ENOMEM.  On failure id_out is unchanged and no image is made. */
FIBER_API int fiber_image_build(const char *program, const char *tag,
                                fiber_buf *id_out);

/* fiber_image_build for a program that needs more than its libraries: an
 * interpreter and its program.  trees (NULL-terminated absolute paths;
 * may be NULL) are added at the same paths: a directory with everything
 * under it (symbolic links kept as links, with what they point to), a
 * file alone; excludes (NULL-terminated absolute paths, may be NULL) are
 * left out of the trees.  The libraries every shared object found in the
 * trees needs are added as the program's are (those the loader cannot
 * find are left out: a module that needs them fails to import in the
 * container as on such a host).  The Python package builds its images
 * with it: the interpreter, its standard library, the site-packages on
 * sys.path and the program's folder (docs/python.md).  Returns as
 * fiber_image_build does; FIBER_EINVAL also for a relative or missing
 * tree. */
FIBER_API int fiber_image_build_trees(const char *program,
                                      const char *const *trees,
                                      const char *const *excludes,
                                      const char *tag, fiber_buf *id_out);

/* One line of progress (no new line at its end), for as long as the call
 * that reports it runs; the text is gone when the function returns. */
typedef void (*fiber_progress_fn)(void *ud, const char *line);

/* What fiber_image_build_with builds; zero it, then set what you need. */
typedef struct fiber_image_build_opts {
    const char *tag;             /* NULL: fiber_image_default_tag() */
    const char *const *trees;    /* as fiber_image_build_trees; NULL: none */
    const char *const *excludes; /* NULL: none */
    fiber_progress_fn progress;  /* NULL: quiet */
    void *progress_ud;           /* handed to progress */
} fiber_image_build_opts;

/* fiber_image_build_trees with its options in *opts (NULL: all zero), and
 * progress: when opts->progress is set, it is called once per stage of
 * the build, from the caller's thread, with a line saying what is being
 * done or was found: the program and its loader, how many libraries the
 * loader listed, how many files and bytes the trees and the whole archive
 * hold, the import into the Docker Engine (where, as which tag), and the
 * result (the image id, the time taken).  `fiber image build` prints them
 * on stderr.  Returns as fiber_image_build_trees does. */
FIBER_API int fiber_image_build_with(const char *program,
                                     const fiber_image_build_opts *opts,
                                     fiber_buf *id_out);

/* Writes program's default image tag into buf (size bytes):
 * "fiber/<program's base name, lower-cased>:<first 12 hex digits of its
 * GNU build id>" (of a BLAKE2b hash of the file if it has no build id).
 * Reads the program but not the daemon.  Returns 0, FIBER_EINVAL (no such
 * program, not ELF, buf too small). */
FIBER_API int fiber_image_default_tag(const char *program, char *buf,
                                      size_t size);

typedef struct fiber_image_info {
    char id[80];         /* "sha256:<64 hex>" */
    char tag[256];       /* its first tag, or the name asked for */
    char program[4096];  /* the fiber.program label, or "" */
    int64_t size_bytes;  /* the image's size as the daemon reports it */
} fiber_image_info;

/* Looks image (a name[:tag] or an id) up in the Docker Engine and fills
 * *out.  Returns 0, FIBER_ENOKEY (no such image), FIBER_EINVAL,
 * FIBER_EUNREACHABLE, FIBER_EBACKEND. */
FIBER_API int fiber_image_inspect(const char *image, fiber_image_info *out);

/* Removes image (untags it, and deletes it once no tag is left).  Returns
 * 0, FIBER_ENOKEY (no such image), FIBER_EBACKEND (the daemon refused,
 * e.g. a container still uses it), FIBER_EUNREACHABLE, FIBER_EINVAL. */
FIBER_API int fiber_image_remove(const char *image);

/* Checks whether backend ("local", "docker", "slurm", "kubernetes") can be
 * used from this host, and writes a line saying what was found into detail
 * (size bytes; may be NULL): "Docker Engine 20.10.24 at
 * /var/run/docker.sock, API 1.41 (fiber uses 1.41)", or why it cannot be
 * used and what to do.  Returns 0 (usable), FIBER_EUNREACHABLE (its engine
 * cannot be reached), FIBER_ENOTSUP (this build has no such backend yet),
 * FIBER_EINVAL (unknown name). */
FIBER_API int fiber_backend_check(const char *backend, char *detail,
                                  size_t size);

/* Returns 1 if this build of fiber has a backend named backend, else 0
 * with fiber_last_error() naming the backends it has.  Asks no engine
 * (fiber_backend_check does). */
FIBER_API int fiber_backend_known(const char *backend);

/* Returns the name of backend i of this build (0, 1, ... in the order
 * `fiber doctor` lists them: "local" first), or NULL when i is past the
 * last.  The strings are static. */
FIBER_API const char *fiber_backend_name(size_t i);

/* One job of a run, as fiber_runs_list() found it.  The strings are
 * never NULL, may be of any length, and belong to the list (freed by
 * fiber_run_list_free()). */
typedef struct fiber_job_info {
    char *name;         /* "master", "Process-1", "PoolWorker-3" */
    char role[16];      /* "master", a container's or pod's fiber.role,
                           or "job" */
    char state[16];     /* "running", "exited", "created", "paused",
                           "zombie", "pending" (a pod not started yet),
                           "terminating" (a pod being deleted), "unknown",
                           or "ended" (gone; its log remains) */
    char *status;       /* in words: "Up 3 minutes", "Exited (0) 2 hours
                           ago", "pid 1234", "Failed (exit 42)" */
    long pid;           /* local: the process id, or -1 */
    char *engine_id;    /* what the run's engine calls the job: docker,
                           the container's short id; kubernetes, the pod's
                           name; "" for a local process */
    char engine_kind[16]; /* what engine_id names, in words: "container",
                             "pod", "job"; "" when engine_id is "" */
} fiber_job_info;

/* One run. */
typedef struct fiber_run_info {
    char run[64];          /* the run id */
    char backend[16];      /* "local", "docker", "slurm" or "kubernetes":
                              the backend its master and jobs run on */
    int alive;             /* 1 while its master runs, 0 once it has
                              ended, -1 when that cannot be told (a
                              master listening on TCP with no job running
                              leaves no trace fiber can test) */
    long master_pid;       /* the master's process id on this host, or -1 */
    char dir[512];         /* its run directory on this host, or "" */
    size_t n_jobs;
    fiber_job_info *jobs;  /* the master first, then by name */
} fiber_run_info;

typedef struct fiber_run_list {
    size_t n;
    fiber_run_info *runs;  /* sorted by run id */
    char warning[512];     /* a source that could not be read ("docker:
                              cannot reach ..."), or "" */
} fiber_run_list;

/* Finds the runs every backend can see from here: local run directories
 * (this user's), the Docker Engine's containers labelled fiber.run (when
 * a daemon is there) and the pods labelled fiber.run in the configured
 * Kubernetes namespace (when k8s_server is set or this runs in a
 * cluster).  run names one run; NULL lists all.  *out must be zeroed or
 * freed; the caller frees it with fiber_run_list_free().  An engine that
 * cannot be reached is not an error: the others' runs are listed and
 * out->warning says why its runs are not.  Returns 0, FIBER_EINVAL (run
 * is not a run id), FIBER_ENOKEY (run given and not found), FIBER_ENOMEM,
 * FIBER_ESYS. */
FIBER_API int fiber_runs_list(const char *run, fiber_run_list *out);

/* Frees what fiber_runs_list() stored and zeroes *l.  NULL is a no-op. */
FIBER_API void fiber_run_list_free(fiber_run_list *l);

/* Appends the logs of run's jobs to out: for a local run, the files of
 * its log directory (the children's fiber logs, and the master's output
 * for detached runs); for containers and pods, what each wrote to stdout
 * and stderr (a pod that has not started has none yet).  job names one
 * job (a log file's name without .log, or a job's name as
 * fiber_runs_list() gives it); NULL gives all, each headed by a line
 * "==> <name> <==".  Returns 0, FIBER_ENOKEY (no such run or job, or
 * nothing logged), FIBER_ENOTSUP (the run's backend keeps no logs that
 * fiber can read yet), FIBER_EUNREACHABLE, FIBER_EBACKEND, FIBER_ENOMEM,
 * FIBER_ESYS. */
FIBER_API int fiber_run_logs(const char *run, const char *job,
                             fiber_buf *out);

/* Stops run: its containers (SIGTERM, then SIGKILL after
 * terminate_grace_ms), its pods (deleted with a grace period of
 * terminate_grace_ms; their logs go with them), and, locally, its master
 * and the job processes found on this host (processes whose environment
 * names the run) as containers are.  Appends a line per action to report
 * (may be NULL).  Returns 0 when everything found was stopped,
 * FIBER_ENOKEY (no such run, or nothing of it runs), FIBER_ESTATE (the
 * run is alive but its master's process could not be found: message says
 * so), FIBER_ENOTSUP (fiber cannot stop runs of that backend yet),
 * FIBER_EUNREACHABLE, FIBER_EBACKEND, FIBER_ESYS. */
FIBER_API int fiber_run_kill(const char *run, fiber_buf *report);

/* Removes what dead runs left behind: their run directories (logs
 * included), their stopped containers, and their ended pods and Secrets.  run names one run, which must
 * not be alive (FIBER_ESTATE otherwise; one whose state cannot be told,
 * alive == -1, is cleaned when named); NULL cleans every dead run and
 * leaves the others alone.  Appends a line per thing removed to report (may be
 * NULL).  Returns 0, FIBER_ENOKEY, FIBER_ESTATE, FIBER_EUNREACHABLE (when
 * containers had to be removed), FIBER_ESYS. */
FIBER_API int fiber_run_clean(const char *run, fiber_buf *report);

/* Watching a live run (what `fiber top` does).
 *
 * A master publishes, in its run directory ($TMPDIR/fiber-<uid>/<run>/,
 * mode 0700), the address of its socket (master.addr) and the run's
 * token (master.token, mode 0600) once its first job starts.  A watcher
 * on the same host, as the same user, reads both, dials that address
 * (encrypted over TCP, as a job's connection is), proves itself with the
 * token in HELLO, exactly as a job does, and then asks for snapshots.  A
 * peer without the token is dropped by the master like any peer that
 * fails authentication.  So a master on this host (local, or a Docker
 * container with host networking and the run directory mounted, or a
 * Slurm job on this node) can be watched.  A run with no run directory
 * here is looked for on the Kubernetes cluster when one is configured
 * (backend = kubernetes, or k8s_server): the address and the encryption
 * setting come from the environment of one of its job pods, the token
 * from its Secret "<run>-boot", so the configured account must be allowed
 * to read pods and secrets of the namespace, and the master's pod IP must
 * be reachable from here. */
typedef struct fiber_pool_row {
    char name[64];        /* "Pool1", or the pool's job name */
    fiber_pool_stats st;  /* its counters (fiber_pool_stats_get) */
} fiber_pool_row;

typedef struct fiber_run_stats {
    long pid;             /* the master's process id (in its namespace) */
    char backend[64];     /* the master's backend: "local", "docker"... */
    uint64_t uptime_ms;   /* since the master process started */
    uint64_t cpu_user_us; /* the master process's CPU time, all threads */
    uint64_t cpu_sys_us;
    uint64_t rss_bytes;   /* its resident memory */
    size_t n_pools;
    fiber_pool_row *pools; /* its live pools, newest first */
} fiber_run_stats;

typedef struct fiber_run_watch fiber_run_watch;

/* Connects to the master of run (a run id; see fiber_runs_list) and
 * authenticates, waiting at most timeout_ms (-1: the connect_timeout_ms
 * key).  Returns 0 with *out a handle to close with
 * fiber_run_watch_close(); FIBER_EINVAL (not a run id), FIBER_ENOKEY (no
 * such run on this host), FIBER_ESTATE (the run has no live master, or it
 * has not published where it listens: it started no job yet, or it ended),
 * FIBER_ENOTSUP (a master fiber cannot reach from here; message says why),
 * FIBER_EUNREACHABLE (its socket does not answer), FIBER_EAUTH (the master
 * refused the token; its reason is in the message), FIBER_ETIMEDOUT,
 * FIBER_EPROTO, FIBER_ENOMEM, FIBER_ESYS. */
FIBER_API int fiber_run_watch_open(fiber_run_watch **out, const char *run,
                                   int timeout_ms);

/* Asks the master for a snapshot and waits for it at most timeout_ms.
 * *out must be zeroed or freed; on success it holds the snapshot (free it
 * with fiber_run_stats_free()).  Returns 0, FIBER_ECLOSED (the master
 * went away), FIBER_ETIMEDOUT, FIBER_EPROTO, FIBER_ENOMEM, FIBER_EINVAL. */
FIBER_API int fiber_run_watch_read(fiber_run_watch *w, fiber_run_stats *out,
                                   int timeout_ms);

/* Frees what fiber_run_watch_read() stored and zeroes *s.  NULL is a
 * no-op. */
FIBER_API void fiber_run_stats_free(fiber_run_stats *s);

/* Closes the connection and frees the handle.  NULL is a no-op. */
FIBER_API void fiber_run_watch_close(fiber_run_watch *w);

/* Starting a program's master as a run (what `fiber run` does). */
typedef struct fiber_run_opts {
    const char *backend;     /* "local", "docker", "slurm" or
                                "kubernetes"; NULL = configured */
    const char *image;       /* docker: the image; NULL = the program's
                                default tag, built if missing;
                                kubernetes: NULL = the image key */
    int cpu;                 /* docker, kubernetes, slurm: CPUs for the
                                master (0 = no limit / Slurm's default) */
    int memory_mb;           /* docker, kubernetes, slurm: memory limit
                                (0 = none) */
    int gpu;                 /* docker, kubernetes, slurm: GPUs (0 = none) */
    const char *const *env;  /* extra "NAME=value" for the master */
    int detach;              /* local: send the master's output to
                                <run dir>/logs/master.log instead of ours */
    int signal_s;            /* slurm: ask Slurm for SIGUSR1 this many
                                seconds before the master's time limit
                                (sbatch --signal=B:USR1@N), which fires
                                its stop event; kubernetes: the master
                                pod's terminationGracePeriodSeconds (from
                                its SIGTERM to its SIGKILL); 0 = none /
                                the cluster's default; at most 65535 */
    int requeue;             /* slurm: the master is requeueable, with the
                                same run name: pre-emption and scontrol
                                requeue bring it back, and once its stop
                                callbacks return after the --signal
                                warning it ends (FIBER_EXIT_REQUEUE) and
                                requeues itself; a restarted master has
                                FIBER_RESUMED=<restarts> (fiber_resumed).
                                kubernetes: the master is the Job
                                <run>-master (backoffLimit 0), whose
                                controller makes a new pod when its pod is
                                deleted (kubectl delete, a drain,
                                pre-emption); each start is counted on the
                                Job, which fiber_resumed() reports */
    fiber_progress_fn progress; /* NULL: quiet; else called with a line per
                                stage of what the backend must do before
                                the master can start (docker: building
                                the program's default image when the
                                daemon lacks it), from the caller's
                                thread */
    void *progress_ud;       /* handed to progress */
} fiber_run_opts;

typedef struct fiber_run fiber_run;

/* Starts argv[0] (a path, or a name searched in PATH; argv is
 * NULL-terminated) as the master of a new run and returns at once.  The
 * run id is chosen here, shown by fiber_run_name(), and handed to the
 * program in FIBER_BOOT_RUN; the program's configuration gets
 * FIBER_BACKEND=<backend> (and, for docker, FIBER_IMAGE) in its
 * environment.
 *
 * local: the program runs as a child of the caller, with the caller's
 * standard streams (or, detached, its output in the run's log directory),
 * and its pid is recorded in <run dir>/master.pid.
 * docker: the program runs in a container of the image named
 * "<run id>-master", labelled as a run's master (fiber.run, fiber.role =
 * master), with host networking and the daemon's socket mounted at
 * /var/run/docker.sock, so that it can start its jobs as sibling
 * containers.  The container is kept after it ends, for its logs, until
 * fiber_run_clean().
 * kubernetes: the program runs in pod "<run id>-master" of the image (the
 * cluster pulls it), with its pod's service account, labelled as the run's
 * master; its jobs' pods are owned by it (docs/backends/kubernetes.md).
 * slurm: the program (at its absolute path, which the nodes share) is
 * submitted as batch job "<run id>-master" with the caller's environment
 * and the run's variables; its output goes to <slurm_dir>/<run id>/
 * master.out and master.err, which fiber_run_follow() copies
 * (docs/backends/slurm.md).
 *
 * On success *out is a handle to free with fiber_run_free() (which does
 * not stop the run).  Returns 0, FIBER_EINVAL (bad options, no program,
 * an unknown backend), FIBER_ENOTSUP (a backend fiber cannot start runs
 * on yet, or options it does not take), FIBER_ESPAWN (the
 * program or container could not start; message says why),
 * FIBER_EUNREACHABLE, FIBER_EBACKEND, FIBER_ESYS.  Nothing runs after a
 * failure. */
FIBER_API int fiber_run_start(fiber_run **out, const char *const *argv,
                              const fiber_run_opts *opts);

/* The run id ("fiber-3f9a1c2e"); lives as long as the handle. */
FIBER_API const char *fiber_run_name(const fiber_run *r);

/* The master's process id (local), or -1. */
FIBER_API long fiber_run_pid(const fiber_run *r);

/* Where the master runs, in words, for messages: "pid 1234" (local),
 * "container 7a38d68a83be" (docker, the short id), "pod
 * fiber-3f9a1c2e-master" (kubernetes), "Slurm job 812" (slurm); "" for an
 * invalid handle.  Lives as long as the handle. */
FIBER_API const char *fiber_run_where(const fiber_run *r);

/* The master's container id (docker), its pod's name (kubernetes), its
 * Slurm job id (slurm), or "". */
FIBER_API const char *fiber_run_container(const fiber_run *r);

/* Copies the master's output to out_fd and err_fd as it is written, until
 * the master ends (docker: the container's log stream).  For a local run
 * not detached the output already goes to the caller's streams, and this
 * returns at once.  Returns 0, FIBER_EUNREACHABLE, FIBER_EBACKEND,
 * FIBER_ESYS (a write failed). */
FIBER_API int fiber_run_follow(fiber_run *r, int out_fd, int err_fd);

/* Waits up to timeout_ms for the master to end and stores its exit code
 * in *exit_code (may be NULL): its exit status, or minus the signal that
 * killed it (local).  Returns 0, FIBER_ETIMEDOUT, FIBER_EUNREACHABLE,
 * FIBER_EBACKEND, FIBER_ESYS.  A local run's directory is removed here
 * when nothing worth keeping is left in it. */
FIBER_API int fiber_run_wait(fiber_run *r, int timeout_ms, int *exit_code);

/* Frees the handle.  The run goes on (a local child that was not waited
 * for is left to the caller's process, as with fork()).  NULL is a
 * no-op. */
FIBER_API void fiber_run_free(fiber_run *r);

#ifdef __cplusplus
}
#endif
#endif /* FIBER_FIBER_H */
