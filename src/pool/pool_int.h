/*
 * pool_int.h -- the pool's insides, shared by pool.c (the API: futures,
 * iterators, lifecycle), batch.c (batches and their results) and
 * pool_sched.c (workers, dispatch, results, the progress loop).
 *
 * Locking: pool->mu guards everything here.  The runtime's service thread
 * never takes it: it reports worker connections and job ends through the
 * inbox (inbox_mu, a leaf lock) and the event fd.  Pool code may call the
 * runtime (which takes the runtime lock) with pool->mu held; the runtime
 * never calls back into the pool with its lock held except into
 * inbox_push().
 */
#ifndef FB_POOL_INT_H
#define FB_POOL_INT_H

#include <pthread.h>
#include <stdint.h>

#include "base/spin.h"
#include "net/net.h"
#include "runtime/runtime.h"

#define POOL_MAGIC 0x504f4f4cu /* "POOL" */

enum batch_kind { B_APPLY, B_MAP, B_BUFS, B_IMAP };

/* One input of a streamed imap (fiber_pool_imap_stream): an owned copy,
 * held from fiber_imap_put until its result is in. */
struct fb_stream_in {
    unsigned char *data;
    size_t len;
};

struct fb_imap_slot {
    int ready;
    int rc;
    size_t index;
    fiber_buf data;
};

/* A set of tasks submitted together: one apply, one map, one imap. */
struct fb_batch {
    enum batch_kind kind;
    struct fiber_pool *pool; /* NULL once the pool is gone */
    char task[FB_WIRE_NAME_MAX + 1];
    uint8_t task_len;
    size_t n;         /* tasks in the batch */
    size_t next;      /* next index never sent */
    size_t done;      /* indices completed */
    size_t chunksize; /* 0 = automatic */

    const uint8_t *in; /* B_MAP, B_IMAP: n records of in_size */
    size_t in_size;
    const fiber_iov *iov;   /* B_BUFS: one per task, or the parts */
    const size_t *first;    /* B_BUFS gathered: task i is iov[first[i]]
                               .. iov[first[i + 1] - 1]; NULL: one each */
    unsigned char *arg;     /* B_APPLY: owned copy */
    size_t arg_len;

    uint8_t *out; /* B_MAP */
    size_t out_size;
    fiber_buf *bufs; /* B_BUFS */
    int *codes;
    fiber_buf result; /* B_APPLY: result bytes or failure text */

    int rc;             /* B_APPLY: the code; others: lowest failure's */
    size_t err_index;   /* index of that failure */
    char *msg;          /* its message (allocated on failure; never NULL
                           when rc != 0) */
    uint64_t *done_bits;

    /* B_IMAP: a window of results; ordered reads slot (taken % window),
     * unordered reads whichever is ready first. */
    struct fb_imap_slot *slots;
    size_t window, taken, ready_count;
    int ordered;
    int cut; /* imap: the pool stopped before every result came */

    /* A streamed imap: n grows with each fiber_imap_put; input i lives in
     * ins[i & (ins_cap - 1)] for i in [ins_base, n) until it is done. */
    int stream;
    int ended;          /* fiber_imap_end: no more inputs */
    struct fb_stream_in *ins;
    size_t ins_cap, ins_base;
    size_t done_words;  /* words allocated in done_bits */

    int has_shared;    /* fiber_pool_shared was in force: pinned */
    fiber_ref shared;

    fiber_done_fn cb;
    void *ud;
    int has_handle;  /* a future or iterator refers to it */
    int complete;    /* all n done */
    int cb_pending;  /* complete, callback not yet run */

    struct fb_batch *q_next;              /* pool's queue of unsent work */
    struct fb_batch *all_prev, *all_next; /* every live batch */
    struct fb_batch *cb_next;             /* completed, callback due */
};

