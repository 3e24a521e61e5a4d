/*
 * launch.c -- fiber_run_start and friends: starting a program's master as
 * a run, locally (a child process) or in a Docker container, following
 * its output and waiting for it.
 *
 * The launcher names the run itself and hands the name to the program in
 * FIBER_BOOT_RUN, so that what it prints, the run directory it records the
 * master's pid in, and the labels of the master's container agree with the
 * run id the program's jobs carry (once the runtime adopts a name given
 * this way; see docs/cli.md).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api/runs.h"
#include "backend/docker/image.h"
#include "backend/kubernetes/k8s_master.h"
#include "core/common.h"

extern char **environ;

#define RUN_MAGIC 0x6e75722bu /* "+run" */

struct fiber_run {
    uint32_t magic;
    char name[64];
    int docker;
    int k8s;      /* kubernetes: the master's pod is named in container */
    /* local */
    long pid;
    char dir[PATH_MAX];
    int detached;
    int reaped;
    int exit_code;
    /* docker */
    char container[80];
};

FIBER_API const char *fiber_run_name(const fiber_run *r)
{
    return r && r->magic == RUN_MAGIC ? r->name : "";
}

FIBER_API long fiber_run_pid(const fiber_run *r)
{
    return r && r->magic == RUN_MAGIC && !r->docker ? r->pid : -1;
}

FIBER_API const char *fiber_run_container(const fiber_run *r)
{
    return r && r->magic == RUN_MAGIC ? r->container : "";
}

FIBER_API void fiber_run_free(fiber_run *r)
{
    if (!r || r->magic != RUN_MAGIC)
        return;
    r->magic = 0;
    free(r);
}

static int new_run_id(char *out, size_t size)
{
    unsigned char r[4];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        return fb_err_errno(FIBER_ESYS, "getrandom");
    snprintf(out, size, "fiber-%02x%02x%02x%02x", r[0], r[1], r[2], r[3]);
    return 0;
}


/* NAME=value entries: does entry set the variable that var sets? */
static int same_var(const char *entry, const char *var)
{
    size_t n = strcspn(var, "=");
    return strncmp(entry, var, n) == 0 && entry[n] == '=';
}

/* environ (unless base is NULL) with each of set[] added or replacing the
 * variable of the same name.  The strings are not copied. */
static char **merged_env(char **base, const char *const *set, size_t n_set)
{
    size_t n_base = 0;
    while (base && base[n_base])
        n_base++;
    char **env = calloc(n_base + n_set + 1, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n_base; i++) {
        int replaced = 0;
        for (size_t j = 0; j < n_set && !replaced; j++)
            replaced = same_var(base[i], set[j]);
        if (!replaced)
            env[k++] = base[i];
    }
    for (size_t j = 0; j < n_set; j++) {
        int later = 0; /* the last setting of a name wins */
        for (size_t m = j + 1; m < n_set && !later; m++)
            later = same_var(set[m], set[j]);
        if (!later)
            env[k++] = (char *)set[j];
    }
    return env;
}

static int check_env(const char *const *env, size_t *n)
{
    *n = 0;
    for (; env && env[*n]; (*n)++)
        if (!strchr(env[*n], '=') || env[*n][0] == '=')
            return fb_err(FIBER_EINVAL,
                          "environment entry '%.80s' is not NAME=value",
                          env[*n]);
    return 0;
}

/* The variables the master gets: the run's name, the backend, the image,
 * then the caller's (which win). */
static const char **master_vars(const char *run, const char *backend,
                                const char *image, const char *const *user,
                                size_t n_user, char *storage, size_t size,
                                size_t *n)
{
    const char **vars = calloc(n_user + 4, sizeof *vars);
    if (!vars)
        return NULL;
    size_t k = 0, used = 0;
    const char *fixed[3][2] = {{"FIBER_BOOT_RUN", run},
                               {"FIBER_BACKEND", backend},
                               {"FIBER_IMAGE", image}};
    for (size_t i = 0; i < 3; i++) {
        if (!fixed[i][1])
            continue;
        int w = snprintf(storage + used, size - used, "%s=%s", fixed[i][0],
                         fixed[i][1]);
        if (w < 0 || (size_t)w >= size - used)
            break;
        vars[k++] = storage + used;
        used += (size_t)w + 1;
    }
    for (size_t i = 0; i < n_user; i++)
        vars[k++] = user[i];
    *n = k;
    return vars;
}

