/*
 * slurm.c -- the slurm backend: every job is a Slurm batch job, submitted
 * with sbatch, watched with squeue and scontrol, stopped with scancel.
 * Slurm's C API is not used: its tools are stable across versions and are
 * what a cluster's users have.
 *
 * Files.  Each run has a folder <slurm_dir>/<run id> (slurm_dir defaults
 * to ~/.fiber/slurm, which must be on a file system the compute nodes
 * share, as the program itself must be), mode 0700, holding:
 *
 *   secret        the run's token, mode 0600: jobs read it through
 *                 FIBER_BOOT_SECRET_FILE, so it is never in a command line
 *                 or an environment that `scontrol show job` or ps shows;
 *   batch-N.sh    the batch scripts, one per submission;
 *   <id>.out      each job's standard output and error (Slurm writes them);
 *   jobs          "<id> <name>" per job submitted (FB_SLURM_NAMES_FILE),
 *                 for fiber ps and fiber logs;
 *   master.out, master.err
 *                 a master that `fiber run` submitted (runs.c).
 *
 * When the run ends the secret and the scripts are removed, and so is
 * every empty job output file, and the names file and the folder if
 * nothing else is left; a job's non-empty output, and a master's output,
 * stay for their user (fiber clean removes them).
 *
 * Submissions.  Between begin_batch and end_batch (a pool starting its
 * workers) create_job only records each job; end_batch submits them as
 * one array job (sbatch --array=0-<n-1>), whose script picks the job's
 * environment by SLURM_ARRAY_TASK_ID.  Outside a batch each job is a
 * single sbatch submission.  All jobs of a run share the run id
 * ("fiber-1a2b3c4d") as their Slurm job name, which is how they are found
 * again, and the comment "fiber:job", which tells fiber ps they are
 * fiber's.
 *
 * State.  A thread of the backend's own asks squeue for the run's jobs
 * every QUERY_INTERVAL_MS while any runs, and `scontrol show job` for the
 * end of each job that left the queue (sacct would need an accounting
 * daemon).  poll_job answers from what the thread found, so the ops never
 * wait for a tool.  The thread also runs the scancel that signal_job and
 * release_job ask for, batching the ids of one round into one call.
 *
 * A killed master.  At init the backend starts a guard: a shell that
 * waits for end of file on a pipe only the master holds, then runs
 * `scancel --name=<run id>`.  However the master ends, even by
 * SIGKILL, its jobs are cancelled, including those still pending.
 * Running jobs would end anyway: a child exits when its connection to the
 * master drops.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/slurm/slurm.h"
#include "base/common.h"
#include "base/log.h"
#include "base/thread.h"


#define TOOL_TIMEOUT_MS 30000
#define QUERY_INTERVAL_MS 250
#define PENDING_NOTE_MS 15000
#define OUTPUT_TAIL_BYTES 65536
#define SECRET_VAR "FIBER_BOOT_SECRET_FILE"

struct sjob {
    struct sjob *next, *prev; /* in slurm_state.jobs, under mu */
    char id[48];              /* "1234" or "1234_7"; "" until submitted */
    char out_path[PATH_MAX];  /* the job's output file */
    char name[64];
    uint64_t submitted_ms;    /* when sbatch returned; 0 before */
    uint64_t noted_pending_ms;
    int killed;               /* signal_job(force) was asked */
    int running;              /* squeue last said RUNNING (thread) */
    uint64_t end_by_ms;       /* its time limit, as squeue's time left
                                 says (thread); 0: none known */
    int ended;                /* set by the thread (or a failed submit) */
    int status;
    /* Until submitted (batches): the script branch and sbatch options. */
    fiber_buf branch;
    fiber_buf sopts;
};

/* How a job is stopped (see run_scancel). */
enum stop_mode { STOP_TERM, STOP_KILL, STOP_CANCEL };

struct cancel {
    char id[48];
    int force;   /* SIGKILL rather than SIGTERM */
    int running; /* squeue said RUNNING (when asked, or last poll) */
    int mode;    /* enum stop_mode, chosen by classify() */
};

struct slurm_state {
    char sbatch[PATH_MAX], squeue[PATH_MAX], scontrol[PATH_MAX],
        scancel[PATH_MAX];
    char cwd[PATH_MAX - 128];
    char dir[PATH_MAX - 128]; /* the run's folder (room left for names) */
    char secret_path[PATH_MAX];
    char job_name[64];      /* the run id, "fiber-1a2b3c4d" */
    char user[32];          /* the numeric uid, for scancel --user */
    int secret_written;
    int script_seq;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int thread_started;
    int stopping;
    struct sjob *jobs;      /* under mu */
    struct cancel *cancels; /* under mu */
    size_t n_cancels, cap_cancels;
    int warned_query;       /* thread only */

    int batching;           /* runtime side only (runtime lock) */
    struct sjob **batch;
    struct fb_job **batch_jobs;
    size_t n_batch, cap_batch;

    pid_t guard_pid;
    int guard_fd;
};

/* ---- helpers usable without a cluster (unit-tested) ---------------------- */

int fb_slurm_shell_quote(fiber_buf *b, const char *text)
{
    int rc = fiber_buf_append(b, "'", 1);
    for (const char *p = text; rc == 0 && *p; p++) {
        if (*p == '\'')
            rc = fiber_buf_append(b, "'\\''", 4);
        else
            rc = fiber_buf_append(b, p, 1);
    }
    if (rc == 0)
        rc = fiber_buf_append(b, "'", 1);
    return rc;
}

void fb_slurm_join_lines(const fiber_buf *b, char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    const char *d = (const char *)b->data;
    for (size_t i = 0; d && i < b->len && used + 3 < size;) {
        size_t n = 0;
        while (i + n < b->len && d[i + n] != '\n')
            n++;
        if (n > 0) {
            int w = snprintf(out + used, size - used, "%s%.*s",
                             used ? "; " : "", (int)n, d + i);
            used += w > 0 ? (size_t)w : 0;
        }
        i += n + 1;
    }
    if (used >= size)
        out[size - 1] = '\0';
}

