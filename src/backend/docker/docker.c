/*
 * docker.c -- the docker backend: every job is a container of the Docker
 * Engine on this host, driven through the Engine API on its unix socket
 * (engine.h, on the HTTP layer backend/http/http.h); the docker command
 * is never run.
 *
 * A job's container:
 *
 *   - runs the master's own executable, at the same path, from an image
 *     that holds it and its shared libraries (`fiber image build` makes
 *     one); the image is the job's `image` option or the `image` key;
 *   - joins the `docker_network` (host by default), so that the job dials
 *     the master on loopback: the master listens on TCP with this backend,
 *     since a container cannot be assumed to share this host's unix
 *     sockets (service.c switches the transport);
 *   - sees the run directory and the log directory at their own paths
 *     (bind mounts), runs as the master's uid:gid so that the files it
 *     writes there are the user's, and reads the run's token from a file
 *     in the run directory, mode 0600, mounted read-only: the token is
 *     never in the container's environment or command line, where
 *     `docker inspect` would show it;
 *   - has docker-init as its PID 1 (HostConfig.Init), so signals reach the
 *     program as they would a local process and its exit status says which
 *     signal ended it;
 *   - is labelled fiber.run, fiber.job, fiber.name and fiber.role, so that
 *     `fiber ps` / `fiber clean` find the containers of a run;
 *   - is removed by the engine as soon as it ends (HostConfig.AutoRemove).
 *     A child ends when its connection to the master drops, so even a
 *     master killed with SIGKILL leaves no container behind.  The price:
 *     a container's standard output and error go with it (logs() reads
 *     them only while the job runs); fiber's own log lines are written to
 *     the log directory and stay.
 *
 * Exits.  Before starting a container the backend asks the engine to wait
 * for its next exit (POST /containers/{id}/wait?condition=next-exit): a
 * long-lived request that the engine answers with the exit code the moment
 * the container ends, before it is removed.  poll_job only moves those
 * requests forward (one non-blocking curl_multi_perform for all jobs), so
 * it costs no engine request while jobs run.  If a wait breaks (the engine
 * restarted), poll_job falls back to inspecting the container, where a 404
 * means it ended and was removed.
 *
 * The ops are called with the runtime lock held, which they never release;
 * create_job makes three engine requests (create, wait, start) and
 * starting a container takes the engine a few hundred milliseconds.
 * Engine errors follow the HTTP layer's contract (backend/http/http.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/docker/engine.h"
#include "backend/docker/image.h"
#include "backend/json_util.h"
#include "base/common.h"
#include "base/log.h"
#include "runtime/runid.h"

#define REQUEST_TIMEOUT_MS 60000L
#define WAIT_HEADERS_TIMEOUT_MS 10000L
#define RELEASE_WAIT_MS 3000L
#define PUMP_INTERVAL_MS 10u
#define INSPECT_INTERVAL_MS 500u
#define GPU_API_MINOR 40 /* DeviceRequests */
#define SECRET_VAR FB_ENV_SECRET_FILE

struct docker_state {
    struct fb_engine engine;  /* its http; the API version negotiated */
    char runtimes[256];       /* the engine's runtimes, for messages */
    int has_gpu_runtime;      /* "nvidia" is among them */
    char secrets_dir[PATH_MAX]; /* "" until the first job */
    char checked_image[256];  /* the last image found to hold the program */
    char built_image[256];    /* docker_build_image: the image made at init */
    uint64_t last_pump_ms;
};

struct docker_job {
    char id[80];                 /* the container's id */
    char secret_path[PATH_MAX];  /* "" once removed */
    struct fb_http_async wait;   /* POST /containers/{id}/wait */
    uint64_t next_inspect_ms;    /* when poll_job may inspect again */
};

/* ---- small helpers --------------------------------------------------------- */