/* ======================================================================
 * local
 * ====================================================================== */

static int write_pidfile(const char *dir, long pid)
{
    char path[PATH_MAX], text[32];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, FB_RUN_PIDFILE) >=
        sizeof path)
        return fb_err(FIBER_EINVAL, "path too long: %s", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return fb_err_errno(FIBER_ESYS, "cannot write %s", path);
    int n = snprintf(text, sizeof text, "%ld\n", pid);
    int ok = write(fd, text, (size_t)n) == n;
    close(fd);
    return ok ? 0 : fb_err_errno(FIBER_ESYS, "cannot write %s", path);
}

/* Removes the run directory if nothing worth keeping is in it: the pid
 * file goes, an empty log directory goes, logs with content stay. */
static void tidy_run_dir(const char *dir)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/%s", dir, FB_RUN_PIDFILE);
    unlink(path);
    snprintf(path, sizeof path, "%s/logs", dir);
    rmdir(path);
    rmdir(dir);
}

static int start_local(fiber_run *r, const char *const *argv,
                       const fiber_run_opts *o, const char *const *vars,
                       size_t n_vars)
{
    char base[PATH_MAX];
    int rc = fb_runs_base(base, sizeof base);
    if (rc == 0)
        rc = fb_private_dir(base);
    if (rc == 0 && (size_t)snprintf(r->dir, sizeof r->dir, "%s/%s", base,
                                    r->name) >= sizeof r->dir)
        rc = fb_err(FIBER_EINVAL, "run directory path too long");
    if (rc == 0)
        rc = fb_private_dir(r->dir);
    if (rc)
        return rc;
    int log_fd = -1;
    char log_path[PATH_MAX];
    if (o->detach) {
        char logs[PATH_MAX - 16];
        rc = fb_run_log_dir(r->name, r->dir, logs, sizeof logs);
        if (rc == 0)
            rc = fb_make_dirs(logs) == 0
                     ? 0
                     : fb_err_errno(FIBER_ESYS, "cannot create %s", logs);
        snprintf(log_path, sizeof log_path, "%s/master.log", logs);
        if (rc == 0 && (log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND |
                                                    O_CLOEXEC,
                                      0600)) < 0)
            rc = fb_err_errno(FIBER_ESYS, "cannot create %s", log_path);
        if (rc) {
            tidy_run_dir(r->dir);
            return rc;
        }
    }
    char **env = merged_env(environ, vars, n_vars);
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    if (o->detach) {
        /* Its own session: the terminal's ^C is not for it. */
        posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null",
                                         O_RDONLY, 0);
        posix_spawn_file_actions_adddup2(&fa, log_fd, STDOUT_FILENO);
        posix_spawn_file_actions_adddup2(&fa, log_fd, STDERR_FILENO);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
    }
    pid_t pid;
    int err = env ? posix_spawnp(&pid, argv[0], &fa, &attr,
                                 (char *const *)argv, env)
                  : ENOMEM;
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    free(env);
    if (log_fd >= 0)
        close(log_fd);
    if (err) {
        errno = err;
        rc = fb_err_errno(FIBER_ESPAWN, "cannot start %s", argv[0]);
        if (o->detach)
            unlink(log_path);
        tidy_run_dir(r->dir);
        return rc;
    }
    r->pid = pid;
    r->detached = o->detach;
    rc = write_pidfile(r->dir, pid);
    if (rc) /* the run goes on; only fiber ps will not know its pid */
        fb_err_clear();
    return 0;
}