/* Copies the value of " key=" in line (up to a space) into out. */
static int field(const char *line, const char *key, char *out, size_t size)
{
    size_t klen = strlen(key);
    for (const char *p = line; (p = strstr(p, key)); p += klen) {
        if ((p == line || p[-1] == ' ') && p[klen] == '=') {
            const char *v = p + klen + 1;
            size_t n = strcspn(v, " \n");
            if (n >= size)
                n = size - 1;
            memcpy(out, v, n);
            out[n] = '\0';
            return 0;
        }
    }
    return -1;
}

int fb_slurm_parse_job(const char *line, char *state, size_t size,
                       int *status)
{
    char code[32];
    if (field(line, "JobState", state, size) != 0 ||
        field(line, "ExitCode", code, sizeof code) != 0)
        return -1;
    static const char *const running[] = {
        "PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED",
        "REQUEUED", "RESIZING", "SIGNALING", "STAGE_OUT", "REQUEUE_HOLD",
        "REQUEUE_FED", "RESV_DEL_HOLD", "STOPPED"};
    for (size_t i = 0; i < FB_ARRAY_LEN(running); i++)
        if (strcmp(state, running[i]) == 0)
            return 0;
    int exit_code = 0, sig = 0;
    if (sscanf(code, "%d:%d", &exit_code, &sig) != 2)
        return -1;
    int cancelled = strcmp(state, "CANCELLED") == 0;
    /* A job that ended by itself just before a scancel reached it reads
     * CANCELLED with its own exit code: the code is what counts. */
    if (sig > 0)
        *status = -sig;
    else if (cancelled && exit_code > 128 && exit_code < 128 + 65)
        *status = -(exit_code - 128); /* the shell reported the signal */
    else if (cancelled && exit_code == 0)
        *status = -SIGTERM;
    else if (exit_code == 0 && strcmp(state, "COMPLETED") != 0)
        *status = 255; /* FAILED, NODE_FAIL, TIMEOUT, OUT_OF_MEMORY... */
    else
        *status = exit_code;
    return 1;
}

static int duration_number(const char **p, long long *v)
{
    if (**p < '0' || **p > '9')
        return -1;
    long long n = 0;
    while (**p >= '0' && **p <= '9') {
        n = n * 10 + (**p - '0');
        if (n > 100000000)
            return -1;
        (*p)++;
    }
    *v = n;
    return 0;
}

int fb_slurm_parse_duration(const char *text, long long *seconds)
{
    size_t len = strcspn(text, " \n");
    static const char *const none[] = {"UNLIMITED", "INFINITE", "NOT_SET",
                                       "INVALID"};
    for (size_t i = 0; i < FB_ARRAY_LEN(none); i++)
        if (len == strlen(none[i]) && strncmp(text, none[i], len) == 0)
            return 0;
    const char *p = text, *end = text + len;
    long long days = 0, f[3];
    int n = 0, has_days = memchr(text, '-', len) != NULL;
    if (has_days && (duration_number(&p, &days) != 0 || *p++ != '-'))
        return -1;
    while (n < 3 && p < end) {
        if (duration_number(&p, &f[n++]) != 0)
            return -1;
        if (p < end && *p++ != ':')
            return -1;
        if (p == end && p[-1] == ':')
            return -1;
    }
    if (p != end || n == 0)
        return -1;
    long long s;
    if (has_days) /* D-H, D-H:M, D-H:M:S */
        s = f[0] * 3600 + (n > 1 ? f[1] * 60 : 0) + (n > 2 ? f[2] : 0);
    else if (n == 1) /* M */
        s = f[0] * 60;
    else if (n == 2) /* M:S */
        s = f[0] * 60 + f[1];
    else /* H:M:S */
        s = f[0] * 3600 + f[1] * 60 + f[2];
    *seconds = days * 86400 + s;
    return 1;
}

/* ---- the state thread ---------------------------------------------------- */

/* Queues a stop of job id for the thread; mu held. */
static void add_cancel(struct slurm_state *s, const char *id, int force,
                       int running)
{
    for (size_t i = 0; i < s->n_cancels; i++) {
        if (strcmp(s->cancels[i].id, id) == 0) {
            s->cancels[i].force |= force;
            s->cancels[i].running |= running;
            return;
        }
    }
    if (s->n_cancels == s->cap_cancels) {
        size_t cap = s->cap_cancels ? 2 * s->cap_cancels : 32;
        struct cancel *c = realloc(s->cancels, cap * sizeof *c);
        if (!c) {
            fb_log_error("slurm: out of memory: cannot cancel job %s", id);
            return;
        }
        s->cancels = c;
        s->cap_cancels = cap;
    }
    struct cancel *c = &s->cancels[s->n_cancels++];
    fb_strlcpy(c->id, id, sizeof c->id);
    c->force = force;
    c->running = running;
    c->mode = STOP_CANCEL;
}

/* Runs one scancel for the ids in list whose mode is mode:
 *
 *   STOP_TERM, STOP_KILL: `scancel --signal=TERM|KILL --batch`, for jobs
 *     squeue saw running: the signal goes at once to the batch step, that
 *     is the program (the script exec'd it), so a job ends the way a
 *     local process would, and the runtime's terminate_grace_ms, not the
 *     cluster's KillWait, decides when SIGTERM turns into SIGKILL.
 *     (Without --batch, or with --full, slurmd handles SIGKILL as a
 *     cancel and the program lives on for seconds.)
 *   STOP_CANCEL: a plain `scancel`, for jobs not seen running: it removes
 *     a pending job, or one array element of a pending array, alone (a
 *     signal sent to a pending array element ends the whole array).
 *
 * --quiet: a job that already ended is no error. */
