/*
 * test_config.c -- the configuration layers (defaults, INI file,
 * environment, code) and fiber's own log, tested through their internal
 * functions.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "runtime/config.h"
#include "harness.h"

/* Every key, in the order of the table in config.c. */
static const char *const all_keys[] = {
    "backend",           "log_level",          "log_dir",
    "log_file",          "transport",         "listen_host",        "connect_timeout_ms",
    "terminate_grace_ms", "max_message_bytes",  "heartbeat_ms", "fork_server",
    "image",             "docker_socket",      "docker_network",
    "docker_mounts",     "docker_build_image", "listen_interface",
    "encryption",        "max_pending_connections", "slurm_dir",
    "slurm_partition",   "slurm_account",      "slurm_time_limit",
    "slurm_sbatch_args", "k8s_server",         "k8s_token_file",
    "k8s_ca_file",       "k8s_namespace",      "k8s_config_dir",
    "k8s_volumes",       "k8s_host_network",   "k8s_pull_policy",
    "object_cache_mb",   "object_shm",         "manager_shm",
    "pymalloc_keep_mb",  "time_limit_margin_ms", "resumed",
};

/* ---- helpers ------------------------------------------------------------- */

static int remove_entry(const char *path, const struct stat *st, int type,
                        struct FTW *ftw)
{
    FB_UNUSED(st);
    FB_UNUSED(type);
    FB_UNUSED(ftw);
    return remove(path);
}

/* Creates a scratch directory; the test removes it with remove_tree(). */
static void make_tmpdir(char *dir, size_t size)
{
    snprintf(dir, size, "%s/fiber-test-config-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    CHECK(mkdtemp(dir) != NULL);
}

static void remove_tree(const char *dir)
{
    CHECK_EQ(nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS), 0);
}

