/*
 * runs.c -- the docker backend's run ops (backend/runops.h): a run's
 * containers, found by their fiber.run label (runtime/runid.h), and a master
 * started in a container of its own.
 *
 * The containers a kubelet makes for pods carry their pod's labels too
 * (fiber.run among them); they are the kubernetes backend's to list
 * (io.kubernetes.* labels tell them apart), not these.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/docker/image.h"
#include "backend/runops.h"
#include "base/common.h"
#include "runtime/runid.h"

/* The label a kubelet puts on the containers of a pod. */
#define KUBELET_LABEL "io.kubernetes.pod.name"

/* ======================================================================
 * list
 * ====================================================================== */

/* The containers labelled fiber.run (=only, when given), as parsed JSON. */
static int list_containers(struct fb_engine *e, const char *only,
                           json_t **out)
{
    char filter[256], escaped[768], path[1024];
    if (only)
        snprintf(filter, sizeof filter, "{\"label\":[\"%s=%s\"]}",
                 FB_LABEL_RUN, only);
    else
        snprintf(filter, sizeof filter, "{\"label\":[\"%s\"]}", FB_LABEL_RUN);
    int rc = fb_engine_escape(filter, escaped, sizeof escaped);
    if (rc)
        return rc;
    snprintf(path, sizeof path, "/containers/json?all=1&filters=%s", escaped);
    return fb_engine_json(e, "GET", path, NULL, out, "listing containers");
}

static const char *label_of(json_t *c, const char *key)
{
    const char *v = json_string_value(
        json_object_get(json_object_get(c, "Labels"), key));
    return v ? v : "";
}

static int add_container_job(fiber_run_info *r, json_t *c)
{
    const char *name = label_of(c, FB_LABEL_NAME);
    if (!*name) {
        const char *cname = json_string_value(
            json_array_get(json_object_get(c, "Names"), 0));
        name = cname ? cname + (cname[0] == '/') : "?";
    }
    const char *role = label_of(c, FB_LABEL_ROLE);
    const char *state = json_string_value(json_object_get(c, "State"));
    const char *id = json_string_value(json_object_get(c, "Id"));
    char short_id[13];
    snprintf(short_id, sizeof short_id, "%.12s", id ? id : "");
    return fb_runs_add_job(r, name, *role ? role : "job", state ? state : "?",
                           json_string_value(json_object_get(c, "Status")),
                           -1, short_id)
               ? 0
               : FIBER_ENOMEM;
}

/* Adds containers to the list; a run with containers is a docker run,
 * alive while its master container (or, without one, any of its
 * containers) runs. */
static int docker_list(fiber_run_list *l, const char *only)
{
    struct stat st;
    struct fb_engine e;
    int rc = fb_engine_open(&e);
    if (rc) {
        /* No daemon here at all is normal: say nothing.  A daemon that is
         * there but unusable deserves a word. */
        if (!(rc == FIBER_EUNREACHABLE && e.socket[0] &&
              stat(e.socket, &st) != 0 && errno == ENOENT))
            fb_runs_warn(l, "containers not listed: %s", fiber_last_error());
        return 0;
    }
    json_t *list = NULL;
    rc = list_containers(&e, only, &list);
    fb_engine_close(&e);
    if (rc) {
        fb_runs_warn(l, "containers not listed: %s", fiber_last_error());
        return 0;
    }
    size_t i;
    json_t *c;
    json_array_foreach(list, i, c)
    {
        const char *run = label_of(c, FB_LABEL_RUN);
        if (!fb_run_id_valid(run) || *label_of(c, KUBELET_LABEL))
            continue;
        fiber_run_info *r = fb_runs_add_run(l, run, "docker");
        if (!r || add_container_job(r, c) != 0) {
            rc = FIBER_ENOMEM;
            break;
        }
        fb_strlcpy(r->backend, "docker", sizeof r->backend);
        /* A running container of the run: its master (fiber.role master)
         * or a job, which lives only as long as its master. */
        if (fb_runs_job_running(&r->jobs[r->n_jobs - 1]))
            r->alive = 1;
    }
    json_decref(list);
    return rc;
}

/* ======================================================================
 * logs
 * ====================================================================== */

struct to_buf {
    struct fb_demux demux;
    fiber_buf *out;
};

static int to_buf(void *ud, int stream, const void *data, size_t len)
{
    FB_UNUSED(stream);
    return fiber_buf_append(ud, data, len) ? fb_err(FIBER_ENOMEM,
                                                    "out of memory")
                                           : 0;
}