static void run_scancel(struct slurm_state *s, struct cancel *list, size_t n,
                        int mode)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        m += list[i].mode == mode;
    if (m == 0)
        return;
    char **argv = calloc(m + 5, sizeof *argv);
    if (!argv)
        return;
    size_t k = 0;
    argv[k++] = s->scancel;
    argv[k++] = "--quiet";
    if (mode != STOP_CANCEL) {
        argv[k++] = mode == STOP_KILL ? "--signal=KILL" : "--signal=TERM";
        argv[k++] = "--batch";
    }
    size_t first = k;
    for (size_t i = 0; i < n; i++)
        if (list[i].mode == mode)
            argv[k++] = list[i].id;
    fiber_buf out = {0}, err = {0};
    int rc = fb_slurm_run(argv, &out, &err, TOOL_TIMEOUT_MS);
    if (rc != 0) {
        char line[300];
        fb_slurm_last_line(&err, line, sizeof line);
        fb_log_debug("slurm: scancel %s%s%s: %s",
                     mode == STOP_CANCEL ? "" : argv[2],
                     mode == STOP_CANCEL ? "" : " ", argv[first], line);
    }
    fiber_buf_free(&out);
    fiber_buf_free(&err);
    free(argv);
}

/* A job that left the queue: asks scontrol how it ended. */
static void query_end(struct slurm_state *s, const char *id)
{
    char *argv[] = {s->scontrol, "-o", "show", "job", (char *)id, NULL};
    fiber_buf out = {0}, err = {0};
    int rc = fb_slurm_run(argv, &out, &err, TOOL_TIMEOUT_MS);
    char state[32] = "";
    int status = 255;
    int ended = 1;
    if (rc == 0) {
        fiber_buf_append(&out, "", 1);
        int r = fb_slurm_parse_job((const char *)out.data, state,
                                   sizeof state, &status);
        if (r == 0)
            ended = 0; /* still there: squeue raced with it */
        else if (r < 0)
            status = 255;
    } else {
        /* Forgotten already (MinJobAge passed): it ended, how is lost. */
        fb_log_info("slurm: job %s has ended and its state is gone", id);
    }
    pthread_mutex_lock(&s->mu);
    for (struct sjob *j = s->jobs; j && ended; j = j->next) {
        if (strcmp(j->id, id) == 0 && !j->ended) {
            /* Slurm records a cancelled job as ended by SIGTERM (0:15)
             * even when it took a SIGKILL: one we killed reads -SIGKILL. */
            if (j->killed && status == -SIGTERM &&
                strcmp(state, "CANCELLED") == 0)
                status = -SIGKILL;
            j->status = status;
            j->ended = 1;
            fb_log_debug("slurm: job %s '%s' ended: %s, status %d", id,
                         j->name, state[0] ? state : "unknown", status);
        }
    }
    pthread_mutex_unlock(&s->mu);
    fiber_buf_free(&out);
    fiber_buf_free(&err);
}

/* Is id among the squeue lines in out ("<id> <state> <reason>")? */
static const char *queue_line(const fiber_buf *out, const char *id)
{
    size_t n = strlen(id);
    const char *p = (const char *)out->data;
    while (p && *p) {
        if (strncmp(p, id, n) == 0 && p[n] == ' ')
            return p + n + 1;
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return NULL;
}

/* Chooses how to stop each job of list, asking squeue for their states
 * now: a job that started after the last poll must get a signal (a
 * cancel takes seconds to reach it), and one still pending a plain
 * cancel.  If squeue cannot be asked, the last poll's word stands. */
static void classify(struct slurm_state *s, struct cancel *list, size_t n)
{
    fiber_buf ids = {0}, out = {0}, err = {0};
    for (size_t i = 0; i < n; i++) {
        if (i)
            fiber_buf_append(&ids, ",", 1);
        fiber_buf_append(&ids, list[i].id, strlen(list[i].id));
    }
    int rc = fiber_buf_append(&ids, "", 1);
    char *argv[] = {s->squeue, "-h", "-r", "-j", (char *)ids.data,
                    "-o", "%i %T", NULL};
    if (rc == 0)
        rc = fb_slurm_run(argv, &out, &err, TOOL_TIMEOUT_MS);
    if (rc == 0)
        rc = fiber_buf_append(&out, "", 1);
    for (size_t i = 0; i < n; i++) {
        struct cancel *c = &list[i];
        if (rc == 0) {
            const char *state = queue_line(&out, c->id);
            c->running = state && strncmp(state, "RUNNING", 7) == 0;
        }
        c->mode = !c->running ? STOP_CANCEL : c->force ? STOP_KILL : STOP_TERM;
    }
    fiber_buf_free(&ids);
    fiber_buf_free(&out);
    fiber_buf_free(&err);
}

static void run_scancels(struct slurm_state *s, struct cancel *list,
                         size_t n)
{
    classify(s, list, n);
    run_scancel(s, list, n, STOP_CANCEL);
    run_scancel(s, list, n, STOP_TERM);
    run_scancel(s, list, n, STOP_KILL);
}

static void query_queue(struct slurm_state *s)
{
    char name[80];
    snprintf(name, sizeof name, "--name=%s", s->job_name);
    char user[48];
    snprintf(user, sizeof user, "--user=%s", s->user);
    char *argv[] = {s->squeue, "-h", "-r", name, user, "-o", "%i %T %L %r",
                    NULL};
    uint64_t asked = fb_now_ms();
    fiber_buf out = {0}, err = {0};
    int rc = fb_slurm_run(argv, &out, &err, TOOL_TIMEOUT_MS);
    if (rc != 0) {
        if (!s->warned_query) {
            char line[300];
            fb_slurm_last_line(&err, line, sizeof line);
            fb_log_warn("slurm: squeue failed (%d): %s; retrying", rc, line);
        }
        s->warned_query = 1;
        goto out;
    }
    s->warned_query = 0;
    fiber_buf_append(&out, "", 1);
    char gone[64][48];
    size_t n_gone = 0;
    pthread_mutex_lock(&s->mu);
    uint64_t now = fb_now_ms();
    for (struct sjob *j = s->jobs; j; j = j->next) {
        if (!j->id[0] || j->ended || j->submitted_ms > asked)
            continue;
        const char *rest = queue_line(&out, j->id);
        j->running = rest && strncmp(rest, "RUNNING", 7) == 0;
        /* "<state> <time left> <reason>": a running job's time left
         * counts from when squeue answered, after `asked`; a second off
         * for its rounding keeps the estimate early. */
        const char *left = rest ? strchr(rest, ' ') : NULL;
        long long secs = 0;
        if (j->running && left &&
            fb_slurm_parse_duration(left + 1, &secs) == 1)
            j->end_by_ms = asked + (uint64_t)secs * 1000u -
                           (secs > 0 ? 1000u : 0u);
        const char *reason = left ? strchr(left + 1, ' ') : NULL;
        if (!rest) {
            if (n_gone < FB_ARRAY_LEN(gone))
                fb_strlcpy(gone[n_gone++], j->id, sizeof gone[0]);
        } else if (strncmp(rest, "PENDING", 7) == 0 &&
                   now - j->submitted_ms > PENDING_NOTE_MS &&
                   !j->noted_pending_ms) {
            j->noted_pending_ms = now;
            reason = reason ? reason + 1 : "unknown";
            fb_log_info("slurm: job %s '%s' is still pending (reason %.*s)",
                        j->id, j->name, (int)strcspn(reason, "\n"), reason);
        }
    }
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < n_gone; i++)
        query_end(s, gone[i]);
out:
    fiber_buf_free(&out);
    fiber_buf_free(&err);
}

