/*
 * test_core.c -- errors, buffers, the task registry, configuration through
 * the public API, and fiber_init's checks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/common.h"
#include "runtime/runtime.h"
#include "harness.h"

FIBER_TASK(square) { return 0; }
FIBER_TASK(cube) { return 0; }

TEST(every_error_code_has_a_name_and_a_text)
{
    int codes[] = {
#define X(name, value, text) FIBER_##name,
        FIBER_ERRNO_MAP(X)
#undef X
    };
    for (size_t i = 0; i < FB_ARRAY_LEN(codes); i++) {
        CHECK(codes[i] < 0);
        CHECK(strncmp(fiber_errname(codes[i]), "FIBER_E", 7) == 0);
        CHECK(strcmp(fiber_strerror(codes[i]), "unknown error") != 0);
        for (size_t k = 0; k < i; k++)
            CHECK(codes[k] != codes[i]);
    }
    CHECK_STR(fiber_errname(FIBER_ETIMEDOUT), "FIBER_ETIMEDOUT");
    CHECK_STR(fiber_strerror(FIBER_ETIMEDOUT), "timed out");
    CHECK_STR(fiber_errname(0), "FIBER_OK");
    CHECK_STR(fiber_errname(-9999), "FIBER_E?");
    CHECK_STR(fiber_strerror(-9999), "unknown error");
}

TEST(buffers_grow_and_free)
{
    fiber_buf b = {0};
    for (int i = 0; i < 10000; i++)
        CHECK_OK(fiber_buf_append(&b, &i, sizeof i));
    CHECK_EQ(b.len, 10000 * sizeof(int));
    CHECK(b.cap >= b.len);
    int v;
    memcpy(&v, b.data + 4 * 9999, sizeof v);
    CHECK_EQ(v, 9999);
    CHECK_ERR(fiber_buf_reserve(&b, SIZE_MAX - 8), FIBER_ENOMEM);
    CHECK_EQ(b.len, 10000 * sizeof(int)); /* unchanged by the failure */
    fiber_buf_free(&b);
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0);
    fiber_buf_free(&b);
    fiber_buf_free(NULL);
}

TEST(unknown_task_message_lists_registered_tasks)
{
    fiber_task_fn fn = NULL;
    CHECK_OK(fiber_task_lookup("square", &fn));
    CHECK(fn != NULL);
    CHECK_ERR(fiber_task_lookup("squre", &fn), FIBER_ENOTASK);
    CHECK_STR(fiber_last_error(),
              "task 'squre' is not registered; registered tasks: cube, "
              "square");
}

TEST(init_twice_is_an_error)
{
    int argc = 1;
    char *args[] = {"x", NULL};
    char **argv = args;
    CHECK_ERR(fiber_init(&argc, &argv), FIBER_ESTATE);
    CHECK_EQ(fiber_is_master(), 1);
    CHECK(strncmp(fiber_run_id(), "fiber-", 6) == 0);
    CHECK_STR(fiber_version(), FIBER_VERSION_STRING);
    CHECK(strlen(fb_rt_build_id()) >= 16);
}

TEST(config_set_and_get)
{
    char buf[64];
    CHECK_OK(fiber_config_set("log_level", "info"));
    CHECK_OK(fiber_config_get("log_level", buf, sizeof buf));
    CHECK_STR(buf, "info");
    CHECK_ERR(fiber_config_set("log_levle", "info"), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "log_levle");
    CHECK_ERR(fiber_config_set("log_level", "loud"), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "loud");
    CHECK_CONTAINS(fiber_last_error(), "log_level");
    CHECK_OK(fiber_config_get("log_level", buf, sizeof buf));
    CHECK_STR(buf, "info"); /* the bad value changed nothing */
    CHECK_ERR(fiber_config_get("nope", buf, sizeof buf), FIBER_ECONFIG);
    CHECK_ERR(fiber_config_set(NULL, "x"), FIBER_EINVAL);
}

/* ---- layering, checked in a fresh process ---------------------------- */

/* Prints the effective log_level and connect_timeout_ms. */
TEST(helper_print_config)
{
    char a[64], b[64];
    CHECK_OK(fiber_config_get("log_level", a, sizeof a));
    CHECK_OK(fiber_config_get("connect_timeout_ms", b, sizeof b));
    printf("%s %s\n", a, b);
}

/* Runs this program with `args` in directory dir with the extra
 * environment variable env (may be NULL); captures stdout+stderr. */
static int run_self(const char *dir, const char *env, const char *arg,
                    char *out, size_t size)
{
    char self[512];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    self[n] = '\0';
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cd %s && env %s '%s' %s 2>&1", dir,
             env ? env : "", self, arg);
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL);
    size_t got = fread(out, 1, size - 1, f);
    out[got] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
}

TEST(file_then_environment_then_code)
{
    char dir[] = "/tmp/fiber-cfg-XXXXXX", path[600], out[4096];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/.fiberconfig", dir);
    write_file(path, "[fiber]\nlog_level = info\nconnect_timeout_ms = 1234\n");
    CHECK_EQ(run_self(dir, NULL, "helper_print_config", out, sizeof out), 0);
    CHECK_CONTAINS(out, "info 1234");
    CHECK_EQ(run_self(dir, "FIBER_LOG_LEVEL=debug", "helper_print_config",
                      out, sizeof out),
             0);
    CHECK_CONTAINS(out, "debug 1234");
    unlink(path);
    rmdir(dir);
}

TEST(unknown_key_in_file_stops_init)
{
    char dir[] = "/tmp/fiber-cfg-XXXXXX", path[600], out[4096];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/.fiberconfig", dir);
    write_file(path, "log_level = info\nbakend = local\n");
    CHECK_EQ(run_self(dir, NULL, "helper_print_config", out, sizeof out), 2);
    CHECK_CONTAINS(out, "FIBER_ECONFIG");
    CHECK_CONTAINS(out, "'bakend'");
    CHECK_CONTAINS(out, ".fiberconfig:2");
    unlink(path);
    rmdir(dir);
}

TEST(unknown_environment_variable_stops_init)
{
    char out[4096];
    CHECK_EQ(run_self("/tmp", "FIBER_LOGLEVEL=debug", "helper_print_config",
                      out, sizeof out),
             2);
    CHECK_CONTAINS(out, "FIBER_LOGLEVEL");
}

TEST(bad_value_in_environment_stops_init)
{
    char out[4096];
    CHECK_EQ(run_self("/tmp", "FIBER_CONNECT_TIMEOUT_MS=soon",
                      "helper_print_config", out, sizeof out),
             2);
    CHECK_CONTAINS(out, "connect_timeout_ms");
    CHECK_CONTAINS(out, "soon");
}

TH_MAIN()
