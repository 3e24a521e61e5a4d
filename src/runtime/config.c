/*
 * config.c -- fiber's configuration keys, their parsers and the file and
 * environment layers.
 *
 * Every key is one line of FB_CONFIG_KEYS below.  That table generates the
 * defaults, the parser and formatter each key uses, the field each key is
 * stored in and the list of known keys quoted in error messages, so none of
 * them can drift from the others.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <ini.h>

#include "backend/runops.h"
#include "base/common.h"
#include "runtime/config.h"

/*
 * X(key, storage, default, kind, min, max)
 *
 *   key      the name users write and the field of struct fb_config;
 *   storage  how the field holds its value: STR (a char array), INT (int)
 *            or U32 (uint32_t);
 *   default  the field's built-in value, in that storage;
 *   kind     the parse_<kind>/format_<kind> pair that reads and writes it;
 *   min/max  the accepted range for the integer kinds (unused otherwise).
 */
#define FB_CONFIG_KEYS(X)                                                      \
    X(backend, STR, "local", backend, 0, 0)                                    \
    X(log_level, INT, FIBER_LOG_WARN, log_level, 0, 0)                         \
    X(log_dir, STR, "", path, 0, 0)                                            \
    X(log_file, STR, "", log_file, 0, 0)                                       \
    X(transport, INT, FB_TRANSPORT_IPC, transport, 0, 0)                       \
    X(listen_host, STR, "auto", host, 0, 0)                                    \
    X(connect_timeout_ms, INT, 30000, integer, 1, 86400000)                    \
    X(terminate_grace_ms, INT, 2000, integer, 0, 3600000)                      \
    X(max_message_bytes, U32, 64u << 20, size, 1024, 1073741824)              \
    X(heartbeat_ms, INT, 1000, integer, 0, 3600000)                            \
    X(fork_server, INT, 1, boolean, 0, 0)                                      \
    X(image, STR, "", image, 0, 0)                                             \
    X(docker_socket, STR, "/var/run/docker.sock", socket, 0, 0)                \
    X(docker_network, STR, "host", network, 0, 0)                              \
    X(docker_mounts, STR, "", mounts, 0, 0)                                    \
    X(docker_build_image, INT, 0, boolean, 0, 0)                               \
    X(listen_interface, STR, "", word, 0, 0)                                   \
    X(encryption, INT, 1, boolean, 0, 0)                                       \
    X(max_pending_connections, INT, 256, integer, 1, 65536)                    \
    X(slurm_dir, STR, "", word, 0, 0)                                          \
    X(slurm_partition, STR, "", word, 0, 0)                                    \
    X(slurm_account, STR, "", word, 0, 0)                                      \
    X(slurm_time_limit, STR, "", word, 0, 0)                                   \
    X(slurm_sbatch_args, STR, "", args, 0, 0)                                  \
    X(k8s_server, STR, "", word, 0, 0)                                         \
    X(k8s_token_file, STR, "", word, 0, 0)                                     \
    X(k8s_ca_file, STR, "", word, 0, 0)                                        \
    X(k8s_namespace, STR, "", word, 0, 0)                                      \
    X(k8s_config_dir, STR, "/var/run/secrets/kubernetes.io/serviceaccount",    \
      word, 0, 0)                                                              \
    X(k8s_volumes, STR, "", word, 0, 0)                                        \
    X(k8s_host_network, INT, 0, boolean, 0, 0)                                 \
    X(k8s_pull_policy, STR, "", pull_policy, 0, 0)                             \
    X(object_cache_mb, INT, 4096, integer, 1, 1048576)                         \
    X(object_shm, INT, 1, boolean, 0, 0)                                       \
    X(manager_shm, INT, 1, boolean, 0, 0)                                      \
    X(pymalloc_keep_mb, INT, 8, integer, 0, 64)                                \
    X(time_limit_margin_ms, INT, 0, integer, 0, 86400000)                      \
    X(resumed, INT, 0, integer, 0, 1000000)

/* Every key's name, ", "-separated, for "known keys: ..." in messages.  The
 * table puts ", " before each name; KNOWN_KEYS skips the first one. */
#define FB_X(key, storage, dflt, kind, min, max) ", " #key
static const char known_keys_with_lead[] = FB_CONFIG_KEYS(FB_X);
#undef FB_X
#define KNOWN_KEYS (known_keys_with_lead + 2)

/* A parsed value on its way into (or out of) a field: text for STR fields,
 * a number for INT and U32 fields. */
union cfg_value {
    const char *str;
    long long num;
};