static int demux_to_buf(void *ud, const void *data, size_t len)
{
    struct to_buf *s = ud;
    return fb_demux_feed(&s->demux, data, len, to_buf, s->out);
}

static int container_logs(struct fb_engine *e, const fiber_job_info *j,
                          fiber_buf *out)
{
    char path[256], what[128];
    snprintf(path, sizeof path,
             "/containers/%s/logs?stdout=1&stderr=1&timestamps=0",
             j->engine_id);
    snprintf(what, sizeof what, "logs of container %s", j->engine_id);
    struct to_buf s = {.out = out};
    return fb_engine_stream(e, "GET", path, demux_to_buf, &s, what);
}

static int docker_logs(const fiber_run_info *r, const char *job,
                       int headings, fiber_buf *out)
{
    struct fb_engine e = {0};
    int rc = 0, engine_open = 0, found = 0;
    for (size_t i = 0; rc == 0 && i < r->n_jobs; i++) {
        const fiber_job_info *j = &r->jobs[i];
        if (!j->engine_id[0] || (job && strcmp(job, j->name) != 0))
            continue;
        if (!engine_open && (rc = fb_engine_open(&e)) != 0)
            break;
        engine_open = 1;
        if (headings)
            rc = fb_runs_heading(out, j->name);
        if (rc == 0)
            rc = container_logs(&e, j, out);
        found++;
    }
    if (engine_open)
        fb_engine_close(&e);
    return rc == 0 && !found ? FIBER_ENOKEY : rc;
}

/* ======================================================================
 * kill and clean
 * ====================================================================== */

static int is_running_container(const fiber_job_info *j)
{
    return j->engine_id[0] && fb_runs_job_running(j);
}

static int container_running(struct fb_engine *e, const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/containers/%s/json", id);
    json_t *j = NULL;
    if (fb_engine_json(e, "GET", path, NULL, &j, "inspecting a container"))
        return 0;
    int running = json_is_true(
        json_object_get(json_object_get(j, "State"), "Running"));
    json_decref(j);
    return running;
}

static int signal_container(struct fb_engine *e, const char *id,
                            const char *sig)
{
    char path[160];
    snprintf(path, sizeof path, "/containers/%s/kill?signal=%s", id, sig);
    return fb_engine_json(e, "POST", path, NULL, NULL, "stopping a container");
}

/* Waits for j's container to stop until deadline, then kills it. */
static void finish_container(struct fb_engine *e, const fiber_job_info *j,
                             uint64_t deadline, fiber_buf *rep)
{
    while (container_running(e, j->engine_id) && fb_ms_left(deadline)) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (container_running(e, j->engine_id)) {
        signal_container(e, j->engine_id, "SIGKILL");
        fb_runs_report(rep, "killed container %s (%s) with SIGKILL after "
                            "the grace period",
                       j->engine_id, j->name);
    } else {
        fb_runs_report(rep, "stopped container %s (%s)", j->engine_id,
                       j->name);
    }
}

static int docker_kill(const fiber_run_info *r, fiber_buf *rep, int *stopped)
{
    int rc = 0, any = 0;
    for (size_t i = 0; i < r->n_jobs; i++)
        any |= is_running_container(&r->jobs[i]);
    if (!any)
        return 0;
    struct fb_engine e;
    if ((rc = fb_engine_open(&e)) != 0)
        return rc;
    for (size_t i = 0; i < r->n_jobs; i++) {
        const fiber_job_info *j = &r->jobs[i];
        if (!is_running_container(j))
            continue;
        int k = signal_container(&e, j->engine_id, "SIGTERM");
        if (k && k != FIBER_ENOKEY) {
            fb_runs_report(rep, "cannot stop container %s (%s): %s",
                           j->engine_id, j->name, fiber_last_error());
            rc = k;
        }
    }
    uint64_t deadline = fb_deadline_ms(fb_runs_grace_ms());
    for (size_t i = 0; i < r->n_jobs; i++) {
        if (!is_running_container(&r->jobs[i]))
            continue;
        finish_container(&e, &r->jobs[i], deadline, rep);
        (*stopped)++;
    }
    fb_engine_close(&e);
    return rc;
}

/* Removes the run's containers that have stopped.  A container that was
 * created but not started yet is left alone unless the run was named: a
 * master elsewhere may be about to start it. */