struct fb_chunk {
    uint64_t id;
    struct fb_batch *b;
    size_t first;    /* indices first .. first + count - 1 */
    uint32_t count;
    uint32_t done;   /* results received, in order */
    int attempts;    /* crashes already charged (retries only) */
    int isolated;    /* a suspect, run alone on its worker */
    struct fb_chunk *next;
};

enum worker_state {
    W_STARTING, /* job launched, not connected */
    W_INIT,     /* connected; POOL sent; waiting for READY */
    W_READY,    /* takes tasks */
    W_GONE,     /* connection closed; waiting for the job to end */
};

/* The sets the scheduler keeps as workers change, so that no pass of the
 * progress loop walks every worker (pool_sets.c).  A worker is on at most
 * one list per link; each list names the link it uses. */
enum { WL_FEED, WL_DIRTY, WL_HEARD, WL_STOP, WL_N };

struct fb_worker;
struct fb_wlist;

struct fb_wlink {
    struct fb_worker *prev, *next;
    struct fb_wlist *on; /* the list it is on, or NULL */
};

struct fb_wlist {
    struct fb_worker *head, *tail;
    size_t len;
    int link; /* WL_* */
};

/* What one worker adds to the pool's totals (struct fb_wcount in both). */
struct fb_wcount {
    int alive;     /* state != W_GONE */
    int live;      /* alive and not retiring: counts toward the target */
    int starting;  /* W_STARTING or W_INIT */
    int ready;     /* W_READY: connected, initialized, taking tasks */
    int stopping;  /* retiring, STOP not yet sent */
    uint64_t inflight;
};

struct fb_worker {
    struct fiber_pool *pool;
    int index;      /* in pool->workers */
    struct fb_wlink link[WL_N];
    struct fb_wcount counted; /* what it adds to pool->count now */
    struct fb_jobrec *job;
    int state;
    int retire;     /* take no more tasks; STOP once drained */
    int stop_sent;
    int asked_to_stop; /* its end is not a loss */
    int at_limit;      /* retired ahead of its job's time limit */
    int faulted;    /* it reported the task that killed it (FAULT) */
    struct fb_conn conn;
    int has_conn;
    int want_out;   /* output waits for room (off the dirty set) */
    int out_armed;  /* EPOLLOUT armed */
    struct fb_chunk *head, *tail;
    uint32_t inflight;
    uint64_t assigned;
    uint64_t last_heard_ms;
    uint64_t idle_since_ms;
    char exit_msg[256]; /* what it said before exiting (EXIT) */
    int shared_told;    /* the shared argument it was last sent (OBJ_CALL) */
    fiber_ref shared;
};

struct fb_retry {
    struct fb_batch *b;
    size_t index;
    int attempts;
};

/* A ring of tasks to send again, oldest first. */
struct fb_ring {
    struct fb_retry *v;
    size_t head, len, cap;
};

struct fb_inbox_ev {
    int kind; /* IN_CONNECTED, IN_ENDED */
    struct fb_worker *w;
    struct fb_conn conn;
    struct fb_inbox_ev *next;
};
#define IN_CONNECTED 1
#define IN_ENDED 2

/* What the background thread waits for on p->cond (fb_pool_bg_main), and
 * so which events wake it (fb_pool_wake, fb_pool_drive_end). */
enum fb_bg_wait {
    BG_AWAKE = 0,  /* not waiting */
    BG_BRIEF,      /* a 2 ms look: no event wakes it */
    BG_IDLE,       /* 200 ms, nothing outstanding: any event wakes it */
    BG_FOR_DRIVER, /* a caller's long drive: woken when no one drives */
};

struct fiber_pool {
    uint32_t magic;
    pthread_mutex_t mu;
    pthread_cond_t cond; /* progress happened; the driver role is free */
    int driving;         /* a thread runs the progress loop */
    int want_drive;      /* callers waiting to take it over */
    int cond_waiters;    /* callers waiting on cond (pool_wait) */
    enum fb_bg_wait bg_wait; /* what the background thread waits for */
    uint64_t drive_start_ms; /* when the driving caller began */
    uint64_t bg_wakes;   /* its waits that ended (tests read it) */
    int epfd, evfd;
    uint64_t last_drive_ms;

