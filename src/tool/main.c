/*
 * main.c -- the `fiber` command: finds the subcommand and runs it; the
 * helpers every subcommand shares; `fiber version`.
 */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool.h"

static const char usage_text[] =
    "usage: fiber <command> [options] [arguments]\n"
    "\n"
    "Run and manage fiber programs on local processes, Docker, Slurm and\n"
    "Kubernetes.\n"
    "\n"
    "commands:\n"
    "  run [options] -- PROGRAM [ARGS]   start PROGRAM's master as a run\n"
    "  ps [RUN]                          list runs and their jobs\n"
    "  logs RUN [JOB]                    print what a run's jobs logged\n"
    "  kill RUN                          stop a run\n"
    "  clean [RUN...]                    remove what dead runs left behind\n"
    "  top [RUN]                         watch a live run's pools and master\n"
    "  image build PROGRAM [--tag NAME]  make a container image of PROGRAM\n"
    "  doctor                            check which backends can be used\n"
    "  version                           print fiber's version\n"
    "\n"
    "'fiber <command> --help' describes a command.  Configuration comes from\n"
    "FIBER_* environment variables and ./.fiberconfig (backend,\n"
    "docker_socket, image, ...).\n"
    "\n"
    "exit status: 0 success, 1 failure, 2 usage error; fiber run exits with\n"
    "the program's status.\n";

static const struct {
    const char *name;
    int (*fn)(int, char **);
} commands[] = {
    {"run", cmd_run},       {"ps", cmd_ps},         {"logs", cmd_logs},
    {"kill", cmd_kill},     {"clean", cmd_clean},   {"image", cmd_image},
    {"doctor", cmd_doctor}, {"version", cmd_version}, {"top", cmd_top},
};

void tool_say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fiber: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int tool_usage(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fiber %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry 'fiber %s --help'.\n", cmd);
    va_end(ap);
    return TOOL_USAGE;
}

int tool_fail(int code, const char *what)
{
    const char *msg = fiber_last_error();
    fprintf(stderr, "fiber: %s: %s\n", what,
            msg[0] ? msg : fiber_strerror(code));
    return TOOL_FAIL;
}

int tool_parse_int(const char *text, int min, int max, int *out)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (!*text || *end || v < min || v > max)
        return -1;
    *out = (int)v;
    return 0;
}

void tool_format_size(int64_t bytes, char *buf, size_t size)
{
    if (bytes >= 1 << 20)
        snprintf(buf, size, "%.1f MiB", (double)bytes / (1 << 20));
    else if (bytes >= 1 << 10)
        snprintf(buf, size, "%.1f KiB", (double)bytes / (1 << 10));
    else
        snprintf(buf, size, "%lld bytes", (long long)bytes);
}

void tool_getopt_reset(void)
{
    optind = 0; /* glibc: start over, with a new argv */
    opterr = 0; /* tool_getopt prints the messages */
}

int tool_getopt(const char *cmd, int argc, char **argv, const char *spec,
                const struct option *longs)
{
    int c = getopt_long(argc, argv, spec, longs, NULL);
    if (c != '?')
        return c;
    const char *arg = argv[optind - 1];
    if (arg[0] == '-' && arg[1] == '-') {
        size_t n = strcspn(arg + 2, "=");
        int known = 0;
        for (const struct option *o = longs; o && o->name; o++)
            known |= strlen(o->name) == n && strncmp(arg + 2, o->name, n) == 0;
        if (known && arg[2 + n] == '=')
            tool_usage(cmd, "option --%.*s takes no value", (int)n, arg + 2);
        else if (known)
            tool_usage(cmd, "option --%.*s needs a value", (int)n, arg + 2);
        else
            tool_usage(cmd, "unknown option --%.*s", (int)n, arg + 2);
    } else if (optopt && strchr(spec, optopt)) {
        tool_usage(cmd, "option -%c needs a value", optopt);
    } else {
        tool_usage(cmd, "unknown option -%c", optopt ? optopt : '?');
    }
    return c;
}

/* ---- fiber version ------------------------------------------------------ */

int cmd_version(int argc, char **argv)
{
    static const struct option longs[] = {{"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    tool_getopt_reset();
    int c;
    while ((c = tool_getopt("version", argc, argv, "h", longs)) != -1) {
        if (c == 'h') {
            printf("usage: fiber version\n\n"
                   "Prints the version of the fiber command and, when it "
                   "differs, of the\nlibrary it runs with.\n\n"
                   "Exit status: 0, or 2 usage error.\n");
            return TOOL_OK;
        }
        return TOOL_USAGE;
    }
    if (optind < argc)
        return tool_usage("version", "unexpected argument '%s'", argv[optind]);
    if (strcmp(fiber_version(), FIBER_VERSION_STRING) == 0)
        printf("fiber %s\n", FIBER_VERSION_STRING);
    else
        printf("fiber %s (library %s)\n", FIBER_VERSION_STRING,
               fiber_version());
    return TOOL_OK;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_text, stderr);
        return TOOL_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 ||
        strcmp(cmd, "help") == 0) {
        if (strcmp(cmd, "help") == 0 && argc > 2) {
            /* fiber help CMD == fiber CMD --help */
            char *sub[] = {argv[2], "--help", NULL};
            for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
                if (strcmp(argv[2], commands[i].name) == 0)
                    return commands[i].fn(2, sub);
            fprintf(stderr,
                    "fiber: unknown command '%s'\nTry 'fiber --help'.\n",
                    argv[2]);
            return TOOL_USAGE;
        }
        fputs(usage_text, stdout);
        return TOOL_OK;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
        char *sub[] = {"version", NULL};
        return cmd_version(1, sub);
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(cmd, commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "fiber: unknown command '%s'\nTry 'fiber --help'.\n", cmd);
    return TOOL_USAGE;
}