/* Writes text to dir/name and stores the path in path. */
static void write_file(const char *dir, const char *name, const char *text,
                       char *path, size_t size)
{
    snprintf(path, size, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    CHECK_EQ(fputs(text, f) >= 0, 1);
    CHECK_EQ(fclose(f), 0);
}

/* Loads text as a configuration file into c and returns the result. */
static int load_text(struct fb_config *c, const char *text)
{
    char dir[256], path[512];
    make_tmpdir(dir, sizeof dir);
    write_file(dir, ".fiberconfig", text, path, sizeof path);
    int rc = fb_config_load_file(c, path);
    remove_tree(dir);
    return rc;
}

static const char *value_of(const struct fb_config *c, const char *key)
{
    static char buf[1024];
    CHECK_OK(fb_config_format(c, key, buf, sizeof buf));
    return buf;
}

/* Two configurations hold the same values when every key formats alike. */
static void check_same_config(const struct fb_config *a,
                              const struct fb_config *b)
{
    for (size_t i = 0; i < FB_ARRAY_LEN(all_keys); i++) {
        char va[1024], vb[1024];
        CHECK_OK(fb_config_format(a, all_keys[i], va, sizeof va));
        CHECK_OK(fb_config_format(b, all_keys[i], vb, sizeof vb));
        CHECK_STR(va, vb);
    }
}

/* ---- defaults and known keys --------------------------------------------- */

TEST(defaults)
{
    struct fb_config c;
    fb_config_defaults(&c);
    CHECK_STR(c.backend, "local");
    CHECK_EQ(c.log_level, FIBER_LOG_WARN);
    CHECK_STR(c.log_dir, "");
    CHECK_EQ(c.transport, FB_TRANSPORT_IPC);
    CHECK_STR(c.listen_host, "auto");
    CHECK_EQ(c.connect_timeout_ms, 30000);
    CHECK_EQ(c.terminate_grace_ms, 2000);
    CHECK_EQ(c.max_message_bytes, 64u << 20);
    CHECK_STR(value_of(&c, "log_level"), "warn");
    CHECK_STR(value_of(&c, "transport"), "ipc");
    CHECK_STR(value_of(&c, "max_message_bytes"), "67108864");

    /* Every default is a value the key's own parser accepts (log_dir's ""
     * too: the runtime's choice, which a program can set again). */
    for (size_t i = 0; i < FB_ARRAY_LEN(all_keys); i++) {
        struct fb_config copy;
        char text[1024];
        fb_config_defaults(&copy);
        CHECK_OK(fb_config_format(&c, all_keys[i], text, sizeof text));
        CHECK_OK(fb_config_apply(&copy, all_keys[i], text, "default"));
    }
}

TEST(known_keys)
{
    for (size_t i = 0; i < FB_ARRAY_LEN(all_keys); i++) {
        CHECK(fb_config_known(all_keys[i]));
        CHECK_STR(fb_config_key_at(i), all_keys[i]);
    }
    CHECK(fb_config_key_at(FB_ARRAY_LEN(all_keys)) == NULL);
    CHECK(!fb_config_known("log_levle"));
    CHECK(!fb_config_known("LOG_LEVEL"));
    CHECK(!fb_config_known(""));
    CHECK(!fb_config_known(NULL));
}

/* ---- fb_config_apply: good values ---------------------------------------- */

struct good_case {
    const char *key, *value, *formatted;
};

static const struct good_case good_cases[] = {
    {"backend", "local", "local"},
    {"backend", "LOCAL", "local"},
    {"backend", "Docker", "docker"},
    {"image", "fiber/es:3f9a1c2e0b7d", "fiber/es:3f9a1c2e0b7d"},
    {"image", "", ""},
    {"docker_socket", "/run/user/1000/docker.sock",
     "/run/user/1000/docker.sock"},
    {"docker_network", "bridge", "bridge"},
    {"docker_mounts", "/data:/data:ro,/scratch:/tmp/s",
     "/data:/data:ro,/scratch:/tmp/s"},
    {"docker_mounts", "", ""},
    {"log_level", "error", "error"},
    {"log_level", "warn", "warn"},
    {"log_level", "Info", "info"},
    {"log_level", "DEBUG", "debug"},
    {"log_dir", "/var/tmp/fiber logs", "/var/tmp/fiber logs"},
    {"log_dir", "relative/dir", "relative/dir"},
    {"log_dir", "", ""}, /* the default folder again */
    {"log_file", "/scratch/logs/fiber.log", "/scratch/logs/fiber.log"},
    {"log_file", "logs/fiber.log", "logs/fiber.log"},
    {"log_file", "", ""}, /* log_dir's layout again */
    {"transport", "ipc", "ipc"},
    {"transport", "TCP", "tcp"},
    {"listen_host", "0.0.0.0", "0.0.0.0"},
    {"listen_host", "node7.cluster", "node7.cluster"},
    {"connect_timeout_ms", "1", "1"},
    {"connect_timeout_ms", "86400000", "86400000"},
    {"connect_timeout_ms", "0100", "100"},
    {"terminate_grace_ms", "0", "0"},
    {"terminate_grace_ms", "3600000", "3600000"},
    {"max_message_bytes", "1024", "1024"},
    {"max_message_bytes", "1073741824", "1073741824"},
};

TEST(apply_good_values)
{
    for (size_t i = 0; i < FB_ARRAY_LEN(good_cases); i++) {
        const struct good_case *g = &good_cases[i];
        struct fb_config c;
        fb_config_defaults(&c);
        CHECK_OK(fb_config_apply(&c, g->key, g->value, "test"));
        CHECK_STR(value_of(&c, g->key), g->formatted);
    }
}

TEST(apply_sets_fields)
{
    struct fb_config c;
    fb_config_defaults(&c);
    CHECK_OK(fb_config_apply(&c, "log_level", "debug", "test"));
    CHECK_OK(fb_config_apply(&c, "transport", "tcp", "test"));
    CHECK_OK(fb_config_apply(&c, "connect_timeout_ms", "1500", "test"));
    CHECK_OK(fb_config_apply(&c, "terminate_grace_ms", "0", "test"));
    CHECK_OK(fb_config_apply(&c, "listen_host", "10.0.0.1", "test"));
    CHECK_OK(fb_config_apply(&c, "log_dir", "/tmp/logs", "test"));
    CHECK_EQ(c.log_level, FIBER_LOG_DEBUG);
    CHECK_EQ(c.transport, FB_TRANSPORT_TCP);
    CHECK_EQ(c.connect_timeout_ms, 1500);
    CHECK_EQ(c.terminate_grace_ms, 0);
    CHECK_STR(c.listen_host, "10.0.0.1");
    CHECK_STR(c.log_dir, "/tmp/logs");
}

/* ---- fb_config_apply: bad values ----------------------------------------- */

struct bad_case {
    const char *key, *value, *expected; /* expected: part of the message */
};

static const struct bad_case bad_cases[] = {
    {"backend", "slurmm", "expected one of local, docker, slurm, kubernetes"},
    {"backend", "", "expected one of local, docker, slurm, kubernetes"},
    {"slurm_partition", "a b", "without spaces"},
    {"slurm_sbatch_args", "--x\n--y", "without control characters"},
    {"k8s_volumes", "data:/d ata", "without spaces"},
    {"k8s_host_network", "sometimes", "true or false"},
    {"k8s_pull_policy", "Whenever", "Always, IfNotPresent, Never, or nothing"},
    {"encryption", "maybe", "true or false"},
    {"max_pending_connections", "0", "from 1 to 65536"},
    {"object_cache_mb", "0", "from 1 to 1048576"},
    {"object_shm", "perhaps", "true or false"},
    {"manager_shm", "sometimes", "true or false"},
    {"pymalloc_keep_mb", "65", "from 0 to 64"},
    {"fork_server", "often", "true or false"},
    {"time_limit_margin_ms", "-1", "from 0 to 86400000"},
    {"resumed", "once", "from 0 to 1000000"},
    {"image", "has space", "image reference"},
    {"docker_socket", "relative.sock", "absolute path of a unix socket"},
    {"docker_socket", "", "absolute path of a unix socket"},
    {"docker_network", "", "network name"},
    {"docker_mounts", "data:/data", "src:dst"},
    {"docker_mounts", "/data:/data:rx", "src:dst"},
    {"docker_mounts", "/data:/data,", "src:dst"},
    {"docker_mounts", "/data", "src:dst"},
    {"log_level", "loud", "error, warn, info, debug"},
    {"log_level", "", "error, warn, info, debug"},
    {"log_level", "warn ", "error, warn, info, debug"},
    {"transport", "udp", "one of ipc, tcp"},
    {"listen_host", "", "non-empty host"},
    {"connect_timeout_ms", "0", "from 1 to 86400000"},
    {"connect_timeout_ms", "86400001", "from 1 to 86400000"},
    {"connect_timeout_ms", "-5", "from 1 to 86400000"},
    {"connect_timeout_ms", "", "from 1 to 86400000"},
    {"connect_timeout_ms", "12ms", "from 1 to 86400000"},
    {"connect_timeout_ms", " 12", "from 1 to 86400000"},
    {"connect_timeout_ms", "12 ", "from 1 to 86400000"},
    {"connect_timeout_ms", "+12", "from 1 to 86400000"},
    {"connect_timeout_ms", "0x10", "from 1 to 86400000"},
    {"connect_timeout_ms", "1e3", "from 1 to 86400000"},
    {"connect_timeout_ms", "99999999999999999999", "from 1 to 86400000"},
    {"connect_timeout_ms", "1k", "from 1 to 86400000"},
    {"terminate_grace_ms", "-1", "from 0 to 3600000"},
    {"terminate_grace_ms", "3600001", "from 0 to 3600000"},
    {"terminate_grace_ms", "soon", "from 0 to 3600000"},
    {"max_message_bytes", "1023", "from 1024 to 1073741824"},
    {"max_message_bytes", "1073741825", "from 1024 to 1073741824"},
    {"max_message_bytes", "2g", "suffix k, m or g"},
    {"max_message_bytes", "1t", "suffix k, m or g"},
    {"max_message_bytes", "1kk", "suffix k, m or g"},
    {"max_message_bytes", "1kb", "suffix k, m or g"},
    {"max_message_bytes", "k", "suffix k, m or g"},
    {"max_message_bytes", "-1k", "suffix k, m or g"},
    {"max_message_bytes", "0k", "suffix k, m or g"},
    {"max_message_bytes", "9223372036854775807k", "suffix k, m or g"},
    {"max_message_bytes", "", "suffix k, m or g"},
};

TEST(apply_bad_values)
{
    for (size_t i = 0; i < FB_ARRAY_LEN(bad_cases); i++) {
        const struct bad_case *b = &bad_cases[i];
        struct fb_config c, before;
        fb_config_defaults(&c);
        before = c;
        char quoted[128];
        snprintf(quoted, sizeof quoted, "bad value '%s' for key '%s'",
                 b->value, b->key);
        CHECK_ERR(fb_config_apply(&c, b->key, b->value, "origin-x"),
                  FIBER_ECONFIG);
        CHECK_CONTAINS(fiber_last_error(), quoted);
        CHECK_CONTAINS(fiber_last_error(), "(origin-x)");
        CHECK_CONTAINS(fiber_last_error(), b->expected);
        CHECK(memcmp(&c, &before, sizeof c) == 0);
    }
}

TEST(apply_message_exact)
{
    struct fb_config c;
    fb_config_defaults(&c);
    CHECK_ERR(fb_config_apply(&c, "log_level", "loud", ".fiberconfig:3"),
              FIBER_ECONFIG);
    CHECK_STR(fiber_last_error(),
              "bad value 'loud' for key 'log_level' (.fiberconfig:3): "
              "expected one of error, warn, info, debug");
}

TEST(apply_unknown_key)
{
    struct fb_config c, before;
    fb_config_defaults(&c);
    before = c;
    CHECK_ERR(fb_config_apply(&c, "log_levle", "info", ".fiberconfig:3"),
              FIBER_ECONFIG);
    CHECK_STR(fiber_last_error(),
              "unknown key 'log_levle' (.fiberconfig:3); known keys: backend, "
              "log_level, log_dir, log_file, transport, listen_host, connect_timeout_ms, "
              "terminate_grace_ms, max_message_bytes, heartbeat_ms, fork_server, image, "
              "docker_socket, docker_network, docker_mounts, "
          "docker_build_image, listen_interface, encryption, "
          "max_pending_connections, slurm_dir, slurm_partition, "
          "slurm_account, slurm_time_limit, slurm_sbatch_args, k8s_server, "
          "k8s_token_file, k8s_ca_file, k8s_namespace, k8s_config_dir, "
          "k8s_volumes, k8s_host_network, k8s_pull_policy, "
          "object_cache_mb, object_shm, manager_shm, pymalloc_keep_mb, "
          "time_limit_margin_ms, "
          "resumed");
    CHECK(memcmp(&c, &before, sizeof c) == 0);
    CHECK_ERR(fb_config_apply(&c, NULL, "x", "test"), FIBER_ECONFIG);
    CHECK_ERR(fb_config_apply(&c, "log_level", NULL, "test"), FIBER_ECONFIG);
}

TEST(apply_long_strings)
{
    struct fb_config c;
    char text[600];
    fb_config_defaults(&c);

    memset(text, 'd', sizeof c.log_dir - 1);
    text[sizeof c.log_dir - 1] = '\0';
    CHECK_OK(fb_config_apply(&c, "log_dir", text, "test"));
    CHECK_STR(c.log_dir, text);
    strcat(text, "d");
    CHECK_ERR(fb_config_apply(&c, "log_dir", text, "test"), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "at most 511 bytes");
    /* A huge value is quoted only in part, so the message stays whole. */
    CHECK_CONTAINS(fiber_last_error(), "...' for key 'log_dir' (test)");

    memset(text, 'h', 255);
    text[255] = '\0';
    CHECK_OK(fb_config_apply(&c, "listen_host", text, "test"));
    strcat(text, "h");
    CHECK_ERR(fb_config_apply(&c, "listen_host", text, "test"),
              FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "at most 255 bytes");
}

TEST(size_suffixes)
{
    static const struct {
        const char *text;
        uint32_t bytes;
    } sizes[] = {
        {"1k", 1024},           {"1K", 1024},          {"64m", 64u << 20},
        {"64M", 64u << 20},     {"1g", 1u << 30},      {"1G", 1u << 30},
        {"1048576k", 1u << 30}, {"4096", 4096},
    };
    for (size_t i = 0; i < FB_ARRAY_LEN(sizes); i++) {
        struct fb_config c;
        fb_config_defaults(&c);
        CHECK_OK(fb_config_apply(&c, "max_message_bytes", sizes[i].text,
                                 "test"));
        CHECK_EQ(c.max_message_bytes, sizes[i].bytes);
    }
}

/* ---- fb_config_format ---------------------------------------------------- */

TEST(format_round_trip)
{
    struct fb_config set, copy;
    fb_config_defaults(&set);
    CHECK_OK(fb_config_apply(&set, "log_level", "info", "test"));
    CHECK_OK(fb_config_apply(&set, "log_dir", "/srv/fiber/logs", "test"));
    CHECK_OK(fb_config_apply(&set, "transport", "tcp", "test"));
    CHECK_OK(fb_config_apply(&set, "listen_host", "::1", "test"));
    CHECK_OK(fb_config_apply(&set, "connect_timeout_ms", "1234", "test"));
    CHECK_OK(fb_config_apply(&set, "terminate_grace_ms", "0", "test"));
    CHECK_OK(fb_config_apply(&set, "max_message_bytes", "3m", "test"));

    fb_config_defaults(&copy);
    for (size_t i = 0; i < FB_ARRAY_LEN(all_keys); i++) {
        char text[1024];
        CHECK_OK(fb_config_format(&set, all_keys[i], text, sizeof text));
        CHECK_OK(fb_config_apply(&copy, all_keys[i], text, "round trip"));
    }
    check_same_config(&set, &copy);
    CHECK_EQ(copy.max_message_bytes, 3u << 20);
    CHECK_EQ(copy.transport, FB_TRANSPORT_TCP);
    CHECK_EQ(copy.log_level, FIBER_LOG_INFO);
}

TEST(format_errors_and_truncation)
{
    struct fb_config c;
    char small[4];
    fb_config_defaults(&c);
    CHECK_ERR(fb_config_format(&c, "nope", small, sizeof small),
              FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "unknown key 'nope'");
    CHECK_CONTAINS(fiber_last_error(), "known keys: backend");
    CHECK_OK(fb_config_format(&c, "listen_host", small, sizeof small));
    CHECK_STR(small, "aut");
    CHECK_OK(fb_config_format(&c, "connect_timeout_ms", small, sizeof small));
    CHECK_STR(small, "300");
}

/* ---- the INI file -------------------------------------------------------- */

TEST(file_no_section)
{
    struct fb_config c;
    fb_config_defaults(&c);
    CHECK_OK(load_text(&c, "# fiber settings\n"
                           "log_level = info\n"
                           "\n"
                           "; another comment\n"
                           "max_message_bytes = 2m ; inline comment\n"
                           "transport: tcp\n"));
    CHECK_EQ(c.log_level, FIBER_LOG_INFO);
    CHECK_EQ(c.max_message_bytes, 2u << 20);
    CHECK_EQ(c.transport, FB_TRANSPORT_TCP);
}

TEST(file_fiber_section)
{
    struct fb_config c;
    fb_config_defaults(&c);
    CHECK_OK(load_text(&c, "terminate_grace_ms = 10\n"
                           "[fiber]\n"
                           "log_level = debug\n"
                           "connect_timeout_ms=500\n"));
    CHECK_EQ(c.terminate_grace_ms, 10);
    CHECK_EQ(c.log_level, FIBER_LOG_DEBUG);
    CHECK_EQ(c.connect_timeout_ms, 500);
}

TEST(file_other_section)
{
    struct fb_config c, before;
    fb_config_defaults(&c);
    before = c;
    CHECK_ERR(load_text(&c, "[fiber]\n"
                            "log_level = info\n"
                            "[tool]\n"
                            "color = yes\n"),
              FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "[tool]");
    CHECK_CONTAINS(fiber_last_error(), ".fiberconfig:4");
    CHECK(memcmp(&c, &before, sizeof c) == 0);
}

TEST(file_unknown_key)
{
    struct fb_config c, before;
    fb_config_defaults(&c);
    before = c;
    CHECK_ERR(load_text(&c, "[fiber]\n"
                            "log_level = info\n"
                            "log_levle = debug\n"),
              FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "unknown key 'log_levle'");
    CHECK_CONTAINS(fiber_last_error(), "/.fiberconfig:3)");
    CHECK_CONTAINS(fiber_last_error(), "known keys: backend, log_level");
    /* The good line before the bad one was not applied either. */
    CHECK(memcmp(&c, &before, sizeof c) == 0);
}

/* Uber Fiber's .fiberconfig: its [default] section, its names and values. */
TEST(file_uber_fiber_default_section)
{
    struct fb_config c;
    fb_config_defaults(&c);
    CHECK_OK(load_text(&c, "[default]\n"
                           "default_backend = docker\n"
                           "default_image = fiber-test:latest\n"
                           "log_level = warning\n"
                           "log_file = /tmp/fiberlogs/fiber.log\n"
                           "kubernetes_namespace = research\n"
                           "connect_timeout_ms = 700\n"));
    CHECK_STR(c.backend, "docker");
    CHECK_STR(c.image, "fiber-test:latest");
    CHECK_EQ(c.log_level, FIBER_LOG_WARN);
    CHECK_STR(c.log_file, "/tmp/fiberlogs/fiber.log");
    CHECK_STR(c.k8s_namespace, "research");
    CHECK_EQ(c.connect_timeout_ms, 700);

    fb_config_defaults(&c);
    CHECK_OK(load_text(&c, "[default]\nlog_level = 10\n"));
    CHECK_EQ(c.log_level, FIBER_LOG_DEBUG);
    fb_config_defaults(&c);
    CHECK_OK(load_text(&c, "[default]\nlog_level = CRITICAL\n"));
    CHECK_EQ(c.log_level, FIBER_LOG_ERROR);
    fb_config_defaults(&c);
    CHECK_OK(load_text(&c, "[default]\ndebug = true\n"));
    CHECK_EQ(c.log_level, FIBER_LOG_DEBUG);
    fb_config_defaults(&c);
    CHECK_OK(load_text(&c, "[default]\nbackend = local\ndebug = false\n"));
    CHECK_EQ(c.log_level, FIBER_LOG_WARN);
}

TEST(file_uber_fiber_refused_keys)
{
    struct fb_config c;
    fb_config_defaults(&c);
    CHECK_ERR(load_text(&c, "[default]\nlog_level = info\ncpu_per_job = 2\n"),
              FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "Uber Fiber's key 'cpu_per_job'");
    CHECK_CONTAINS(fiber_last_error(), ".fiberconfig:3");
    CHECK_CONTAINS(fiber_last_error(), "fiber.config.cpu_per_job");
    CHECK_ERR(load_text(&c, "[default]\nipc_active = false\n"),
              FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "always dial their master");
    CHECK_ERR(load_text(&c, "[default]\nlog_file = stdout\n"),
              FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "log_file = stdout");
    CHECK_ERR(load_text(&c, "[default]\nlog_level = loud\n"), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "bad value 'loud' for key 'log_level'");
    CHECK_ERR(load_text(&c, "[default]\nbogus = 1\n"), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "unknown key 'bogus'");
}

TEST(file_bad_value)
{
    struct fb_config c;
    fb_config_defaults(&c);
    CHECK_ERR(load_text(&c, "\n\nlog_level = loud\n"), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(),
                   "bad value 'loud' for key 'log_level' (");
    CHECK_CONTAINS(fiber_last_error(),
                   "/.fiberconfig:3): expected one of error, warn");
    CHECK_ERR(load_text(&c, "log_level =\n"), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "bad value '' for key 'log_level'");
}

TEST(file_syntax_error)
{
    struct fb_config c;
    fb_config_defaults(&c);
    CHECK_ERR(load_text(&c, "log_level = info\nthis line has no equals\n"),
              FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "syntax error in ");
    CHECK_CONTAINS(fiber_last_error(), "/.fiberconfig:2");
    CHECK_ERR(load_text(&c, "[fiber\nlog_level = info\n"), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "/.fiberconfig:1");
}

TEST(file_first_error_wins)
{
    struct fb_config c;
    fb_config_defaults(&c);
    /* A syntax error before a bad value is the one reported... */
    CHECK_ERR(load_text(&c, "log_level = info\nnonsense\nlog_level = x\n"),
              FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "syntax error");
    CHECK_CONTAINS(fiber_last_error(), ":2");
    /* ...and a bad value before a syntax error. */
    CHECK_ERR(load_text(&c, "log_level = x\nnonsense\n"), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "bad value 'x'");
    CHECK_CONTAINS(fiber_last_error(), ":1)");
}

TEST(file_long_lines)
{
    struct fb_config c;
    char text[1024], dir_value[600];
    fb_config_defaults(&c);

    /* A line that fits inih's buffer is read whole... */
    memset(dir_value, 'p', 150);
    dir_value[150] = '\0';
    snprintf(text, sizeof text, "log_level = info\nlog_dir = %s\n", dir_value);
    CHECK_OK(load_text(&c, text));
    CHECK_STR(c.log_dir, dir_value);

    /* ...and a longer one is refused rather than cut into pieces. */
    memset(dir_value, 'q', 400);
    dir_value[400] = '\0';
    snprintf(text, sizeof text, "log_level = info\nlog_dir = %s\n", dir_value);
    CHECK_ERR(load_text(&c, text), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "line too long");
    CHECK_CONTAINS(fiber_last_error(), "/.fiberconfig:2");
    CHECK_EQ(c.log_dir[0], 'p');

    /* A syntax error before the long line is still the one reported. */
    snprintf(text, sizeof text, "nonsense\nlog_dir = %s\n", dir_value);
    CHECK_ERR(load_text(&c, text), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "syntax error");
    CHECK_CONTAINS(fiber_last_error(), "/.fiberconfig:1");
}

TEST(file_last_line_without_newline)
{
    struct fb_config c;
    fb_config_defaults(&c);
    CHECK_OK(load_text(&c, "log_level = error"));
    CHECK_EQ(c.log_level, FIBER_LOG_ERROR);
}

TEST(file_missing_and_unreadable)
{
    struct fb_config c, before;
    char dir[256], path[512];
    fb_config_defaults(&c);
    before = c;
    make_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/.fiberconfig", dir);
    CHECK_OK(fb_config_load_file(&c, path));
    CHECK(memcmp(&c, &before, sizeof c) == 0);

    /* A directory where the file should be exists but cannot be read. */
    CHECK_EQ(mkdir(path, 0700), 0);
    CHECK_ERR(fb_config_load_file(&c, path), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "cannot read configuration file");
    CHECK_CONTAINS(fiber_last_error(), path);
    CHECK(memcmp(&c, &before, sizeof c) == 0);
    remove_tree(dir);
}

/* ---- the environment ----------------------------------------------------- */

TEST(env_applies_keys)
{
    char *envp[] = {"PATH=/usr/bin",
                    "FIBER_LOG_LEVEL=debug",
                    "FIBER_BOOT_X=1",
                    "FIBER_BOOT_SECRET_FD=3",
                    "FIBER_MAX_MESSAGE_BYTES=8k",
                    "NOT_FIBER_NOPE=1",
                    "FIBER_WITHOUT_EQUALS",
                    NULL};
    struct fb_config c;
    fb_config_defaults(&c);
    CHECK_OK(fb_config_load_env(&c, envp));
    CHECK_EQ(c.log_level, FIBER_LOG_DEBUG);
    CHECK_EQ(c.max_message_bytes, 8192);
    CHECK_OK(fb_config_load_env(&c, NULL));
}

/* Uber Fiber's variables: FIBER_ + its key in upper case. */
TEST(env_uber_fiber_variables)
{
    char *envp[] = {"FIBER_DEFAULT_BACKEND=slurm", "FIBER_LOG_LEVEL=warning",
                    "FIBER_DEFAULT_IMAGE=fiber-test:latest",
                    "FIBER_KUBERNETES_NAMESPACE=research",
                    "FIBER_LOG_FILE=/var/tmp/f/fiber.log", NULL};
    struct fb_config c;
    fb_config_defaults(&c);
    c.log_level = FIBER_LOG_DEBUG;
    CHECK_OK(fb_config_load_env(&c, envp));
    CHECK_STR(c.backend, "slurm");
    CHECK_EQ(c.log_level, FIBER_LOG_WARN);
    CHECK_STR(c.image, "fiber-test:latest");
    CHECK_STR(c.k8s_namespace, "research");
    CHECK_STR(c.log_file, "/var/tmp/f/fiber.log");

    char *refused[] = {"FIBER_CPU_PER_JOB=2", NULL};
    CHECK_ERR(fb_config_load_env(&c, refused), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "Uber Fiber's key 'cpu_per_job' "
                   "(environment variable FIBER_CPU_PER_JOB)");
}

TEST(env_unknown_variable)
{
    char *envp[] = {"FIBER_LOG_LEVEL=debug", "FIBER_NOPE=1", NULL};
    struct fb_config c, before;
    fb_config_defaults(&c);
    before = c;
    CHECK_ERR(fb_config_load_env(&c, envp), FIBER_ECONFIG);
    CHECK_STR(fiber_last_error(),
              "unknown environment variable FIBER_NOPE: not a fiber "
              "configuration key; known keys: backend, log_level, log_dir, "
              "log_file, transport, listen_host, connect_timeout_ms, "
              "terminate_grace_ms, max_message_bytes, heartbeat_ms, fork_server, image, "
              "docker_socket, docker_network, docker_mounts, "
          "docker_build_image, listen_interface, encryption, "
          "max_pending_connections, slurm_dir, slurm_partition, "
          "slurm_account, slurm_time_limit, slurm_sbatch_args, k8s_server, "
          "k8s_token_file, k8s_ca_file, k8s_namespace, k8s_config_dir, "
          "k8s_volumes, k8s_host_network, k8s_pull_policy, "
          "object_cache_mb, object_shm, manager_shm, pymalloc_keep_mb, "
          "time_limit_margin_ms, "
          "resumed");
    CHECK(memcmp(&c, &before, sizeof c) == 0);
}

TEST(env_bad_and_empty_values)
{
    char *bad[] = {"FIBER_LOG_LEVEL=loud", NULL};
    char *empty[] = {"FIBER_CONNECT_TIMEOUT_MS=", NULL};
    struct fb_config c;
    fb_config_defaults(&c);
    CHECK_ERR(fb_config_load_env(&c, bad), FIBER_ECONFIG);
    CHECK_STR(fiber_last_error(),
              "bad value 'loud' for key 'log_level' (environment variable "
              "FIBER_LOG_LEVEL): expected one of error, warn, info, debug");
    CHECK_ERR(fb_config_load_env(&c, empty), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(),
                   "bad value '' for key 'connect_timeout_ms' (environment "
                   "variable FIBER_CONNECT_TIMEOUT_MS)");
}

/* ---- layering: defaults < file < environment < code ---------------------- */

TEST(layering)
{
    char *envp[] = {"FIBER_LOG_LEVEL=debug", NULL};
    struct fb_config c;
    fb_config_defaults(&c);
    CHECK_OK(load_text(&c, "log_level = info\nterminate_grace_ms = 7\n"));
    CHECK_EQ(c.log_level, FIBER_LOG_INFO);
    CHECK_OK(fb_config_load_env(&c, envp));
    CHECK_EQ(c.log_level, FIBER_LOG_DEBUG);
    CHECK_EQ(c.terminate_grace_ms, 7); /* the file's, untouched by env */
    CHECK_OK(fb_config_apply(&c, "log_level", "error", "fiber_config_set"));
    CHECK_EQ(c.log_level, FIBER_LOG_ERROR);
}

/* ---- the log ------------------------------------------------------------- */

/* Reads the whole file at path into buf (NUL-terminated). */
static size_t read_file(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0);
    ssize_t n = read(fd, buf, size - 1);
    CHECK(n >= 0);
    buf[n] = '\0';
    close(fd);
    return (size_t)n;
}