static void *state_thread(void *arg)
{
    struct slurm_state *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stopping) {
        if (s->n_cancels) {
            struct cancel *list = s->cancels;
            size_t n = s->n_cancels;
            s->cancels = NULL;
            s->n_cancels = s->cap_cancels = 0;
            pthread_mutex_unlock(&s->mu);
            run_scancels(s, list, n);
            free(list);
            pthread_mutex_lock(&s->mu);
            continue;
        }
        int live = 0;
        for (struct sjob *j = s->jobs; j && !live; j = j->next)
            live = j->id[0] && !j->ended;
        if (live) {
            pthread_mutex_unlock(&s->mu);
            query_queue(s);
            pthread_mutex_lock(&s->mu);
        }
        if (s->stopping || s->n_cancels)
            continue;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += QUERY_INTERVAL_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->cv, &s->mu, &until);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int fb_slurm_describe(char *detail, size_t size)
{
    char sinfo[PATH_MAX], sbatch[PATH_MAX];
    if (fb_slurm_find_tool("sinfo", sinfo, sizeof sinfo) != 0 ||
        fb_slurm_find_tool("sbatch", sbatch, sizeof sbatch) != 0) {
        snprintf(detail, size,
                 "Slurm's client tools are not on PATH (Debian: "
                 "slurm-client)");
        return fb_err(FIBER_ENOTSUP, "%s", detail);
    }
    char *argv[] = {sinfo, "-h", "-o", "%R %D %T", NULL};
    fiber_buf out = {0}, err = {0};
    int rc = fb_slurm_run(argv, &out, &err, 15000);
    if (rc != 0) {
        char line[300];
        fb_slurm_last_line(&err, line, sizeof line);
        snprintf(detail, size, "the controller does not answer: %s",
                 rc < 0 ? "sinfo timed out" : line);
        fiber_buf_free(&out);
        fiber_buf_free(&err);
        return fb_err(FIBER_EUNREACHABLE, "%s", detail);
    }
    /* "debug 4 idle" lines become "partitions: debug 4 idle, ...". */
    fiber_buf_append(&out, "", 1);
    size_t used = (size_t)snprintf(detail, size, "controller answers; ");
    const char *sep = "partitions: ";
    for (char *p = (char *)out.data, *nl; p && *p && used < size; p = nl) {
        nl = strchr(p, '\n');
        if (nl)
            *nl++ = '\0';
        if (*p)
            used += (size_t)snprintf(detail + used, size - used, "%s%s", sep,
                                     p);
        sep = ", ";
    }
    fiber_buf_free(&out);
    fiber_buf_free(&err);
    return 0;
}

/* ---- init and fini ------------------------------------------------------- */

int fb_slurm_base_dir(const char *slurm_dir, char *out, size_t size)
{
    const char *home = getenv("HOME");
    char cwd[PATH_MAX - 32];
    int n;
    if (slurm_dir && slurm_dir[0]) {
        n = snprintf(out, size, "%s", slurm_dir);
    } else if (home && home[0] == '/') {
        n = snprintf(out, size, "%s/.fiber/slurm", home);
    } else {
        if (!getcwd(cwd, sizeof cwd))
            return fb_err_errno(FIBER_ESYS, "slurm: getcwd");
        n = snprintf(out, size, "%s/.fiber-slurm", cwd);
    }
    if (n < 0 || (size_t)n >= size)
        return fb_err(FIBER_ECONFIG, "slurm_dir '%.200s' is too long",
                      slurm_dir && slurm_dir[0] ? slurm_dir : out);
    return 0;
}

static int find_tools(struct slurm_state *s)
{
    static const char *const names[] = {"sbatch", "squeue", "scontrol",
                                        "scancel"};
    char *paths[] = {s->sbatch, s->squeue, s->scontrol, s->scancel};
    for (size_t i = 0; i < FB_ARRAY_LEN(names); i++)
        if (fb_slurm_find_tool(names[i], paths[i], PATH_MAX) != 0)
            return fb_err(FIBER_EUNREACHABLE,
                          "slurm backend: '%s' is not on PATH; install "
                          "Slurm's client tools (Debian: slurm-client) or "
                          "run on a cluster node",
                          names[i]);
    return 0;
}