static int docker_clean(const fiber_run_info *r, int named, fiber_buf *rep)
{
    struct fb_engine e;
    int rc = 0, engine_open = 0;
    for (size_t i = 0; i < r->n_jobs && rc == 0; i++) {
        const fiber_job_info *j = &r->jobs[i];
        if (!j->engine_id[0])
            continue;
        if (!named && strcmp(j->state, "created") == 0) {
            fb_runs_report(rep, "left container %s (%s) of run %s: created, "
                                "not started yet",
                           j->engine_id, j->name, r->run);
            continue;
        }
        if (fb_runs_job_running(j) || strcmp(j->state, "paused") == 0 ||
            strcmp(j->state, "restarting") == 0) {
            fb_runs_report(rep, "left container %s (%s) of run %s: it still "
                                "runs; fiber kill %s stops it",
                           j->engine_id, j->name, r->run, r->run);
            continue;
        }
        if (!engine_open && (rc = fb_engine_open(&e)) != 0)
            break;
        engine_open = 1;
        char path[128];
        snprintf(path, sizeof path, "/containers/%s?v=1", j->engine_id);
        int k = fb_engine_json(&e, "DELETE", path, NULL, NULL,
                               "removing a container");
        if (k == 0 || k == FIBER_ENOKEY)
            fb_runs_report(rep, "removed container %s (%s) of run %s",
                           j->engine_id, j->name, r->run);
        else
            rc = k;
    }
    if (engine_open)
        fb_engine_close(&e);
    return rc;
}

/* ======================================================================
 * start, follow, wait
 * ====================================================================== */

/* The image to run: the caller's, or the program's default tag, built
 * when the daemon does not have it yet. */
