/*
 * runs.c -- the slurm backend's run-level operations (backend/runops.h):
 * what `fiber run --backend slurm`, fiber ps, logs, kill and clean do on
 * a Slurm cluster, from a submit host, with Slurm's own tools.
 *
 * The master.  `fiber run` submits the program as one batch job:
 *
 *   name     <run id>-master; its jobs (slurm.c) are named <run id>.  The
 *            names differ so that the master's own guard, which runs
 *            `scancel --name=<run id>` when the master ends, never
 *            cancels the master's job;
 *   comment  fiber:master (its jobs: fiber:job), which is how fiber ps
 *            tells fiber's jobs from the user's others;
 *   output   <run folder>/master.out and master.err, where the run folder
 *            is slurm.c's, <slurm_dir>/<run id> (default
 *            ~/.fiber/slurm/<run id>), which the compute nodes and the
 *            submit host share;
 *   env      the submitter's environment (sbatch's --export=ALL: PATH,
 *            SLURM_CONF, FIBER_* settings) and the run's variables
 *            (FIBER_BOOT_RUN, FIBER_BACKEND=slurm, --env), which the batch
 *            script exports before it execs the program;
 *   where    the submitter's working directory (--chdir), with the
 *            program at the path it has on the submit host.
 *
 * follow tails the two output files while asking `scontrol show job` every
 * half second whether the job has ended; wait asks the same.  Nothing runs
 * on the submit host once sbatch has returned: fiber run may be stopped
 * (^C) and the run goes on; fiber logs shows its output.
 *
 * Finding runs.  One `squeue --states=all` call lists this user's jobs
 * that slurmctld still holds (pending, running, and ended ones for
 * MinJobAge seconds; there is no accounting daemon to ask for older
 * ones), and the run folders under the slurm_dir base list what ended
 * runs left.  A fiber job is one whose comment starts with "fiber:", or,
 * from before fiber wrote comments, whose name is a run id as fiber
 * makes them (fiber-<8 hex digits>).  A job is shown by its fiber name
 * (the run folder's names file, written by slurm.c), else by its Slurm id.
 *
 * Every tool is run with fb_slurm_run (tool.c): the caller's environment,
 * a timeout, both output streams collected.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/runops.h"
#include "backend/slurm/slurm.h"
#include "base/common.h"
#include "runtime/runid.h"

#define TOOL_TIMEOUT_MS 30000
#define POLL_MS 200
#define STATE_EVERY_MS 500
#define GIVE_UP_MS 60000   /* scontrol failing this long: unreachable */
#define SETTLE_MS 30000    /* kill: how long the queue may take to empty */
#define YOUNG_FOLDER_S 10  /* a folder this new may be a run starting */
#define MASTER_OUT "master.out"
#define MASTER_ERR "master.err"
#define MASTER_SCRIPT "master.sh"

/* What start leaves for follow, wait and release (fiber_run.priv). */
struct run_priv {
    char scontrol[PATH_MAX];
    char out_path[PATH_MAX], err_path[PATH_MAX];
    off_t out_off, err_off;
    int ended;  /* scontrol said so, or forgot the job (lost) */
    int lost;   /* the job is gone from slurmctld: its status is unknown */
    int status; /* exit code, or -signal */
    uint64_t failing_since; /* scontrol failing since (ms), or 0 */
};

/* ---- small helpers ------------------------------------------------------- */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Finds tool name on PATH, or says it is missing (FIBER_EUNREACHABLE). */
static int need_tool(const char *name, char *path)
{
    if (fb_slurm_find_tool(name, path, PATH_MAX) == 0)
        return 0;
    return fb_err(FIBER_EUNREACHABLE,
                  "slurm: '%s' is not on PATH; install Slurm's client tools "
                  "(Debian: slurm-client) or run on a cluster node",
                  name);
}

/* Copies err without the "<tool>: " and "error: " each line starts with
 * ("sbatch: error: invalid partition specified: x"): the message names
 * the tool once. */
static void tool_words(const fiber_buf *err, const char *tool, char *out,
                       size_t size)
{
    fiber_buf clean = {0};
    const char *d = (const char *)err->data;
    size_t tl = strlen(tool);
    for (size_t i = 0; d && i < err->len;) {
        size_t n = 0;
        while (i + n < err->len && d[i + n] != '\n')
            n++;
        const char *line = d + i;
        size_t len = n;
        if (len > tl + 2 && strncmp(line, tool, tl) == 0 &&
            line[tl] == ':' && line[tl + 1] == ' ') {
            line += tl + 2;
            len -= tl + 2;
        }
        if (len > 7 && strncmp(line, "error: ", 7) == 0) {
            line += 7;
            len -= 7;
        }
        fiber_buf_append(&clean, line, len);
        fiber_buf_append(&clean, "\n", 1);
        i += n + 1;
    }
    fb_slurm_join_lines(&clean, out, size);
    fiber_buf_free(&clean);
}

/* Runs a tool; on failure returns FIBER_EUNREACHABLE (the controller did
 * not answer, or the tool timed out) or FIBER_EBACKEND (it refused),
 * with what it said.  On success out holds its output, NUL-terminated. */
static int run_tool(char *const argv[], fiber_buf *out, const char *what)
{
    fiber_buf err = {0};
    int rc = fb_slurm_run(argv, out, &err, TOOL_TIMEOUT_MS);
    int e = errno;
    const char *tool = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1
                                             : argv[0];
    char said[400];
    tool_words(&err, tool, said, sizeof said);
    fiber_buf_free(&err);
    if (rc < 0)
        return fb_err(FIBER_EUNREACHABLE, "slurm: %s (%s): %s", what, tool,
                      e == ETIMEDOUT ? "timed out" : strerror(e));
    if (rc != 0 && (strstr(said, "Unable to contact slurm controller") ||
                    strstr(said, "Socket timed out") ||
                    strstr(said, "Connection refused") ||
                    strstr(said, "Zero Bytes were transmitted")))
        return fb_err(FIBER_EUNREACHABLE,
                      "slurm: %s: the Slurm controller does not answer (%s: "
                      "%s); is slurmctld running, and SLURM_CONF right?",
                      what, tool, said);
    if (rc != 0)
        return fb_err(FIBER_EBACKEND, "slurm: %s: %s says: %s", what, tool,
                      said[0] ? said : "nothing (status only)");
    if (fiber_buf_append(out, "", 1) != 0)
        return fb_err(FIBER_ENOMEM, "out of memory");
    out->len--;
    return 0;
}

static int run_folder(const char *run, char *out, size_t size)
{
    char configured[PATH_MAX], base[PATH_MAX];
    int rc = fiber_config_get("slurm_dir", configured, sizeof configured);
    if (rc == 0)
        rc = fb_slurm_base_dir(configured, base, sizeof base);
    if (rc == 0 && (size_t)snprintf(out, size, "%s/%s", base, run) >= size)
        rc = fb_err(FIBER_ECONFIG, "slurm_dir '%.200s' is too long", base);
    return rc;
}