    /* configuration */
    int target, min_workers, max_workers, idle_ms;
    int maxtasks, max_crashes;
    char *init_task;
    unsigned char *init_arg;
    size_t init_arg_len;
    fiber_job_opts job;     /* deep copy */
    char **job_env;
    char *job_strs[4];      /* name, backend, image, workdir copies */
    int heartbeat_ms;
    int spin_allowed;
    struct fb_spin spin;
    int n_live;             /* live workers, as of the last maintain */
    uint64_t last_maintain_ms;
    unsigned ncpu;
    uint32_t max_frame;

    struct fb_worker **workers;
    int n_workers, cap_workers;
    /* Kept as workers change (fb_pool_note): */
    struct fb_wcount count;  /* sums over every worker */
    struct fb_wlist idle;    /* ready, nothing in flight: fed first */
    struct fb_wlist hungry;  /* ready, below its credit */
    struct fb_wlist dirty;   /* output queued, socket not known full */
    struct fb_wlist heard;   /* connected, least recently heard first */
    struct fb_wlist stopq;   /* retiring, STOP not yet sent */
    uint32_t credit;         /* tasks a worker may hold (credit_limit) */
    int all_retired;         /* fb_pool_retire_all has run */
    int startup_failures;   /* workers in a row that died before READY */
    uint64_t last_grow_ms;
    uint64_t last_limit_check_ms; /* workers near their time limit */
    char broken[512];       /* set when workers cannot start */
    uint64_t name_seq;
    unsigned pool_no;

    struct fb_batch *q_head, *q_tail; /* batches with unsent tasks */
    struct fb_batch *all;             /* every live batch */
    struct fb_batch *cb_head, *cb_tail;
    struct fb_ring retry;   /* tasks to send again */
    struct fb_ring suspect; /* tasks to send again, each alone on a worker */
    size_t queued;                    /* unsent tasks, all batches */
    uint64_t chunk_seq;
    double task_ns;                   /* EWMA of a task's run time */

    int closed, terminated;
    int callbacks_running;
    int creating; /* fiber_pool_create is still launching the workers */
    fiber_pool_stats st;

    pthread_mutex_t inbox_mu;
    struct fb_inbox_ev *inbox;

    pthread_t bg;
    int bg_running, bg_stop;

    /* the registry of live pools (pool_watch.c; its lock, not mu) */
    struct fiber_pool *reg_prev, *reg_next;
    int registered;
};

#define RETRIES(p) ((p)->retry.len + (p)->suspect.len)

/* pool_watch.c: the list `fiber top` reads.  Called without mu. */
void fb_pool_registry_add(struct fiber_pool *p);
void fb_pool_registry_remove(struct fiber_pool *p);

/* pool_sets.c */
void fb_wlist_init(struct fb_wlist *l, int link);
/* Puts w at the tail of l (taking it off any other list of l's link);
 * moves it to the tail when it is on l already. */
void fb_wlist_push(struct fb_wlist *l, struct fb_worker *w);
/* Takes w off whatever list it is on for link (a no-op when none). */
void fb_wlist_drop(struct fb_worker *w, int link);
/* Brings the pool's sets and totals up to date with w's state, in O(1).
 * Call it after anything about w changes (state, retire, stop_sent,
 * inflight, its first chunk, its queued output).  mu held. */
void fb_pool_note(struct fiber_pool *p, struct fb_worker *w);
/* Marks every worker retiring (once: later calls return at once); mu
 * held. */
void fb_pool_retire_all(struct fiber_pool *p);

