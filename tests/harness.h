/*
 * harness.h -- fiber's tiny test harness.
 *
 * A test program is an ordinary fiber program: main() calls fiber_init()
 * (so the program can re-run itself to play children), then runs the one
 * test case named on its command line.  ctest runs each case as its own
 * process with its own timeout, so one crashing or hanging case cannot
 * take others with it.
 *
 *     TEST(start_join) { CHECK_OK(fiber_process_start(...)); }
 *     TH_MAIN()
 *
 *   prog --list      prints the case names, one a line
 *   prog NAME        runs one case; exit 0 = pass
 *   prog             runs every case in this process, in order
 *
 * Cases whose names start with "helper_" are not tests: they are roles a
 * test plays by running this program again (a second master, say).  They
 * are not listed and run only when named.
 *
 * A failed CHECK prints the file, line, expression and, for fiber calls,
 * the code's name and fiber_last_error(), then exits with status 1.
 *
 * A case that cannot run here says so and exits with TH_SKIP_CODE (77),
 * which every test's SKIP_RETURN_CODE names (cmake/FiberSkip.cmake), so
 * ctest reports it as skipped, never as passed:
 *
 *     TH_SKIP("%s is absent", path);          always a skip
 *     TH_SKIP_ENGINE("no Docker Engine at %s", sock);
 *
 * TH_SKIP_ENGINE is for a case that needs an engine (Docker, Slurm,
 * Kubernetes).  Under CI (the environment variable CI set to anything but
 * "", "0" or "false") every engine must be there, so it fails instead
 * (exit 1, "FAIL: ... engine case cannot run under CI").  The shell
 * wrappers do the same through tests/skip.sh.
 */
#ifndef FIBER_TEST_HARNESS_H
#define FIBER_TEST_HARNESS_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fiber/fiber.h"

typedef void (*th_fn)(void);
struct th_case {
    const char *name;
    th_fn fn;
    struct th_case *next;
};
static struct th_case *th_cases;

static inline void th_register(struct th_case *c)
{
    struct th_case **p = &th_cases; /* keep file order */
    while (*p)
        p = &(*p)->next;
    *p = c;
}

#define TEST(tname)                                                            \
    static void th_test_##tname(void);                                         \
    __attribute__((constructor)) static void th_reg_##tname(void)              \
    {                                                                          \
        static struct th_case c = {#tname, th_test_##tname, NULL};             \
        th_register(&c);                                                       \
    }                                                                          \
    static void th_test_##tname(void)

#define TH_FAIL(...)                                                           \
    do {                                                                       \
        fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);                  \
        fprintf(stderr, __VA_ARGS__);                                          \
        fprintf(stderr, "\n");                                                 \
        exit(1);                                                               \
    } while (0)

#define TH_SKIP_CODE 77

/* 1 when the environment says this is a CI run (CI=true, CI=1, ...). */
static inline int th_under_ci(void)
{
    const char *ci = getenv("CI");
    return ci && *ci && strcmp(ci, "0") != 0 && strcmp(ci, "false") != 0;
}

/* Prints "SKIP: <reason>" on both streams and exits TH_SKIP_CODE; an
 * engine skip under CI prints FAIL and exits 1 instead. */
__attribute__((format(printf, 2, 3), noreturn)) static inline void
th_skip(int engine, const char *fmt, ...)
{
    char reason[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    if (engine && th_under_ci()) {
        fprintf(stderr, "FAIL: %s: an engine case cannot run under CI=%s\n",
                reason, getenv("CI"));
        fflush(stdout);
        exit(1);
    }
    printf("SKIP: %s\n", reason);
    fprintf(stderr, "SKIP: %s\n", reason);
    fflush(stdout);
    exit(TH_SKIP_CODE);
}

#define TH_SKIP(...) th_skip(0, __VA_ARGS__)
#define TH_SKIP_ENGINE(...) th_skip(1, __VA_ARGS__)

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond))                                                           \
            TH_FAIL("%s", #cond);                                              \
    } while (0)

#define CHECK_EQ(a, b)                                                         \
    do {                                                                       \
        long long th_a = (long long)(a), th_b = (long long)(b);                \
        if (th_a != th_b)                                                      \
            TH_FAIL("%s == %s: %lld != %lld", #a, #b, th_a, th_b);             \
    } while (0)

#define CHECK_STR(a, b)                                                        \
    do {                                                                       \
        const char *th_a = (a), *th_b = (b);                                   \
        if (strcmp(th_a, th_b) != 0)                                           \
            TH_FAIL("%s == %s: \"%s\" != \"%s\"", #a, #b, th_a, th_b);         \
    } while (0)

#define CHECK_CONTAINS(hay, needle)                                            \
    do {                                                                       \
        const char *th_h = (hay), *th_n = (needle);                            \
        if (!strstr(th_h, th_n))                                               \
            TH_FAIL("\"%s\" does not contain \"%s\"", th_h, th_n);            \
    } while (0)

/* Asserts that a fiber call returns exactly `code`. */
#define CHECK_ERR(expr, code)                                                  \
    do {                                                                       \
        int th_rc = (expr);                                                    \
        if (th_rc != (code))                                                   \
            TH_FAIL("%s returned %s (%d), want %s; last error: %s", #expr,     \
                    fiber_errname(th_rc), th_rc, fiber_errname(code),          \
                    fiber_last_error());                                       \
    } while (0)

#define CHECK_OK(expr) CHECK_ERR(expr, 0)

/* Reads f to its end into a NUL-terminated buffer the caller frees.  It
 * never stops early: a reader that stops at a fixed size and closes a
 * pipe kills the writer with SIGPIPE, and the test then fails on the
 * writer's status rather than on what it printed. */
static inline char *th_read_all(FILE *f, size_t *len_out)
{
    size_t cap = 1 << 16, len = 0, n;
    char *buf = malloc(cap);
    CHECK(buf != NULL);
    while ((n = fread(buf + len, 1, cap - 1 - len, f)) > 0) {
        len += n;
        if (cap - 1 - len == 0) {
            char *bigger = realloc(buf, cap * 2);
            CHECK(bigger != NULL);
            buf = bigger;
            cap *= 2;
        }
    }
    buf[len] = '\0';
    if (len_out)
        *len_out = len;
    return buf;
}

static inline int th_main(int argc, char **argv)
{
    int rc = fiber_init(&argc, &argv);
    if (rc != 0) {
        fprintf(stderr, "fiber_init: %s: %s\n", fiber_errname(rc),
                fiber_last_error());
        return 2;
    }
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (struct th_case *c = th_cases; c; c = c->next)
            if (strncmp(c->name, "helper_", 7) != 0)
                printf("%s\n", c->name);
        return 0;
    }
    int ran = 0;
    for (struct th_case *c = th_cases; c; c = c->next) {
        if (argc > 1 ? strcmp(argv[1], c->name) != 0
                     : strncmp(c->name, "helper_", 7) == 0)
            continue;
        fprintf(stderr, "-- %s\n", c->name);
        c->fn();
        ran++;
    }
    if (ran == 0) {
        fprintf(stderr, "no test case named '%s'\n", argc > 1 ? argv[1] : "");
        return 2;
    }
    return 0;
}

#define TH_MAIN()                                                              \
    int main(int argc, char **argv) { return th_main(argc, argv); }

#endif /* FIBER_TEST_HARNESS_H */