/* ---- the master's sbatch command line ----------------------------------- */

int fb_slurm_args_add(struct fb_slurm_args *a, const char *fmt, ...)
{
    if (a->n + 2 > a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 32;
        char **v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return fb_err(FIBER_ENOMEM, "out of memory");
        a->v = v;
        a->cap = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    char *text = NULL;
    int n = vasprintf(&text, fmt, ap);
    va_end(ap);
    if (n < 0)
        return fb_err(FIBER_ENOMEM, "out of memory");
    a->v[a->n++] = text;
    a->v[a->n] = NULL;
    return 0;
}

void fb_slurm_args_free(struct fb_slurm_args *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->v[i]);
    free(a->v);
    memset(a, 0, sizeof *a);
}

/* Adds "--<option>=<value of key>" when the key is set. */
static int add_key(struct fb_slurm_args *a, const char *option,
                   const char *key)
{
    char value[1024];
    int rc = fiber_config_get(key, value, sizeof value);
    if (rc == 0 && value[0])
        rc = fb_slurm_args_add(a, "--%s=%s", option, value);
    return rc;
}

int fb_slurm_master_args(const struct fb_run_start *s, const char *sbatch,
                         const char *dir, const char *cwd, const char *script,
                         struct fb_slurm_args *a)
{
    const fiber_run_opts *o = s->opts;
    int rc = fb_slurm_args_add(a, "%s", sbatch);
    if (rc == 0)
        rc = fb_slurm_args_add(a, "--parsable");
    if (rc == 0)
        rc = fb_slurm_args_add(a, "--job-name=%s%s", s->run,
                               FB_SLURM_MASTER_SUFFIX);
    if (rc == 0)
        rc = fb_slurm_args_add(a, "--comment=%s", FB_SLURM_MASTER_COMMENT);
    if (rc == 0)
        rc = fb_slurm_args_add(a, "--output=%s/%s", dir, MASTER_OUT);
    if (rc == 0)
        rc = fb_slurm_args_add(a, "--error=%s/%s", dir, MASTER_ERR);
    if (rc == 0) /* a requeued master adds to its output */
        rc = fb_slurm_args_add(a, "--open-mode=append");
    if (rc == 0)
        rc = fb_slurm_args_add(a, "--chdir=%s", cwd);
    if (rc == 0)
        rc = fb_slurm_args_add(a, "--ntasks=1");
    if (rc == 0) /* requeueable only when asked (fiber run --requeue) */
        rc = fb_slurm_args_add(a, o->requeue ? "--requeue" : "--no-requeue");
    if (rc == 0 && o->signal_s > 0) /* B: the batch shell, see the script */
        rc = fb_slurm_args_add(a, "--signal=B:USR1@%d", o->signal_s);
    if (rc == 0 && o->cpu > 0)
        rc = fb_slurm_args_add(a, "--cpus-per-task=%d", o->cpu);
    if (rc == 0 && o->memory_mb > 0)
        rc = fb_slurm_args_add(a, "--mem=%dM", o->memory_mb);
    if (rc == 0 && o->gpu > 0)
        rc = fb_slurm_args_add(a, "--gres=gpu:%d", o->gpu);
    if (rc == 0)
        rc = add_key(a, "partition", "slurm_partition");
    if (rc == 0)
        rc = add_key(a, "account", "slurm_account");
    if (rc == 0)
        rc = add_key(a, "time", "slurm_time_limit");
    char extra[1024] = "", *save = NULL;
    if (rc == 0)
        rc = fiber_config_get("slurm_sbatch_args", extra, sizeof extra);
    for (char *t = strtok_r(extra, " ", &save); rc == 0 && t;
         t = strtok_r(NULL, " ", &save))
        rc = fb_slurm_args_add(a, "%s", t);
    if (rc == 0)
        rc = fb_slurm_args_add(a, "%s", script);
    return rc;
}

/* ---- start --------------------------------------------------------------- */

/* The program's absolute path, as the compute nodes will find it. */
static int program_path(const char *arg0, char *out, size_t size)
{
    if (strchr(arg0, '/')) {
        char cwd[PATH_MAX];
        if (arg0[0] != '/' && !getcwd(cwd, sizeof cwd))
            return fb_err_errno(FIBER_ESYS, "getcwd");
        if ((size_t)snprintf(out, size, "%s%s%s", arg0[0] == '/' ? "" : cwd,
                             arg0[0] == '/' ? "" : "/", arg0) >= size)
            return fb_err(FIBER_EINVAL, "program path too long: %.200s",
                          arg0);
    } else if (fb_slurm_find_tool(arg0, out, size) != 0) {
        return fb_err(FIBER_ESPAWN, "cannot start %s: it is not on PATH",
                      arg0);
    }
    struct stat st;
    if (stat(out, &st) != 0 || !S_ISREG(st.st_mode) || access(out, X_OK) != 0)
        return fb_err(FIBER_ESPAWN,
                      "cannot start %s: no executable file there (the "
                      "slurm backend runs it at that path on the compute "
                      "nodes, which must share it)",
                      out);
    return 0;
}

/* The end of a requeueable master's script (fiber run --requeue), which
 * runs the program as its child instead of exec'ing it:
 *
 *   - FIBER_RESUMED counts the restarts (fiber_resumed), and
 *     FIBER_BOOT_REQUEUE=1 makes the master end with FIBER_EXIT_REQUEUE
 *     (75) once its stop callbacks have returned;
 *   - SIGUSR1 (sbatch --signal=B:USR1@N, sent to this shell alone) is
 *     passed on to the program, whose stop event it fires;
 *   - SIGTERM is not passed on: Slurm's time limit, pre-emption, scancel
 *     and scontrol requeue send it to every process of the job, the
 *     program included, and a second SIGTERM would end it before its
 *     callbacks ran; the shell only survives it;
 *   - when the program ends with 75 after a SIGUSR1, the shell requeues
 *     the job (`scontrol requeue`): Slurm ends it and starts it again,
 *     same name, same run id, with SLURM_RESTART_COUNT one higher.  After
 *     a SIGTERM alone it does not: pre-emption and scontrol requeue
 *     requeue the job themselves, and a scancel must stay a cancel. */
static const char requeue_tail[] =
    "export FIBER_RESUMED=\"${SLURM_RESTART_COUNT:-0}\" FIBER_BOOT_REQUEUE=1\n"
    "warned=0\n"
    "trap 'warned=1; kill -USR1 \"$pid\" 2>/dev/null' USR1\n"
    "trap ':' TERM\n"
    "\"$@\" &\n"
    "pid=$!\n"
    "while :; do\n"
    "    wait \"$pid\"; status=$?\n"
    "    kill -0 \"$pid\" 2>/dev/null || break\n"
    "done\n"
    "if [ \"$status\" -gt 128 ]; then\n"
    "    wait \"$pid\" 2>/dev/null; s=$?\n"
    "    [ \"$s\" -ne 127 ] && status=$s\n"
    "fi\n"
    "if [ \"$status\" -eq 75 ] && [ \"$warned\" = 1 ]; then\n"
    "    echo \"fiber: the master ended to be requeued; scontrol requeue "
    "$SLURM_JOB_ID\" >&2\n"
    "    \"$FIBER_SCONTROL\" requeue \"$SLURM_JOB_ID\"\n"
    "fi\n"
    "exit \"$status\"\n";