static int wait_local(fiber_run *r, int timeout_ms, int *exit_code)
{
    uint64_t deadline = fb_deadline_ms(timeout_ms);
    while (!r->reaped) {
        int status;
        pid_t got = waitpid((pid_t)r->pid, &status,
                            timeout_ms < 0 ? 0 : WNOHANG);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return fb_err_errno(FIBER_ESYS, "waitpid(%ld)", r->pid);
        if (got == 0) {
            if (fb_ms_left(deadline) == 0)
                return fb_err(FIBER_ETIMEDOUT, "run %s is still running",
                              r->name);
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        r->reaped = 1;
        r->exit_code = WIFEXITED(status)     ? WEXITSTATUS(status)
                       : WIFSIGNALED(status) ? -WTERMSIG(status)
                                             : -1;
        tidy_run_dir(r->dir);
    }
    if (exit_code)
        *exit_code = r->exit_code;
    return 0;
}

/* ======================================================================
 * docker
 * ====================================================================== */

/* Where the program lives in the image: argv[0] made absolute as on the
 * host, or the image's fiber.program label for a bare name the host does
 * not have. */
static int program_in_image(const char *arg0, const fiber_image_info *img,
                            char *out, size_t size)
{
    if (arg0[0] == '/') {
        fb_strlcpy(out, arg0, size);
    } else if (strchr(arg0, '/')) {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd))
            return fb_err_errno(FIBER_ESYS, "getcwd");
        if ((size_t)snprintf(out, size, "%s/%s", cwd, arg0) >= size)
            return fb_err(FIBER_EINVAL, "program path too long");
    } else {
        const char *path = getenv("PATH");
        out[0] = '\0';
        while (path && *path && !out[0]) {
            const char *end = strchr(path, ':');
            size_t n = end ? (size_t)(end - path) : strlen(path);
            char cand[PATH_MAX];
            snprintf(cand, sizeof cand, "%.*s/%s", (int)n, n ? path : ".",
                     arg0);
            if (cand[0] == '/' && access(cand, X_OK) == 0)
                fb_strlcpy(out, cand, size);
            path = end ? end + 1 : NULL;
        }
        if (!out[0] && img->program[0])
            fb_strlcpy(out, img->program, size);
        if (!out[0])
            return fb_err(FIBER_EINVAL,
                          "cannot tell where %s is in image %s: give its "
                          "absolute path",
                          arg0, img->tag);
    }
    return 0;
}

static json_t *string_array(const char *const *items, size_t n,
                            const char *first)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_string(i == 0 && first ? first
                                                             : items[i]));
    return a;
}

/* The master's container settings.  It sees the daemon's socket at the
 * default path, and this user's run directories ($TMPDIR/fiber-<uid>) at
 * their own path, running as this user: so the run directory it makes is
 * a directory of this host, which the containers of its jobs can mount
 * (the docker backend mounts the run directory by its path) and fiber ps
 * can read. */
static json_t *host_config(const fiber_run_opts *o, const char *socket,
                           const char *base)
{
    char sock_bind[600], base_bind[2 * PATH_MAX + 2];
    snprintf(sock_bind, sizeof sock_bind, "%s:/var/run/docker.sock", socket);
    snprintf(base_bind, sizeof base_bind, "%s:%s", base, base);
    json_t *host = json_pack("{s:s, s:[s,s], s:b}", "NetworkMode", "host",
                             "Binds", sock_bind, base_bind, "Init", 1);
    struct stat st;
    if (host && geteuid() != 0 && stat(socket, &st) == 0) {
        char gid[32];
        snprintf(gid, sizeof gid, "%u", (unsigned)st.st_gid);
        json_object_set_new(host, "GroupAdd", json_pack("[s]", gid));
    }
    if (host && o->cpu > 0)
        json_object_set_new(host, "NanoCpus",
                            json_integer((json_int_t)o->cpu * 1000000000));
    if (host && o->memory_mb > 0)
        json_object_set_new(host, "Memory",
                            json_integer((json_int_t)o->memory_mb << 20));
    if (host && o->gpu > 0)
        json_object_set_new(
            host, "DeviceRequests",
            json_pack("[{s:s, s:i, s:[[s]]}]", "Driver", "", "Count", o->gpu,
                      "Capabilities", "gpu"));
    return host;
}