/* Moving values between fields and union cfg_value, one macro per storage.
 * Using the wrong storage for a field fails to compile (an int is not a
 * char array), which is what keeps the table honest. */
#define FB_STR_STORE(field, v) fb_strlcpy((field), (v).str, sizeof(field))
#define FB_INT_STORE(field, v) ((field) = (int)(v).num)
#define FB_U32_STORE(field, v) ((field) = (uint32_t)(v).num)
#define FB_STR_LOAD(field) ((union cfg_value){.str = (field)})
#define FB_INT_LOAD(field) ((union cfg_value){.num = (field)})
#define FB_U32_LOAD(field) ((union cfg_value){.num = (field)})
#define FB_STR_CONST(d) ((union cfg_value){.str = (d)})
#define FB_INT_CONST(d) ((union cfg_value){.num = (d)})
#define FB_U32_CONST(d) ((union cfg_value){.num = (d)})
#define FB_STR_CAPACITY(field) sizeof(field)
#define FB_INT_CAPACITY(field) 0
#define FB_U32_CAPACITY(field) 0

struct key_spec;

/* Parses text for key k; on success stores the result in *out (a string
 * result points to text or to static storage).  Returns 0 or FIBER_ECONFIG
 * with a message naming the key, the origin and what is accepted. */
typedef int (*parse_fn)(const struct key_spec *k, const char *text,
                        const char *origin, union cfg_value *out);

/* Writes the value as text a parse_fn of the same kind accepts. */
typedef void (*format_fn)(union cfg_value v, char *buf, size_t size);

struct key_spec {
    const char *name;
    parse_fn parse;
    format_fn format;
    long long min, max; /* integer kinds: the accepted range */
    size_t capacity;    /* STR fields: the buffer size, NUL included */
};

/* ---- messages ------------------------------------------------------------ */

/* Values are quoted in messages; a huge one (an environment variable can
 * hold megabytes) is cut so that the rest of the message still fits. */
#define FB_QUOTE_MAX 80

static int bad_value(const struct key_spec *k, const char *text,
                     const char *origin, const char *expected)
{
    int cut = strlen(text) > FB_QUOTE_MAX;
    return fb_err(FIBER_ECONFIG,
                  "bad value '%.*s%s' for key '%s' (%s): expected %s",
                  FB_QUOTE_MAX, text, cut ? "..." : "", k->name, origin,
                  expected);
}

/* ---- choices: backend, log_level, transport ------------------------------ */

/* The order of these lists is the order of the values they stand for.
 * The backends' names are the registry's (backend/backend.c). */
static const char *const log_level_names[] = {"error", "warn", "info",
                                              "debug"};
static const char *const transport_names[] = {"ipc", "tcp"};

_Static_assert(FIBER_LOG_ERROR == 0 && FIBER_LOG_WARN == 1 &&
                   FIBER_LOG_INFO == 2 && FIBER_LOG_DEBUG == 3,
               "log_level_names must follow enum fiber_log_level");
_Static_assert(FB_TRANSPORT_IPC == 0 && FB_TRANSPORT_TCP == 1,
               "transport_names must follow FB_TRANSPORT_*");

/* Finds text in names (case-insensitive) and stores its index in *index.
 * Returns 0, or FIBER_ECONFIG with a message listing the names. */
static int parse_choice(const struct key_spec *k, const char *text,
                        const char *origin, const char *const *names,
                        size_t count, size_t *index)
{
    for (size_t i = 0; i < count; i++) {
        if (strcasecmp(names[i], text) == 0) {
            *index = i;
            return 0;
        }
    }
    char expected[128];
    size_t used = fb_strlcpy(expected, "one of ", sizeof expected);
    for (size_t i = 0; i < count; i++) {
        /* fb_strlcpy never passes the end, so used stays below the size. */
        if (i > 0)
            used += fb_strlcpy(expected + used, ", ", sizeof expected - used);
        used += fb_strlcpy(expected + used, names[i], sizeof expected - used);
    }
    return bad_value(k, text, origin, expected);
}

static int parse_backend(const struct key_spec *k, const char *text,
                         const char *origin, union cfg_value *out)
{
    const char *names[16];
    size_t count = 0, index;
    const struct fb_run_ops *ops;
    while (count < FB_ARRAY_LEN(names) && (ops = fb_run_ops_at(count)))
        names[count++] = ops->name;
    int rc = parse_choice(k, text, origin, names, count, &index);
    /* Store the canonical spelling, so "LOCAL" reads back as "local". */
    if (rc == 0)
        out->str = names[index];
    return rc;
}