/* The batch script: the run's variables, then the program (exec'd, or,
 * for a requeueable master, run by requeue_tail). */
static int write_script(const struct fb_run_start *s, const char *program,
                        const char *scontrol, const char *path)
{
    fiber_buf b = {0};
    char head[200];
    snprintf(head, sizeof head,
             "#!/bin/sh\n# fiber run %s: the master, submitted by fiber's "
             "slurm backend\n",
             s->run);
    int rc = fiber_buf_append(&b, head, strlen(head));
    for (size_t i = 0; rc == 0 && i < s->n_vars; i++) {
        rc = fiber_buf_append(&b, "export ", 7);
        if (rc == 0)
            rc = fb_slurm_shell_quote(&b, s->vars[i]);
        if (rc == 0)
            rc = fiber_buf_append(&b, "\n", 1);
    }
    int requeue = s->opts->requeue;
    if (rc == 0 && requeue) {
        rc = fiber_buf_append(&b, "FIBER_SCONTROL=", 15);
        if (rc == 0)
            rc = fb_slurm_shell_quote(&b, scontrol);
        if (rc == 0)
            rc = fiber_buf_append(&b, "\nset -- ", 8);
    } else if (rc == 0) {
        rc = fiber_buf_append(&b, "exec ", 5);
    }
    if (rc == 0)
        rc = fb_slurm_shell_quote(&b, program);
    for (size_t i = 1; rc == 0 && s->argv[i]; i++) {
        rc = fiber_buf_append(&b, " ", 1);
        if (rc == 0)
            rc = fb_slurm_shell_quote(&b, s->argv[i]);
    }
    if (rc == 0)
        rc = fiber_buf_append(&b, "\n", 1);
    if (rc == 0 && requeue)
        rc = fiber_buf_append(&b, requeue_tail, sizeof requeue_tail - 1);
    if (rc) {
        fiber_buf_free(&b);
        return fb_err(FIBER_ENOMEM, "out of memory");
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0700);
    int ok = fd >= 0 && write(fd, b.data, b.len) == (ssize_t)b.len;
    if (fd >= 0)
        ok = close(fd) == 0 && ok;
    fiber_buf_free(&b);
    if (!ok) {
        rc = fb_err_errno(FIBER_ESYS, "slurm: cannot write %s", path);
        unlink(path);
    }
    return rc;
}

/* Runs sbatch; the job id into id. */
static int submit_master(struct fb_slurm_args *a, const char *run, char *id,
                         size_t size)
{
    fiber_buf out = {0};
    int rc = run_tool(a->v, &out, "submitting the master");
    if (rc == FIBER_EBACKEND) {
        const char *said = strstr(fiber_last_error(), "says: ");
        char why[500];
        fb_strlcpy(why, said ? said + 6 : fiber_last_error(), sizeof why);
        rc = fb_err(FIBER_ESPAWN,
                    "slurm: sbatch refused the master of run %s: %s", run,
                    why);
    }
    char line[128] = "";
    if (rc == 0)
        fb_slurm_last_line(&out, line, sizeof line);
    fiber_buf_free(&out);
    char *end = NULL;
    unsigned long long n = rc == 0 ? strtoull(line, &end, 10) : 0;
    if (rc == 0 && (n == 0 || (*end && *end != ';')))
        rc = fb_err(FIBER_EBACKEND, "slurm: sbatch answered '%.100s', not "
                                    "a job id",
                    line);
    if (rc == 0)
        snprintf(id, size, "%llu", n);
    return rc;
}

static int slurm_start(const struct fb_run_start *s, struct fiber_run *r)
{
    if (s->opts->image)
        return fb_err(FIBER_ENOTSUP,
                      "the slurm backend runs the program itself on the "
                      "compute nodes, not an image: drop --image");
    char sbatch[PATH_MAX], program[PATH_MAX], dir[PATH_MAX - 32],
        cwd[PATH_MAX], script[PATH_MAX];
    struct run_priv *p = calloc(1, sizeof *p);
    if (!p)
        return fb_err(FIBER_ENOMEM, "out of memory");
    int rc = need_tool("sbatch", sbatch);
    if (rc == 0)
        rc = need_tool("scontrol", p->scontrol);
    if (rc == 0)
        rc = program_path(s->argv[0], program, sizeof program);
    if (rc == 0 && !getcwd(cwd, sizeof cwd))
        rc = fb_err_errno(FIBER_ESYS, "getcwd");
    if (rc == 0)
        rc = run_folder(s->run, dir, sizeof dir);
    int made = rc == 0;
    if (rc == 0 && fb_make_dirs(dir) != 0)
        rc = fb_err_errno(FIBER_ESYS,
                          "slurm: cannot make the run folder %s (the "
                          "slurm_dir key)",
                          dir);
    if (rc == 0)
        rc = fb_private_dir(dir);
    if (rc == 0)
        snprintf(script, sizeof script, "%s/%s", dir, MASTER_SCRIPT);
    int wrote = rc == 0 && (rc = write_script(s, program, p->scontrol, script)) == 0;
    struct fb_slurm_args a = {0};
    if (rc == 0)
        rc = fb_slurm_master_args(s, sbatch, dir, cwd, script, &a);
    if (rc == 0)
        rc = submit_master(&a, s->run, r->engine_id, sizeof r->engine_id);
    fb_slurm_args_free(&a);
    if (wrote) /* sbatch keeps its own copy */
        unlink(script);
    if (rc) {
        if (made)
            rmdir(dir); /* only if nothing else is in it */
        free(p);
        return rc;
    }
    snprintf(p->out_path, sizeof p->out_path, "%s/%s", dir, MASTER_OUT);
    snprintf(p->err_path, sizeof p->err_path, "%s/%s", dir, MASTER_ERR);
    r->priv = p;
    r->pid = -1;
    r->dir[0] = '\0';
    return 0;
}

/* ---- follow and wait ----------------------------------------------------- */

/* Asks scontrol whether the master's job has ended, into p.  A tool that
 * keeps failing for GIVE_UP_MS is FIBER_EUNREACHABLE; before that, a
 * failure is tried again next time. */
