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
 *   heartbeat_ms         pool workers say they are alive this often; one
 *                        silent for 10 intervals is lost (default 1000;
 *                        0 = off)
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
 * a worker holds only as much work as keeps it busy (about a millisecond's
 * worth, at least two tasks), so a slow or stuck worker never hoards tasks
 * that others could run.  Tiny tasks are grouped into chunks automatically,
 * sized from the measured task time.
 *
 * Resilience: when a worker's job ends or it stops heart-beating, the tasks
 * it held go back to the queue one by one and a replacement starts.  The
 * task that was running when a worker died is blamed; once a task has
 * killed max_task_crashes workers (default 3) it fails with
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
} fiber_pool_stats;

/* One input of fiber_pool_map_bufs. */
typedef struct fiber_iov {
    const void *data;
    size_t len;
} fiber_iov;

/* A completion callback: rc is 0 or the task's failure code
 * (FIBER_ETASK, FIBER_ECRASHED, FIBER_ECLOSED); data/len are its result
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
 * FIBER_ECRASHED, FIBER_ENOTASK, FIBER_ECLOSED (pool closed). */
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

/* Starts task over n fixed-size input records and returns an iterator over
 * the results: in order of input when ordered is 1 (imap), in order of
 * completion when 0 (imap_unordered).  At most a bounded window of results
 * is held at a time, so a slow consumer slows dispatch rather than growing
 * memory.  in must stay valid until the iterator is freed. */
FIBER_API int fiber_pool_imap(fiber_pool *p, const char *task, const void *in,
                              size_t in_size, size_t n, size_t chunksize,
                              int ordered, fiber_imap **it);

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

/* Waits until every submitted task has completed and, if the pool is
 * closed, until its workers have exited.  Returns 0 or FIBER_ETIMEDOUT. */
FIBER_API int fiber_pool_join(fiber_pool *p, int timeout_ms);

/* Stops the workers now (SIGTERM, then SIGKILL after the grace period).
 * Tasks not yet completed fail with FIBER_ECLOSED; callbacks are called. */
FIBER_API int fiber_pool_terminate(fiber_pool *p);

/* Changes the number of workers while tasks run.  Growing starts jobs;
 * shrinking retires idle workers first and the others once their current
 * tasks are done (no task is lost).  Returns 0 or FIBER_EINVAL. */
FIBER_API int fiber_pool_resize(fiber_pool *p, int workers);

/* Fills *st with the pool's counters. */
FIBER_API int fiber_pool_stats_get(fiber_pool *p, fiber_pool_stats *st);

/* Terminates the pool if it is still running and frees it.  Futures and
 * iterators of the pool stay valid (failed with FIBER_ECLOSED if not done)
 * until freed.  NULL is a no-op. */
FIBER_API void fiber_pool_free(fiber_pool *p);

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
 * Delivery is pull-based: each get asks the server for one message, so a
 * slow consumer never holds messages that others could take.  A handle may
 * be used by several threads at once.
 *
 * Timeouts: a negative timeout waits forever; 0 does not wait and fails
 * with FIBER_EAGAIN when the queue is empty (get) or full (put); a
 * positive one fails with FIBER_ETIMEDOUT when it passes.
 * ------------------------------------------------------------------------ */
typedef struct fiber_queue fiber_queue;
typedef struct fiber_pipe fiber_pipe;

/* Creates a queue holding at most capacity messages (0 = unbounded) on
 * the master's object server.  Only the master creates queues. */
FIBER_API int fiber_queue_create(fiber_queue **out, size_t capacity);

/* Appends a copy of data/len, waiting up to timeout_ms while the queue is
 * full.  Returns 0, FIBER_EAGAIN, FIBER_ETIMEDOUT, FIBER_ECLOSED (closed
 * queue, or its server is gone). */
FIBER_API int fiber_queue_put(fiber_queue *q, const void *data, size_t len,
                              int timeout_ms);

/* Takes the oldest message, appending it to out (may be NULL to discard
 * it), waiting up to timeout_ms while the queue is empty.  Returns 0,
 * FIBER_EAGAIN, FIBER_ETIMEDOUT, or FIBER_ECLOSED once the queue is closed
 * and empty (or its server is gone). */
FIBER_API int fiber_queue_get(fiber_queue *q, fiber_buf *out, int timeout_ms);

/* Stores the number of messages in the queue in *n. */
FIBER_API int fiber_queue_size(fiber_queue *q, size_t *n);

/* Closes the queue for every process: waiting puts and gets fail with
 * FIBER_ECLOSED, further puts fail, and gets drain what is left. */
FIBER_API int fiber_queue_close(fiber_queue *q);

/* Appends the handle's serialised form (tens of bytes) to out. */
FIBER_API int fiber_queue_serialize(fiber_queue *q, fiber_buf *out);

/* Opens a handle from a serialised form, in any process of the run. */
FIBER_API int fiber_queue_open(fiber_queue **out, const void *data,
                               size_t len);

/* Frees the handle (not the queue, which lives as long as its server).
 * NULL is a no-op. */
FIBER_API void fiber_queue_free(fiber_queue *q);

/* Creates a pipe: with duplex, both ends send and receive; otherwise a
 * sends and b receives.  Each direction holds up to 1024 messages; a send
 * to a full pipe waits.  Only the master creates pipes; either end can be
 * serialised and handed to a child. */
FIBER_API int fiber_pipe_create(fiber_pipe **a, fiber_pipe **b, int duplex);

/* Sends a message to the other end (timeouts as for queues).  On a
 * receive-only end: FIBER_ENOTSUP. */
FIBER_API int fiber_pipe_send(fiber_pipe *p, const void *data, size_t len,
                              int timeout_ms);

/* Receives the next message from the other end, appending it to out.
 * Returns as fiber_queue_get does (FIBER_ECLOSED once the other end closed
 * and everything sent was received). */
FIBER_API int fiber_pipe_recv(fiber_pipe *p, fiber_buf *out, int timeout_ms);

/* Closes this end's sending direction: the other end's recv drains what
 * was sent, then gets FIBER_ECLOSED. */
FIBER_API int fiber_pipe_close(fiber_pipe *p);

FIBER_API int fiber_pipe_serialize(fiber_pipe *p, fiber_buf *out);
FIBER_API int fiber_pipe_open(fiber_pipe **out, const void *data, size_t len);
FIBER_API void fiber_pipe_free(fiber_pipe *p);

#ifdef __cplusplus
}
#endif
#endif /* FIBER_FIBER_H */