static int parse_log_level(const struct key_spec *k, const char *text,
                           const char *origin, union cfg_value *out)
{
    size_t index;
    int rc = parse_choice(k, text, origin, log_level_names,
                          FB_ARRAY_LEN(log_level_names), &index);
    if (rc == 0)
        out->num = (long long)index;
    return rc;
}

static int parse_transport(const struct key_spec *k, const char *text,
                           const char *origin, union cfg_value *out)
{
    size_t index;
    int rc = parse_choice(k, text, origin, transport_names,
                          FB_ARRAY_LEN(transport_names), &index);
    if (rc == 0)
        out->num = (long long)index;
    return rc;
}

static void format_name(const char *const *names, size_t count, long long i,
                        char *buf, size_t size)
{
    fb_strlcpy(buf, i >= 0 && (size_t)i < count ? names[i] : "?", size);
}

static void format_log_level(union cfg_value v, char *buf, size_t size)
{
    format_name(log_level_names, FB_ARRAY_LEN(log_level_names), v.num, buf,
                size);
}

static void format_transport(union cfg_value v, char *buf, size_t size)
{
    format_name(transport_names, FB_ARRAY_LEN(transport_names), v.num, buf,
                size);
}

/* ---- strings: log_dir, listen_host (and backend, stored as text) -------- */

static void format_string(union cfg_value v, char *buf, size_t size)
{
    fb_strlcpy(buf, v.str, size);
}

#define format_backend format_string
#define format_path format_string
#define format_host format_string

/* Accepts a non-empty text that fits the field; what names the kind of
 * text in the message ("path"). */
static int parse_text(const struct key_spec *k, const char *text,
                      const char *origin, const char *what,
                      union cfg_value *out)
{
    size_t len = strlen(text);
    if (len == 0 || len >= k->capacity) {
        char expected[128];
        snprintf(expected, sizeof expected,
                 "a non-empty %s of at most %zu bytes", what,
                 k->capacity - 1);
        return bad_value(k, text, origin, expected);
    }
    out->str = text;
    return 0;
}

/* log_dir: a path, or empty for the default folder (its default value,
 * so that a program can go back to it). */
static int parse_path(const struct key_spec *k, const char *text,
                      const char *origin, union cfg_value *out)
{
    if (text[0] == '\0') {
        out->str = text;
        return 0;
    }
    return parse_text(k, text, origin, "path", out);
}

/* log_file: Uber Fiber's layout, a path prefix each process appends
 * ".<its name>" to; empty (the default) for log_dir's layout.  Fiber's
 * "stdout" and "stderr" are refused: fiber's master logs to standard error
 * and its jobs to files. */
#define format_log_file format_string
static int parse_log_file(const struct key_spec *k, const char *text,
                          const char *origin, union cfg_value *out)
{
    if (strcmp(text, "stdout") == 0 || strcmp(text, "stderr") == 0)
        return fb_err(FIBER_ECONFIG,
                      "log_file = %s (%s) is not supported: fiber's master "
                      "logs to standard error and its jobs to files; set a "
                      "path prefix, or leave log_file empty for log_dir",
                      text, origin);
    return parse_path(k, text, origin, out);
}

static int parse_host(const struct key_spec *k, const char *text,
                      const char *origin, union cfg_value *out)
{
    return parse_text(k, text, origin, "host name or address", out);
}

/* ---- the docker keys: image, docker_socket, docker_network, docker_mounts */

#define format_image format_string
#define format_socket format_string
#define format_network format_string
#define format_mounts format_string

/* Returns 1 if text has a space or a control character. */
static int has_space(const char *text)
{
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        if (*p <= ' ' || *p == 0x7f)
            return 1;
    return 0;
}

/* An image reference ("fiber-es:latest", "registry:5000/team/es@sha256:..."),
 * or "" for none.  The engine checks the reference itself when a job is
 * created; here only what can never be one is refused. */
static int parse_image(const struct key_spec *k, const char *text,
                       const char *origin, union cfg_value *out)
{
    if (strlen(text) >= k->capacity || has_space(text)) {
        char expected[128];
        snprintf(expected, sizeof expected,
                 "an image reference of at most %zu bytes without spaces, "
                 "or nothing",
                 k->capacity - 1);
        return bad_value(k, text, origin, expected);
    }
    out->str = text;
    return 0;
}