static int check_end(struct run_priv *p, const char *id)
{
    char *argv[] = {p->scontrol, "-o", "show", "job", (char *)id, NULL};
    fiber_buf out = {0};
    int rc = run_tool(argv, &out, "asking for the master's job");
    if (rc == FIBER_EBACKEND && strstr(fiber_last_error(), "Invalid job id")) {
        /* slurmctld forgot it (MinJobAge passed): it ended, how is lost */
        p->ended = p->lost = 1;
        fiber_buf_free(&out);
        return 0;
    }
    if (rc) {
        fiber_buf_free(&out);
        uint64_t now = fb_now_ms();
        if (!p->failing_since)
            p->failing_since = now;
        return now - p->failing_since >= GIVE_UP_MS ? rc : 0;
    }
    p->failing_since = 0;
    char state[32];
    int status = 0;
    if (fb_slurm_parse_job((const char *)out.data, state, sizeof state,
                           &status) == 1) {
        p->ended = 1;
        p->status = status;
    }
    fiber_buf_free(&out);
    return 0;
}

/* Copies what path has beyond *off to fd. */
static int copy_new(const char *path, off_t *off, int fd)
{
    int in = open(path, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return errno == ENOENT ? 0 /* not started yet, or tidied */
                               : fb_err_errno(FIBER_ESYS, "cannot read %s",
                                              path);
    char chunk[65536];
    ssize_t n;
    int rc = 0;
    while (rc == 0 && (n = pread(in, chunk, sizeof chunk, *off)) > 0) {
        if (fb_write_all(fd, chunk, (size_t)n) != 0)
            rc = fb_err_errno(FIBER_ESYS, "writing the run's output");
        *off += n;
    }
    close(in);
    return rc;
}

static int slurm_follow(struct fiber_run *r, int out_fd, int err_fd)
{
    struct run_priv *p = r->priv;
    uint64_t last_check = 0;
    for (;;) {
        int ended = p->ended;
        int rc = copy_new(p->out_path, &p->out_off, out_fd);
        if (rc == 0)
            rc = copy_new(p->err_path, &p->err_off, err_fd);
        if (rc || ended)
            return rc;
        if (fb_now_ms() - last_check >= STATE_EVERY_MS) {
            last_check = fb_now_ms();
            if ((rc = check_end(p, r->engine_id)) != 0)
                return rc;
            if (p->ended)
                continue; /* one last copy */
        }
        sleep_ms(POLL_MS);
    }
}

static int slurm_wait(struct fiber_run *r, int timeout_ms, int *exit_code)
{
    struct run_priv *p = r->priv;
    uint64_t deadline = fb_deadline_ms(timeout_ms);
    while (!p->ended) {
        int rc = check_end(p, r->engine_id);
        if (rc)
            return rc;
        if (p->ended)
            break;
        int left = fb_ms_left(deadline);
        if (left == 0)
            return fb_err(FIBER_ETIMEDOUT,
                          "run %s is still running (master: Slurm job %s)",
                          r->name, r->engine_id);
        sleep_ms(left < 0 || left > STATE_EVERY_MS ? STATE_EVERY_MS : left);
    }
    if (p->lost)
        return fb_err(FIBER_EBACKEND,
                      "run %s: the master's job %s has ended, and Slurm no "
                      "longer knows how (its MinJobAge passed); its output "
                      "is in %s",
                      r->name, r->engine_id, p->out_path);
    if (exit_code)
        *exit_code = p->status;
    return 0;
}

static void slurm_release(struct fiber_run *r)
{
    free(r->priv);
    r->priv = NULL;
}

/* ---- names of jobs ------------------------------------------------------- */

/* A run folder's names file, loaded once per run. */
struct names {
    char run[64];
    char *text; /* "\n" + the file, or NULL when there is none */
};

struct name_cache {
    struct names *v;
    size_t n;
};

static const struct names *names_of(struct name_cache *c, const char *run)
{
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->v[i].run, run) == 0)
            return &c->v[i];
    struct names *v = realloc(c->v, (c->n + 1) * sizeof *v);
    if (!v)
        return NULL;
    c->v = v;
    struct names *e = &v[c->n++];
    memset(e, 0, sizeof *e);
    fb_strlcpy(e->run, run, sizeof e->run);
    char path[PATH_MAX];
    if (run_folder(run, path, sizeof path - 8) != 0) {
        fb_err_clear();
        return e;
    }
    strcat(path, "/" FB_SLURM_NAMES_FILE);
    FILE *f = fopen(path, "re");
    if (!f)
        return e;
    fiber_buf b = {0};
    fiber_buf_append(&b, "\n", 1);
    char chunk[8192];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        fiber_buf_append(&b, chunk, got);
    fclose(f);
    if (fiber_buf_append(&b, "", 1) == 0)
        e->text = (char *)b.data;
    else
        fiber_buf_free(&b);
    return e;
}

static void names_free(struct name_cache *c)
{
    for (size_t i = 0; i < c->n; i++)
        free(c->v[i].text);
    free(c->v);
    memset(c, 0, sizeof *c);
}

/* The fiber name of job id of run, or id itself. */
static void job_name(struct name_cache *c, const char *run, const char *id,
                     char *out, size_t size)
{
    fb_strlcpy(out, id, size);
    const struct names *e = names_of(c, run);
    if (!e || !e->text)
        return;
    char key[64];
    snprintf(key, sizeof key, "\n%s ", id);
    const char *p = strstr(e->text, key);
    if (!p)
        return;
    p += strlen(key);
    size_t n = strcspn(p, "\n");
    if (n > 0 && n < size) {
        memcpy(out, p, n);
        out[n] = '\0';
    }
}

/* ---- the queue ----------------------------------------------------------- */

/* One job as squeue gives it. */
struct qjob {
    char id[48], state[32], reason[64], time[32], comment[64], nodes[64];
    char name[160];
    int raw_exit; /* wait status: code << 8 | signal */
    int master;
    char run[64];
};

static void lower(char *s)
{
    for (; *s; s++)
        *s = (char)tolower((unsigned char)*s);
}

/* Is name a run id as fiber makes them: "fiber-" and 8 hex digits? */
static int generated_run_id(const char *name, size_t n)
{
    if (n != 14 || strncmp(name, "fiber-", 6) != 0)
        return 0;
    for (size_t i = 6; i < 14; i++)
        if (!isxdigit((unsigned char)name[i]))
            return 0;
    return 1;
}

/* Reads one line "id|state|reason|time|comment|exit|nodes|name|" into j;
 * returns 1 for a job of fiber's, else 0. */