TEST(log_to_dir)
{
    char dir[256], log_dir[512], path[600], text[8192], expect[128];
    struct stat st;
    make_tmpdir(dir, sizeof dir);
    snprintf(log_dir, sizeof log_dir, "%s/run/logs", dir);
    fb_log_setup(FIBER_LOG_INFO, "Process-3");
    CHECK_OK(fb_log_to_dir(log_dir, "Process-3"));

    errno = EAGAIN;
    fb_log_info("hello %d", 42);
    CHECK_EQ(errno, EAGAIN); /* logging keeps errno */
    fb_log_debug("below the level");
    fiber_log(FIBER_LOG_DEBUG, "also below the level");
    fb_log_warn("ends in a newline\n");

    snprintf(path, sizeof path, "%s/Process-3.log", log_dir);
    read_file(path, text, sizeof text);
    snprintf(expect, sizeof expect, "Z INFO  Process-3[%ld] hello 42\n",
             (long)getpid());
    CHECK_CONTAINS(text, expect);
    snprintf(expect, sizeof expect,
             "Z WARN  Process-3[%ld] ends in a newline\n", (long)getpid());
    CHECK_CONTAINS(text, expect);
    CHECK(strstr(text, "below the level") == NULL);
    CHECK(strstr(text, "\n\n") == NULL);
    /* "2026-11-29T18:40:01.123Z INFO ..." */
    CHECK_EQ(text[4], '-');
    CHECK_EQ(text[10], 'T');
    CHECK_EQ(text[19], '.');
    CHECK_EQ(text[23], 'Z');

    CHECK_EQ(stat(log_dir, &st), 0);
    CHECK_EQ(st.st_mode & 0777, 0700);
    CHECK_EQ(stat(path, &st), 0);
    CHECK_EQ(st.st_mode & 0777, 0600);
    remove_tree(dir);
}