/* The engine's unix socket: an absolute path that fits a sockaddr_un. */
static int parse_socket(const struct key_spec *k, const char *text,
                        const char *origin, union cfg_value *out)
{
    if (text[0] != '/' || strlen(text) >= k->capacity) {
        char expected[128];
        snprintf(expected, sizeof expected,
                 "the absolute path of a unix socket, at most %zu bytes",
                 k->capacity - 1);
        return bad_value(k, text, origin, expected);
    }
    out->str = text;
    return 0;
}

/* A network mode: "host", "bridge", "none", "container:<id>" or the name
 * of a network. */
static int parse_network(const struct key_spec *k, const char *text,
                         const char *origin, union cfg_value *out)
{
    if (has_space(text))
        return bad_value(k, text, origin,
                         "a network name without spaces (host, bridge, none, "
                         "or a network's name)");
    return parse_text(k, text, origin, "network name", out);
}

/* Checks one "src:dst[:ro|:rw]" entry of n bytes. */
static int mount_valid(const char *entry, size_t n)
{
    const char *colon = memchr(entry, ':', n);
    if (n == 0 || entry[0] != '/' || !colon || colon + 1 >= entry + n ||
        colon[1] != '/')
        return 0;
    const char *dst = colon + 1;
    size_t rest = n - (size_t)(dst - entry);
    const char *mode = memchr(dst, ':', rest);
    if (!mode)
        return 1;
    size_t mode_len = rest - (size_t)(mode + 1 - dst);
    return mode_len == 2 && (strncmp(mode + 1, "ro", 2) == 0 ||
                             strncmp(mode + 1, "rw", 2) == 0);
}

/* Extra bind mounts for docker jobs: "", or comma-separated
 * "src:dst[:ro|:rw]" entries with absolute paths. */
static int parse_mounts(const struct key_spec *k, const char *text,
                        const char *origin, union cfg_value *out)
{
    int ok = strlen(text) < k->capacity && !has_space(text);
    for (const char *p = text; ok && *p;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        ok = mount_valid(p, n);
        p += n + (comma ? 1 : 0);
        if (comma && !*p)
            ok = 0; /* a trailing comma */
    }
    if (!ok) {
        char expected[192];
        snprintf(expected, sizeof expected,
                 "comma-separated src:dst or src:dst:ro bind mounts with "
                 "absolute paths, at most %zu bytes in all, or nothing",
                 k->capacity - 1);
        return bad_value(k, text, origin, expected);
    }
    out->str = text;
    return 0;
}

/* ---- free-form words and argument lists (slurm_*, k8s_*, listen_interface)
 *
 * A word is one token without spaces or control characters (a partition,
 * a path, a URL, "claim:/data:ro,..."), or nothing; args is a command-line
 * fragment split on spaces (slurm_sbatch_args), without control
 * characters. */

#define format_word format_string
#define format_args format_string

static int parse_word(const struct key_spec *k, const char *text,
                      const char *origin, union cfg_value *out)
{
    if (strlen(text) >= k->capacity || has_space(text)) {
        char expected[128];
        snprintf(expected, sizeof expected,
                 "a value of at most %zu bytes without spaces, or nothing",
                 k->capacity - 1);
        return bad_value(k, text, origin, expected);
    }
    out->str = text;
    return 0;
}

/* k8s_pull_policy: the pods' imagePullPolicy, in Kubernetes' spelling
 * (any case is read), or "" for the cluster's default. */
static const char *const pull_policy_names[] = {"", "Always", "IfNotPresent",
                                                "Never"};
#define format_pull_policy format_string

static int parse_pull_policy(const struct key_spec *k, const char *text,
                             const char *origin, union cfg_value *out)
{
    for (size_t i = 0; i < FB_ARRAY_LEN(pull_policy_names); i++) {
        if (strcasecmp(pull_policy_names[i], text) == 0) {
            out->str = pull_policy_names[i];
            return 0;
        }
    }
    return bad_value(k, text, origin,
                     "Always, IfNotPresent, Never, or nothing (the "
                     "cluster's default)");
}

static int parse_args(const struct key_spec *k, const char *text,
                      const char *origin, union cfg_value *out)
{
    int ok = strlen(text) < k->capacity;
    for (const unsigned char *p = (const unsigned char *)text; ok && *p; p++)
        ok = *p >= ' ' && *p != 0x7f;
    if (!ok) {
        char expected[160];
        snprintf(expected, sizeof expected,
                 "space-separated arguments of at most %zu bytes without "
                 "control characters, or nothing",
                 k->capacity - 1);
        return bad_value(k, text, origin, expected);
    }
    out->str = text;
    return 0;
}

