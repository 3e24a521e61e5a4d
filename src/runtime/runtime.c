/*
 * runtime.c -- fb_rt_init (fiber_init's work; fiber_init is init/init.c)
 * and the roles, the run's identity, configuration layering, and the
 * master's job records.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "base/common.h"
#include "base/log.h"
#include "runtime/hooks.h"
#include "runtime/runid.h"
#include "runtime/runtime.h"
#include "runtime/task.h"

extern char **environ;

static struct fb_runtime rt = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .listen_fd = -1,
    .epoll_fd = -1,
    .wake_fd = -1,
};

struct fb_runtime *fb_rt(void) { return &rt; }

void fb_rt_lock(void) { pthread_mutex_lock(&rt.lock); }
void fb_rt_unlock(void) { pthread_mutex_unlock(&rt.lock); }
int fb_rt_is_master(void) { return rt.initialized && rt.master; }
const struct fb_config *fb_rt_config(void) { return &rt.cfg; }

void fb_rt_config_changed(void)
{
    struct fb_net_config net = {
        .encryption = rt.cfg.encryption,
        .max_pending_connections = rt.cfg.max_pending_connections,
        .connect_timeout_ms = rt.cfg.connect_timeout_ms,
    };
    fb_net_configure(&net);
}
const uint8_t *fb_rt_token(void) { return rt.token; }
const char *fb_rt_build_id(void) { return rt.build_id; }

int fb_rt_wait(uint64_t deadline_ms)
{
    if (deadline_ms == UINT64_MAX) {
        pthread_cond_wait(&rt.changed, &rt.lock);
        return 0;
    }
    struct timespec ts = {.tv_sec = (time_t)(deadline_ms / 1000),
                          .tv_nsec = (long)(deadline_ms % 1000) * 1000000L};
    int rc = pthread_cond_timedwait(&rt.changed, &rt.lock, &ts);
    return rc == ETIMEDOUT ? FIBER_ETIMEDOUT : 0;
}

/* ---- configuration ---------------------------------------------------- */

/* Builds a configuration from every layer: defaults, the file (master
 * only: a child takes everything from its master through the
 * environment), the environment, and fiber_config_set() values. */
static int load_config(struct fb_config *c, int with_file)
{
    fb_config_defaults(c);
    int rc = 0;
    if (with_file)
        rc = fb_config_load_file(c, ".fiberconfig");
    if (rc == 0)
        rc = fb_config_load_env(c, environ);
    for (int i = 0; rc == 0 && i < rt.n_overrides; i++)
        rc = fb_config_apply(c, rt.override_key[i], rt.override_val[i],
                             "fiber_config_set");
    return rc;
}

static int remember_override(const char *key, const char *value)
{
    for (int i = 0; i < rt.n_overrides; i++) {
        if (strcmp(rt.override_key[i], key) == 0) {
            char *v = strdup(value);
            if (!v)
                return fb_err(FIBER_ENOMEM, "out of memory");
            free(rt.override_val[i]);
            rt.override_val[i] = v;
            return 0;
        }
    }
    if (rt.n_overrides == FB_MAX_OVERRIDES)
        return fb_err(FIBER_ECONFIG, "too many fiber_config_set calls");
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return fb_err(FIBER_ENOMEM, "out of memory");
    }
    rt.override_key[rt.n_overrides] = k;
    rt.override_val[rt.n_overrides++] = v;
    return 0;
}

/* The master's side of log_file (Uber Fiber's layout): the key made
 * absolute against the working directory at the time it is set, so that
 * jobs, wherever they start, write next to the master's own file
 * <log_file>.MainProcess (the name multiprocessing and Fiber give the main
 * process).  Opened at once: a path that cannot be written is an error
 * now, not a lost log later. */
static int master_log_file(const char *value)
{
    char path[PATH_MAX] = "";
    if (value[0] == '/') {
        fb_strlcpy(path, value, sizeof path);
    } else if (value[0]) {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd))
            return fb_err_errno(FIBER_ESYS, "log_file %s: cannot read the "
                                "working directory", value);
        int n = snprintf(path, sizeof path, "%s/%s", cwd, value);
        if (n < 0 || (size_t)n >= sizeof rt.log_file)
            return fb_err(FIBER_ECONFIG, "log_file %s: the path in %s is "
                          "longer than %zu bytes", value, cwd,
                          sizeof rt.log_file - 1);
    }
    if (strcmp(path, rt.log_file) == 0)
        return 0;
    if (path[0] == '\0')
        fb_log_to_stderr();
    else if (fb_log_to_prefix(path, "MainProcess", 1) != 0)
        return fb_err(FIBER_ECONFIG, "log_file %s: %s", value,
                      fiber_last_error());
    fb_strlcpy(rt.log_file, path, sizeof rt.log_file);
    return 0;
}

