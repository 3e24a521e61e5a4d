/*
 * runs.c -- `fiber ps`, `fiber logs`, `fiber kill`, `fiber clean`: the
 * commands about runs that exist already.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tool.h"

/* Parses a subcommand that takes only --help and positional arguments
 * (between min_args and max_args; max_args < 0: any number).  Returns -1
 * to go on with argv[optind..], or the exit code. */
static int simple_options(const char *cmd, const char *help, int argc,
                          char **argv, int min_args, int max_args)
{
    static const struct option longs[] = {{"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    tool_getopt_reset();
    int c;
    while ((c = tool_getopt(cmd, argc, argv, "h", longs)) != -1) {
        if (c == 'h') {
            fputs(help, stdout);
            return TOOL_OK;
        }
        return TOOL_USAGE;
    }
    int n = argc - optind;
    if (n < min_args)
        return tool_usage(cmd, "which run? (fiber ps lists them)");
    if (max_args >= 0 && n > max_args)
        return tool_usage(cmd, "unexpected argument '%s'",
                          argv[optind + max_args]);
    return -1;
}

/* Writes a report (lines) to stdout. */
static void print_report(const fiber_buf *rep)
{
    if (rep->len)
        fwrite(rep->data, 1, rep->len, stdout);
}

/* ---- fiber ps ------------------------------------------------------------ */

static const char ps_help[] =
    "usage: fiber ps [RUN]\n"
    "\n"
    "Lists runs and their jobs, on every backend: local runs (the run\n"
    "directories under $TMPDIR/fiber-<uid>/; alive while the master's\n"
    "socket accepts a connection or its recorded process lives), Docker\n"
    "containers and Kubernetes pods (in the configured namespace) labelled\n"
    "fiber.run.  RUN shows one run.\n"
    "\n"
    "A run's STATE is alive, dead, or unknown (a master that listens on TCP\n"
    "and has no job running leaves nothing to test).  Each job line gives\n"
    "its name, role, state and where it runs (pid, container or pod).\n"
    "\n"
    "Exit status: 0 listed (also when there are no runs), 1 failure (RUN\n"
    "not found), 2 usage error.\n";

static const char *run_state(int alive)
{
    return alive > 0 ? "alive" : alive < 0 ? "unknown" : "dead";
}

static void print_run(const fiber_run_info *r)
{
    printf("%-18s %-8s %-8s %s\n", r->run, r->backend, run_state(r->alive),
           r->dir[0] ? r->dir : "(no run directory on this host)");
    for (size_t i = 0; i < r->n_jobs; i++) {
        const fiber_job_info *j = &r->jobs[i];
        if (j->engine_id[0])
            printf("  %-16s %-8s %-8s %s %-14s %s\n", j->name, j->role,
                   j->state, j->engine_kind, j->engine_id,
                   j->status);
        else if (j->pid > 0)
            printf("  %-16s %-8s %-8s pid %ld\n", j->name, j->role,
                   j->state, j->pid);
        else
            printf("  %-16s %-8s %-8s -\n", j->name, j->role, j->state);
    }
}

int cmd_ps(int argc, char **argv)
{
    int rc = simple_options("ps", ps_help, argc, argv, 0, 1);
    if (rc >= 0)
        return rc;
    const char *run = optind < argc ? argv[optind] : NULL;
    fiber_run_list list = {0};
    rc = fiber_runs_list(run, &list);
    if (rc)
        return tool_fail(rc, "ps");
    if (list.warning[0])
        tool_say("warning: %s", list.warning);
    if (list.n == 0) {
        printf("no runs\n");
    } else {
        printf("%-18s %-8s %-8s %s\n", "RUN", "BACKEND", "STATE", "WHERE");
        for (size_t i = 0; i < list.n; i++)
            print_run(&list.runs[i]);
    }
    fiber_run_list_free(&list);
    return TOOL_OK;
}

/* ---- fiber logs ---------------------------------------------------------- */

static const char logs_help[] =
    "usage: fiber logs RUN [JOB]\n"
    "\n"
    "Prints what RUN's jobs logged: for a local run the files in its log\n"
    "directory (<run dir>/logs, or <log_dir>/<run>), one per job, and the\n"
    "master's output for runs started with fiber run --detach; for\n"
    "containers and pods, their standard output and error.  JOB picks one\n"
    "(its name as fiber ps shows it); without it each job's part is headed\n"
    "'==> JOB <=='.\n"
    "\n"
    "Exit status: 0 printed, 1 no such run or job, or nothing logged, 2\n"
    "usage error.\n";

int cmd_logs(int argc, char **argv)
{
    int rc = simple_options("logs", logs_help, argc, argv, 1, 2);
    if (rc >= 0)
        return rc;
    const char *run = argv[optind];
    const char *job = optind + 1 < argc ? argv[optind + 1] : NULL;
    fiber_buf out = {0};
    rc = fiber_run_logs(run, job, &out);
    if (rc)
        return tool_fail(rc, "logs");
    fwrite(out.data, 1, out.len, stdout);
    if (out.len && out.data[out.len - 1] != '\n' && isatty(STDOUT_FILENO))
        putchar('\n');
    fiber_buf_free(&out);
    return TOOL_OK;
}

/* ---- fiber kill ---------------------------------------------------------- */

static const char kill_help[] =
    "usage: fiber kill RUN\n"
    "\n"
    "Stops RUN: its containers, its pods (deleted, with their logs), and on\n"
    "this host its master and jobs (SIGTERM, then SIGKILL after\n"
    "terminate_grace_ms, default 2000).  Prints what it stopped.  Jobs stop by themselves within moments of losing\n"
    "their master.\n"
    "\n"
    "Exit status: 0 stopped, 1 failure (no such run, nothing running, or a\n"
    "master that could not be found: the message says so), 2 usage error.\n";

int cmd_kill(int argc, char **argv)
{
    int rc = simple_options("kill", kill_help, argc, argv, 1, 1);
    if (rc >= 0)
        return rc;
    fiber_buf rep = {0};
    rc = fiber_run_kill(argv[optind], &rep);
    print_report(&rep);
    fiber_buf_free(&rep);
    return rc ? tool_fail(rc, "kill") : TOOL_OK;
}

/* ---- fiber clean --------------------------------------------------------- */

static const char clean_help[] =
    "usage: fiber clean [RUN...]\n"
    "\n"
    "Removes what dead runs left behind: their run directories (logs\n"
    "included), their stopped containers, and their ended pods and\n"
    "Secrets.  Without RUN, every dead run;\n"
    "live runs, and runs whose state is unknown, are left alone.  A RUN\n"
    "named must not be alive (one whose state is unknown is cleaned).\n"
    "\n"
    "Exit status: 0 cleaned (or nothing to clean), 1 failure (a run alive\n"
    "or not found), 2 usage error.\n";

int cmd_clean(int argc, char **argv)
{
    int rc = simple_options("clean", clean_help, argc, argv, 0, -1);
    if (rc >= 0)
        return rc;
    fiber_buf rep = {0};
    int status = TOOL_OK;
    if (optind == argc) {
        rc = fiber_run_clean(NULL, &rep);
        if (rc)
            status = tool_fail(rc, "clean");
    }
    for (int i = optind; i < argc; i++) {
        rc = fiber_run_clean(argv[i], &rep);
        if (rc) {
            print_report(&rep);
            rep.len = 0;
            status = tool_fail(rc, "clean");
        }
    }
    if (rep.len == 0 && status == TOOL_OK)
        printf("nothing to clean\n");
    print_report(&rep);
    fiber_buf_free(&rep);
    return status;
}