/* Checks that the controller answers, and that slurm_partition exists. */
static int check_cluster(struct slurm_state *s, const struct fb_config *cfg)
{
    char user[48];
    snprintf(user, sizeof user, "--user=%s", s->user);
    char *argv[] = {s->squeue, "-h", user, "-o", "%i", NULL};
    fiber_buf out = {0}, err = {0};
    int rc = fb_slurm_run(argv, &out, &err, TOOL_TIMEOUT_MS);
    char line[300];
    fb_slurm_last_line(&err, line, sizeof line);
    fiber_buf_free(&out);
    fiber_buf_free(&err);
    if (rc != 0)
        return fb_err(FIBER_EUNREACHABLE,
                      "slurm backend: the Slurm controller does not answer "
                      "(squeue: %s); is slurmctld running, and SLURM_CONF "
                      "right?",
                      rc < 0 ? "timed out" : line);
    if (!cfg->slurm_partition[0])
        return 0;
    char *argv2[] = {s->scontrol, "-o", "show", "partition", NULL};
    rc = fb_slurm_run(argv2, &out, &err, TOOL_TIMEOUT_MS);
    fiber_buf_append(&out, "", 1);
    char names[256] = "";
    size_t used = 0;
    int found = 0;
    for (const char *p = (const char *)out.data; rc == 0 && p && *p;) {
        char name[64];
        if (field(p, "PartitionName", name, sizeof name) == 0) {
            found |= strcmp(name, cfg->slurm_partition) == 0;
            used += (size_t)snprintf(names + used, sizeof names - used,
                                     "%s%s", used ? ", " : "", name);
            if (used >= sizeof names)
                used = sizeof names - 1;
        }
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    fiber_buf_free(&out);
    fiber_buf_free(&err);
    if (rc == 0 && !found)
        return fb_err(FIBER_ECONFIG,
                      "slurm_partition '%s' does not exist on this cluster; "
                      "partitions: %s",
                      cfg->slurm_partition, names[0] ? names : "none");
    return 0;
}

/* Starts the guard that cancels the run's jobs when the master is gone. */
static int start_guard(struct slurm_state *s)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return fb_err_errno(FIBER_ESYS, "slurm: pipe");
    char name[80], user[48];
    snprintf(name, sizeof name, "--name=%s", s->job_name);
    snprintf(user, sizeof user, "--user=%s", s->user);
    char *argv[] = {"/bin/sh", "-c",
                    "cat >/dev/null; exec \"$0\" --quiet \"$1\" \"$2\"",
                    s->scancel, name, user, NULL};
    int err = fb_slurm_spawn(argv, p[0], -1, -1, &s->guard_pid);
    close(p[0]);
    if (err != 0) {
        close(p[1]);
        errno = err;
        return fb_err_errno(FIBER_ESYS, "slurm: cannot start the guard");
    }
    s->guard_fd = p[1];
    return 0;
}

static int slurm_init(struct fb_backend *be)
{
    struct slurm_state *s = be->state;
    const struct fb_config *cfg = be->cfg;
    s->guard_fd = -1;
    s->guard_pid = -1;
    snprintf(s->user, sizeof s->user, "%u", (unsigned)getuid());
    int rc = find_tools(s);
    if (rc == 0)
        rc = check_cluster(s, cfg);
    if (rc)
        return rc;
    if (!getcwd(s->cwd, sizeof s->cwd))
        return fb_err_errno(FIBER_ESYS, "slurm: getcwd");
    const char *run = be->run_id;
    fb_strlcpy(s->job_name, run, sizeof s->job_name); /* "fiber-..." */
    char base[PATH_MAX];
    rc = fb_slurm_base_dir(cfg->slurm_dir, base, sizeof base);
    if (rc)
        return rc;
    int len = snprintf(s->dir, sizeof s->dir, "%s/%s", base, run);
    if (len < 0 || (size_t)len >= sizeof s->dir)
        return fb_err(FIBER_ECONFIG, "slurm_dir '%s' is too long", base);
    if (fb_make_dirs(s->dir) != 0 || chmod(s->dir, 0700) != 0)
        return fb_err_errno(FIBER_ESYS,
                            "slurm: cannot make the run folder %s (the "
                            "slurm_dir key)",
                            s->dir);
    snprintf(s->secret_path, sizeof s->secret_path, "%s/secret", s->dir);
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    rc = start_guard(s);
    if (rc == 0) {
        rc = fb_thread_start(&s->thread, state_thread, s,
                             "the slurm backend's thread");
        s->thread_started = rc == 0;
    }
    if (rc) {
        if (s->guard_fd >= 0)
            close(s->guard_fd);
        rmdir(s->dir);
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        return rc;
    }
    fb_log_info("slurm: run folder %s, job name %s", s->dir, s->job_name);
    return 0;
}

int fb_slurm_is_job_output(const char *name)
{
    size_t n = strlen(name);
    if (n < 5 || strcmp(name + n - 4, ".out") != 0)
        return 0;
    size_t digits = strspn(name, "0123456789");
    if (digits == 0)
        return 0;
    if (name[digits] == '_') {
        size_t more = strspn(name + digits + 1, "0123456789");
        if (more == 0)
            return 0;
        digits += 1 + more;
    }
    return digits == n - 4;
}

/* Removes the run folder's scripts, secret and empty job outputs, and
 * the names file and the folder itself if nothing else is left.  What `fiber run` put there (master.out,
 * master.err: the master's output, which Slurm writes until the master
 * process has exited, after this) stays for fiber logs and fiber clean. */
static void tidy_dir(struct slurm_state *s)
{
    DIR *d = opendir(s->dir);
    if (!d)
        return;
    struct dirent *e;
    int kept = 0; /* what stays, but for the names file */
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", s->dir, e->d_name);
        struct stat st;
        size_t n = strlen(e->d_name);
        int script = strncmp(e->d_name, "batch-", 6) == 0 && n > 3 &&
                     strcmp(e->d_name + n - 3, ".sh") == 0;
        int output = fb_slurm_is_job_output(e->d_name);
        if (script || strcmp(e->d_name, "secret") == 0 ||
            (output && stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
             st.st_size == 0))
            unlink(path);
        else
            kept += strcmp(e->d_name, FB_SLURM_NAMES_FILE) != 0;
    }
    closedir(d);
    if (!kept) {
        char path[PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/%s", s->dir, FB_SLURM_NAMES_FILE);
        unlink(path);
    }
    if (rmdir(s->dir) != 0 && errno == ENOTEMPTY)
        fb_log_info("slurm: job output kept in %s", s->dir);
}

static void slurm_fini(struct fb_backend *be)
{
    struct slurm_state *s = be->state;
    pthread_mutex_lock(&s->mu);
    struct cancel *list = s->cancels;
    size_t n = s->n_cancels;
    s->cancels = NULL;
    s->n_cancels = s->cap_cancels = 0;
    s->stopping = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->thread_started)
        pthread_join(s->thread, NULL);
    run_scancels(s, list, n);
    free(list);
    /* The guard cancels whatever of the run is left (nothing, normally). */
    if (s->guard_fd >= 0)
        close(s->guard_fd);
    tidy_dir(s);
    free(s->batch);
    free(s->batch_jobs);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
}