TEST(log_levels)
{
    fb_log_setup(FIBER_LOG_WARN, "master");
    CHECK(fb_log_enabled(FIBER_LOG_ERROR));
    CHECK(fb_log_enabled(FIBER_LOG_WARN));
    CHECK(!fb_log_enabled(FIBER_LOG_INFO));
    CHECK(!fb_log_enabled(FIBER_LOG_DEBUG));
    fb_log_setup(FIBER_LOG_DEBUG, NULL);
    CHECK(fb_log_enabled(FIBER_LOG_DEBUG));
    fb_log_setup(FIBER_LOG_ERROR, NULL);
    CHECK(!fb_log_enabled(FIBER_LOG_WARN));
}

TEST(log_long_line_and_odd_name)
{
    char dir[256], path[600], text[16384];
    static char message[10000];
    make_tmpdir(dir, sizeof dir);
    fb_log_setup(FIBER_LOG_ERROR, "../odd/name");
    /* The file name cannot leave the directory. */
    CHECK_OK(fb_log_to_dir(dir, "../odd/name"));
    memset(message, 'm', sizeof message - 1);
    fb_log_error("%s", message);
    fb_log_error("short");

    snprintf(path, sizeof path, "%s/_._odd_name.log", dir);
    size_t len = read_file(path, text, sizeof text);
    char *first_end = strchr(text, '\n');
    CHECK(first_end != NULL);
    CHECK_EQ(first_end - text + 1, 4096);
    CHECK(memcmp(first_end - 3, "...", 3) == 0);
    CHECK_CONTAINS(first_end + 1, "] short\n");
    CHECK_EQ(text[len - 1], '\n');
    remove_tree(dir);
}