FIBER_API int fiber_config_set(const char *key, const char *value)
{
    if (!key || !value)
        return fb_err(FIBER_EINVAL, "fiber_config_set: key or value is NULL");
    fb_rt_lock();
    /* Validate against a scratch copy so that a bad value changes nothing. */
    struct fb_config scratch;
    if (rt.initialized)
        scratch = rt.cfg;
    else
        fb_config_defaults(&scratch);
    int rc = fb_config_apply(&scratch, key, value, "fiber_config_set");
    if (rc == 0)
        rc = remember_override(key, value);
    if (rc == 0 && rt.initialized && rt.master)
        rc = master_log_file(scratch.log_file);
    if (rc == 0 && rt.initialized) {
        rt.cfg = scratch;
        fb_rt_config_changed();
        fb_log_setup(rt.cfg.log_level, rt.master ? "master" : NULL);
    }
    fb_rt_unlock();
    return rc;
}

FIBER_API int fiber_config_get(const char *key, char *buf, size_t size)
{
    if (!key || !buf)
        return fb_err(FIBER_EINVAL, "fiber_config_get: key or buf is NULL");
    fb_rt_lock();
    int rc;
    if (rt.initialized) {
        rc = fb_config_format(&rt.cfg, key, buf, size);
    } else {
        struct fb_config c;
        rc = load_config(&c, 1);
        if (rc == 0)
            rc = fb_config_format(&c, key, buf, size);
    }
    fb_rt_unlock();
    return rc;
}

/* ---- init and shutdown ------------------------------------------------ */

/* A run started by `fiber run` keeps the name the tool gave it
 * (FIBER_BOOT_RUN in a master), so that the tool finds its jobs. */
static int make_run_id(void)
{
    const char *given = getenv(FB_ENV_RUN);
    if (given && fb_run_id_valid(given)) {
        fb_strlcpy(rt.run_id, given, sizeof rt.run_id);
        return 0;
    }
    return fb_run_id_new(rt.run_id, sizeof rt.run_id);
}

/* A master with many workers holds a socket (and a pidfd) per job: raise
 * the soft descriptor limit as far as the hard limit allows. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max)
        return;
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        fb_log_warn("cannot raise the descriptor limit from %llu: %s",
                    (unsigned long long)was, strerror(errno));
}

static int init_master(void)
{
    int rc = load_config(&rt.cfg, 1);
    fb_rt_config_changed();
    if (rc)
        return rc;
    fb_log_setup(rt.cfg.log_level, "master");
    rc = master_log_file(rt.cfg.log_file);
    if (rc)
        return rc;
    raise_fd_limit();
    fb_run_secret_new(rt.token, sizeof rt.token);
    rc = fb_build_id(rt.build_id, sizeof rt.build_id);
    if (rc == 0)
        rc = make_run_id();
    const char *requeue = getenv("FIBER_BOOT_REQUEUE");
    if (rc == 0 && requeue && strcmp(requeue, "1") == 0)
        rc = fb_backend_master_boot(&rt.cfg);
    if (rc)
        return rc;
    rt.master = 1;
    return 0;
}

static int init_common(int *argc, char ***argv)
{
    int rc = fb_task_registry_check();
    if (rc)
        return rc;
    if (sodium_init() < 0)
        return fb_err(FIBER_ESYS, "libsodium failed to initialise");
    const char *a0 = (argc && argv && *argc > 0 && *argv) ? (*argv)[0] : NULL;
    fb_strlcpy(rt.argv0, a0 ? a0 : "fiber-program", sizeof rt.argv0);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&rt.changed, &ca);
    pthread_condattr_destroy(&ca);
    return 0;
}

int fb_rt_client_setup(void)
{
    /* The usual case, on every object connection: nothing to do, and the
     * runtime lock (held around backend calls) is not taken for it. */
    if (__atomic_load_n(&rt.initialized, __ATOMIC_ACQUIRE) ||
        __atomic_load_n(&rt.client, __ATOMIC_ACQUIRE))
        return 0;
    fb_rt_lock();
    if (rt.initialized || rt.client) {
        fb_rt_unlock();
        return 0;
    }
    int rc = sodium_init() < 0
                 ? fb_err(FIBER_ESYS, "libsodium failed to initialise")
                 : 0;
    if (rc == 0)
        rc = load_config(&rt.cfg, 1);
    /* net/ encrypts tcp: connections by its own copy of the settings,
     * zeroed (encryption off) until handed down: a process that opens a
     * handle without fiber_init must use the configured value, as the
     * server it dials does. */
    if (rc == 0)
        fb_rt_config_changed();
    if (rc == 0)
        rc = fb_build_id(rt.build_id, sizeof rt.build_id);
    if (rc == 0)
        __atomic_store_n(&rt.client, 1, __ATOMIC_RELEASE);
    fb_rt_unlock();
    return rc ? rc : 1;
}

