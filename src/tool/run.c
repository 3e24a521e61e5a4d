/*
 * run.c -- `fiber run`: start a program's master as a run on a backend,
 * follow it, and exit with its status.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tool.h"

static const char run_help[] =
    "usage: fiber run [options] [--] PROGRAM [ARGS...]\n"
    "\n"
    "Starts PROGRAM as the master of a new run and prints the run's name.\n"
    "  local   PROGRAM runs as a child of this command, with FIBER_BACKEND\n"
    "          and the run's name (FIBER_BOOT_RUN) in its environment; its\n"
    "          output is this command's.\n"
    "  docker  PROGRAM runs in a container of the image (host networking,\n"
    "          the daemon's socket mounted, so its jobs become sibling\n"
    "          containers); its output is followed here.\n"
    "  kubernetes  PROGRAM runs in pod <run>-master of the image (which\n"
    "          the cluster pulls: --image or the image key), with its\n"
    "          service account; its jobs' pods are owned by it.\n"
    "  slurm   PROGRAM is submitted as batch job <run>-master (the\n"
    "          slurm_* keys: partition, account, time limit); its output\n"
    "          file is followed here until the job ends.\n"
    "Without --detach, fiber run waits and exits with PROGRAM's status.\n"
    "\n"
    "options:\n"
    "  -b, --backend B      local, docker, slurm or kubernetes (default:\n"
    "                       the backend key)\n"
    "  -i, --image I        docker: the image (default: PROGRAM's default\n"
    "                       tag, built with fiber image build if missing);\n"
    "                       kubernetes: the image (default: the image key)\n"
    "      --cpu N          docker, kubernetes, slurm: CPUs for the master\n"
    "      --memory MB      docker, kubernetes, slurm: memory, in MiB\n"
    "      --gpu N          docker, kubernetes, slurm: GPUs for the master\n"
    "  -e, --env NAME=VALUE add to the master's environment (repeatable)\n"
    "  -d, --detach         start, print the run's name, and return; a local\n"
    "                       master's output goes to its log (fiber logs RUN)\n"
    "      --signal S       slurm: SIGUSR1 to the master S seconds before its\n"
    "                       time limit (its stop event: fiber_on_stop_requested)\n"
    "                       kubernetes: S seconds from the master pod's SIGTERM\n"
    "                       to its SIGKILL (terminationGracePeriodSeconds)\n"
    "      --requeue        slurm: requeue the master, same run name, when it\n"
    "                       is pre-empted or scontrol-requeued, and after its\n"
    "                       stop callbacks ran on the --signal warning; it\n"
    "                       starts again with FIBER_RESUMED=<restarts>\n"
    "                       kubernetes: the master is Job <run>-master, which\n"
    "                       makes a new master pod when its pod is deleted or\n"
    "                       pre-empted; fiber_resumed() counts the restarts\n"
    "  -h, --help           show this help\n"
    "\n"
    "Exit status: PROGRAM's (128+N if signal N ended it); before it starts,\n"
    "1 failure or 2 usage error; with --detach, 0 once it started.\n";

/* The child to pass termination signals on to (local runs). */
static volatile sig_atomic_t forward_pid = -1;

static void forward_signal(int sig)
{
    if (forward_pid > 0)
        kill((pid_t)forward_pid, sig);
}

/* A local master shares our terminal: ^C reaches it directly, so this
 * command ignores it (as system() does) and lives to report the status;
 * signals aimed at this command alone are passed on. */
static void watch_signals(long pid)
{
    forward_pid = (sig_atomic_t)pid;
    struct sigaction sa = {0};
    sa.sa_handler = SIG_IGN;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGQUIT, &sa, NULL);
    sa.sa_handler = forward_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

struct run_args {
    fiber_run_opts opts;
    const char **env;
    size_t n_env;
    char backend[32];
};

/* Parses the options; returns -1 to go on (argv[optind] is PROGRAM), or
 * an exit code. */