#define LOG_THREADS 8
#define LOG_LINES 200
#define LOG_PADDING "padding that makes a torn line easy to see"

static void *log_many(void *arg)
{
    long id = (long)arg;
    for (int i = 0; i < LOG_LINES; i++)
        fb_log_warn("thread %ld line %d %s", id, i, LOG_PADDING);
    return NULL;
}

TEST(log_threads_do_not_interleave)
{
    char dir[256], path[600];
    static char text[LOG_THREADS * LOG_LINES * 256];
    pthread_t threads[LOG_THREADS];
    make_tmpdir(dir, sizeof dir);
    fb_log_setup(FIBER_LOG_WARN, "threads");
    CHECK_OK(fb_log_to_dir(dir, "threads"));
    for (long i = 0; i < LOG_THREADS; i++)
        CHECK_EQ(pthread_create(&threads[i], NULL, log_many, (void *)i), 0);
    for (int i = 0; i < LOG_THREADS; i++)
        CHECK_EQ(pthread_join(threads[i], NULL), 0);

    snprintf(path, sizeof path, "%s/threads.log", dir);
    read_file(path, text, sizeof text);
    int lines = 0;
    for (char *line = text, *end; (end = strchr(line, '\n')); line = end + 1) {
        *end = '\0';
        CHECK_EQ(line[23], 'Z');
        CHECK_CONTAINS(line, " WARN  threads[");
        CHECK(end - line > (long)strlen(LOG_PADDING));
        CHECK_STR(end - strlen(LOG_PADDING), LOG_PADDING);
        lines++;
    }
    CHECK_EQ(lines, LOG_THREADS * LOG_LINES);
    remove_tree(dir);
}

TEST(log_to_dir_failure)
{
    char dir[256], path[600];
    make_tmpdir(dir, sizeof dir);
    /* A file where a parent directory should be. */
    write_file(dir, "file", "", path, sizeof path);
    strcat(path, "/logs");
    CHECK_ERR(fb_log_to_dir(path, "master"), FIBER_ESYS);
    CHECK_CONTAINS(fiber_last_error(), "cannot create log directory");
    CHECK_CONTAINS(fiber_last_error(), path);
    CHECK_ERR(fb_log_to_dir("", "master"), FIBER_ESYS);
    remove_tree(dir);
}

TH_MAIN()