/* ---- submitting ---------------------------------------------------------- */

static int write_secret(struct slurm_state *s, const void *secret, size_t len)
{
    if (s->secret_written)
        return 0;
    int fd = open(s->secret_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC |
                                      O_NOFOLLOW,
                  0600);
    if (fd < 0)
        return fb_err_errno(FIBER_ESYS, "slurm: cannot write %s",
                            s->secret_path);
    int ok = fchmod(fd, 0600) == 0 && write(fd, secret, len) == (ssize_t)len;
    ok = close(fd) == 0 && ok;
    if (!ok) {
        unlink(s->secret_path);
        return fb_err_errno(FIBER_ESYS, "slurm: cannot write %s",
                            s->secret_path);
    }
    s->secret_written = 1;
    return 0;
}

/* The script branch that runs one job: its environment, then the program.
 * Returns 0 or FIBER_ENOMEM. */
static int make_branch(struct slurm_state *s, const struct fb_job_spec *spec,
                       const char *program, fiber_buf *b)
{
    int rc = 0;
    for (char *const *e = spec->env; rc == 0 && e && *e; e++) {
        rc = fiber_buf_append(b, "export ", 7);
        if (rc == 0)
            rc = fb_slurm_shell_quote(b, *e);
        if (rc == 0)
            rc = fiber_buf_append(b, "\n", 1);
    }
    char var[PATH_MAX + 32];
    snprintf(var, sizeof var, "%s=%s", SECRET_VAR, s->secret_path);
    if (rc == 0)
        rc = fiber_buf_append(b, "export ", 7);
    if (rc == 0)
        rc = fb_slurm_shell_quote(b, var);
    if (rc == 0)
        rc = fiber_buf_append(b, "\nexec ", 6);
    if (rc == 0)
        rc = fb_slurm_shell_quote(b, program);
    for (char *const *a = spec->argv + (spec->argv[0] ? 1 : 0);
         rc == 0 && *a; a++) {
        rc = fiber_buf_append(b, " ", 1);
        if (rc == 0)
            rc = fb_slurm_shell_quote(b, *a);
    }
    if (rc == 0)
        rc = fiber_buf_append(b, "\n", 1);
    return rc;
}

/* The sbatch options a job's resources ask for, '\n'-separated. */
static int make_opts(struct slurm_state *s, const struct fb_job_spec *spec,
                     fiber_buf *b)
{
    const fiber_job_opts *o = spec->opts;
    char line[PATH_MAX + 32];
    int rc = 0;
#define OPT(...)                                                               \
    do {                                                                       \
        snprintf(line, sizeof line, __VA_ARGS__);                              \
        if (rc == 0)                                                           \
            rc = fiber_buf_append(b, line, strlen(line) + 1);                  \
    } while (0)
    OPT("--chdir=%s", o && o->workdir ? o->workdir : s->cwd);
    if (o && o->cpu > 0)
        OPT("--cpus-per-task=%d", o->cpu);
    if (o && o->memory_mb > 0)
        OPT("--mem=%dM", o->memory_mb);
    if (o && o->gpu > 0)
        OPT("--gres=gpu:%d", o->gpu);
#undef OPT
    return rc;
}

/* Appends a line "<job id> <name>" for each job just submitted to the run
 * folder's names file, so that fiber ps and fiber logs can call a Slurm
 * job by its fiber name.  Losing it costs only the names. */
static void record_names(struct slurm_state *s, struct sjob **list, size_t n)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/%s", s->dir, FB_SLURM_NAMES_FILE);
    fiber_buf text = {0};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        char line[160];
        int w = snprintf(line, sizeof line, "%s %s\n", list[i]->id,
                         list[i]->name);
        for (int c = 0; c < w - 1; c++)
            if ((unsigned char)line[c] < 0x20)
                line[c] = '_';
        rc = fiber_buf_append(&text, line, (size_t)w);
    }
    int fd = rc == 0 ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
                            0600)
                     : -1;
    if (fd < 0 || write(fd, text.data, text.len) != (ssize_t)text.len)
        fb_log_debug("slurm: cannot record job names in %s", path);
    if (fd >= 0)
        close(fd);
    fiber_buf_free(&text);
}

/* Submits the jobs in list (count n, all with the same sbatch options) as
 * one submission: an array job when n > 1.  On success fills each job's
 * id; on failure returns FIBER_ESPAWN naming the jobs and sbatch's own
 * words. */
static int submit(struct fb_backend *be, struct sjob **list,
                  struct fb_job **jobs, size_t n)
{
    struct slurm_state *s = be->state;
    const struct fb_config *cfg = be->cfg;
    char script[PATH_MAX];
    snprintf(script, sizeof script, "%s/batch-%d.sh", s->dir,
             ++s->script_seq);
    fiber_buf text = {0};
    int rc = 0;
    char head[256];
    snprintf(head, sizeof head,
             "#!/bin/sh\n# fiber run %s: %zu job(s), written by fiber's "
             "slurm backend\ncase \"${SLURM_ARRAY_TASK_ID:-0}\" in\n",
             be->run_id, n);
    rc = fiber_buf_append(&text, head, strlen(head));
    for (size_t i = 0; rc == 0 && i < n; i++) {
        char label[32];
        snprintf(label, sizeof label, "%zu)\n", i);
        rc = fiber_buf_append(&text, label, strlen(label));
        if (rc == 0)
            rc = fiber_buf_append(&text, list[i]->branch.data,
                                  list[i]->branch.len);
        if (rc == 0)
            rc = fiber_buf_append(&text, ";;\n", 3);
    }
    static const char tail[] =
        "esac\necho \"fiber: no job for array task "
        "$SLURM_ARRAY_TASK_ID\" >&2\nexit 127\n";
    if (rc == 0)
        rc = fiber_buf_append(&text, tail, sizeof tail - 1);
    if (rc) {
        fiber_buf_free(&text);
        return fb_err(FIBER_ENOMEM, "slurm: out of memory writing a script");
    }
    int fd = open(script, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0700);
    int ok = fd >= 0 && write(fd, text.data, text.len) == (ssize_t)text.len;
    if (fd >= 0)
        ok = close(fd) == 0 && ok;
    fiber_buf_free(&text);
    if (!ok)
        return fb_err_errno(FIBER_ESYS, "slurm: cannot write %s", script);