static int parse(int argc, char **argv, struct run_args *a)
{
    enum { OPT_CPU = 256, OPT_MEMORY, OPT_GPU, OPT_SIGNAL, OPT_REQUEUE };
    static const struct option longs[] = {
        {"backend", required_argument, NULL, 'b'},
        {"image", required_argument, NULL, 'i'},
        {"cpu", required_argument, NULL, OPT_CPU},
        {"memory", required_argument, NULL, OPT_MEMORY},
        {"gpu", required_argument, NULL, OPT_GPU},
        {"env", required_argument, NULL, 'e'},
        {"detach", no_argument, NULL, 'd'},
        {"signal", required_argument, NULL, OPT_SIGNAL},
        {"requeue", no_argument, NULL, OPT_REQUEUE},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    tool_getopt_reset();
    int c;
    /* '+': options end at PROGRAM, whose own options are its business. */
    while ((c = tool_getopt("run", argc, argv, "+b:i:e:dh", longs)) != -1) {
        switch (c) {
        case 'h':
            fputs(run_help, stdout);
            return TOOL_OK;
        case 'b': {
            /* The library knows the backends (its registry): an unknown
             * name is a usage error naming them. */
            if (!fiber_backend_known(optarg))
                return tool_usage("run", "%s", fiber_last_error());
            snprintf(a->backend, sizeof a->backend, "%s", optarg);
            a->opts.backend = a->backend;
            break;
        }
        case 'i':
            a->opts.image = optarg;
            break;
        case 'd':
            a->opts.detach = 1;
            break;
        case 'e':
            if (!strchr(optarg, '=') || optarg[0] == '=')
                return tool_usage("run", "--env wants NAME=VALUE, not '%s'",
                                  optarg);
            a->env[a->n_env++] = optarg;
            break;
        case OPT_SIGNAL:
            if (tool_parse_int(optarg, 1, 65535, &a->opts.signal_s) != 0)
                return tool_usage("run", "--signal wants the seconds before "
                                         "the time limit, 1 to 65535, not "
                                         "'%s'",
                                  optarg);
            break;
        case OPT_REQUEUE:
            a->opts.requeue = 1;
            break;
        case OPT_CPU:
        case OPT_MEMORY:
        case OPT_GPU: {
            int v;
            if (tool_parse_int(optarg, 1, 1 << 20, &v) != 0)
                return tool_usage("run", "--%s wants a positive whole "
                                         "number, not '%s'",
                                  c == OPT_CPU      ? "cpu"
                                  : c == OPT_MEMORY ? "memory"
                                                    : "gpu",
                                  optarg);
            *(c == OPT_CPU ? &a->opts.cpu
              : c == OPT_MEMORY ? &a->opts.memory_mb
                                : &a->opts.gpu) = v;
            break;
        }
        default:
            return TOOL_USAGE;
        }
    }
    if (optind >= argc)
        return tool_usage("run", "which program? fiber run [options] -- "
                                 "PROGRAM [ARGS]");
    a->opts.env = a->n_env ? a->env : NULL;
    return -1;
}

/* What the backend reports while it prepares the master (a first image
 * build takes a few seconds). */
static void say_progress(void *ud, const char *line)
{
    (void)ud;
    tool_say("run: %s", line);
}

static int exit_status_of(const char *run, const char *program, int code,
                          int elsewhere)
{
    if (code < 0) {
        tool_say("run %s: the master was killed by signal %d (%s)", run,
                 -code, strsignal(-code));
        return 128 - code;
    }
    if (elsewhere && code == 127)
        tool_say("run %s: the master could not be started (status 127): "
                 "is %s at that path where it runs (in an image: fiber "
                 "image build makes one that holds it)?",
                 run, program);
    else if (elsewhere && code > 128 && code < 128 + 65)
        tool_say("run %s: the master was killed by signal %d (%s)", run,
                 code - 128, strsignal(code - 128));
    else if (code != 0)
        tool_say("run %s: the master exited with status %d", run, code);
    return code > 255 ? 255 : code;
}

int cmd_run(int argc, char **argv)
{
    struct run_args a = {0};
    a.env = calloc((size_t)argc + 1, sizeof *a.env);
    if (!a.env)
        return tool_fail(FIBER_ENOMEM, "run");
    int rc = parse(argc, argv, &a);
    if (rc >= 0) {
        free(a.env);
        return rc;
    }
    a.opts.progress = say_progress;
    fiber_run *run = NULL;
    rc = fiber_run_start(&run, (const char *const *)argv + optind, &a.opts);
    free(a.env);
    if (rc)
        return tool_fail(rc, "run");
    const char *name = fiber_run_name(run);
    /* A master on this host is our child, with our streams; one elsewhere
     * (a container, a pod, a batch job) is followed. */
    int here = fiber_run_pid(run) > 0;
    const char *where = fiber_run_where(run);
    if (a.opts.detach) {
        printf("%s\n", name);
        tool_say("run %s: master %s%s (fiber logs %s shows its output)", name,
                 here ? "" : "in ", where, name);
        fiber_run_free(run);
        return TOOL_OK;
    }
    int code = 0;
    if (here) {
        tool_say("run %s: master %s", name, where);
        watch_signals(fiber_run_pid(run));
        rc = fiber_run_wait(run, -1, &code);
    } else {
        tool_say("run %s: master in %s (^C stops following; fiber kill %s "
                 "stops the run)",
                 name, where, name);
        fflush(stdout);
        /* A cluster whose nodes do not serve logs still runs the master:
         * say so and wait for it. */
        rc = fiber_run_follow(run, STDOUT_FILENO, STDERR_FILENO);
        if (rc)
            tool_say("run %s: cannot follow the master's output: %s", name,
                     fiber_last_error());
        rc = fiber_run_wait(run, -1, &code);
    }
    int status = rc ? tool_fail(rc, "run")
                    : exit_status_of(name, argv[optind], code, !here);
    fiber_run_free(run);
    return status;
}