/* Returns 1 if path lies inside dir. */
static int inside(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

/* ---- init and fini --------------------------------------------------------- */

/* Learns which runtimes the engine has (GET /info), to refuse GPU jobs
 * clearly on an engine that cannot run them. */
static int read_info(struct docker_state *ds)
{
    long status;
    json_t *info = NULL;
    int rc = fb_http_json(&ds->engine.http, "GET", "/info", NULL, REQUEST_TIMEOUT_MS,
                          &status, &info);
    if (rc)
        return rc;
    const char *name;
    json_t *v;
    size_t used = 0;
    json_object_foreach(json_object_get(info, "Runtimes"), name, v)
    {
        if (strcmp(name, "nvidia") == 0)
            ds->has_gpu_runtime = 1;
        if (used + strlen(name) + 3 < sizeof ds->runtimes)
            used += (size_t)snprintf(ds->runtimes + used,
                                     sizeof ds->runtimes - used, "%s%s",
                                     used ? ", " : "", name);
    }
    if (!used)
        fb_strlcpy(ds->runtimes, "none reported", sizeof ds->runtimes);
    json_decref(info);
    return 0;
}

/* Reports the stages of docker_build_image's build in the log. */
static void log_progress(void *ud, const char *line)
{
    fb_log_info("docker_build_image (%s): %s", (const char *)ud, line);
}

/* docker_build_image: with no image configured, builds one of the running
 * program (the default tag) and keeps its tag for the jobs that name no
 * image.  Runs within init, with the runtime lock held as every op (it is
 * never released): fb_image_build is given the socket from be->cfg, so it
 * reads no configuration through fiber_config_get (which takes the lock)
 * and touches nothing of the runtime.  init runs from fb_service_start
 * before the service thread exists, so the build holds up no runtime loop,
 * heartbeat or connection; another thread's fiber call waits until the
 * backend is ready (backend.h says what init may do). */
static int build_image(struct fb_backend *be, struct docker_state *ds)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return fb_err_errno(FIBER_ESYS, "readlink(/proc/self/exe)");
    exe[n] = '\0';
    char tag[sizeof ds->built_image];
    fiber_buf id = {0};
    uint64_t t0 = fb_now_ms();
    int rc = fiber_image_default_tag(exe, tag, sizeof tag);
    fiber_image_build_opts o = {.tag = tag, .progress = log_progress,
                                .progress_ud = tag};
    if (rc == 0)
        rc = fb_image_build(be->cfg->docker_socket, exe, &o, &id);
    if (rc) {
        char why[900];
        fb_strlcpy(why, fiber_last_error(), sizeof why);
        fiber_buf_free(&id);
        return fb_err(rc,
                      "docker_build_image is on and no image is set, but "
                      "no image of %s could be built: %s",
                      exe, why);
    }
    fb_strlcpy(ds->built_image, tag, sizeof ds->built_image);
    fb_log_info("docker_build_image: built %s (%s) of %s in %llu ms", tag,
                id.data ? (const char *)id.data : "?", exe,
                (unsigned long long)(fb_now_ms() - t0));
    fiber_buf_free(&id);
    return 0;
}

static int docker_init(struct fb_backend *be)
{
    struct docker_state *ds = be->state;
    int rc = fb_engine_open_at(&ds->engine, be->cfg->docker_socket);
    if (rc)
        return rc;
    fb_log_debug("docker engine at %s, API %s (the daemon's: %s)",
                 ds->engine.socket, ds->engine.api, ds->engine.daemon_api);
    rc = read_info(ds);
    if (rc == 0 && be->cfg->docker_build_image && !be->cfg->image[0])
        rc = build_image(be, ds);
    if (rc)
        fb_engine_close(&ds->engine);
    return rc;
}

