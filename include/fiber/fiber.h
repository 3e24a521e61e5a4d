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
    X(EUNREACHABLE, -19, "peer or engine unreachable")

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
 * master, authenticates, runs its assignment and exits.  The child exits
 * within about two seconds of losing its connection to the master.
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

/* ------------------------------------------------------------------------
 * Configuration
 *
 * Keys (the full reference is docs/configuration.md):
 *   backend              local                       (default local)
 *   log_level            error|warn|info|debug       (default warn)
 *   log_dir              directory for child logs    (default
 *                        $TMPDIR/fiber-<uid>/<run>/logs)
 *   transport            ipc|tcp  how local children dial (default ipc)
 *   listen_host          address to listen on for tcp (default 127.0.0.1)
 *   connect_timeout_ms   how long a child may take to dial and prove
 *                        itself (default 30000)
 *   terminate_grace_ms   SIGTERM to SIGKILL delay (default 2000)
 *   max_message_bytes    largest frame a peer may send (default 64 MiB)
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
 * log_level: stderr in the master, <log_dir>/<process name>.log in a child.
 * Each line carries a timestamp, the level, the process name and pid. */
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
 * FIBER_ENOTINIT, FIBER_EINVAL, FIBER_ESPAWN (the backend could not start
 * the job; the message says why), FIBER_ETOOBIG (argument larger than
 * max_message_bytes).  On failure *out is left unchanged and no job runs. */
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

#ifdef __cplusplus
}
#endif
#endif /* FIBER_FIBER_H */