/* pool_sched.c */
extern const struct fb_owner_ops fb_pool_worker_ops;
int fb_pool_sched_init(struct fiber_pool *p);
void fb_pool_sched_fini(struct fiber_pool *p);
int fb_pool_grow(struct fiber_pool *p, int n);     /* mu held */
void fb_pool_dispatch(struct fiber_pool *p);       /* mu held */
void fb_pool_flush(struct fiber_pool *p);          /* mu held */
/* Takes b off the queue of batches with unsent tasks; mu held. */
void fb_pool_unqueue(struct fiber_pool *p, struct fb_batch *b);
void fb_pool_stop_workers(struct fiber_pool *p);   /* mu held */
/* Runs the progress loop until done(arg) is true or deadline passes.
 * mu held.  Returns 0 or FIBER_ETIMEDOUT. */
int fb_pool_progress(struct fiber_pool *p, int (*done)(void *), void *arg,
                     uint64_t deadline_ms);
void fb_pool_run_callbacks(struct fiber_pool *p); /* mu held */
void *fb_pool_bg_main(void *arg);
/* A caller stops driving (mu held): wakes the callers waiting for the
 * driver role, and the background thread if work is left for it; with
 * nothing left, the next submission made while no one drives wakes it
 * (fb_pool_wake). */
void fb_pool_drive_end(struct fiber_pool *p);
int fb_pool_alive_workers(const struct fiber_pool *p);

/* batch.c */
/* A new batch of n tasks of task for p (the call's shared object pinned,
 * if one is set), not yet submitted; NULL when out of memory.  mu held. */
struct fb_batch *fb_batch_new(struct fiber_pool *p, enum batch_kind kind,
                              const char *task, size_t n);
/* Puts a batch on the pool's lists; its tasks become dispatchable.  mu
 * held. */
void fb_batch_submit(struct fiber_pool *p, struct fb_batch *b);
/* Completes task index of b with code (0, FIBER_ETASK, FIBER_ECRASHED,
 * FIBER_ECLOSED) and data.  Drops duplicates.  mu held. */
void fb_batch_finish(struct fiber_pool *p, struct fb_batch *b, size_t index,
                     int code, const void *data, size_t len);
/* Task i's argument as count parts whose bytes, back to back, are it:
 * *parts is b's own (gathered map_bufs) or `one`, filled in. */
size_t fb_batch_parts(const struct fb_batch *b, size_t i, fiber_iov *one,
                      const fiber_iov **parts);
int fb_batch_can_send(const struct fb_batch *b);
/* A streamed imap's next input: parts[0..k) copied back to back as task
 * b->n, which n then counts, queued for sending as fb_batch_submit's
 * tasks are.  0 or FIBER_ENOMEM (nothing changed).  mu held. */
int fb_batch_stream_put(struct fiber_pool *p, struct fb_batch *b,
                        const fiber_iov *parts, size_t k);
void fb_batch_free(struct fb_batch *b);
/* The failure message, "" if none. */
const char *fb_batch_msg(const struct fb_batch *b);

/* Whether someone sleeping on p->cond needs every change: a caller
 * waiting for a result or for the driver role, or the background thread
 * idle (no work was outstanding: now there may be).  mu held. */
static inline int fb_pool_cond_watched(const struct fiber_pool *p)
{
    return p->cond_waiters > 0 || p->bg_wait == BG_IDLE;
}

/* Wakes whoever waits on p->cond and needs to know: fb_pool_cond_watched,
 * and the background thread waiting out a caller's long drive once no
 * one drives (a submission after the drive).  Its brief wait (2 ms,
 * while a caller may come back) ends by itself.  Waking it on every
 * submission and result cost two context switches each on the other
 * core, preempting a worker or a caller that spun for its answer: the
 * spins then failed and their budgets fell, and a 1-worker apply round
 * trip went from ~15 us to ~50 us for thousands of calls.  mu held. */
static inline void fb_pool_wake(struct fiber_pool *p)
{
    if (fb_pool_cond_watched(p) ||
        (p->bg_wait == BG_FOR_DRIVER && !p->driving))
        pthread_cond_broadcast(&p->cond);
}

#endif /* FB_POOL_INT_H */