static int parse_queue_line(char *line, struct qjob *j)
{
    memset(j, 0, sizeof *j);
    char *f[8];
    for (int i = 0; i < 7; i++) {
        f[i] = line;
        char *bar = strchr(line, '|');
        if (!bar)
            return 0;
        *bar = '\0';
        line = bar + 1;
    }
    f[7] = line; /* the name, last: it may hold anything */
    size_t n = strlen(f[7]);
    if (n && f[7][n - 1] == '|')
        f[7][--n] = '\0';
    fb_strlcpy(j->id, f[0], sizeof j->id);
    fb_strlcpy(j->state, f[1], sizeof j->state);
    fb_strlcpy(j->reason, f[2], sizeof j->reason);
    fb_strlcpy(j->time, f[3], sizeof j->time);
    fb_strlcpy(j->comment, f[4], sizeof j->comment);
    j->raw_exit = atoi(f[5]);
    fb_strlcpy(j->nodes, f[6], sizeof j->nodes);
    fb_strlcpy(j->name, f[7], sizeof j->name);
    size_t sl = strlen(FB_SLURM_MASTER_SUFFIX);
    int ours = strncmp(j->comment, "fiber:", 6) == 0;
    int named_master = n > sl &&
                       strcmp(j->name + n - sl, FB_SLURM_MASTER_SUFFIX) == 0;
    if (!ours)
        ours = generated_run_id(j->name, n) ||
               (named_master && generated_run_id(j->name, n - sl));
    if (!ours)
        return 0;
    j->master = strcmp(j->comment, FB_SLURM_MASTER_COMMENT) == 0 ||
                (strncmp(j->comment, "fiber:", 6) != 0 && named_master);
    if (j->master && !named_master)
        return 0;
    snprintf(j->run, sizeof j->run, "%.*s",
             (int)(j->master ? n - sl : n), j->name);
    return fb_run_id_valid(j->run);
}

static int active_state(const char *state)
{
    static const char *const ended[] = {
        "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
        "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
        "SPECIAL_EXIT", "REVOKED"};
    for (size_t i = 0; i < FB_ARRAY_LEN(ended); i++)
        if (strcmp(state, ended[i]) == 0)
            return 0;
    return 1;
}

/* fiber's word for a Slurm state, and the status in words. */
static void describe_job(const struct qjob *j, char *state, size_t ssize,
                         char *status, size_t size)
{
    char word[32];
    fb_strlcpy(word, j->state, sizeof word);
    lower(word);
    if (strcmp(j->state, "PENDING") == 0) {
        fb_strlcpy(state, "pending", ssize);
        snprintf(status, size, "pending (%s)", j->reason);
    } else if (strcmp(j->state, "SUSPENDED") == 0 ||
               strcmp(j->state, "STOPPED") == 0) {
        fb_strlcpy(state, "paused", ssize);
        snprintf(status, size, "%s on %s", word, j->nodes);
    } else if (active_state(j->state)) {
        fb_strlcpy(state, "running", ssize);
        snprintf(status, size, "%s %s on %s", word, j->time, j->nodes);
    } else {
        fb_strlcpy(state, "exited", ssize);
        int sig = j->raw_exit & 0x7f, code = (j->raw_exit >> 8) & 0xff;
        if (sig)
            snprintf(status, size, "%s (signal %d) after %s", word, sig,
                     j->time);
        else
            snprintf(status, size, "%s (%d) after %s", word, code, j->time);
    }
}

/* squeue's view of this user's fiber jobs (of run only, if given); the
 * lines "id|state|reason|time|comment|exit|nodes|name|" into out. */
static int query_queue(const char *squeue, const char *only, int all_states,
                       fiber_buf *out)
{
    char user[48], names[160];
    snprintf(user, sizeof user, "--user=%u", (unsigned)getuid());
    snprintf(names, sizeof names, "--name=%s,%s%s", only ? only : "",
             only ? only : "", FB_SLURM_MASTER_SUFFIX);
    char *argv[12];
    size_t k = 0;
    argv[k++] = (char *)squeue;
    argv[k++] = "-h";
    argv[k++] = "-r";
    argv[k++] = user;
    if (all_states)
        argv[k++] = "--states=all";
    if (only)
        argv[k++] = names;
    argv[k++] = "-O";
    argv[k++] = "JobArrayID:|,State:|,Reason:|,TimeUsed:|,Comment:|,"
                "exit_code:|,NodeList:|,Name:|";
    argv[k] = NULL;
    return run_tool(argv, out, "listing jobs");
}

/* Calls fn for each fiber job in squeue's output. */
static int each_job(fiber_buf *out, int (*fn)(struct qjob *, void *),
                    void *ud)
{
    char *text = (char *)out->data;
    int rc = 0;
    for (char *line = text, *nl; rc == 0 && line && *line; line = nl) {
        nl = strchr(line, '\n');
        if (nl)
            *nl++ = '\0';
        struct qjob j;
        if (parse_queue_line(line, &j))
            rc = fn(&j, ud);
    }
    return rc;
}

/* ---- list ---------------------------------------------------------------- */

struct list_ctx {
    fiber_run_list *l;
    const char *only;
    struct name_cache names;
};

static int list_job(struct qjob *j, void *ud)
{
    struct list_ctx *c = ud;
    if (c->only && strcmp(c->only, j->run) != 0)
        return 0;
    fiber_run_info *r = fb_runs_add_run(c->l, j->run, "slurm");
    if (!r)
        return FIBER_ENOMEM;
    char name[64], state[16], status[320];
    if (j->master) {
        fb_strlcpy(name, "master", sizeof name);
        /* The master is a Slurm job: the run is Slurm's, whichever
         * backend found its traces first. */
        fb_strlcpy(r->backend, "slurm", sizeof r->backend);
    } else {
        job_name(&c->names, j->run, j->id, name, sizeof name);
    }
    describe_job(j, state, sizeof state, status, sizeof status);
    if (active_state(j->state))
        r->alive = 1;
    return fb_runs_add_job(r, name, j->master ? "master" : "job", state,
                           status, -1, j->id)
               ? 0
               : FIBER_ENOMEM;
}

static int has_job(const fiber_run_info *r, const char *name)
{
    for (size_t i = 0; i < r->n_jobs; i++)
        if (strcmp(r->jobs[i].name, name) == 0)
            return 1;
    return 0;
}

/* The outputs in a run folder that squeue did not list: ended jobs. */
static int list_outputs(struct list_ctx *c, fiber_run_info *r,
                        const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        char name[64];
        if (strcmp(e->d_name, MASTER_OUT) == 0) {
            fb_strlcpy(name, "master", sizeof name);
        } else if (fb_slurm_is_job_output(e->d_name)) {
            char id[64];
            snprintf(id, sizeof id, "%.*s", (int)(strlen(e->d_name) - 4),
                     e->d_name);
            job_name(&c->names, r->run, id, name, sizeof name);
        } else {
            continue;
        }
        if (!has_job(r, name) &&
            !fb_runs_add_job(r, name,
                             strcmp(name, "master") == 0 ? "master" : "job",
                             "ended", "ended; its output is kept", -1, ""))
            rc = FIBER_ENOMEM;
    }
    closedir(d);
    return rc;
}