int fb_rt_init(int *argc, char ***argv)
{
    fb_err_clear();
    fb_rt_lock();
    if (rt.initialized) {
        fb_rt_unlock();
        return fb_err(FIBER_ESTATE, "fiber_init() was already called");
    }
    int rc = init_common(argc, argv);
    if (rc == 0 && getenv(FB_ENV_ADDR)) {
        rt.initialized = 1;
        fb_rt_unlock();
        fb_child_main(); /* never returns */
    }
    if (rc == 0)
        rc = init_master();
    if (rc == 0) {
        rt.initialized = 1;
        atexit(fiber_shutdown);
    }
    fb_rt_unlock();
    return rc;
}

FIBER_API int fiber_is_master(void)
{
    if (!rt.initialized)
        return -1;
    return rt.master;
}

FIBER_API const char *fiber_run_id(void) { return rt.run_id; }

FIBER_API const char *fiber_version(void) { return FIBER_VERSION_STRING; }

/* Removes the run directory if nothing worth keeping is in it: the socket
 * goes, and so do empty child logs; logs with content stay for the user. */
static void clean_run_dir(void)
{
    if (!rt.run_dir[0])
        return;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", rt.run_dir, FB_RUN_SOCKET);
    unlink(path);
    static const char *const ours[] = {FB_RUN_PIDFILE, FB_RUN_LOCKFILE,
                                       FB_RUN_OBJSOCKET};
    for (size_t i = 0; i < FB_ARRAY_LEN(ours); i++) {
        snprintf(path, sizeof path, "%s/%s", rt.run_dir, ours[i]);
        unlink(path);
    }
    DIR *d = opendir(rt.log_dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            struct stat st;
            snprintf(path, sizeof path, "%s/%s", rt.log_dir, e->d_name);
            if (e->d_name[0] != '.' && stat(path, &st) == 0 &&
                S_ISREG(st.st_mode) && st.st_size == 0)
                unlink(path);
        }
        closedir(d);
        rmdir(rt.log_dir);
    }
    rmdir(rt.run_dir);
}

/* Stops every job that still runs: politely, then by force after the grace
 * period.  Lock held. */