/* Removes the secrets directory and whatever is left in it. */
static void remove_secrets(struct docker_state *ds)
{
    if (!ds->secrets_dir[0])
        return;
    DIR *d = opendir(ds->secrets_dir);
    if (d) {
        struct dirent *e;
        char path[PATH_MAX + 256];
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof path, "%s/%s", ds->secrets_dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(ds->secrets_dir);
    ds->secrets_dir[0] = '\0';
}

static void docker_fini(struct fb_backend *be)
{
    struct docker_state *ds = be->state;
    remove_secrets(ds);
    fb_engine_close(&ds->engine);
}

/* ---- creating a job -------------------------------------------------------- */

/* Writes the secret to <run dir>/secrets/<job id>, readable by the user
 * only, for the container to read through a read-only mount. */
static int write_secret(struct docker_state *ds, const struct fb_job_spec *spec,
                        struct docker_job *dj)
{
    if (!ds->secrets_dir[0]) {
        char dir[PATH_MAX];
        int n = snprintf(dir, sizeof dir, "%s/secrets", spec->run_dir);
        if (n < 0 || (size_t)n >= sizeof dir)
            return fb_err(FIBER_ESYS, "run directory path is too long");
        if (mkdir(dir, 0700) != 0 && errno != EEXIST)
            return fb_err_errno(FIBER_ESYS, "cannot create %s", dir);
        fb_strlcpy(ds->secrets_dir, dir, sizeof ds->secrets_dir);
    }
    int n = snprintf(dj->secret_path, sizeof dj->secret_path, "%s/%llu",
                     ds->secrets_dir, (unsigned long long)spec->job_id);
    if (n < 0 || (size_t)n >= sizeof dj->secret_path) {
        dj->secret_path[0] = '\0';
        return fb_err(FIBER_ESYS, "run directory path is too long");
    }
    unlink(dj->secret_path);
    int fd = open(dj->secret_path,
                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    int rc = 0;
    if (fd < 0)
        rc = fb_err_errno(FIBER_ESYS, "cannot create %s", dj->secret_path);
    else if (write(fd, spec->secret, spec->secret_len) !=
             (ssize_t)spec->secret_len)
        rc = fb_err_errno(FIBER_ESYS, "cannot write %s", dj->secret_path);
    if (fd >= 0)
        close(fd);
    if (rc) {
        unlink(dj->secret_path);
        dj->secret_path[0] = '\0';
    }
    return rc;
}

/* The bind mounts: the run directory, the log directory (when it lies
 * elsewhere), the secret read-only, and the docker_mounts key's. */
static json_t *binds(const struct fb_config *cfg,
                     const struct fb_job_spec *spec, const char *secret_path)
{
    json_t *b = json_array();
    int bad = !b;
    char bind[2 * PATH_MAX + 8];
    snprintf(bind, sizeof bind, "%s:%s", spec->run_dir, spec->run_dir);
    fb_json_push(b, json_string(bind), &bad);
    if (spec->log_dir && spec->log_dir[0] &&
        !inside(spec->log_dir, spec->run_dir)) {
        snprintf(bind, sizeof bind, "%s:%s", spec->log_dir, spec->log_dir);
        fb_json_push(b, json_string(bind), &bad);
    }
    snprintf(bind, sizeof bind, "%s:%s:ro", secret_path, secret_path);
    fb_json_push(b, json_string(bind), &bad);
    for (const char *p = cfg->docker_mounts; *p;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        fb_json_push(b, json_stringn(p, n), &bad);
        p += n + (comma ? 1 : 0);
    }
    return fb_json_done(b, bad);
}

static json_t *host_config(const struct fb_config *cfg,
                           const struct fb_job_spec *spec,
                           const char *secret_path)
{
    const fiber_job_opts *o = spec->opts;
    json_t *h = json_object();
    int bad = !h;
    fb_json_put(h, "NetworkMode", json_string(cfg->docker_network), &bad);
    fb_json_put(h, "AutoRemove", json_true(), &bad);
    fb_json_put(h, "Init", json_true(), &bad);
    fb_json_put(h, "Binds", binds(cfg, spec, secret_path), &bad);
    if (o && o->cpu > 0)
        fb_json_put(h, "NanoCpus", json_integer((json_int_t)o->cpu * 1000000000),
            &bad);
    if (o && o->memory_mb > 0)
        fb_json_put(h, "Memory", json_integer((json_int_t)o->memory_mb << 20), &bad);
    if (o && o->gpu > 0) {
        json_t *req = json_object(), *caps = json_array(), *gpu = json_array();
        json_t *reqs = json_array();
        bad |= !req || !caps || !gpu || !reqs;
        fb_json_push(gpu, json_string("gpu"), &bad);
        fb_json_push(caps, gpu, &bad);
        fb_json_put(req, "Driver", json_string("nvidia"), &bad);
        fb_json_put(req, "Count", json_integer(o->gpu), &bad);
        fb_json_put(req, "Capabilities", caps, &bad);
        fb_json_push(reqs, req, &bad);
        fb_json_put(h, "DeviceRequests", reqs, &bad);
    }
    return fb_json_done(h, bad);
}

/* The body of POST /containers/create. */
static json_t *container_config(const struct fb_config *cfg,
                                const char *run_id,
                                const struct fb_job_spec *spec,
                                const char *image, const char *program,
                                const char *secret_path)
{
    json_t *c = json_object(), *entry = json_array(), *cmd = json_array();
    json_t *env = json_array(), *labels = json_object();
    int bad = !c || !entry || !cmd || !env || !labels;
    char text[PATH_MAX + 64];
    fb_json_put(c, "Image", json_string(image), &bad);
    /* The program is the entrypoint, so that an image's own Entrypoint or
     * Cmd can never run instead of it or in front of it. */
    fb_json_push(entry, json_string(program), &bad);
    fb_json_put(c, "Entrypoint", entry, &bad);
    for (size_t i = 1; spec->argv[0] && spec->argv[i]; i++)
        fb_json_push(cmd, json_string(spec->argv[i]), &bad);
    fb_json_put(c, "Cmd", cmd, &bad);
    for (size_t i = 0; spec->env && spec->env[i]; i++)
        fb_json_push(env, json_string(spec->env[i]), &bad);
    snprintf(text, sizeof text, SECRET_VAR "=%s", secret_path);
    fb_json_push(env, json_string(text), &bad);
    fb_json_put(c, "Env", env, &bad);
    fb_json_put(labels, FB_LABEL_RUN, json_string(run_id), &bad);
    snprintf(text, sizeof text, "%llu", (unsigned long long)spec->job_id);
    fb_json_put(labels, FB_LABEL_JOB, json_string(text), &bad);
    fb_json_put(labels, FB_LABEL_NAME, json_string(spec->name), &bad);
    fb_json_put(labels, FB_LABEL_ROLE, json_string("job"), &bad);
    fb_json_put(c, "Labels", labels, &bad);
    snprintf(text, sizeof text, "%u:%u", (unsigned)geteuid(),
             (unsigned)getegid());
    fb_json_put(c, "User", json_string(text), &bad);
    if (spec->opts && spec->opts->workdir)
        fb_json_put(c, "WorkingDir", json_string(spec->opts->workdir), &bad);
    fb_json_put(c, "HostConfig", host_config(cfg, spec, secret_path), &bad);
    return fb_json_done(c, bad);
}

/* Checks what the job asks for against what the engine offers, and picks
 * its image and the program's path.  Returns 0 or a code. */
static int check_spec(struct fb_backend *be, const struct fb_job_spec *spec,
                      const char **image, char *program, size_t size)
{
    struct docker_state *ds = be->state;
    const fiber_job_opts *o = spec->opts;
    *image = o && o->image && o->image[0] ? o->image : be->cfg->image;
    if (!(*image)[0])
        *image = ds->built_image;
    if (!(*image)[0])
        return fb_err(FIBER_ECONFIG,
                      "job '%s' has no image: the docker backend runs every "
                      "job in an image that holds this program; set the "
                      "`image` key (FIBER_IMAGE) or the job's image option, "
                      "after making one with `fiber image build`, or set "
                      "docker_build_image (FIBER_DOCKER_BUILD_IMAGE=true)",
                      spec->name);
    if (!spec->run_dir || !spec->run_dir[0])
        return fb_err(FIBER_EINVAL, "job '%s': no run directory", spec->name);
    if (o && o->gpu > 0 &&
        (!ds->has_gpu_runtime || ds->engine.api_minor < GPU_API_MINOR))
        return fb_err(FIBER_ENOTSUP,
                      "job '%s' asks for %d GPU(s), but the Docker engine at "
                      "%s has no GPU runtime (its runtimes: %s; API 1.%d, "
                      "GPUs need 1.%d): install the NVIDIA Container Toolkit "
                      "and restart dockerd, or run the job without GPUs",
                      spec->name, o->gpu, be->cfg->docker_socket,
                      ds->runtimes, ds->engine.api_minor, GPU_API_MINOR);
    return fb_job_program(spec, program, size);
}

/* POST /containers/create.  Fills dj->id. */
static int create_container(struct fb_backend *be,
                            const struct fb_job_spec *spec, const char *image,
                            const char *program, struct docker_job *dj)
{
    struct docker_state *ds = be->state;
    json_t *body = container_config(be->cfg, be->run_id, spec, image,
                                    program, dj->secret_path);
    if (!body)
        return fb_err(FIBER_ENOMEM, "out of memory describing job '%s'",
                      spec->name);
    char name[256], escaped[768], path[1024];
    snprintf(name, sizeof name, "%s-%llu-%s", be->run_id,
             (unsigned long long)spec->job_id, spec->name);
    fb_http_escape(name, escaped, sizeof escaped);
    snprintf(path, sizeof path, "/containers/create?name=%s", escaped);
    long status;
    json_t *reply = NULL;
    int rc = fb_http_json(&ds->engine.http, "POST", path, body, REQUEST_TIMEOUT_MS,
                          &status, &reply);
    json_decref(body);
    if (rc)
        return rc;
    const char *msg = json_string_value(json_object_get(reply, "message"));
    const char *id = json_string_value(json_object_get(reply, "Id"));
    if (status == 201 && id && strlen(id) < sizeof dj->id)
        fb_strlcpy(dj->id, id, sizeof dj->id);
    else if (status == 404)
        rc = fb_err(FIBER_ESPAWN,
                    "cannot start job '%s': image '%s' is not in the Docker "
                    "engine at %s (%s); make it with `fiber image build` "
                    "(fiber never pulls images)",
                    spec->name, image, be->cfg->docker_socket,
                    msg ? msg : "not found");
    else
        rc = fb_err(FIBER_ESPAWN,
                    "cannot start job '%s' in image '%s': the Docker engine "
                    "refused to create its container (HTTP %ld): %s",
                    spec->name, image, status, msg ? msg : "no reason given");
    json_decref(reply);
    return rc;
}

/* Checks, once per image, that the image holds the program at its path
 * (HEAD /containers/{id}/archive on the created container).  Without this
 * a missing program would only show as exit status 127 from docker-init,
 * its message gone with the container. */
static int check_program(struct fb_backend *be, const char *name,
                         const char *image, const char *program,
                         struct docker_job *dj)
{
    struct docker_state *ds = be->state;
    if (strcmp(ds->checked_image, image) == 0)
        return 0;
    char escaped[3 * PATH_MAX], path[3 * PATH_MAX + 128];
    if (fb_http_escape(program, escaped, sizeof escaped) != 0)
        return fb_err(FIBER_EINVAL, "program path is too long");
    snprintf(path, sizeof path, "/containers/%s/archive?path=%s", dj->id,
             escaped);
    struct fb_http_reply r;
    int rc = fb_http_request(&ds->engine.http, "HEAD", path, NULL, 0, NULL,
                             REQUEST_TIMEOUT_MS, &r);
    if (rc == 0 && r.status == 404)
        rc = fb_err(FIBER_ESPAWN,
                    "cannot start job '%s': image '%s' does not hold %s, "
                    "the program every job runs; make an image of it with "
                    "`fiber image build %s`",
                    name, image, program, program);
    else if (rc == 0 && r.status != 200)
        rc = fb_err(FIBER_ESPAWN,
                    "cannot start job '%s': the Docker engine could not look "
                    "for %s in image '%s' (HTTP %ld)",
                    name, program, image, r.status);
    else if (rc == 0)
        fb_strlcpy(ds->checked_image, image, sizeof ds->checked_image);
    fb_http_reply_free(&r);
    return rc;
}

/* Asks the engine for the container's next exit; returns once the engine
 * has registered the request, so no exit can be missed. */
static int watch_container(struct docker_state *ds, const char *name,
                           struct docker_job *dj)
{
    char path[256];
    snprintf(path, sizeof path, "/containers/%s/wait?condition=next-exit",
             dj->id);
    int rc = fb_http_async_start(&ds->engine.http, &dj->wait, "POST", path,
                                 NULL, NULL);
    if (rc == 0)
        rc = fb_http_async_headers(&ds->engine.http, &dj->wait,
                                   WAIT_HEADERS_TIMEOUT_MS);
    if (rc == 0 && dj->wait.status != 200) {
        char msg[300];
        rc = fb_err(FIBER_ESPAWN,
                    "cannot start job '%s': the Docker engine refused to "
                    "watch its container (HTTP %ld): %s",
                    name, dj->wait.status,
                    fb_http_message(dj->wait.body.data, dj->wait.body.len,
                                    msg, sizeof msg));
    }
    return rc;
}

static int start_container(struct fb_backend *be, const char *name,
                           const char *image, const char *program,
                           struct docker_job *dj)
{
    struct docker_state *ds = be->state;
    char path[256];
    snprintf(path, sizeof path, "/containers/%s/start", dj->id);
    struct fb_http_reply r;
    int rc = fb_http_request(&ds->engine.http, "POST", path, NULL, 0, NULL,
                             REQUEST_TIMEOUT_MS, &r);
    if (rc == 0 && r.status != 204 && r.status != 304) {
        char msg[600];
        rc = fb_err(FIBER_ESPAWN,
                    "cannot start job '%s' in image '%s' (HTTP %ld): %s; the "
                    "image must hold %s and its libraries at the same paths "
                    "(`fiber image build` makes such an image)",
                    name, image, r.status,
                    fb_http_message(r.body.data, r.body.len, msg, sizeof msg),
                    program);
    }
    fb_http_reply_free(&r);
    return rc;
}

/* Kills and removes the container at once (DELETE ?force=1).  An already
 * removed container is not an error. */
static void remove_container(struct docker_state *ds, struct docker_job *dj)
{
    char path[256];
    snprintf(path, sizeof path, "/containers/%s?force=1", dj->id);
    struct fb_http_reply r;
    int rc = fb_http_request(&ds->engine.http, "DELETE", path, NULL, 0, NULL,
                             REQUEST_TIMEOUT_MS, &r);
    if (rc == 0 && r.status != 204 && r.status != 404 && r.status != 409) {
        char msg[300];
        fb_log_warn("cannot remove container %.12s (HTTP %ld): %s", dj->id,
                    r.status,
                    fb_http_message(r.body.data, r.body.len, msg, sizeof msg));
    } else if (rc) {
        fb_log_warn("cannot remove container %.12s: %s", dj->id,
                    fiber_last_error());
    }
    fb_http_reply_free(&r);
}

/* Undoes a create_job that failed after its first step; keeps the
 * message of the failure. */
static void undo_create(struct docker_state *ds, struct docker_job *dj)
{
    char why[1024];
    fb_strlcpy(why, fiber_last_error(), sizeof why);
    if (dj->id[0])
        remove_container(ds, dj);
    fb_http_async_free(&ds->engine.http, &dj->wait);
    if (dj->secret_path[0])
        unlink(dj->secret_path);
    dj->secret_path[0] = '\0';
    fb_err(FIBER_ESPAWN, "%s", why);
}

static int docker_create_job(struct fb_backend *be,
                             const struct fb_job_spec *spec, struct fb_job *job)
{
    struct docker_state *ds = be->state;
    struct docker_job *dj = job->priv;
    const char *image;
    char program[PATH_MAX];
    int rc = check_spec(be, spec, &image, program, sizeof program);
    if (rc)
        return rc;
    if (spec->log_dir && spec->log_dir[0] && fb_make_dirs(spec->log_dir) != 0)
        return fb_err_errno(FIBER_ESYS, "cannot create log directory %s",
                            spec->log_dir);
    uint64_t t0 = fb_now_ms();
    rc = write_secret(ds, spec, dj);
    if (rc == 0)
        rc = create_container(be, spec, image, program, dj);
    uint64_t t_created = fb_now_ms();
    if (rc == 0)
        rc = check_program(be, spec->name, image, program, dj);
    if (rc == 0)
        rc = watch_container(ds, spec->name, dj);
    uint64_t t_watched = fb_now_ms();
    if (rc == 0)
        rc = start_container(be, spec->name, image, program, dj);
    if (rc) {
        undo_create(ds, dj);
        return rc;
    }
    job->pid = -1;
    job->state = FB_JOB_RUNNING;
    fb_log_debug("job %llu '%s': container %.12s (create %llu ms, check and "
                 "watch %llu ms, start %llu ms)",
                 (unsigned long long)spec->job_id, spec->name, dj->id,
                 (unsigned long long)(t_created - t0),
                 (unsigned long long)(t_watched - t_created),
                 (unsigned long long)(fb_now_ms() - t_watched));
    return 0;
}

/* ---- watching, stopping, reading ------------------------------------------- */

static int docker_event_fd(struct fb_backend *be, struct fb_job *job)
{
    FB_UNUSED(be);
    FB_UNUSED(job);
    return -1; /* the runtime polls */
}

/* Asks the engine about the container (GET /containers/{id}/json): the
 * fallback when its wait request broke. */
static int inspect(struct docker_state *ds, struct fb_job *job)
{
    struct docker_job *dj = job->priv;
    char path[256];
    snprintf(path, sizeof path, "/containers/%s/json", dj->id);
    long status;
    json_t *reply = NULL;
    int rc = fb_http_json(&ds->engine.http, "GET", path, NULL, REQUEST_TIMEOUT_MS,
                          &status, &reply);
    if (rc)
        return rc;
    json_t *state = json_object_get(reply, "State");
    const char *s = json_string_value(json_object_get(state, "Status"));
    json_int_t code = json_integer_value(json_object_get(state, "ExitCode"));
    if (status == 404) {
        /* Ended and removed before anyone saw its exit code. */
        fb_job_exited(job, 255);
    } else if (status == 200 && s &&
               (strcmp(s, "exited") == 0 || strcmp(s, "dead") == 0 ||
                strcmp(s, "removing") == 0)) {
        fb_job_exited(job, fb_exit_status_of_code((long)code));
    } else if (status != 200) {
        const char *msg = json_string_value(json_object_get(reply, "message"));
        rc = fb_err(FIBER_EBACKEND,
                    "cannot inspect container %.12s (HTTP %ld): %s", dj->id,
                    status, msg ? msg : "no reason given");
    }
    json_decref(reply);
    return rc;
}

/* Reads the exit code from a completed wait; returns 0, or -1 if the
 * wait did not complete normally. */
static int wait_result(const struct fb_http_async *w, int *status)
{
    if (!w->done || w->failed || w->status != 200)
        return -1;
    json_t *j = json_loadb((const char *)w->body.data, w->body.len, 0, NULL);
    json_t *code = json_object_get(j, "StatusCode");
    int ok = json_is_integer(code);
    if (ok)
        *status = fb_exit_status_of_code((long)json_integer_value(code));
    json_decref(j);
    return ok ? 0 : -1;
}

static int docker_poll_job(struct fb_backend *be, struct fb_job *job)
{
    struct docker_state *ds = be->state;
    struct docker_job *dj = job->priv;
    uint64_t now = fb_now_ms();
    if (now - ds->last_pump_ms >= PUMP_INTERVAL_MS) {
        fb_http_pump(&ds->engine.http);
        ds->last_pump_ms = now;
    }
    if (!dj->wait.done)
        return 0;
    int status;
    if (wait_result(&dj->wait, &status) == 0) {
        fb_job_exited(job, status);
        return 0;
    }
    if (now < dj->next_inspect_ms)
        return 0;
    dj->next_inspect_ms = now + INSPECT_INTERVAL_MS;
    return inspect(ds, job);
}

static int docker_signal_job(struct fb_backend *be, struct fb_job *job,
                             int force)
{
    struct docker_state *ds = be->state;
    struct docker_job *dj = job->priv;
    char path[256];
    snprintf(path, sizeof path, "/containers/%s/kill?signal=%s", dj->id,
             force ? "SIGKILL" : "SIGTERM");
    struct fb_http_reply r;
    int rc = fb_http_request(&ds->engine.http, "POST", path, NULL, 0, NULL,
                             REQUEST_TIMEOUT_MS, &r);
    /* 404: removed already; 409: not running any more. */
    if (rc == 0 && r.status != 204 && r.status != 404 && r.status != 409) {
        char msg[300];
        rc = fb_err(FIBER_EBACKEND,
                    "cannot signal container %.12s (HTTP %ld): %s", dj->id,
                    r.status,
                    fb_http_message(r.body.data, r.body.len, msg, sizeof msg));
    }
    fb_http_reply_free(&r);
    return rc;
}

/* Appends the frames of a multiplexed log stream (8-byte headers: stream,
 * three zero bytes, big-endian length) to out, both streams in the order
 * written; a stream without such headers (a TTY) is copied whole. */
static int demux(const unsigned char *p, size_t len, fiber_buf *out)
{
    size_t off = 0;
    while (off + 8 <= len && p[off] <= 2 && p[off + 1] == 0 &&
           p[off + 2] == 0 && p[off + 3] == 0) {
        size_t n = ((size_t)p[off + 4] << 24) | ((size_t)p[off + 5] << 16) |
                   ((size_t)p[off + 6] << 8) | p[off + 7];
        if (n > len - off - 8)
            n = len - off - 8; /* cut short: keep what arrived */
        if (fiber_buf_append(out, p + off + 8, n) != 0)
            return fb_err(FIBER_ENOMEM, "out of memory reading logs");
        off += 8 + n;
    }
    if (off < len && fiber_buf_append(out, p + off, len - off) != 0)
        return fb_err(FIBER_ENOMEM, "out of memory reading logs");
    return 0;
}

static int docker_logs(struct fb_backend *be, struct fb_job *job,
                       fiber_buf *out)
{
    struct docker_state *ds = be->state;
    struct docker_job *dj = job->priv;
    char path[256];
    snprintf(path, sizeof path, "/containers/%s/logs?stdout=1&stderr=1",
             dj->id);
    struct fb_http_reply r;
    int rc = fb_http_request(&ds->engine.http, "GET", path, NULL, 0, NULL,
                             REQUEST_TIMEOUT_MS, &r);
    if (rc == 0 && r.status == 200) {
        rc = demux(r.body.data, r.body.len, out);
    } else if (rc == 0 && r.status == 404) {
        rc = fb_err(FIBER_ESTATE,
                    "container %.12s is gone: docker jobs are removed when "
                    "they end, and their output with them; fiber's own log "
                    "lines are in the run's log directory",
                    dj->id);
    } else if (rc == 0) {
        char msg[300];
        rc = fb_err(FIBER_EBACKEND,
                    "cannot read the logs of container %.12s (HTTP %ld): %s",
                    dj->id, r.status,
                    fb_http_message(r.body.data, r.body.len, msg, sizeof msg));
    }
    fb_http_reply_free(&r);
    return rc;
}

static void docker_release_job(struct fb_backend *be, struct fb_job *job)
{
    struct docker_state *ds = be->state;
    struct docker_job *dj = job->priv;
    if (job->state != FB_JOB_EXITED) {
        remove_container(ds, dj);
        /* The wait answers as the container dies; without it, the status
         * is what SIGKILL gives. */
        fb_http_async_wait(&ds->engine.http, &dj->wait, RELEASE_WAIT_MS);
        int status;
        fb_job_exited(job, wait_result(&dj->wait, &status) == 0 ? status
                                                               : -SIGKILL);
    }
    fb_http_async_free(&ds->engine.http, &dj->wait);
    if (dj->secret_path[0])
        unlink(dj->secret_path);
    dj->secret_path[0] = '\0';
}

const struct fb_backend_ops fb_backend_docker = {
    .name = "docker",
    /* Containers may not share this host's unix sockets; on the default
     * host network they share its loopback. */
    .caps = FB_CAP_LOOPBACK,
    .state_size = sizeof(struct docker_state),
    .job_size = sizeof(struct docker_job),
    .init = docker_init,
    .fini = docker_fini,
    .create_job = docker_create_job,
    .event_fd = docker_event_fd,
    .poll_job = docker_poll_job,
    .signal_job = docker_signal_job,
    .logs = docker_logs,
    .release_job = docker_release_job,
};