/* A run folder: the run's leftovers, or a live run's files. */
static int list_folder(struct list_ctx *c, const char *base, const char *run,
                       int queue_read)
{
    char dir[PATH_MAX], path[PATH_MAX + 16];
    struct stat st;
    if ((size_t)snprintf(dir, sizeof dir, "%s/%s", base, run) >= sizeof dir ||
        lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != getuid())
        return 0;
    fiber_run_info *r = fb_runs_add_run(c->l, run, "slurm");
    if (!r)
        return FIBER_ENOMEM;
    int rc = list_outputs(c, r, dir);
    /* Nothing of the run in the queue.  A master that fiber run submitted
     * (it wrote master.out) has ended then.  A master elsewhere (a login
     * node: its local run directory would tell) may be alive and hold the
     * secret, or a run is being submitted right now: cannot tell, so that
     * fiber clean leaves it. */
    struct stat other;
    snprintf(path, sizeof path, "%s/%s", dir, MASTER_OUT);
    int submitted = lstat(path, &other) == 0;
    snprintf(path, sizeof path, "%s/secret", dir);
    if (r->alive == 0 && !r->dir[0] &&
        (!queue_read ||
         (!submitted && (lstat(path, &other) == 0 ||
                         time(NULL) - st.st_mtime < YOUNG_FOLDER_S))))
        r->alive = -1;
    return rc;
}

static int list_folders(struct list_ctx *c, int queue_read)
{
    char configured[PATH_MAX], base[PATH_MAX];
    if (fiber_config_get("slurm_dir", configured, sizeof configured) != 0 ||
        fb_slurm_base_dir(configured, base, sizeof base) != 0) {
        fb_runs_warn(c->l, "slurm: run folders not listed: %s",
                     fiber_last_error());
        return 0;
    }
    if (c->only)
        return list_folder(c, base, c->only, queue_read);
    DIR *d = opendir(base);
    if (!d)
        return 0;
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)))
        if (fb_run_id_valid(e->d_name))
            rc = list_folder(c, base, e->d_name, queue_read);
    closedir(d);
    return rc;
}

/* Whether this host is meant to use Slurm (SLURM_CONF set, the system's
 * slurm.conf there, or backend = slurm): then missing tools or a
 * controller that does not answer are worth a word in fiber ps, and the
 * run folders are listed even when the queue could not be read;
 * elsewhere (Slurm's tools installed, no cluster configured) the slurm
 * backend stays silent. */
static int slurm_expected(void)
{
    char backend[32];
    return getenv("SLURM_CONF") || access("/etc/slurm/slurm.conf", F_OK) == 0 ||
           (fiber_config_get("backend", backend, sizeof backend) == 0 &&
            strcmp(backend, "slurm") == 0);
}

static int slurm_list(fiber_run_list *l, const char *only)
{
    if (only && !fb_run_id_valid(only))
        return 0;
    struct list_ctx c = {l, only, {0}};
    char squeue[PATH_MAX];
    int queue_read = 0, rc = 0;
    if (need_tool("squeue", squeue) != 0) {
        if (slurm_expected())
            fb_runs_warn(l, "slurm jobs not listed: %s", fiber_last_error());
    } else {
        fiber_buf out = {0};
        rc = query_queue(squeue, only, 1, &out);
        if (rc == 0) {
            queue_read = 1;
            rc = each_job(&out, list_job, &c);
        } else if (rc != FIBER_ENOMEM) {
            if (slurm_expected())
                fb_runs_warn(l, "slurm jobs not listed: %s",
                             fiber_last_error());
            rc = 0;
        }
        fiber_buf_free(&out);
    }
    if (rc == 0 && (queue_read || only || slurm_expected()))
        rc = list_folders(&c, queue_read);
    names_free(&c.names);
    fb_err_clear();
    return rc == FIBER_ENOMEM ? fb_err(rc, "out of memory") : rc;
}

/* ---- logs ---------------------------------------------------------------- */

/* Master's files first (output, then errors), then jobs by id. */
static int output_cmp(const void *a, const void *b)
{
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    int xm = strncmp(x, "master.", 7) == 0, ym = strncmp(y, "master.", 7) == 0;
    if (xm != ym)
        return ym - xm;
    if (xm)
        return strcmp(y, x); /* master.out before master.err */
    return strverscmp(x, y);
}

/* The output files in dir, sorted; *n of them (caller frees). */
static char **output_files(const char *dir, size_t *n)
{
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    size_t cap = 0;
    char **v = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, MASTER_OUT) != 0 &&
            strcmp(e->d_name, MASTER_ERR) != 0 &&
            !fb_slurm_is_job_output(e->d_name))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **w = realloc(v, cap * sizeof *w);
            if (!w)
                break;
            v = w;
        }
        if ((v[*n] = strdup(e->d_name)) != NULL)
            (*n)++;
    }
    closedir(d);
    if (*n > 1)
        qsort(v, *n, sizeof *v, output_cmp);
    return v;
}

static int slurm_logs(const fiber_run_info *r, const char *job, int headings,
                      fiber_buf *out)
{
    char dir[PATH_MAX - 300];
    int rc = fb_run_id_valid(r->run) ? run_folder(r->run, dir, sizeof dir)
                                     : fb_err(FIBER_EINVAL, "bad run id");
    if (rc)
        return rc;
    size_t n = 0, found = 0, before = out->len;
    char **files = output_files(dir, &n);
    struct name_cache names = {0};
    for (size_t i = 0; i < n; i++) {
        char id[64], name[64], heading[96], path[PATH_MAX];
        int master = strncmp(files[i], "master.", 7) == 0;
        snprintf(id, sizeof id, "%.*s", (int)(strlen(files[i]) - 4),
                 files[i]);
        if (master)
            fb_strlcpy(name, "master", sizeof name);
        else
            job_name(&names, r->run, id, name, sizeof name);
        if (rc || (job && strcmp(job, name) != 0 && strcmp(job, id) != 0))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        struct stat st;
        if (stat(path, &st) != 0 || (!job && st.st_size == 0))
            continue; /* nothing said: no heading either */
        found++;
        snprintf(heading, sizeof heading, "==> %s%s <==\n", name,
                 strcmp(files[i], MASTER_ERR) == 0 ? " (stderr)" : "");
        if (headings && out->len > before &&
            out->data[out->len - 1] != '\n' && fiber_buf_append(out, "\n", 1))
            rc = fb_err(FIBER_ENOMEM, "out of memory");
        if (rc == 0 && headings &&
            fiber_buf_append(out, heading, strlen(heading)))
            rc = fb_err(FIBER_ENOMEM, "out of memory");
        if (rc == 0)
            rc = fb_buf_append_file(out, path);
    }
    for (size_t i = 0; i < n; i++)
        free(files[i]);
    free(files);
    names_free(&names);
    if (rc == 0 && !found)
        rc = job ? fb_err(FIBER_ENOKEY,
                          "run %s has no job %s with output in %s (fiber ps "
                          "%s lists its jobs)",
                          r->run, job, dir, r->run)
                 : fb_err(FIBER_ENOKEY,
                          "run %s has no Slurm job output in %s", r->run,
                          dir);
    if (rc)
        out->len = before;
    return rc;
}