static json_t *container_spec(const fiber_run *r, const char *image,
                              const char *program, const char *const *argv,
                              size_t argc, const char *const *vars,
                              size_t n_vars, const fiber_run_opts *o,
                              const char *socket, const char *base)
{
    char user[64], tmpdir[PATH_MAX + 8];
    snprintf(user, sizeof user, "%u:%u", (unsigned)geteuid(),
             (unsigned)getegid());
    /* base is "<TMPDIR>/fiber-<uid>": the master must pick the same. */
    snprintf(tmpdir, sizeof tmpdir, "TMPDIR=%.*s", (int)(strrchr(base, '/') -
                                                          base),
             base);
    json_t *env = string_array(vars, n_vars, NULL);
    if (env)
        json_array_insert_new(env, 0, json_string(tmpdir));
    json_t *spec = json_pack(
        "{s:s, s:o, s:o, s:{s:s, s:s, s:s, s:s}, s:s, s:s, s:b, s:o}",
        "Image", image, "Cmd", string_array(argv, argc, program), "Env", env,
        "Labels", "fiber.run", r->name, "fiber.role", "master", "fiber.name",
        "master", "fiber.job", "0", "User", user, "WorkingDir", "/", "Tty", 0,
        "HostConfig", host_config(o, socket, base));
    return spec;
}

static int start_docker(fiber_run *r, const char *const *argv,
                        const fiber_run_opts *o, const char *const *vars,
                        size_t n_vars, const char *image)
{
    fiber_image_info img;
    int rc = fiber_image_inspect(image, &img);
    if (rc)
        return rc;
    char program[PATH_MAX];
    rc = program_in_image(argv[0], &img, program, sizeof program);
    if (rc)
        return rc;
    char base[PATH_MAX];
    if ((rc = fb_runs_base(base, sizeof base)) != 0 ||
        (rc = fb_private_dir(base)) != 0)
        return rc;
    struct fb_engine e;
    if ((rc = fb_engine_open(&e)) != 0)
        return rc;
    size_t argc = 0;
    while (argv[argc])
        argc++;
    json_t *spec = container_spec(r, image, program, argv, argc, vars, n_vars,
                                  o, e.socket, base);
    char path[256];
    snprintf(path, sizeof path, "/containers/create?name=%s-master", r->name);
    json_t *created = NULL;
    rc = spec ? fb_engine_json(&e, "POST", path, spec, &created,
                               "creating the master's container")
              : fb_err(FIBER_ENOMEM, "out of memory");
    json_decref(spec);
    const char *id = json_string_value(json_object_get(created, "Id"));
    if (rc == 0 && !id)
        rc = fb_err(FIBER_EBACKEND, "the Docker Engine created a container "
                                    "but did not say its id");
    if (rc == 0) {
        fb_strlcpy(r->container, id, sizeof r->container);
        snprintf(path, sizeof path, "/containers/%s/start", r->container);
        rc = fb_engine_json(&e, "POST", path, NULL, NULL,
                            "starting the master's container");
        if (rc) {
            char why[1024];
            fb_strlcpy(why, fiber_last_error(), sizeof why);
            snprintf(path, sizeof path, "/containers/%s?force=1",
                     r->container);
            fb_engine_json(&e, "DELETE", path, NULL, NULL, "cleaning up");
            rc = fb_err(FIBER_ESPAWN, "%s", why);
        }
    } else if (rc == FIBER_ENOKEY) {
        rc = fb_err(FIBER_ESPAWN, "%s", fiber_last_error());
    }
    json_decref(created);
    fb_engine_close(&e);
    return rc;
}

struct follow_state {
    struct fb_demux demux;
    int fds[3]; /* by stream number: 1 stdout, 2 stderr */
};

static int write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return fb_err_errno(FIBER_ESYS, "writing the run's output");
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int follow_out(void *ud, int stream, const void *data, size_t len)
{
    struct follow_state *s = ud;
    return write_all(s->fds[stream == 2 ? 2 : 1], data, len);
}

