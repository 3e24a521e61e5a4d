/*
 * slurm.h -- internals of the slurm backend shared by its files and its
 * unit tests.  The backend itself is fb_backend_slurm (backend.h).
 */
#ifndef FB_SLURM_H
#define FB_SLURM_H

#include <stddef.h>
#include <sys/types.h>

#include "fiber/fiber.h"

/* Finds the executable name on PATH and writes its path to path.
 * Returns 0, or -1 (path = "") when there is none. */
int fb_slurm_find_tool(const char *name, char *path, size_t size);

/* Starts argv (argv[0] an absolute path) with the master's environment,
 * default signal handling, descriptors 0, 1 and 2 from in_fd, out_fd and
 * err_fd (-1: /dev/null for 0 and 1, the same as 1 for 2) and nothing
 * else open.  Returns 0 with *pid, or an errno value. */
int fb_slurm_spawn(char *const argv[], int in_fd, int out_fd, int err_fd,
                   pid_t *pid);

/* Runs argv (argv[0] an absolute path) with the master's environment,
 * standard input from /dev/null, and waits up to timeout_ms.  Appends its
 * standard output to out and its standard error to err (4 MiB of each at
 * most).  Returns its exit code (128 + n when signal n ended it), or -1
 * with errno (ETIMEDOUT: it was killed when its time ran out). */
int fb_slurm_run(char *const argv[], fiber_buf *out, fiber_buf *err,
                 int timeout_ms);

/* Copies the last non-empty line of b (at most size - 1 bytes) to out. */
void fb_slurm_last_line(const fiber_buf *b, char *out, size_t size);

/* Reads a job's end from one line of `scontrol -o show job`: its JobState
 * into state (size bytes) and its exit status into *status: the exit code
 * of "ExitCode=<code>:<signal>", or minus the signal when there is one; a
 * job cancelled before it ran (CANCELLED with ExitCode=0:0) reads as
 * -SIGTERM, and one whose shell reported 128 + n reads as -n.  Returns 1 when the job has ended, 0 while it still runs or
 * waits, -1 when the line is not a job record. */
int fb_slurm_parse_job(const char *line, char *state, size_t size,
                       int *status);

/* Parses a Slurm duration, as sbatch --time takes it and squeue's %L
 * prints it: "M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S" (a word up to
 * a space or the end).  Returns 1 with the seconds in *seconds, 0 for
 * none ("UNLIMITED", "INFINITE", "NOT_SET", "INVALID"), -1 when text is
 * no duration. */
int fb_slurm_parse_duration(const char *text, long long *seconds);

/* For `fiber doctor`: whether Slurm's tools are here and its controller
 * answers, with the partitions and their nodes' states in detail.
 * Returns 0, FIBER_ENOTSUP (no tools) or FIBER_EUNREACHABLE, with detail
 * saying which. */
int fb_slurm_describe(char *detail, size_t size);

/* Appends text to b quoted for the POSIX shell ('...', with ' as '\'').
 * Returns 0 or FIBER_ENOMEM. */
int fb_slurm_shell_quote(fiber_buf *b, const char *text);

/* Copies b's non-empty lines to out (size bytes), joined by "; " (sbatch
 * says what is wrong over two lines: "invalid partition specified: x",
 * then "Batch job submission failed: ..."). */
void fb_slurm_join_lines(const fiber_buf *b, char *out, size_t size);

/* The folder that holds each run's folder <base>/<run id>: slurm_dir (the
 * key's value; may be "" or NULL), else $HOME/.fiber/slurm, else
 * <cwd>/.fiber-slurm.  It must be on a file system the compute nodes
 * share.  Returns 0 or FIBER_ECONFIG (too long), FIBER_ESYS. */
int fb_slurm_base_dir(const char *slurm_dir, char *out, size_t size);

/* Is name a job's output file in a run folder: "<id>.out" or
 * "<id>_<index>.out", as sbatch --output writes them? */
int fb_slurm_is_job_output(const char *name);

/* In a run folder: "<job id> <fiber job name>" lines, one per job
 * submitted (slurm.c), for fiber ps and fiber logs. */
#define FB_SLURM_NAMES_FILE "jobs"

/* How fiber marks its Slurm jobs (sbatch --comment), beside their names:
 * a run's jobs are named <run id>, the master that `fiber run` submits
 * <run id>-master (runs.c). */
#define FB_SLURM_JOB_COMMENT "fiber:job"
#define FB_SLURM_MASTER_COMMENT "fiber:master"
#define FB_SLURM_MASTER_SUFFIX "-master"

/* An argument vector being built: v[0..n) strdup'ed, v[n] NULL. */
struct fb_slurm_args {
    char **v;
    size_t n, cap;
};

/* Appends one printf-formatted argument.  Returns 0 or FIBER_ENOMEM. */
int fb_slurm_args_add(struct fb_slurm_args *a, const char *fmt, ...)
    FIBER_PRINTF(2, 3);
void fb_slurm_args_free(struct fb_slurm_args *a);

struct fb_run_start;

/* The sbatch command line that submits the master of run s->run
 * (runs.c): sbatch is the tool's path, dir the run's folder, cwd the
 * directory the master starts in, script the batch script.  Every option
 * fiber gives the master's job is added here and nowhere else: the job's
 * name and comment, output files, resources from s->opts (cpu, memory_mb,
 * gpu) and the slurm_partition, slurm_account, slurm_time_limit and
 * slurm_sbatch_args keys.  Returns 0, FIBER_ENOMEM, FIBER_ECONFIG. */
int fb_slurm_master_args(const struct fb_run_start *s, const char *sbatch,
                         const char *dir, const char *cwd, const char *script,
                         struct fb_slurm_args *a);

#endif /* FB_SLURM_H */