/* ---- kill ---------------------------------------------------------------- */

/* A job of the run being stopped. */
struct victim {
    char id[48], what[128]; /* "master (job 12)" */
    char state[32];         /* squeue's, lower case */
    int master, running, done;
};

struct victims {
    struct victim *v;
    size_t n;
    struct name_cache names;
    const char *run;
};

static struct victim *find_victim(struct victims *vs, const char *id)
{
    for (size_t i = 0; i < vs->n; i++)
        if (strcmp(vs->v[i].id, id) == 0)
            return &vs->v[i];
    return NULL;
}

/* Adds (or updates) a job still in the queue. */
static int note_victim(struct qjob *j, void *ud)
{
    struct victims *vs = ud;
    if (strcmp(j->run, vs->run) != 0 || !active_state(j->state))
        return 0;
    struct victim *v = find_victim(vs, j->id);
    if (!v) {
        struct victim *w = realloc(vs->v, (vs->n + 1) * sizeof *w);
        if (!w)
            return fb_err(FIBER_ENOMEM, "out of memory");
        vs->v = w;
        v = &w[vs->n++];
        memset(v, 0, sizeof *v);
        fb_strlcpy(v->id, j->id, sizeof v->id);
        v->master = j->master;
        char name[64];
        if (j->master)
            fb_strlcpy(name, "master", sizeof name);
        else
            job_name(&vs->names, j->run, j->id, name, sizeof name);
        if (strcmp(name, j->id) == 0)
            snprintf(v->what, sizeof v->what, "job %s", j->id);
        else
            snprintf(v->what, sizeof v->what, "%s (job %s)", name, j->id);
    }
    v->running = strcmp(j->state, "RUNNING") == 0;
    fb_strlcpy(v->state, j->state, sizeof v->state);
    lower(v->state);
    v->done = 0; /* still queued */
    return 0;
}

/* Asks squeue which jobs of the run are still queued, marking the others
 * done.  Returns the count still queued, or a negative code. */
static int refresh(const char *squeue, struct victims *vs)
{
    fiber_buf out = {0};
    int rc = query_queue(squeue, vs->run, 0, &out);
    for (size_t i = 0; rc == 0 && i < vs->n; i++)
        vs->v[i].done = 1;
    if (rc == 0)
        rc = each_job(&out, note_victim, vs);
    fiber_buf_free(&out);
    if (rc)
        return rc;
    int left = 0;
    for (size_t i = 0; i < vs->n; i++)
        left += !vs->v[i].done;
    return left;
}

/* scancel [options] the ids chosen by pick. */
static int scancel(const char *tool, const char *const *opts,
                   struct victims *vs, int (*pick)(const struct victim *, int),
                   int arg)
{
    size_t n = 0;
    for (size_t i = 0; i < vs->n; i++)
        n += pick(&vs->v[i], arg);
    if (n == 0)
        return 0;
    char **argv = calloc(n + 8, sizeof *argv);
    if (!argv)
        return fb_err(FIBER_ENOMEM, "out of memory");
    size_t k = 0;
    argv[k++] = (char *)tool;
    argv[k++] = "--quiet";
    for (; *opts; opts++)
        argv[k++] = (char *)*opts;
    for (size_t i = 0; i < vs->n; i++)
        if (pick(&vs->v[i], arg))
            argv[k++] = vs->v[i].id;
    fiber_buf out = {0};
    int rc = run_tool(argv, &out, "stopping jobs");
    fiber_buf_free(&out);
    free(argv);
    /* scancel fails for a job that ended meanwhile, even with --quiet;
     * the next squeue says what is left. */
    if (rc == FIBER_EBACKEND) {
        fb_err_clear();
        rc = 0;
    }
    return rc;
}

static int pick_pending(const struct victim *v, int master)
{
    return !v->done && !v->running && v->master == master;
}

static int pick_running(const struct victim *v, int master)
{
    return !v->done && v->running && v->master == master;
}

static int pick_queued(const struct victim *v, int unused)
{
    FB_UNUSED(unused);
    return !v->done;
}

static int grace_ms(void)
{
    char text[32];
    if (fiber_config_get("terminate_grace_ms", text, sizeof text) != 0)
        return 2000;
    return atoi(text);
}

/* Stops the queued jobs that are (master) or are not the master: pending
 * ones are cancelled, running ones get SIGTERM, and after the grace
 * period SIGKILL.  Signals go to the batch step (the program itself),
 * as slurm.c sends them. */
static int stop_phase(const char *squeue, const char *tool,
                      struct victims *vs, int master, fiber_buf *rep,
                      int *stopped)
{
    static const char *const none[] = {NULL};
    static const char *const term[] = {"--signal=TERM", "--batch", NULL};
    static const char *const kill9[] = {"--signal=KILL", "--batch", NULL};
    int rc = scancel(tool, none, vs, pick_pending, master);
    for (size_t i = 0; rc == 0 && i < vs->n; i++)
        if (pick_pending(&vs->v[i], master)) {
            fb_runs_report(rep, "cancelled %s, which was %s", vs->v[i].what,
                   vs->v[i].state);
            vs->v[i].done = 1;
            (*stopped)++;
        }
    size_t n_before = vs->n;
    int any = 0;
    for (size_t i = 0; i < n_before; i++)
        any += pick_running(&vs->v[i], master);
    if (rc || !any)
        return rc;
    char *was_running = calloc(n_before, 1);
    if (!was_running)
        return fb_err(FIBER_ENOMEM, "out of memory");
    for (size_t i = 0; i < n_before; i++)
        was_running[i] = (char)pick_running(&vs->v[i], master);
    rc = scancel(tool, term, vs, pick_running, master);
    uint64_t deadline = fb_deadline_ms(grace_ms());
    int left = 1;
    while (rc == 0 && left > 0) {
        int queued = refresh(squeue, vs);
        if (queued < 0) {
            rc = queued;
            break;
        }
        left = 0;
        for (size_t i = 0; i < n_before; i++)
            left += was_running[i] && !vs->v[i].done && vs->v[i].running;
        if (left && fb_ms_left(deadline) == 0) {
            rc = scancel(tool, kill9, vs, pick_running, master);
            for (size_t i = 0; rc == 0 && i < n_before; i++)
                if (was_running[i] && !vs->v[i].done && vs->v[i].running) {
                    fb_runs_report(rep, "killed %s with SIGKILL after the grace "
                                "period",
                           vs->v[i].what);
                    was_running[i] = 0;
                    (*stopped)++;
                }
            break;
        }
        if (left)
            sleep_ms(POLL_MS);
    }
    for (size_t i = 0; rc == 0 && i < n_before; i++)
        if (was_running[i]) {
            fb_runs_report(rep, "stopped %s (SIGTERM)", vs->v[i].what);
            (*stopped)++;
        }
    free(was_running);
    return rc;
}