static void stop_all_jobs(void)
{
    for (struct fb_jobrec *j = rt.jobs; j; j = j->next) {
        if (j->connected)
            fb_conn_close(&j->conn); /* the child notices and exits */
        j->connected = 0;
        if (j->job && !j->ended)
            fb_backend_signal_job(rt.backend, j->job, 0);
    }
    uint64_t deadline = fb_deadline_ms(rt.cfg.terminate_grace_ms);
    for (;;) {
        int running = 0;
        for (struct fb_jobrec *j = rt.jobs; j; j = j->next) {
            if (j->job && !j->ended) {
                fb_backend_poll_job(rt.backend, j->job);
                if (j->job->state == FB_JOB_EXITED) {
                    j->ended = 1;
                    j->exit_status = j->job->exit_status;
                }
                else
                    running++;
            }
        }
        if (!running || fb_ms_left(deadline) == 0)
            break;
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    for (struct fb_jobrec *j = rt.jobs; j; j = j->next) {
        if (!j->job)
            continue;
        /* Release kills what is left and says how it ended. */
        j->exit_status = fb_backend_release_job(rt.backend, j->job);
        j->job = NULL;
        j->ended = 1;
    }
}

FIBER_API void fiber_shutdown(void)
{
    fb_rt_lock();
    int active = rt.initialized && rt.master && !rt.shut_down;
    rt.shut_down = 1;
    fb_rt_unlock();
    if (!active) {
        /* Another thread shuts down: the stop thread of a requeueable
         * master, which ends the process with FIBER_EXIT_REQUEUE. */
        fb_stop_await_requeue_exit();
        return;
    }
    fb_stop_shutdown(); /* a stop callback still running may use fiber */
    fb_rt_api()->shutdown(); /* the API layer's servers */
    fb_service_stop();
    fb_rt_lock();
    if (rt.backend) {
        stop_all_jobs();
        fb_backend_close(rt.backend);
        rt.backend = NULL;
    }
    clean_run_dir();
    pthread_cond_broadcast(&rt.changed);
    fb_rt_unlock();
}

/* ---- job records ------------------------------------------------------ */

struct fb_jobrec *fb_rt_find_job(uint64_t id)
{
    struct fb_jobrec *j = rt.hash[id % FB_HASH_BUCKETS];
    while (j && j->id != id)
        j = j->hash_next;
    return j;
}

static void link_job(struct fb_jobrec *j)
{
    struct fb_jobrec **b = &rt.hash[j->id % FB_HASH_BUCKETS];
    j->hash_next = *b;
    *b = j;
    j->next = rt.jobs;
    if (rt.jobs)
        rt.jobs->prev = j;
    rt.jobs = j;
}

static void unlink_job(struct fb_jobrec *j)
{
    struct fb_jobrec **b = &rt.hash[j->id % FB_HASH_BUCKETS];
    while (*b && *b != j)
        b = &(*b)->hash_next;
    if (*b)
        *b = j->hash_next;
    if (j->prev)
        j->prev->next = j->next;
    else if (rt.jobs == j)
        rt.jobs = j->next;
    if (j->next)
        j->next->prev = j->prev;
    j->next = j->prev = j->hash_next = NULL;
}

/* Appends "FIBER_<KEY>=value" for every configuration key, so that a child
 * runs with exactly its master's configuration. */
static int config_env(char **env, size_t *n, size_t cap)
{
    for (size_t i = 0; fb_config_key_at(i); i++) {
        const char *key = fb_config_key_at(i);
        char val[600], var[700];
        if (strcmp(key, "log_dir") == 0)
            fb_strlcpy(val, rt.log_dir, sizeof val);
        else if (strcmp(key, "log_file") == 0)
            fb_strlcpy(val, rt.log_file, sizeof val);
        else if (fb_config_format(&rt.cfg, key, val, sizeof val) != 0)
            continue;
        size_t k = (size_t)snprintf(var, sizeof var, "FIBER_");
        for (const char *p = key; *p && k + 1 < sizeof var; p++)
            var[k++] = (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
        snprintf(var + k, sizeof var - k, "=%s", val);
        if (*n + 1 >= cap || !(env[*n] = strdup(var)))
            return fb_err(FIBER_ENOMEM, "out of memory building job env");
        (*n)++;
    }
    return 0;
}

static size_t strv_len(const char *const *v)
{
    size_t n = 0;
    while (v && v[n])
        n++;
    return n;
}

static void strv_free(char **v)
{
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

/* A NULL-terminated deep copy of v, or NULL when out of memory. */
static char **strv_dup(const char *const *v)
{
    size_t n = strv_len(v);
    char **c = calloc(n + 1, sizeof *c);
    for (size_t i = 0; c && i < n; i++) {
        if (!(c[i] = strdup(v[i]))) {
            strv_free(c);
            return NULL;
        }
    }
    return c;
}

static int env_entry_valid(const char *e)
{
    const char *eq = strchr(e, '=');
    if (!eq || eq == e)
        return 0;
    for (const char *p = e; p < eq; p++)
        if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
              (*p >= '0' && *p <= '9') || *p == '_'))
            return 0;
    return strncmp(e, "FIBER_BOOT_", 11) != 0;
}

FIBER_API int fiber_job_command_set(const char *const *argv,
                                    const char *const *env)
{
    fb_err_clear();
    if (argv && (!argv[0] || argv[0][0] != '/'))
        return fb_err(FIBER_EINVAL, "the job command's program must be an "
                                    "absolute path");
    if (argv && strv_len(argv) > 32)
        return fb_err(FIBER_EINVAL, "the job command has more than 32 "
                                    "arguments");
    for (size_t i = 0; env && env[i]; i++)
        if (!env_entry_valid(env[i]))
            return fb_err(FIBER_EINVAL,
                          "job command environment entry '%.60s' is not "
                          "NAME=value (or names a FIBER_BOOT_ variable)",
                          env[i]);
    char **a = argv ? strv_dup(argv) : NULL;
    char **e = env ? strv_dup(env) : NULL;
    if ((argv && !a) || (env && !e)) {
        strv_free(a);
        strv_free(e);
        return fb_err(FIBER_ENOMEM, "out of memory copying the job command");
    }
    fb_rt_lock();
    int rc = 0;
    if (rt.initialized && !rt.master)
        rc = fb_err(FIBER_ENOTSUP, "only the master sets the job command");
    else if (rt.next_job_id > 0)
        rc = fb_err(FIBER_ESTATE, "the job command must be set before the "
                                  "first job starts");
    if (rc == 0) {
        strv_free(rt.job_argv);
        strv_free(rt.job_env);
        rt.job_argv = a;
        rt.job_env = e;
    }
    fb_rt_unlock();
    if (rc) {
        strv_free(a);
        strv_free(e);
    }
    return rc;
}

FIBER_API int fiber_job_forkserver_set(const char *const *argv)
{
    fb_err_clear();
    if (argv && (!argv[0] || argv[0][0] != '/'))
        return fb_err(FIBER_EINVAL, "the fork server's program must be an "
                                    "absolute path");
    if (argv && strv_len(argv) > 32)
        return fb_err(FIBER_EINVAL, "the fork server command has more than "
                                    "32 arguments");
    char **a = argv ? strv_dup(argv) : NULL;
    if (argv && !a)
        return fb_err(FIBER_ENOMEM, "out of memory copying the fork server "
                                    "command");
    fb_rt_lock();
    int rc = 0;
    if (rt.initialized && !rt.master)
        rc = fb_err(FIBER_ENOTSUP, "only the master sets the fork server");
    else if (rt.next_job_id > 0)
        rc = fb_err(FIBER_ESTATE, "the fork server must be set before the "
                                  "first job starts");
    if (rc == 0) {
        strv_free(rt.forkserver_argv);
        rt.forkserver_argv = a;
        a = NULL;
    }
    fb_rt_unlock();
    strv_free(a);
    return rc;
}

static char **job_env(const struct fb_jobrec *j, const fiber_job_opts *opts)
{
    size_t n_user = strv_len(opts ? opts->env : NULL);
    size_t n_cmd = strv_len((const char *const *)rt.job_env);
    size_t cap = n_user + n_cmd + 64, n = 0;
    char **env = calloc(cap, sizeof *env);
    if (!env)
        return NULL;
    char var[700];
    const char *boot[5][2] = {{"ADDR", rt.address},
                              {"NAME", j->name},
                              {"RUN", rt.run_id},
                              {"JOB", NULL},
                              {"OBJECTS", fb_rt_api()->objects_address()}};
    char id[32];
    snprintf(id, sizeof id, "%llu", (unsigned long long)j->id);
    boot[3][1] = id;
    for (size_t i = 0; i < 5; i++) {
        snprintf(var, sizeof var, "FIBER_BOOT_%s=%s", boot[i][0], boot[i][1]);
        if (!(env[n++] = strdup(var)))
            goto fail;
    }
    if (config_env(env, &n, cap) != 0)
        goto fail;
    for (size_t i = 0; i < n_cmd; i++)
        if (!(env[n++] = strdup(rt.job_env[i])))
            goto fail;
    for (size_t i = 0; i < n_user; i++)
        if (!(env[n++] = strdup(opts->env[i])))
            goto fail;
    return env;
fail:
    strv_free(env);
    return NULL;
}

/* Names become log file names and travel in HELLO: keep them tame. */
static int fb_job_name_valid(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > FB_WIRE_NAME_MAX || name[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
            return 0;
    }
    return 1;
}

static int new_record(struct fb_jobrec **out, const char *prefix,
                      const char *name, const struct fb_owner_ops *ops,
                      void *owner)
{
    struct fb_jobrec *j = calloc(1, sizeof *j);
    if (!j)
        return fb_err(FIBER_ENOMEM, "out of memory");
    j->id = ++rt.next_job_id;
    j->ops = ops;
    j->owner = owner;
    j->event_fd = -1;
    if (name && *name) {
        if (!fb_job_name_valid(name)) {
            free(j);
            return fb_err(FIBER_EINVAL,
                          "job name '%.80s' is invalid: use 1..63 of "
                          "[A-Za-z0-9_.-], not starting with '.'",
                          name);
        }
        fb_strlcpy(j->name, name, sizeof j->name);
    } else {
        snprintf(j->name, sizeof j->name, "%s-%llu", prefix,
                 (unsigned long long)++rt.next_proc_num);
    }
    *out = j;
    return 0;
}

static int launch_locked(struct fb_jobrec *j, const fiber_job_opts *opts,
                         const char *program)
{
    char **env = job_env(j, opts);
    if (!env)
        return fb_err(FIBER_ENOMEM, "out of memory building job environment");
    char flag[96];
    snprintf(flag, sizeof flag, "--fiber-job=%s", j->name);
    /* argv: the job command's (a binding's interpreter and its arguments)
     * or this program's name, then the flag that shows the job in ps. */
    char *argv[36];
    size_t argc = 0;
    if (rt.job_argv && !program) {
        while (rt.job_argv[argc]) {
            argv[argc] = rt.job_argv[argc];
            argc++;
        }
        program = rt.job_argv[0];
    } else {
        argv[argc++] = rt.argv0;
    }
    argv[argc++] = flag;
    argv[argc] = NULL;
    struct fb_job_spec spec = {
        .program = program ? program : "/proc/self/exe",
        .argv = argv,
        .env = env,
        .secret = rt.token,
        .secret_len = sizeof rt.token,
        .name = j->name,
        .opts = opts,
        .job_id = j->id,
        .run_dir = rt.run_dir,
        .log_dir = rt.log_dir,
    };
    /* With log_file the job writes next to it: that folder is the one a
     * container must see. */
    char log_folder[PATH_MAX];
    if (rt.log_file[0]) {
        fb_strlcpy(log_folder, rt.log_file, sizeof log_folder);
        char *slash = strrchr(log_folder, '/');
        if (slash && slash != log_folder) {
            *slash = '\0';
            spec.log_dir = log_folder;
        }
    }
    /* Only jobs that run the job command can be forked from its server. */
    if (rt.job_argv && program == rt.job_argv[0] && rt.forkserver_argv &&
        rt.cfg.fork_server) {
        spec.forkserver_argv = rt.forkserver_argv;
        spec.forkserver_env = rt.job_env;
    }
    int rc = fb_backend_create_job(rt.backend, &spec, &j->job);
    strv_free(env);
    if (rc)
        return rc;
    link_job(j);
    rc = fb_service_watch_job(j);
    if (rc) {
        unlink_job(j);
        fb_backend_release_job(rt.backend, j->job);
        j->job = NULL;
        return rc;
    }
    j->pid = j->job->pid;
    fb_log_debug("started job %llu '%s' (pid %ld)", (unsigned long long)j->id,
                 j->name, j->job->pid);
    return 0;
}

int fb_rt_job_output_tail(struct fb_jobrec *j, char *id, size_t id_size,
                          char *lines, size_t lines_size, int max_lines)
{
    fiber_buf b = {0};
    fb_rt_lock();
    int have = j->job && rt.backend && rt.backend->ops->logs &&
               fb_backend_logs(rt.backend, j->job, &b) == 0 && b.len > 0;
    fb_strlcpy(id, j->job && j->job->engine_id[0] ? j->job->engine_id : j->name,
               id_size);
    fb_rt_unlock();
    lines[0] = '\0';
    if (!have) {
        fiber_buf_free(&b);
        return 0;
    }
    /* Back from the end over max_lines non-empty lines... */
    const char *d = (const char *)b.data;
    size_t start = b.len;
    for (int n = 0; start > 0 && n < max_lines;) {
        size_t end = start;
        while (end > 0 && (d[end - 1] == '\n' || d[end - 1] == '\r'))
            end--;
        start = end;
        while (start > 0 && d[start - 1] != '\n')
            start--;
        n += end > start;
    }
    /* ...then forward, lines joined by " | ", control bytes as '?'. */
    size_t used = 0;
    int pending_sep = 0;
    for (size_t i = start; i < b.len && used + 4 < lines_size; i++) {
        char c = d[i];
        if (c == '\n' || c == '\r') {
            pending_sep = used > 0;
            continue;
        }
        if (pending_sep) {
            memcpy(lines + used, " | ", 3);
            used += 3;
            pending_sep = 0;
        }
        lines[used++] = (c >= ' ' && c != 0x7f) ? c : '?';
    }
    lines[used] = '\0';
    fiber_buf_free(&b);
    return used > 0;
}

void fb_rt_batch_begin(void)
{
    fb_rt_lock();
    if (rt.initialized && rt.master && !rt.shut_down &&
        fb_service_start() == 0)
        fb_backend_begin_batch(rt.backend);
    fb_rt_unlock();
}

int fb_rt_batch_end(void)
{
    fb_rt_lock();
    int rc = rt.backend ? fb_backend_end_batch(rt.backend) : 0;
    fb_rt_unlock();
    return rc;
}

int fb_rt_launch(struct fb_jobrec **out, const char *prefix, const char *name,
                 const fiber_job_opts *opts, const struct fb_owner_ops *ops,
                 void *owner, const char *program)
{
    fb_rt_lock();
    int rc;
    if (!rt.initialized)
        rc = fb_err(FIBER_ENOTINIT, "call fiber_init() first");
    else if (!rt.master)
        rc = fb_err(FIBER_ENOTSUP,
                    "only the master can start jobs (this is a child job)");
    else if (rt.shut_down)
        rc = fb_err(FIBER_ECLOSED, "fiber_shutdown() was called");
    else if (opts && opts->backend && strcmp(opts->backend, rt.cfg.backend))
        rc = fb_err(FIBER_ENOTSUP,
                    "job asks for backend '%s' but this run uses '%s'; one "
                    "backend per run is supported",
                    opts->backend, rt.cfg.backend);
    else
        rc = fb_service_start();
    struct fb_jobrec *j = NULL;
    if (rc == 0)
        rc = new_record(&j, prefix, opts && opts->name ? opts->name : name,
                        ops, owner);
    if (rc == 0)
        rc = launch_locked(j, opts, program);
    fb_rt_unlock();
    if (rc) {
        free(j);
        return rc;
    }
    *out = j;
    return 0;
}

static int terminate(struct fb_jobrec *j, int slack)
{
    if (j->ended || !j->job)
        return 0;
    int rc = fb_backend_signal_job(rt.backend, j->job, 0);
    uint64_t wait = (uint64_t)rt.cfg.terminate_grace_ms;
    if (slack && (rt.backend->ops->caps & FB_CAP_OWN_GRACE))
        wait += FB_OWN_GRACE_SLACK_MS;
    uint64_t at = fb_now_ms() + wait;
    if (rc == 0 && (j->kill_at_ms == 0 || at < j->kill_at_ms)) {
        j->kill_at_ms = at ? at : 1;
        fb_service_wake();
    }
    return rc;
}

int fb_rt_terminate(struct fb_jobrec *j) { return terminate(j, 1); }

int fb_rt_terminate_unread(struct fb_jobrec *j) { return terminate(j, 0); }

void fb_rt_kick(struct fb_jobrec *j)
{
    if (j->connected && fb_conn_flush(&j->conn) == 1)
        fb_service_wake(); /* it watches POLLOUT for unsent output */
}

void fb_rt_job_ended(struct fb_jobrec *j)
{
    fb_service_unwatch_job(j);
    if (j->connected) {
        /* Whatever the child sent before it exited is already buffered in
         * the socket: read it so that a reported exit code is not lost. */
        struct fb_wire_hdr h;
        const uint8_t *p;
        int r = fb_conn_read(&j->conn);
        while (r == 0 && fb_conn_next(&j->conn, &h, &p) == 1) {
            if (j->ops->message(j, &h, p) != 0)
                break;
            r = fb_conn_read(&j->conn);
        }
        fb_conn_close(&j->conn);
        j->connected = 0;
    }
    j->ended = 1;
    j->exit_status = j->job->exit_status;
    if (j->ops->ended)
        j->ops->ended(j);
    pthread_cond_broadcast(&rt.changed);
}

void fb_rt_forget(struct fb_jobrec *j)
{
    if (!j)
        return;
    fb_rt_lock();
    if (j->job) {
        fb_service_unwatch_job(j);
        j->exit_status = fb_backend_release_job(rt.backend, j->job);
        j->job = NULL;
    }
    if (j->connected)
        fb_conn_close(&j->conn);
    unlink_job(j);
    fb_rt_unlock();
    free(j);
}
