/*
 * image.c -- `fiber image build` and `fiber doctor`: the commands about
 * what this host offers (an image of a program, reachable backends).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tool.h"

static const char image_help[] =
    "usage: fiber image build PROGRAM [--tag NAME[:TAG]]\n"
    "\n"
    "Builds a minimal container image of PROGRAM and imports it into the\n"
    "Docker Engine (no registry): the program, the shared libraries the\n"
    "dynamic loader finds for it, the loader and an empty /tmp, each at the\n"
    "same path as on this host.  Prints the image's id, tag and size on\n"
    "stdout, and a line per stage of the build on stderr (the program and\n"
    "its loader, the libraries found, the files and bytes collected, the\n"
    "import, the result).\n"
    "\n"
    "options:\n"
    "  -t, --tag NAME[:TAG]  the image's name (default fiber/<program>:<first\n"
    "                        12 hex digits of its build id>)\n"
    "  -h, --help            show this help\n"
    "\n"
    "The daemon is reached at docker_socket (FIBER_DOCKER_SOCKET; default\n"
    "/var/run/docker.sock).  Exit status: 0 built, 1 failed, 2 usage error.\n"
    "\n"
    "A Python program (PROGRAM ending in .py) is built by `python -m\n"
    "fiber.image build`, which adds the interpreter, its standard library,\n"
    "sys.path and the program's folder (docs/python.md), with python3 from\n"
    "PATH (the `fiber` command a pip install puts in an environment uses\n"
    "that environment's interpreter).\n";

/* PROGRAM.py: the Python package's image builder, with the interpreter
 * that will run the program (it decides what goes in the image). */
static int image_build_python(const char *program, const char *tag)
{
    const char *py = "python3";
    char *args[8];
    int n = 0;
    args[n++] = (char *)py;
    args[n++] = "-m";
    args[n++] = "fiber.image";
    args[n++] = "build";
    if (tag) {
        args[n++] = "--tag";
        args[n++] = (char *)tag;
    }
    args[n++] = (char *)program;
    args[n] = NULL;
    fflush(NULL);
    execvp(py, args);
    tool_say("image build: cannot run %s -m fiber.image for %s: %s", py,
             program, strerror(errno));
    return TOOL_FAIL;
}

/* Prints a stage of the build on stderr, as it happens. */
static void print_progress(void *ud, const char *line)
{
    (void)ud;
    fprintf(stderr, "fiber: %s\n", line);
    fflush(stderr);
}

static int image_build(int argc, char **argv)
{
    static const struct option longs[] = {{"tag", required_argument, NULL, 't'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    const char *tag = NULL;
    tool_getopt_reset();
    int c;
    while ((c = tool_getopt("image build", argc, argv, "t:h", longs)) != -1) {
        if (c == 'h') {
            fputs(image_help, stdout);
            return TOOL_OK;
        }
        if (c != 't')
            return TOOL_USAGE;
        tag = optarg;
    }
    if (optind >= argc)
        return tool_usage("image build", "which program? give its path");
    if (optind + 1 < argc)
        return tool_usage("image build", "unexpected argument '%s'",
                          argv[optind + 1]);
    const char *program = argv[optind];
    size_t plen = strlen(program);
    if (plen > 3 && strcmp(program + plen - 3, ".py") == 0)
        return image_build_python(program, tag);
    char default_tag[320];
    if (!tag) {
        int rc = fiber_image_default_tag(program, default_tag,
                                         sizeof default_tag);
        if (rc)
            return tool_fail(rc, "image build");
        tag = default_tag;
    }
    fiber_buf id = {0};
    fiber_image_build_opts opts = {.tag = tag, .progress = print_progress};
    int rc = fiber_image_build_with(program, &opts, &id);
    if (rc)
        return tool_fail(rc, "image build");
    fiber_image_info info;
    int irc = fiber_image_inspect(tag, &info);
    printf("image  %s\n", (const char *)id.data);
    printf("tag    %s\n", tag);
    if (irc == 0) {
        char size[32];
        tool_format_size(info.size_bytes, size, sizeof size);
        printf("size   %s (%lld bytes)\n", size, (long long)info.size_bytes);
    }
    fiber_buf_free(&id);
    if (irc)
        return tool_fail(irc, "image build: the image was made, but");
    return TOOL_OK;
}

int cmd_image(int argc, char **argv)
{
    if (argc < 2) {
        fputs(image_help, stderr);
        return TOOL_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(image_help, stdout);
        return TOOL_OK;
    }
    if (strcmp(argv[1], "build") == 0)
        return image_build(argc - 1, argv + 1);
    return tool_usage("image", "unknown subcommand '%s' (there is: build)",
                      argv[1]);
}

/* ---- fiber doctor -------------------------------------------------------- */

static const char doctor_help[] =
    "usage: fiber doctor\n"
    "\n"
    "Checks each backend from this host and says what it found: local\n"
    "(always usable), docker (pings the daemon at docker_socket and prints\n"
    "its versions, or why it cannot be reached and what to do), slurm and\n"
    "kubernetes.\n"
    "\n"
    "Exit status: 0 if the configured backend (the backend key; default\n"
    "local) is usable, 1 if not, 2 usage error.\n";

int cmd_doctor(int argc, char **argv)
{
    static const struct option longs[] = {{"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    tool_getopt_reset();
    int c;
    while ((c = tool_getopt("doctor", argc, argv, "h", longs)) != -1) {
        if (c == 'h') {
            fputs(doctor_help, stdout);
            return TOOL_OK;
        }
        return TOOL_USAGE;
    }
    if (optind < argc)
        return tool_usage("doctor", "unexpected argument '%s'", argv[optind]);

    char configured[64];
    int crc = fiber_config_get("backend", configured, sizeof configured);
    if (crc) {
        tool_fail(crc, "configuration");
        configured[0] = '\0';
    }
    int configured_ok = 0;
    printf("%-11s %-12s %s\n", "BACKEND", "STATUS", "DETAIL");
    const char *backend;
    for (size_t i = 0; (backend = fiber_backend_name(i)) != NULL; i++) {
        char detail[1024];
        int rc = fiber_backend_check(backend, detail, sizeof detail);
        const char *status = rc == 0                    ? "ok"
                             : rc == FIBER_ENOTSUP      ? "unavailable"
                             : rc == FIBER_EUNREACHABLE ? "unreachable"
                                                        : "error";
        printf("%-11s %-12s %s\n", backend, status, detail);
        if (strcmp(configured, backend) == 0)
            configured_ok = rc == 0;
    }
    if (!configured[0]) {
        printf("\nthe configuration cannot be read (see above); fix it "
               "first\n");
        return TOOL_FAIL;
    }
    printf("\nconfigured backend: %s (%s)\n", configured,
           configured_ok ? "usable" : "NOT usable: see its line above");
    return configured_ok ? TOOL_OK : TOOL_FAIL;
}