static int follow_sink(void *ud, const void *data, size_t len)
{
    struct follow_state *s = ud;
    return fb_demux_feed(&s->demux, data, len, follow_out, s);
}

static int wait_docker(fiber_run *r, int timeout_ms, int *exit_code)
{
    struct fb_engine e;
    int rc = fb_engine_open(&e);
    if (rc)
        return rc;
    char path[160];
    snprintf(path, sizeof path, "/containers/%s/wait", r->container);
    fiber_buf resp = {0};
    long status = 0;
    rc = fb_engine_request(&e, "POST", path, NULL, NULL, 0, &resp, &status,
                           timeout_ms < 0 ? 0 : timeout_ms > 0 ? timeout_ms
                                                                 : 1);
    json_t *j = rc == 0 ? json_loadb((const char *)resp.data, resp.len, 0,
                                     NULL)
                        : NULL;
    if (rc == FIBER_ETIMEDOUT)
        fb_err(FIBER_ETIMEDOUT, "run %s is still running", r->name);
    else if (rc == 0 && (status != 200 || !j))
        rc = fb_err(FIBER_EBACKEND,
                    "waiting for container %.12s: the Docker Engine "
                    "answered HTTP %ld %.200s",
                    r->container, status,
                    resp.len ? (const char *)resp.data : "");
    if (rc == 0 && exit_code)
        *exit_code = (int)json_integer_value(json_object_get(j, "StatusCode"));
    json_decref(j);
    fiber_buf_free(&resp);
    fb_engine_close(&e);
    return rc;
}

/* ======================================================================
 * kubernetes (k8s_master.c)
 * ====================================================================== */

/* The image: the caller's, or the image key; a cluster pulls it, so fiber
 * builds none. */
static int k8s_image(const char *given, char *out, size_t size)
{
    if (given) {
        fb_strlcpy(out, given, size);
        return 0;
    }
    int rc = fiber_config_get("image", out, size);
    if (rc == 0 && !out[0])
        rc = fb_err(FIBER_ECONFIG,
                    "the kubernetes backend runs the master in an image "
                    "that the cluster pulls: give one (--image, or the "
                    "image key), made with `fiber image build` and pushed "
                    "to the cluster's registry");
    return rc;
}

static int start_k8s(fiber_run *r, const char *const *argv,
                     const fiber_run_opts *o, const char *const *vars,
                     size_t n_vars, const char *image)
{
    fiber_image_info img = {0};
    fb_strlcpy(img.tag, image, sizeof img.tag);
    char program[PATH_MAX];
    int rc = program_in_image(argv[0], &img, program, sizeof program);
    if (rc)
        return rc;
    size_t argc = 0;
    while (argv[argc])
        argc++;
    const char **args = calloc(argc + 1, sizeof *args);
    if (!args)
        return fb_err(FIBER_ENOMEM, "out of memory");
    memcpy(args, argv, argc * sizeof *args);
    args[0] = program;
    rc = fb_k8s_master_start(r->name, args, o, vars, n_vars, image,
                             r->container, sizeof r->container);
    free(args);
    return rc;
}

/* ======================================================================
 * The public calls
 * ====================================================================== */

static int choose_backend(const fiber_run_opts *o, char *out, size_t size)
{
    if (o->backend) {
        fb_strlcpy(out, o->backend, size);
        return 0;
    }
    return fiber_config_get("backend", out, size);
}

/* The image to run: the caller's, or the program's default tag, built
 * when the daemon does not have it yet. */
static int choose_image(const char *program, const char *given, char *out,
                        size_t size)
{
    if (given) {
        fb_strlcpy(out, given, size);
        return 0;
    }
    int rc = fiber_image_default_tag(program, out, size);
    fiber_image_info info;
    if (rc == 0)
        rc = fiber_image_inspect(out, &info);
    if (rc == FIBER_ENOKEY) {
        fiber_buf id = {0};
        rc = fiber_image_build(program, out, &id);
        fiber_buf_free(&id);
    }
    return rc;
}