/* Whether the docker backend, when no image is set, builds one of the
 * running program (fiber_image_build) when it opens: true or false (also
 * 1/0, yes/no, on/off), stored as 1 or 0. */
static const char *const bool_true[] = {"true", "1", "yes", "on"};
static const char *const bool_false[] = {"false", "0", "no", "off"};

static int parse_boolean(const struct key_spec *k, const char *text,
                         const char *origin, union cfg_value *out)
{
    for (size_t i = 0; i < FB_ARRAY_LEN(bool_true); i++) {
        if (strcasecmp(text, bool_true[i]) == 0) {
            out->num = 1;
            return 0;
        }
        if (strcasecmp(text, bool_false[i]) == 0) {
            out->num = 0;
            return 0;
        }
    }
    return bad_value(k, text, origin, "true or false");
}

static void format_boolean(union cfg_value v, char *buf, size_t size)
{
    fb_strlcpy(buf, v.num ? "true" : "false", size);
}

/* ---- integers: connect_timeout_ms, terminate_grace_ms, max_message_bytes - */

/* Parses the decimal integer at the start of text into *value and points
 * *end after it.  Strict: no leading space or '+', no empty digits, no
 * overflow.  Returns 0 or -1. */
static int parse_decimal(const char *text, long long *value, char **end)
{
    if (!isdigit((unsigned char)text[0]) &&
        !(text[0] == '-' && isdigit((unsigned char)text[1])))
        return -1;
    errno = 0;
    *value = strtoll(text, end, 10);
    return errno == ERANGE ? -1 : 0;
}

static int range_error(const struct key_spec *k, const char *text,
                       const char *origin)
{
    char expected[128];
    snprintf(expected, sizeof expected, "an integer from %lld to %lld",
             k->min, k->max);
    return bad_value(k, text, origin, expected);
}

static int parse_integer(const struct key_spec *k, const char *text,
                         const char *origin, union cfg_value *out)
{
    long long value;
    char *end;
    if (parse_decimal(text, &value, &end) != 0 || *end != '\0' ||
        value < k->min || value > k->max)
        return range_error(k, text, origin);
    out->num = value;
    return 0;
}

/* Returns the multiplier a size suffix stands for (k, m, g: KiB, MiB, GiB;
 * none: 1), or 0 for anything else. */
static long long size_multiplier(const char *suffix)
{
    if (suffix[0] == '\0')
        return 1;
    if (suffix[1] != '\0')
        return 0;
    switch (suffix[0]) {
    case 'k':
    case 'K':
        return 1LL << 10;
    case 'm':
    case 'M':
        return 1LL << 20;
    case 'g':
    case 'G':
        return 1LL << 30;
    }
    return 0;
}

static int parse_size(const struct key_spec *k, const char *text,
                      const char *origin, union cfg_value *out)
{
    long long value = 0, multiplier = 0;
    char *end;
    if (parse_decimal(text, &value, &end) == 0)
        multiplier = size_multiplier(end);
    /* value is held to max / multiplier before it is multiplied, so the
     * product cannot overflow. */
    if (multiplier == 0 || value < 0 || value > k->max / multiplier ||
        value * multiplier < k->min) {
        char expected[192];
        snprintf(expected, sizeof expected,
                 "a byte count from %lld to %lld, optionally with a suffix k, "
                 "m or g (KiB, MiB, GiB)",
                 k->min, k->max);
        return bad_value(k, text, origin, expected);
    }
    out->num = value * multiplier;
    return 0;
}

static void format_number(union cfg_value v, char *buf, size_t size)
{
    snprintf(buf, size, "%lld", v.num);
}

#define format_integer format_number
#define format_size format_number

/* ---- the table, expanded ------------------------------------------------- */