    /* sbatch's arguments: fixed ones, the job's, the config's, extra. */
    char *argv[64 + 32];
    size_t k = 0;
    char name[80], output[PATH_MAX + 16], array[48], part[96], acct[96],
        tlimit[64];
    argv[k++] = s->sbatch;
    argv[k++] = "--parsable";
    argv[k++] = "--no-requeue";
    argv[k++] = "--ntasks=1";
    snprintf(name, sizeof name, "--job-name=%s", s->job_name);
    argv[k++] = name;
    argv[k++] = "--comment=" FB_SLURM_JOB_COMMENT;
    snprintf(output, sizeof output, "--output=%s/%s", s->dir,
             n > 1 ? "%A_%a.out" : "%j.out");
    argv[k++] = output;
    if (n > 1) {
        snprintf(array, sizeof array, "--array=0-%zu", n - 1);
        argv[k++] = array;
    }
    if (cfg->slurm_partition[0]) {
        snprintf(part, sizeof part, "--partition=%s", cfg->slurm_partition);
        argv[k++] = part;
    }
    if (cfg->slurm_account[0]) {
        snprintf(acct, sizeof acct, "--account=%s", cfg->slurm_account);
        argv[k++] = acct;
    }
    if (cfg->slurm_time_limit[0]) {
        snprintf(tlimit, sizeof tlimit, "--time=%s", cfg->slurm_time_limit);
        argv[k++] = tlimit;
    }
    for (size_t off = 0; off < list[0]->sopts.len && k < 40;) {
        char *o = (char *)list[0]->sopts.data + off;
        argv[k++] = o;
        off += strlen(o) + 1;
    }
    char extra[sizeof cfg->slurm_sbatch_args];
    fb_strlcpy(extra, cfg->slurm_sbatch_args, sizeof extra);
    char *save = NULL;
    for (char *t = strtok_r(extra, " ", &save); t && k < 90;
         t = strtok_r(NULL, " ", &save))
        argv[k++] = t;
    argv[k++] = script;
    argv[k] = NULL;

    fiber_buf out = {0}, err = {0};
    rc = fb_slurm_run(argv, &out, &err, TOOL_TIMEOUT_MS);
    char line[400];
    if (rc == 0)
        fb_slurm_last_line(&out, line, sizeof line);
    else
        fb_slurm_join_lines(&err, line, sizeof line);
    fiber_buf_free(&out);
    fiber_buf_free(&err);
    char *end = NULL;
    unsigned long long id = rc == 0 ? strtoull(line, &end, 10) : 0;
    if (rc != 0 || id == 0 || (*end && *end != ';')) {
        if (rc < 0)
            snprintf(line, sizeof line, "%s",
                     errno == ETIMEDOUT ? "timed out" : strerror(errno));
        return fb_err(FIBER_ESPAWN, "slurm: sbatch refused job%s '%s'%s: %s",
                      n > 1 ? "s" : "", list[0]->name,
                      n > 1 ? " and the rest of its array" : "",
                      line[0] ? line : "no reason given");
    }
    uint64_t now = fb_now_ms();
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < n; i++) {
        struct sjob *j = list[i];
        if (n > 1) {
            snprintf(j->id, sizeof j->id, "%llu_%zu", id, i);
            snprintf(j->out_path, sizeof j->out_path, "%s/%llu_%zu.out",
                     s->dir, id, i);
        } else {
            snprintf(j->id, sizeof j->id, "%llu", id);
            snprintf(j->out_path, sizeof j->out_path, "%s/%llu.out", s->dir,
                     id);
        }
        fb_strlcpy(jobs[i]->engine_id, j->id, sizeof jobs[i]->engine_id);
        j->submitted_ms = now;
        fiber_buf_free(&j->branch);
        fiber_buf_free(&j->sopts);
    }
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    record_names(s, list, n);
    fb_log_debug("slurm: submitted %s%s (%zu job%s)", list[n - 1]->id,
                 n > 1 ? " (array)" : "", n, n > 1 ? "s" : "");
    return 0;
}

static void link_sjob(struct slurm_state *s, struct sjob *j)
{
    pthread_mutex_lock(&s->mu);
    j->prev = NULL;
    j->next = s->jobs;
    if (s->jobs)
        s->jobs->prev = j;
    s->jobs = j;
    pthread_mutex_unlock(&s->mu);
}

static int slurm_create_job(struct fb_backend *be,
                            const struct fb_job_spec *spec, struct fb_job *job)
{
    struct slurm_state *s = be->state;
    struct sjob *j = job->priv;
    if (spec->opts && spec->opts->image)
        return fb_err(FIBER_ENOTSUP,
                      "job '%s': the slurm backend runs the program itself, "
                      "not an image",
                      spec->name);
    char program[PATH_MAX];
    int rc = fb_job_program(spec, program, sizeof program);
    if (rc == 0)
        rc = write_secret(s, spec->secret, spec->secret_len);
    if (rc)
        return rc;
    fb_strlcpy(j->name, spec->name, sizeof j->name);
    if (make_branch(s, spec, program, &j->branch) != 0 ||
        make_opts(s, spec, &j->sopts) != 0) {
        fiber_buf_free(&j->branch);
        fiber_buf_free(&j->sopts);
        return fb_err(FIBER_ENOMEM, "slurm: out of memory");
    }
    job->pid = -1;
    job->state = FB_JOB_RUNNING;
    if (s->batching) {
        if (s->n_batch == s->cap_batch) {
            size_t cap = s->cap_batch ? 2 * s->cap_batch : 16;
            struct sjob **b = realloc(s->batch, cap * sizeof *b);
            struct fb_job **bj =
                b ? realloc(s->batch_jobs, cap * sizeof *bj) : NULL;
            if (b)
                s->batch = b;
            if (!bj) {
                fiber_buf_free(&j->branch);
                fiber_buf_free(&j->sopts);
                return fb_err(FIBER_ENOMEM, "slurm: out of memory");
            }
            s->batch_jobs = bj;
            s->cap_batch = cap;
        }
        s->batch[s->n_batch] = j;
        s->batch_jobs[s->n_batch++] = job;
        link_sjob(s, j);
        return 0;
    }
    rc = submit(be, &j, &job, 1);
    if (rc) {
        fiber_buf_free(&j->branch);
        fiber_buf_free(&j->sopts);
        return rc;
    }
    link_sjob(s, j);
    return 0;
}