/* Waits until none of the run's jobs is in the queue, cancelling what is
 * (jobs the master submitted while it stopped, jobs completing). */
static int settle(const char *squeue, const char *tool, struct victims *vs,
                  fiber_buf *rep, int *stopped)
{
    static const char *const none[] = {NULL};
    uint64_t deadline = fb_deadline_ms(SETTLE_MS), last_cancel = 0;
    size_t known = vs->n;
    for (;;) {
        int left = refresh(squeue, vs);
        if (left <= 0)
            return left;
        for (size_t i = known; i < vs->n; i++) {
            fb_runs_report(rep, "cancelled %s, submitted while the run stopped",
                   vs->v[i].what);
            (*stopped)++;
        }
        known = vs->n;
        if (fb_ms_left(deadline) == 0) {
            for (size_t i = 0; i < vs->n; i++)
                if (!vs->v[i].done)
                    fb_runs_report(rep, "%s is still in the queue after %d s",
                           vs->v[i].what, SETTLE_MS / 1000);
            return fb_err(FIBER_EBACKEND,
                          "slurm: jobs of run %s are still in the queue "
                          "after %d s (squeue --name=%s)",
                          vs->run, SETTLE_MS / 1000, vs->run);
        }
        if (fb_now_ms() - last_cancel >= 2000) {
            last_cancel = fb_now_ms();
            int rc = scancel(tool, none, vs, pick_queued, 0);
            if (rc)
                return rc;
        }
        sleep_ms(POLL_MS);
    }
}

/* A run that another backend found (a local run whose jobs may or may
 * not be Slurm's): Slurm that cannot be asked is no error for it. */
static int not_ours(const fiber_run_info *r, int rc)
{
    if (rc == 0 || rc == FIBER_ENOMEM || strcmp(r->backend, "slurm") == 0)
        return rc;
    fb_err_clear();
    return 0;
}

static int slurm_kill(const fiber_run_info *r, fiber_buf *rep, int *stopped)
{
    *stopped = 0;
    char squeue[PATH_MAX], tool[PATH_MAX];
    int rc = fb_run_id_valid(r->run) ? 0
                                     : fb_err(FIBER_EINVAL, "bad run id");
    if (rc == 0)
        rc = not_ours(r, need_tool("squeue", squeue));
    if (rc == 0 && squeue[0])
        rc = not_ours(r, need_tool("scancel", tool));
    if (rc || !squeue[0] || !tool[0])
        return rc;
    struct victims vs = {.run = r->run};
    int left = refresh(squeue, &vs);
    if (left < 0 && not_ours(r, left) == 0)
        left = 0;
    rc = left < 0 ? left : 0;
    /* The master first, so that it stops its own jobs; then the rest. */
    if (rc == 0 && left > 0)
        rc = stop_phase(squeue, tool, &vs, 1, rep, stopped);
    if (rc == 0 && left > 0 && (left = refresh(squeue, &vs)) > 0)
        rc = stop_phase(squeue, tool, &vs, 0, rep, stopped);
    if (left < 0)
        rc = left;
    if (rc == 0 && vs.n > 0)
        rc = settle(squeue, tool, &vs, rep, stopped);
    free(vs.v);
    names_free(&vs.names);
    return rc;
}

/* ---- clean --------------------------------------------------------------- */

/* Is name a file fiber writes in a run folder? */
static int ours_to_remove(const char *name)
{
    size_t n = strlen(name);
    return strcmp(name, MASTER_OUT) == 0 || strcmp(name, MASTER_ERR) == 0 ||
           strcmp(name, MASTER_SCRIPT) == 0 ||
           strcmp(name, FB_SLURM_NAMES_FILE) == 0 ||
           strcmp(name, "secret") == 0 || fb_slurm_is_job_output(name) ||
           (strncmp(name, "batch-", 6) == 0 && n > 9 &&
            strcmp(name + n - 3, ".sh") == 0);
}

static int remove_folder(const char *dir, fiber_buf *rep)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0
                               : fb_err_errno(FIBER_ESYS, "cannot read %s",
                                              dir);
    struct dirent *e;
    int removed = 0, rc = 0;
    char strange[256] = "";
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (!ours_to_remove(e->d_name)) {
            if (!strange[0])
                fb_strlcpy(strange, e->d_name, sizeof strange);
            continue;
        }
        if (unlink(path) == 0)
            removed++;
        else if (errno != ENOENT && rc == 0)
            rc = fb_err_errno(FIBER_ESYS, "cannot remove %s", path);
    }
    closedir(d);
    if (rc == 0 && strange[0]) {
        fb_runs_report(rep, "left %s: it holds %s, which fiber did not write", dir,
               strange);
        return 0;
    }
    if (rc == 0 && rmdir(dir) != 0 && errno != ENOENT)
        rc = fb_err_errno(FIBER_ESYS, "cannot remove %s", dir);
    if (rc == 0)
        fb_runs_report(rep, "removed %s (%d file%s)", dir, removed,
               removed == 1 ? "" : "s");
    return rc;
}

static int slurm_clean(const fiber_run_info *r, int named, fiber_buf *rep)
{
    char dir[PATH_MAX], squeue[PATH_MAX];
    int rc = fb_run_id_valid(r->run) ? run_folder(r->run, dir, sizeof dir)
                                     : fb_err(FIBER_EINVAL, "bad run id");
    if (rc)
        return rc;
    struct stat st;
    if (lstat(dir, &st) != 0)
        return 0; /* nothing left here; Slurm's records age out alone */
    if (!S_ISDIR(st.st_mode) || st.st_uid != getuid())
        return fb_err(FIBER_ESYS, "%s is not a folder of this user's", dir);
    /* A run whose jobs are still queued is not dead, whatever was said. */
    int left = -1;
    if (need_tool("squeue", squeue) == 0) {
        struct victims vs = {.run = r->run};
        left = refresh(squeue, &vs);
        free(vs.v);
        names_free(&vs.names);
    }
    if (left > 0)
        return named ? fb_err(FIBER_ESTATE,
                              "run %s still has %d job%s in the Slurm queue; "
                              "fiber kill %s stops them",
                              r->run, left, left == 1 ? "" : "s", r->run)
                     : 0;
    if (left < 0 && !named)
        return 0; /* cannot tell: only when asked by name */
    fb_err_clear();
    return remove_folder(dir, rep);
}

const struct fb_run_ops fb_run_ops_slurm = {
    .name = "slurm",
    .job_noun = "Slurm job",
    .can_requeue = 1,
    .describe = fb_slurm_describe,
    .start = slurm_start,
    .follow = slurm_follow,
    .wait = slurm_wait,
    .release = slurm_release,
    .list = slurm_list,
    .logs = slurm_logs,
    .kill = slurm_kill,
    .clean = slurm_clean,
};