FIBER_API int fiber_run_start(fiber_run **out, const char *const *argv,
                              const fiber_run_opts *opts)
{
    fiber_run_opts none = {0};
    const fiber_run_opts *o = opts ? opts : &none;
    if (!out || !argv || !argv[0] || !argv[0][0])
        return fb_err(FIBER_EINVAL, "fiber_run_start: no program to run");
    size_t n_user;
    char backend[32], image[320];
    int rc = check_env(o->env, &n_user);
    if (rc == 0)
        rc = choose_backend(o, backend, sizeof backend);
    if (rc)
        return rc;
    int docker = strcmp(backend, "docker") == 0;
    int k8s = strcmp(backend, "kubernetes") == 0;
    if (!docker && !k8s && strcmp(backend, "local") != 0)
        return fb_err(FIBER_ENOTSUP,
                      "fiber cannot start runs on the %s backend yet: use "
                      "local, docker or kubernetes",
                      backend);
    if (!docker && !k8s && (o->cpu > 0 || o->memory_mb > 0 || o->gpu > 0 ||
                            o->image))
        return fb_err(FIBER_ENOTSUP,
                      "cpu, memory, gpu and image limit or choose a "
                      "container; the local backend runs the program on "
                      "this host as it is (drop them, or use the docker "
                      "backend)");
    if (o->cpu < 0 || o->memory_mb < 0 || o->gpu < 0)
        return fb_err(FIBER_EINVAL, "cpu, memory and gpu cannot be negative");
    if (docker && (rc = choose_image(argv[0], o->image, image,
                                     sizeof image)) != 0)
        return rc;
    if (k8s && (rc = k8s_image(o->image, image, sizeof image)) != 0)
        return rc;
    fiber_run *r = calloc(1, sizeof *r);
    if (!r)
        return fb_err(FIBER_ENOMEM, "out of memory");
    r->magic = RUN_MAGIC;
    r->pid = -1;
    r->docker = docker;
    r->k8s = k8s;
    rc = new_run_id(r->name, sizeof r->name);
    char storage[1024];
    size_t n_vars = 0;
    const char **vars = NULL;
    if (rc == 0 &&
        !(vars = master_vars(r->name, backend, docker || k8s ? image : NULL,
                             o->env,
                             n_user, storage,
                             sizeof storage, &n_vars)))
        rc = fb_err(FIBER_ENOMEM, "out of memory");
    if (rc == 0)
        rc = docker ? start_docker(r, argv, o, vars, n_vars, image)
             : k8s  ? start_k8s(r, argv, o, vars, n_vars, image)
                    : start_local(r, argv, o, vars, n_vars);
    free(vars);
    if (rc) {
        free(r);
        return rc;
    }
    fb_err_clear();
    *out = r;
    return 0;
}

FIBER_API int fiber_run_follow(fiber_run *r, int out_fd, int err_fd)
{
    if (!r || r->magic != RUN_MAGIC)
        return fb_err(FIBER_EINVAL, "fiber_run_follow: invalid handle");
    if (r->k8s)
        return fb_k8s_master_follow(r->container, out_fd);
    if (!r->docker)
        return 0; /* the child writes to our streams, or to its log */
    struct fb_engine e;
    int rc = fb_engine_open(&e);
    if (rc)
        return rc;
    struct follow_state s = {.fds = {-1, out_fd, err_fd}};
    char path[200];
    snprintf(path, sizeof path,
             "/containers/%s/logs?follow=1&stdout=1&stderr=1", r->container);
    rc = fb_engine_stream(&e, "GET", path, follow_sink, &s,
                          "following the master's output");
    fb_engine_close(&e);
    return rc;
}

FIBER_API int fiber_run_wait(fiber_run *r, int timeout_ms, int *exit_code)
{
    if (!r || r->magic != RUN_MAGIC)
        return fb_err(FIBER_EINVAL, "fiber_run_wait: invalid handle");
    if (r->k8s)
        return fb_k8s_master_wait(r->container, timeout_ms, exit_code);
    return r->docker ? wait_docker(r, timeout_ms, exit_code)
                     : wait_local(r, timeout_ms, exit_code);
}