static int choose_image(const char *program, const fiber_run_opts *o,
                        char *out, size_t size)
{
    if (o->image) {
        fb_strlcpy(out, o->image, size);
        return 0;
    }
    int rc = fiber_image_default_tag(program, out, size);
    fiber_image_info info;
    if (rc == 0)
        rc = fiber_image_inspect(out, &info);
    if (rc == FIBER_ENOKEY) {
        char line[600];
        if (o->progress) {
            snprintf(line, sizeof line, "building image %s from %s (the "
                     "daemon does not have it yet)", out, program);
            o->progress(o->progress_ud, line);
        }
        fiber_image_build_opts b = {.tag = out,
                                    .progress = o->progress,
                                    .progress_ud = o->progress_ud};
        fiber_buf id = {0};
        rc = fiber_image_build_with(program, &b, &id);
        fiber_buf_free(&id);
    }
    return rc;
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

static json_t *container_spec(const struct fb_run_start *s, const char *image,
                              const char *program, const char *const *vars,
                              size_t n_vars, const char *socket,
                              const char *base)
{
    char user[64], tmpdir[PATH_MAX + 8];
    snprintf(user, sizeof user, "%u:%u", (unsigned)geteuid(),
             (unsigned)getegid());
    /* base is "<TMPDIR>/fiber-<uid>": the master must pick the same. */
    snprintf(tmpdir, sizeof tmpdir, "TMPDIR=%.*s",
             (int)(strrchr(base, '/') - base), base);
    json_t *env = string_array(vars, n_vars, NULL);
    if (env)
        json_array_insert_new(env, 0, json_string(tmpdir));
    size_t argc = 0;
    while (s->argv[argc])
        argc++;
    json_t *labels = json_pack("{s:s, s:s, s:s, s:s}", FB_LABEL_RUN, s->run,
                               FB_LABEL_ROLE, "master", FB_LABEL_NAME,
                               "master", FB_LABEL_JOB, "0");
    return json_pack("{s:s, s:o, s:o, s:o, s:s, s:s, s:b, s:o}", "Image",
                     image, "Cmd", string_array(s->argv, argc, program),
                     "Env", env, "Labels", labels, "User", user,
                     "WorkingDir", "/", "Tty", 0, "HostConfig",
                     host_config(s->opts, socket, base));
}

/* Creates and starts the master's container; its id in r->engine_id. */
static int create_master(struct fb_engine *e, json_t *spec,
                         struct fiber_run *r)
{
    char path[400];
    snprintf(path, sizeof path, "/containers/create?name=%s-master", r->name);
    json_t *created = NULL;
    int rc = spec ? fb_engine_json(e, "POST", path, spec, &created,
                                   "creating the master's container")
                  : fb_err(FIBER_ENOMEM, "out of memory");
    const char *id = json_string_value(json_object_get(created, "Id"));
    if (rc == 0 && !id)
        rc = fb_err(FIBER_EBACKEND, "the Docker Engine created a container "
                                    "but did not say its id");
    if (rc == 0) {
        fb_strlcpy(r->engine_id, id, sizeof r->engine_id);
        snprintf(path, sizeof path, "/containers/%s/start", r->engine_id);
        rc = fb_engine_json(e, "POST", path, NULL, NULL,
                            "starting the master's container");
        if (rc) {
            char why[1024];
            fb_strlcpy(why, fiber_last_error(), sizeof why);
            snprintf(path, sizeof path, "/containers/%s?force=1",
                     r->engine_id);
            fb_engine_json(e, "DELETE", path, NULL, NULL, "cleaning up");
            r->engine_id[0] = '\0';
            rc = fb_err(FIBER_ESPAWN, "%s", why);
        }
    } else if (rc == FIBER_ENOKEY) {
        rc = fb_err(FIBER_ESPAWN, "%s", fiber_last_error());
    }
    json_decref(created);
    return rc;
}

static int docker_start(const struct fb_run_start *s, struct fiber_run *r)
{
    char image[320], program[PATH_MAX], base[PATH_MAX], var[340];
    fiber_image_info img;
    int rc = choose_image(s->argv[0], s->opts, image, sizeof image);
    if (rc == 0)
        rc = fiber_image_inspect(image, &img);
    if (rc == 0)
        rc = fb_run_program_in_image(s->argv[0], &img, program,
                                     sizeof program);
    if (rc == 0)
        rc = fb_run_base(base, sizeof base);
    if (rc == 0)
        rc = fb_private_dir(base);
    if (rc)
        return rc;
    snprintf(var, sizeof var, "FIBER_IMAGE=%s", image);
    size_t n_vars;
    const char **vars = fb_run_vars_with(s, var, &n_vars);
    if (!vars)
        return FIBER_ENOMEM;
    struct fb_engine e;
    if ((rc = fb_engine_open(&e)) == 0) {
        json_t *spec = container_spec(s, image, program, vars, n_vars,
                                      e.socket, base);
        rc = create_master(&e, spec, r);
        json_decref(spec);
        fb_engine_close(&e);
    }
    free(vars);
    return rc;
}

struct follow_state {
    struct fb_demux demux;
    int fds[3]; /* by stream number: 1 stdout, 2 stderr */
};

static int write_all(int fd, const void *data, size_t len)
{
    if (fb_write_all(fd, data, len) != 0)
        return fb_err_errno(FIBER_ESYS, "writing the run's output");
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

static int docker_follow(struct fiber_run *r, int out_fd, int err_fd)
{
    struct fb_engine e;
    int rc = fb_engine_open(&e);
    if (rc)
        return rc;
    struct follow_state s = {.fds = {-1, out_fd, err_fd}};
    char path[400];
    snprintf(path, sizeof path,
             "/containers/%s/logs?follow=1&stdout=1&stderr=1", r->engine_id);
    rc = fb_engine_stream(&e, "GET", path, follow_sink, &s,
                          "following the master's output");
    fb_engine_close(&e);
    return rc;
}

static int docker_wait(struct fiber_run *r, int timeout_ms, int *exit_code)
{
    struct fb_engine e;
    int rc = fb_engine_open(&e);
    if (rc)
        return rc;
    char path[400];
    snprintf(path, sizeof path, "/containers/%s/wait", r->engine_id);
    fiber_buf resp = {0};
    long status = 0;
    rc = fb_engine_request(&e, "POST", path, NULL, NULL, 0, &resp, &status,
                           timeout_ms < 0   ? 0
                           : timeout_ms > 0 ? timeout_ms
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
                    r->engine_id, status,
                    resp.len ? (const char *)resp.data : "");
    if (rc == 0 && exit_code)
        *exit_code = (int)json_integer_value(json_object_get(j, "StatusCode"));
    json_decref(j);
    fiber_buf_free(&resp);
    fb_engine_close(&e);
    return rc;
}

const struct fb_run_ops fb_run_ops_docker = {
    .name = "docker",
    .job_noun = "container",
    .describe = fb_engine_describe,
    .start = docker_start,
    .follow = docker_follow,
    .wait = docker_wait,
    .list = docker_list,
    .logs = docker_logs,
    .kill = docker_kill,
    .clean = docker_clean,
};