static void slurm_begin_batch(struct fb_backend *be)
{
    struct slurm_state *s = be->state;
    s->batching = 1;
}

static int same_opts(const struct sjob *a, const struct sjob *b)
{
    return a->sopts.len == b->sopts.len &&
           (a->sopts.len == 0 ||
            memcmp(a->sopts.data, b->sopts.data, a->sopts.len) == 0);
}

static int slurm_end_batch(struct fb_backend *be)
{
    struct slurm_state *s = be->state;
    s->batching = 0;
    int first_rc = 0;
    /* Jobs stopped before they were submitted are skipped. */
    size_t m = 0;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n_batch; i++) {
        if (!s->batch[i]->ended) {
            s->batch[m] = s->batch[i];
            s->batch_jobs[m++] = s->batch_jobs[i];
        } else {
            fiber_buf_free(&s->batch[i]->branch);
            fiber_buf_free(&s->batch[i]->sopts);
        }
    }
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < m;) {
        size_t n = 1;
        while (i + n < m && same_opts(s->batch[i], s->batch[i + n]))
            n++;
        int rc = submit(be, s->batch + i, s->batch_jobs + i, n);
        if (rc) {
            pthread_mutex_lock(&s->mu);
            for (size_t k = i; k < i + n; k++) {
                s->batch[k]->ended = 1;
                s->batch[k]->status = 127;
                fiber_buf_free(&s->batch[k]->branch);
                fiber_buf_free(&s->batch[k]->sopts);
            }
            pthread_mutex_unlock(&s->mu);
            if (!first_rc)
                first_rc = rc;
        }
        i += n;
    }
    s->n_batch = 0;
    return first_rc;
}

/* ---- watching and stopping ----------------------------------------------- */

static int slurm_poll_job(struct fb_backend *be, struct fb_job *job)
{
    struct slurm_state *s = be->state;
    struct sjob *j = job->priv;
    pthread_mutex_lock(&s->mu);
    if (j->ended) {
        job->state = FB_JOB_EXITED;
        job->exit_status = j->status;
    }
    job->end_by_ms = j->end_by_ms;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int slurm_signal_job(struct fb_backend *be, struct fb_job *job,
                            int force)
{
    struct slurm_state *s = be->state;
    struct sjob *j = job->priv;
    pthread_mutex_lock(&s->mu);
    if (!j->id[0] && !j->ended) {
        /* Not submitted yet (inside a batch): it never will be. */
        j->ended = 1;
        j->status = force ? -SIGKILL : -SIGTERM;
    } else if (!j->ended) {
        j->killed |= force;
        add_cancel(s, j->id, force, j->running);
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int slurm_logs(struct fb_backend *be, struct fb_job *job,
                      fiber_buf *out)
{
    FB_UNUSED(be);
    struct sjob *j = job->priv;
    if (!j->out_path[0])
        return 0;
    int fd = open(j->out_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return 0; /* the job has not started, or wrote nothing */
        return fb_err_errno(FIBER_ESYS, "slurm: cannot read %s",
                            j->out_path);
    }
    struct stat st;
    off_t from = 0;
    if (fstat(fd, &st) == 0 && st.st_size > OUTPUT_TAIL_BYTES)
        from = st.st_size - OUTPUT_TAIL_BYTES;
    char chunk[8192];
    ssize_t n;
    int rc = 0;
    while (rc == 0 && (n = pread(fd, chunk, sizeof chunk, from)) > 0) {
        rc = fiber_buf_append(out, chunk, (size_t)n);
        from += n;
    }
    close(fd);
    return rc;
}

static void slurm_release_job(struct fb_backend *be, struct fb_job *job)
{
    struct slurm_state *s = be->state;
    struct sjob *j = job->priv;
    pthread_mutex_lock(&s->mu);
    if (j->id[0] && !j->ended)
        add_cancel(s, j->id, 1, j->running);
    if (j->prev)
        j->prev->next = j->next;
    else if (s->jobs == j)
        s->jobs = j->next;
    if (j->next)
        j->next->prev = j->prev;
    j->next = j->prev = NULL;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    /* A job released inside a batch is taken out of it. */
    for (size_t i = 0; i < s->n_batch; i++) {
        if (s->batch[i] == j) {
            s->batch[i] = s->batch[s->n_batch - 1];
            s->batch_jobs[i] = s->batch_jobs[s->n_batch - 1];
            s->n_batch--;
            break;
        }
    }
    fiber_buf_free(&j->branch);
    fiber_buf_free(&j->sopts);
}

/* A requeued job's restarts (sbatch --requeue, scontrol requeue). */
static int slurm_restarts(void)
{
    const char *count = getenv("SLURM_RESTART_COUNT");
    if (!count || !*count)
        return 0;
    char *end = NULL;
    long v = strtol(count, &end, 10);
    return *end == '\0' && v > 0 && v <= 1000000 ? (int)v : 0;
}

const struct fb_backend_ops fb_backend_slurm = {
    .name = "slurm",
    .caps = 0,
    .state_size = sizeof(struct slurm_state),
    .job_size = sizeof(struct sjob),
    .init = slurm_init,
    .fini = slurm_fini,
    .create_job = slurm_create_job,
    .event_fd = NULL,
    .poll_job = slurm_poll_job,
    .signal_job = slurm_signal_job,
    .logs = slurm_logs,
    .release_job = slurm_release_job,
    .begin_batch = slurm_begin_batch,
    .end_batch = slurm_end_batch,
    .restarts = slurm_restarts,
};
