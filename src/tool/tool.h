/*
 * tool.h -- what the subcommands of the `fiber` command share.
 *
 * The command is built only on the public API (fiber/fiber.h), as curl's
 * tool is built on libcurl: whatever it needs, a user's program can do
 * too.  docs/cli.md documents every subcommand; each one's --help text
 * says the same in short.
 *
 * Exit codes, for every subcommand (fiber run: until the program starts;
 * then the program's own status):
 *   0  success
 *   1  failure (the message says what to do next)
 *   2  usage error (bad option or argument)
 */
#ifndef FIBER_TOOL_H
#define FIBER_TOOL_H

#include <stddef.h>
#include <stdint.h>

#include "fiber/fiber.h"

#define TOOL_OK 0
#define TOOL_FAIL 1
#define TOOL_USAGE 2

/* The subcommands: each takes its own argv (argv[0] is its name) and
 * returns the process's exit code. */
int cmd_version(int argc, char **argv);
int cmd_image(int argc, char **argv);
int cmd_doctor(int argc, char **argv);
int cmd_ps(int argc, char **argv);
int cmd_logs(int argc, char **argv);
int cmd_kill(int argc, char **argv);
int cmd_clean(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_top(int argc, char **argv);

/* Prints "fiber: <message>" to stderr. */
void tool_say(const char *fmt, ...) FIBER_PRINTF(1, 2);

/* Prints "fiber <cmd>: <message>" and "Try 'fiber <cmd> --help'." to
 * stderr; returns TOOL_USAGE. */
int tool_usage(const char *cmd, const char *fmt, ...) FIBER_PRINTF(2, 3);

/* Prints "fiber: <what>: <fiber_last_error() or the code's text>" to
 * stderr; returns TOOL_FAIL. */
int tool_fail(int code, const char *what);

/* Parses a whole decimal number in [min, max].  Returns 0 or -1. */
int tool_parse_int(const char *text, int min, int max, int *out);

/* "14.2 MiB" */
void tool_format_size(int64_t bytes, char *buf, size_t size);

/* Runs getopt_long over argv with short options spec and long options
 * longs (a struct option array), after resetting getopt's state.  Used as
 * the loop condition of each subcommand.  Unknown options and missing
 * arguments come back as '?' after tool_usage printed the message, so the
 * caller returns TOOL_USAGE. */
struct option;
int tool_getopt(const char *cmd, int argc, char **argv, const char *spec,
                const struct option *longs);

/* Resets getopt before a subcommand parses its options. */
void tool_getopt_reset(void);

#endif /* FIBER_TOOL_H */