#define FB_X(key, storage, dflt, kind, min, max)                               \
    {#key, parse_##kind, format_##kind, min, max,                              \
     FB_##storage##_CAPACITY(((struct fb_config *)0)->key)},
static const struct key_spec key_specs[] = {FB_CONFIG_KEYS(FB_X)};
#undef FB_X

enum key_id {
#define FB_X(key, storage, dflt, kind, min, max) KEY_##key,
    FB_CONFIG_KEYS(FB_X)
#undef FB_X
};

static void store_value(struct fb_config *c, enum key_id id, union cfg_value v)
{
    switch (id) {
#define FB_X(key, storage, dflt, kind, min, max)                               \
    case KEY_##key:                                                            \
        FB_##storage##_STORE(c->key, v);                                       \
        break;
        FB_CONFIG_KEYS(FB_X)
#undef FB_X
    }
}

static union cfg_value load_value(const struct fb_config *c, enum key_id id)
{
    switch (id) {
#define FB_X(key, storage, dflt, kind, min, max)                               \
    case KEY_##key:                                                            \
        return FB_##storage##_LOAD(c->key);
        FB_CONFIG_KEYS(FB_X)
#undef FB_X
    }
    return FB_INT_CONST(0);
}

static const struct key_spec *find_key(const char *key)
{
    for (size_t i = 0; i < FB_ARRAY_LEN(key_specs); i++)
        if (strcmp(key_specs[i].name, key) == 0)
            return &key_specs[i];
    return NULL;
}

/* ---- the contract of config.h -------------------------------------------- */

void fb_config_defaults(struct fb_config *c)
{
    memset(c, 0, sizeof *c);
#define FB_X(key, storage, dflt, kind, min, max)                               \
    FB_##storage##_STORE(c->key, FB_##storage##_CONST(dflt));
    FB_CONFIG_KEYS(FB_X)
#undef FB_X
}

const char *fb_config_key_at(size_t i)
{
    return i < FB_ARRAY_LEN(key_specs) ? key_specs[i].name : NULL;
}

int fb_config_known(const char *key)
{
    return key != NULL && find_key(key) != NULL;
}

int fb_config_apply(struct fb_config *c, const char *key, const char *value,
                    const char *origin)
{
    if (origin == NULL)
        origin = "unknown origin";
    if (key == NULL || value == NULL)
        return fb_err(FIBER_ECONFIG, "%s without a %s (%s)",
                      key ? "key" : "value", key ? "value" : "key", origin);
    const struct key_spec *k = find_key(key);
    if (k == NULL)
        return fb_err(FIBER_ECONFIG, "unknown key '%.*s' (%s); known keys: %s",
                      FB_QUOTE_MAX, key, origin, KNOWN_KEYS);
    union cfg_value parsed;
    int rc = k->parse(k, value, origin, &parsed);
    if (rc != 0)
        return rc;
    store_value(c, (enum key_id)(k - key_specs), parsed);
    return 0;
}

int fb_config_format(const struct fb_config *c, const char *key, char *buf,
                     size_t size)
{
    const struct key_spec *k = key ? find_key(key) : NULL;
    if (k == NULL)
        return fb_err(FIBER_ECONFIG, "unknown key '%.*s'; known keys: %s",
                      FB_QUOTE_MAX, key ? key : "(null)", KNOWN_KEYS);
    k->format(load_value(c, (enum key_id)(k - key_specs)), buf, size);
    return 0;
}

/* ---- the INI file layer -------------------------------------------------- */

/* What one parse of a configuration file carries between inih's callbacks.
 * The reader counts lines itself because this build of inih does not pass
 * line numbers to the handler, and a message must name the line. */
struct file_parse {
    FILE *file;
    const char *path;
    struct fb_config scratch; /* applied to the caller's config on success */
    int line;                 /* the line inih is working on */
    int error_line; /* the line a message was set for, or 0: the first
                     * error the reader or handler met, not always the
                     * first in the file (inih finds syntax errors) */
};

/* Returns 1 if nothing but the end of the file follows. */
static int at_end(FILE *file)
{
    int next = getc(file);
    if (next == EOF)
        return 1;
    ungetc(next, file);
    return 0;
}

/* inih's reader: fgets that counts lines and refuses a line longer than
 * inih's buffer (num bytes, which must also hold "\r\n" and the NUL).
 * inih would split such a line and parse the pieces as separate lines, so
 * a long log_dir would be silently cut short. */
static char *read_line(char *str, int num, void *stream)
{
    struct file_parse *fp = stream;
    if (fp->error_line != 0 || fgets(str, num, fp->file) == NULL)
        return NULL;
    fp->line++;
    size_t len = strlen(str);
    if (len == (size_t)num - 1 && str[len - 1] != '\n' && !at_end(fp->file)) {
        fp->error_line = fp->line;
        fb_err(FIBER_ECONFIG, "line too long in %s:%d: at most %d bytes",
               fp->path, fp->line, num - 3);
        return NULL;
    }
    return str;
}

/* ---- Uber Fiber's [default] section ---------------------------------------
 *
 * Uber Fiber 0.2.1 read its .fiberconfig with Python's configparser, keys
 * under [default], with its own names and values.  fiber reads that
 * section too: fiber's keys as anywhere, Fiber's mapped onto fiber's
 * (docs/configuration.md, "Uber Fiber's [default] section"), and Fiber's
 * keys fiber has no counterpart for refused with the reason. */

struct fiber_alias {
    const char *name; /* Fiber's */
    const char *key;  /* fiber's */
};

static const struct fiber_alias fiber_aliases[] = {
    {"default_backend", "backend"},
    {"default_image", "image"},
    {"kubernetes_namespace", "k8s_namespace"},
};

struct fiber_refusal {
    const char *name;
    const char *why;
};

static const struct fiber_refusal fiber_refusals[] = {
    {"cpu_per_job", "fiber reserves CPUs per job: set fiber.config."
                    "cpu_per_job in Python, @fiber.meta(cpu=N) on a "
                    "function, or fiber_job_opts.cpu"},
    {"mem_per_job", "fiber reserves memory per job: set fiber.config."
                    "mem_per_job in Python, @fiber.meta(memory=MiB) on a "
                    "function, or fiber_job_opts.memory_mb"},
    {"ipc_active", "fiber's jobs always dial their master"},
    {"ipc_admin_master_port", "fiber's master listens on a port the kernel "
                              "picks"},
    {"ipc_admin_worker_port", "fiber's jobs always dial their master"},
    {"use_push_queue", "fiber has one kind of queue"},
    {"merge_output", "a job's output goes to its log file (log_dir)"},
    {"use_bash", "fiber starts jobs without a shell"},
};

/* Fiber's log levels: its names (warning, critical) and logging's numbers
 * (10 debug, 20 info, 30 warning, 40 error, 50 critical) as fiber's. */
static const char *fiber_log_level(const char *value)
{
    static const char *const names[][2] = {
        {"warning", "warn"}, {"critical", "error"}, {"10", "debug"},
        {"20", "info"},      {"30", "warn"},        {"40", "error"},
        {"50", "error"}};
    for (size_t i = 0; i < FB_ARRAY_LEN(names); i++)
        if (strcasecmp(value, names[i][0]) == 0)
            return names[i][1];
    return value;
}

/* Whether name is one of Fiber's keys that fiber's table lacks. */
static int is_fiber_only_key(const char *name)
{
    for (size_t i = 0; i < FB_ARRAY_LEN(fiber_aliases); i++)
        if (strcmp(name, fiber_aliases[i].name) == 0)
            return 1;
    for (size_t i = 0; i < FB_ARRAY_LEN(fiber_refusals); i++)
        if (strcmp(name, fiber_refusals[i].name) == 0)
            return 1;
    return strcmp(name, "debug") == 0;
}

static int apply_fiber_pair(struct fb_config *c, const char *name,
                            const char *value, const char *origin)
{
    for (size_t i = 0; i < FB_ARRAY_LEN(fiber_aliases); i++)
        if (strcmp(name, fiber_aliases[i].name) == 0)
            return fb_config_apply(c, fiber_aliases[i].key, value, origin);
    for (size_t i = 0; i < FB_ARRAY_LEN(fiber_refusals); i++)
        if (strcmp(name, fiber_refusals[i].name) == 0)
            return fb_err(FIBER_ECONFIG,
                          "Uber Fiber's key '%s' (%s) has no counterpart in "
                          "fiber: %s", name, origin, fiber_refusals[i].why);
    if (strcmp(name, "log_level") == 0)
        return fb_config_apply(c, name, fiber_log_level(value), origin);
    if (strcmp(name, "debug") == 0) {
        union cfg_value on;
        const struct key_spec *k = find_key("encryption"); /* a boolean */
        int rc = parse_boolean(k, value, origin, &on);
        if (rc != 0)
            return fb_err(FIBER_ECONFIG, "bad value '%.*s' for Fiber's key "
                          "'debug' (%s): expected true or false",
                          FB_QUOTE_MAX, value, origin);
        return on.num ? fb_config_apply(c, "log_level", "debug", origin) : 0;
    }
    return fb_config_apply(c, name, value, origin);
}

/* inih's handler: applies one key to the scratch config.  Returns 1 to go
 * on, 0 on an error (whose message names the file and line). */
static int handle_pair(void *user, const char *section, const char *name,
                       const char *value)
{
    struct file_parse *fp = user;
    if (fp->error_line != 0)
        return 0;
    char origin[600];
    snprintf(origin, sizeof origin, "%s:%d", fp->path, fp->line);
    int rc;
    if (strcmp(section, "default") == 0)
        rc = apply_fiber_pair(&fp->scratch, name, value, origin);
    else if (section[0] != '\0' && strcmp(section, "fiber") != 0)
        rc = fb_err(FIBER_ECONFIG,
                    "unknown section [%.*s] (%s): fiber reads keys before any "
                    "section, under [fiber], or under Uber Fiber's [default]",
                    FB_QUOTE_MAX, section, origin);
    else
        rc = fb_config_apply(&fp->scratch, name, value, origin);
    if (rc != 0)
        fp->error_line = fp->line;
    return rc == 0;
}

/* Turns inih's result into fiber's: 0, or FIBER_ECONFIG with the message of
 * the first error in the file. */
static int parse_result(struct file_parse *fp, int ini_rc)
{
    if (ferror(fp->file))
        return fb_err_errno(FIBER_ECONFIG, "cannot read configuration file %s",
                            fp->path);
    /* inih returns the first line with any error, ours included. */
    if (ini_rc > 0 && (fp->error_line == 0 || ini_rc < fp->error_line))
        return fb_err(FIBER_ECONFIG,
                      "syntax error in %s:%d: expected 'key = value', "
                      "'[section]' or a comment",
                      fp->path, ini_rc);
    if (fp->error_line != 0)
        return FIBER_ECONFIG; /* the reader or handler set the message */
    if (ini_rc != 0)
        return fb_err(FIBER_ECONFIG, "cannot parse configuration file %s",
                      fp->path);
    return 0;
}

int fb_config_load_file(struct fb_config *c, const char *path)
{
    FILE *file = fopen(path, "re");
    if (file == NULL) {
        if (errno == ENOENT)
            return 0; /* no file: the defaults stand */
        return fb_err_errno(FIBER_ECONFIG,
                            "cannot open configuration file %s", path);
    }
    struct file_parse fp = {.file = file, .path = path, .scratch = *c};
    int rc = parse_result(&fp, ini_parse_stream(read_line, &fp, handle_pair,
                                                &fp));
    fclose(file);
    if (rc == 0)
        *c = fp.scratch;
    return rc;
}

/* ---- the environment layer ----------------------------------------------- */

#define FB_ENV_PREFIX "FIBER_"
#define FB_ENV_BOOT_PREFIX "FIBER_BOOT_"

/* Applies one FIBER_<KEY>=value entry of the environment.  name_len is the
 * length of the variable's name (up to the '='). */
static int apply_env_entry(struct fb_config *c, const char *entry,
                           size_t name_len)
{
    const char *suffix = entry + strlen(FB_ENV_PREFIX);
    size_t key_len = name_len - strlen(FB_ENV_PREFIX);
    char key[64];
    int known = key_len < sizeof key;
    if (known) {
        for (size_t i = 0; i < key_len; i++)
            key[i] = (char)tolower((unsigned char)suffix[i]);
        key[key_len] = '\0';
        known = fb_config_known(key) || is_fiber_only_key(key);
    }
    if (!known)
        return fb_err(FIBER_ECONFIG,
                      "unknown environment variable %.*s: not a fiber "
                      "configuration key; known keys: %s",
                      (int)(name_len < FB_QUOTE_MAX ? name_len : FB_QUOTE_MAX),
                      entry, KNOWN_KEYS);
    char origin[128];
    snprintf(origin, sizeof origin, "environment variable %.*s",
             (int)name_len, entry);
    /* Uber Fiber's variables (FIBER_DEFAULT_BACKEND, FIBER_LOG_LEVEL=
     * warning, ...) as its [default] section's keys. */
    if (is_fiber_only_key(key) || strcmp(key, "log_level") == 0)
        return apply_fiber_pair(c, key, entry + name_len + 1, origin);
    return fb_config_apply(c, key, entry + name_len + 1, origin);
}

static int starts_with(const char *text, const char *prefix)
{
    return strncmp(text, prefix, strlen(prefix)) == 0;
}

int fb_config_load_env(struct fb_config *c, char *const *envp)
{
    struct fb_config scratch = *c;
    for (char *const *entry = envp; entry && *entry; entry++) {
        const char *equals = strchr(*entry, '=');
        if (equals == NULL || !starts_with(*entry, FB_ENV_PREFIX) ||
            starts_with(*entry, FB_ENV_BOOT_PREFIX))
            continue;
        int rc = apply_env_entry(&scratch, *entry, (size_t)(equals - *entry));
        if (rc != 0)
            return rc;
    }
    *c = scratch;
    return 0;
}
