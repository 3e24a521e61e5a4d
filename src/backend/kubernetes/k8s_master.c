/*
 * k8s_master.c -- a run's master as a pod; see k8s_master.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "backend/kubernetes/k8s_api.h"
#include "backend/kubernetes/k8s_master.h"
#include "base/common.h"
#include "base/log.h"
#include "runtime/runid.h"

#define REQUEST_TIMEOUT_MS 30000L
#define POLL_MS 200

/* Reads the caller's kubernetes keys (fiber_config_get: the defaults,
 * .fiberconfig and FIBER_* variables) into c. */
static int read_config(struct fb_config *c)
{
    static const char *const keys[] = {"k8s_server",       "k8s_token_file",
                                       "k8s_ca_file",      "k8s_namespace",
                                       "k8s_config_dir",   "k8s_host_network",
                                       "k8s_pull_policy",  "k8s_volumes"};
    fb_config_defaults(c);
    for (size_t i = 0; i < FB_ARRAY_LEN(keys); i++) {
        char v[600];
        int rc = fiber_config_get(keys[i], v, sizeof v);
        if (rc == 0)
            rc = fb_config_apply(c, keys[i], v, "configuration");
        if (rc)
            return rc;
    }
    return 0;
}

int fb_k8s_open_configured(struct fb_k8s *k, int *configured)
{
    if (configured) {
        char server[600];
        *configured = getenv("KUBERNETES_SERVICE_HOST") != NULL ||
                      (fiber_config_get("k8s_server", server, sizeof server) ==
                           0 &&
                       server[0]);
        if (!*configured)
            return 0;
    }
    struct fb_config c;
    int rc = read_config(&c);
    return rc ? rc : fb_k8s_open(k, &c);
}

static json_t *env_of(const char *const *vars, size_t n_vars, const char *ns)
{
    json_t *env = json_array();
    for (size_t i = 0; env && i < n_vars; i++) {
        const char *eq = strchr(vars[i], '=');
        if (eq)
            json_array_append_new(env, json_pack("{s:s%, s:s}", "name",
                                                 vars[i],
                                                 (size_t)(eq - vars[i]),
                                                 "value", eq + 1));
    }
    if (env) {
        json_array_append_new(env, json_pack("{s:s, s:s}", "name",
                                             "FIBER_K8S_NAMESPACE", "value",
                                             ns));
        json_array_append_new(
            env, json_pack("{s:s, s:{s:{s:s}}}", "name", "FIBER_LISTEN_HOST",
                           "valueFrom", "fieldRef", "fieldPath",
                           "status.podIP"));
    }
    return env;
}

/* A requeueable master (fiber run --requeue): the pod as the template of
 * a Job of the same name, which the Job controller recreates when the pod
 * is deleted (kubectl delete, a drain, pre-emption).  backoffLimit 0: a
 * master that fails by itself is not run again. */
static json_t *as_job(json_t *pod)
{
    json_t *md = json_object_get(pod, "metadata");
    json_t *job = json_pack(
        "{s:s, s:s, s:{s:O, s:O}, s:{s:i, s:i, s:i, s:{s:{s:O}, s:O}}}",
        "apiVersion", "batch/v1", "kind", "Job", "metadata", "name",
        json_object_get(md, "name"), "labels", json_object_get(md, "labels"),
        "spec", "backoffLimit", 0, "completions", 1, "parallelism", 1,
        "template", "metadata", "labels", json_object_get(md, "labels"),
        "spec", json_object_get(pod, "spec"));
    json_decref(pod);
    return job;
}

int fb_k8s_master_start(const char *run, const char *const *argv,
                        const fiber_run_opts *o, const char *const *vars,
                        size_t n_vars, const char *image, char *pod,
                        size_t size)
{
    struct fb_k8s k;
    struct fb_config c;
    int rc = read_config(&c);
    if (rc == 0)
        rc = fb_k8s_open(&k, &c);
    if (rc)
        return rc;
    char name[64], run_label[48], q[32];
    fb_k8s_dns_name(run, run_label, sizeof run_label);
    snprintf(name, sizeof name, "%s-master", run_label);
    json_t *args = json_array(), *limits = json_object();
    for (size_t i = 1; argv[i]; i++)
        json_array_append_new(args, json_string(argv[i]));
    if (o->cpu > 0) {
        snprintf(q, sizeof q, "%d", o->cpu);
        json_object_set_new(limits, "cpu", json_string(q));
    }
    if (o->memory_mb > 0) {
        snprintf(q, sizeof q, "%dMi", o->memory_mb);
        json_object_set_new(limits, "memory", json_string(q));
    }
    if (o->gpu > 0) {
        snprintf(q, sizeof q, "%d", o->gpu);
        json_object_set_new(limits, "nvidia.com/gpu", json_string(q));
    }
    json_t *body = json_pack(
        "{s:s, s:s, s:{s:s, s:{s:s, s:s, s:s, s:s}},"
        " s:{s:s, s:b, s:b, s:[{s:s, s:s, s:[s], s:o, s:o, s:{s:o}}]}}",
        "apiVersion", "v1", "kind", "Pod", "metadata", "name", name, "labels",
        FB_LABEL_RUN, run_label, FB_LABEL_ROLE, "master", FB_LABEL_JOB, "0",
        "app.kubernetes.io/managed-by", "fiber", "spec", "restartPolicy",
        "Never", "enableServiceLinks", 0, "shareProcessNamespace", 1,
        "containers", "name", "master",
        "image", image, "command", argv[0], "args", args, "env",
        env_of(vars, n_vars, k.ns), "resources", "limits", limits);
    /* The master's pod is made like its jobs' pods will be, and the master
     * makes them with the same two keys. */
    json_t *spec = json_object_get(body, "spec");
    json_t *container = json_array_get(json_object_get(spec, "containers"), 0);
    json_t *env = json_object_get(container, "env");
    if (body && c.k8s_host_network) {
        /* On the node's network the pod's hostname is the node's; the
         * master finds its own pod (the owner of its jobs' pods) by the
         * name in HOSTNAME, so that is set to the pod's name. */
        json_object_set_new(spec, "hostNetwork", json_true());
        json_array_append_new(
            env, json_pack("{s:s, s:{s:{s:s}}}", "name", "HOSTNAME",
                           "valueFrom", "fieldRef", "fieldPath",
                           "metadata.name"));
        json_array_append_new(env, json_pack("{s:s, s:s}", "name",
                                             "FIBER_K8S_HOST_NETWORK",
                                             "value", "true"));
    }
    if (body && c.k8s_pull_policy[0]) {
        json_object_set_new(container, "imagePullPolicy",
                            json_string(c.k8s_pull_policy));
        json_array_append_new(env, json_pack("{s:s, s:s}", "name",
                                             "FIBER_K8S_PULL_POLICY", "value",
                                             c.k8s_pull_policy));
    }
    if (body && c.k8s_volumes[0]) {
        /* The master's pod mounts the claims too (a checkpoint goes on
         * one), and hands them to its jobs. */
        json_t *volumes = json_array(), *mounts = json_array();
        rc = fb_k8s_add_claims(c.k8s_volumes, volumes, mounts);
        json_object_set_new(spec, "volumes", volumes);
        json_object_set_new(container, "volumeMounts", mounts);
        json_array_append_new(env, json_pack("{s:s, s:s}", "name",
                                             "FIBER_K8S_VOLUMES", "value",
                                             c.k8s_volumes));
    }
    if (body && o->signal_s > 0) /* the time from SIGTERM to SIGKILL */
        json_object_set_new(spec, "terminationGracePeriodSeconds",
                            json_integer(o->signal_s));
    if (body && o->requeue) {
        json_array_append_new(env, json_pack("{s:s, s:s}", "name",
                                             "FIBER_BOOT_REQUEUE", "value",
                                             "1"));
        body = as_job(body);
    }
    char path[300], what[200];
    snprintf(path, sizeof path, o->requeue ? "/apis/batch/v1/namespaces/%s/jobs"
                                           : "/api/v1/namespaces/%s/pods",
             k.ns);
    snprintf(what, sizeof what, "creating the master's %s %s in namespace "
             "'%s'", o->requeue ? "Job" : "pod", name, k.ns);
    long status = 0;
    json_t *reply = NULL;
    if (rc == 0)
        rc = body ? fb_k8s_json(&k, "POST", path, body, NULL,
                                REQUEST_TIMEOUT_MS, &status, &reply)
                  : fb_err(FIBER_ENOMEM, "out of memory");
    if (rc == 0 && status != 201 && status != 200)
        rc = fb_k8s_refused(&k, FIBER_ESPAWN, what, status, reply);
    if (rc == 0)
        fb_strlcpy(pod, name, size);
    json_decref(body);
    json_decref(reply);
    fb_k8s_close(&k);
    return rc;
}

/* A pod's end, from its JSON: 1 and *code once it ended, else 0. */
static int pod_exit(json_t *p, int *code)
{
    json_t *st = json_object_get(p, "status");
    const char *phase = json_string_value(json_object_get(st, "phase"));
    json_t *term = json_object_get(
        json_object_get(json_array_get(json_object_get(st,
                                                       "containerStatuses"),
                                       0),
                        "state"),
        "terminated");
    if (json_is_integer(json_object_get(term, "exitCode"))) {
        *code = (int)json_integer_value(json_object_get(term, "exitCode"));
        return 1;
    }
    if (phase && (strcmp(phase, "Succeeded") == 0 ||
                  strcmp(phase, "Failed") == 0)) {
        *code = strcmp(phase, "Succeeded") == 0 ? 0 : 137;
        return 1;
    }
    return 0;
}

/* GETs path into *out; 0 with *status, or a negative code. */
static int get(struct fb_k8s *k, const char *path, long *status, json_t **out)
{
    *out = NULL;
    return fb_k8s_json(k, "GET", path, NULL, NULL, REQUEST_TIMEOUT_MS, status,
                       out);
}

/* Reads the pod's end: 1 and *code once it ended, 0 while it runs, or a
 * negative code. */
static int pod_ended(struct fb_k8s *k, const char *pod, int *code)
{
    char path[400], what[300];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods/%s", k->ns, pod);
    long status = 0;
    json_t *p = NULL;
    int rc = get(k, path, &status, &p);
    if (rc == 0 && status == 404) {
        *code = 137; /* deleted before it ended */
        rc = 1;
    } else if (rc == 0 && status != 200) {
        snprintf(what, sizeof what, "reading pod %s", pod);
        rc = fb_k8s_refused(k, FIBER_EBACKEND, what, status, p);
    } else if (rc == 0) {
        rc = pod_exit(p, code);
    }
    json_decref(p);
    return rc;
}

/* The master pods of run (label value) as a parsed list, in *out. */
static int master_pods(struct fb_k8s *k, const char *run, json_t **out)
{
    char path[400];
    snprintf(path, sizeof path,
             "/api/v1/namespaces/%s/pods?labelSelector=%s%%3D%s%%2C%s%%3D"
             "master",
             k->ns, FB_LABEL_RUN, run, FB_LABEL_ROLE);
    long status = 0;
    int rc = get(k, path, &status, out);
    if (rc == 0 && status != 200)
        rc = fb_k8s_refused(k, FIBER_EBACKEND, "listing the run's master "
                            "pods", status, *out);
    return rc;
}

static const char *created(json_t *pod)
{
    const char *t = json_string_value(json_object_get(
        json_object_get(pod, "metadata"), "creationTimestamp"));
    return t ? t : "";
}

static const char *name_of(json_t *pod)
{
    const char *n = json_string_value(
        json_object_get(json_object_get(pod, "metadata"), "name"));
    return n ? n : "";
}

/* The newest pod of list (by creation; RFC 3339 times compare as
 * strings), or NULL. */
static json_t *newest(json_t *list)
{
    json_t *best = NULL, *pod;
    size_t i;
    json_array_foreach(json_object_get(list, "items"), i, pod)
    {
        if (!best || strcmp(created(pod), created(best)) >= 0)
            best = pod;
    }
    return best;
}

/* The run's label: a master's Job is named "<run>-master". */
static void run_of_job(const char *job, char *run, size_t size)
{
    fb_strlcpy(run, job, size);
    size_t n = strlen(run);
    if (n > 7 && strcmp(run + n - 7, "-master") == 0)
        run[n - 7] = '\0';
}

/* Whether the Job has finished: 1 (Complete or Failed), 2 (it is gone),
 * 0 (not yet), or a negative code. */
static int job_finished(struct fb_k8s *k, const char *job)
{
    char path[400];
    snprintf(path, sizeof path, "/apis/batch/v1/namespaces/%s/jobs/%s",
             k->ns, job);
    long status = 0;
    json_t *j = NULL;
    int rc = get(k, path, &status, &j);
    if (rc == 0 && status == 404)
        rc = 2;
    else if (rc == 0 && status != 200)
        rc = fb_k8s_refused(k, FIBER_EBACKEND, "reading the master's Job",
                            status, j);
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(json_object_get(j, "status"),
                                       "conditions"),
                       i, c)
    {
        const char *type = json_string_value(json_object_get(c, "type"));
        const char *on = json_string_value(json_object_get(c, "status"));
        if (rc == 0 && type && on && strcmp(on, "True") == 0 &&
            (strcmp(type, "Complete") == 0 || strcmp(type, "Failed") == 0))
            rc = 1;
    }
    json_decref(j);
    return rc;
}

/* Whether a master pod's exit status says it ended the run itself:
 * neither FIBER_EXIT_REQUEUE (stopped to be requeued) nor a signal's. */
static int ends_the_run(int code)
{
    return code != FIBER_EXIT_REQUEUE && code < 128;
}

/* A requeueable master's end: 1 and *code once its Job finished or went,
 * 0 while it runs, or a negative code.  The code is that of the newest
 * pod that ended the run itself (ends_the_run): a pod the Job controller
 * started after it (ended_by_itself: it counted a failure late) copies
 * that status, or is still starting, or is stopped with the Job, and
 * must not stand for the run.  Without such a pod, the newest pod's. */
static int job_ended(struct fb_k8s *k, const char *job, int *code)
{
    int rc = job_finished(k, job);
    if (rc <= 0)
        return rc;
    char run[64];
    run_of_job(job, run, sizeof run);
    json_t *l = NULL;
    int lrc = master_pods(k, run, &l);
    json_t *last = lrc == 0 ? newest(l) : NULL, *ender = NULL, *pod;
    int c, ender_code = 0;
    size_t i;
    json_array_foreach(json_object_get(l, "items"), i, pod)
    {
        if (pod_exit(pod, &c) && ends_the_run(c) &&
            (!ender || strcmp(created(pod), created(ender)) >= 0)) {
            ender = pod;
            ender_code = c;
        }
    }
    if (lrc)
        rc = lrc;
    else if (ender)
        *code = ender_code;
    else if (!last || !pod_exit(last, code))
        *code = rc == 1 ? 0 : 137; /* gone with its pods: killed */
    json_decref(l);
    return rc < 0 ? rc : 1;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int fb_k8s_master_wait(const char *pod, int is_job, int timeout_ms,
                       int *exit_code)
{
    struct fb_k8s k;
    int rc = fb_k8s_open_configured(&k, NULL);
    if (rc)
        return rc;
    uint64_t deadline = fb_deadline_ms(timeout_ms);
    int code = 0;
    while ((rc = is_job ? job_ended(&k, pod, &code)
                        : pod_ended(&k, pod, &code)) == 0) {
        int left = fb_ms_left(deadline);
        if (left == 0) {
            rc = fb_err(FIBER_ETIMEDOUT, "%s %s is still running",
                        is_job ? "Job" : "pod", pod);
            break;
        }
        sleep_ms(left >= 0 && left < POLL_MS ? left : POLL_MS);
    }
    fb_k8s_close(&k);
    if (rc == 1) {
        if (exit_code)
            *exit_code = code;
        return 0;
    }
    return rc;
}

/* Copies pod's log to fd until the pod ends. */
static int follow_pod(struct fb_k8s *k, const char *pod, int fd)
{
    int rc;
    /* The log endpoint refuses a pod whose container has not started. */
    char path[400];
    for (;;) {
        snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods/%s", k->ns,
                 pod);
        long status = 0;
        json_t *p = NULL;
        rc = get(k, path, &status, &p);
        const char *phase = json_string_value(
            json_object_get(json_object_get(p, "status"), "phase"));
        int pending = rc == 0 && status == 200 && phase &&
                      strcmp(phase, "Pending") == 0;
        json_decref(p);
        if (!pending)
            break;
        sleep_ms(POLL_MS);
    }
    if (rc)
        return rc;
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods/%s/log?follow=true",
             k->ns, pod);
    struct fb_k8s_watch w = {0};
    rc = fb_k8s_watch_start(k, &w, path, NULL, NULL);
    size_t written = 0;
    while (rc == 0) {
        int done = fb_k8s_watch_pump(&w, -1, 1000);
        while (w.status == 200 && w.line.len > written) {
            ssize_t n = write(fd, w.line.data + written, w.line.len - written);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            written += (size_t)n;
        }
        if (written == w.line.len)
            written = w.line.len = 0;
        if (done)
            break;
    }
    if (rc == 0 && w.status != 200) {
        json_t *reply = json_loadb((const char *)w.error_body.data,
                                   w.error_body.len, 0, NULL);
        char what[300];
        snprintf(what, sizeof what, "reading the log of pod %s", pod);
        rc = fb_k8s_refused(k, FIBER_EBACKEND, what, w.status, reply);
        json_decref(reply);
    } else if (rc == 0 && w.failed) {
        rc = fb_err(FIBER_EUNREACHABLE, "following the log of pod %s: %s",
                    pod, w.curl_error);
    }
    fb_k8s_watch_free(&w);
    return rc;
}

/* Follows the pods of a requeueable master's Job one after the other:
 * each new pod (the Job controller's replacement of a deleted one) once
 * the one before has ended, until the Job has finished. */
static int follow_job(struct fb_k8s *k, const char *job, int fd, int err_fd)
{
    char run[64], last[254] = "", line[600];
    run_of_job(job, run, sizeof run);
    int rc = 0, followed = 0;
    for (;;) {
        json_t *l = NULL;
        rc = master_pods(k, run, &l);
        json_t *pod = rc == 0 ? newest(l) : NULL;
        char name[254] = "";
        if (pod)
            fb_strlcpy(name, name_of(pod), sizeof name);
        json_decref(l);
        if (rc)
            break;
        if (name[0] && strcmp(name, last) != 0) {
            if (followed) {
                int n = snprintf(line, sizeof line,
                                 "fiber: the master's pod %s ended; its Job "
                                 "started %s\n",
                                 last, name);
                if (write(err_fd, line, (size_t)n) < 0) {
                    /* the caller's stream: nothing to do */
                }
            }
            fb_strlcpy(last, name, sizeof last);
            int f = follow_pod(k, name, fd);
            if (f && !followed)
                rc = f; /* the nodes serve no logs: say so */
            followed = 1;
            if (rc)
                break;
            continue;
        }
        int done = job_finished(k, job);
        if (done != 0) {
            rc = done < 0 ? done : 0;
            break;
        }
        sleep_ms(POLL_MS * 5);
    }
    return rc;
}

int fb_k8s_master_follow(const char *pod, int is_job, int fd, int err_fd)
{
    struct fb_k8s k;
    int rc = fb_k8s_open_configured(&k, NULL);
    if (rc == 0)
        rc = is_job ? follow_job(&k, pod, fd, err_fd)
                    : follow_pod(&k, pod, fd);
    fb_k8s_close(&k);
    return rc;
}

int fb_k8s_describe(char *detail, size_t size)
{
    struct fb_k8s k;
    int rc = fb_k8s_open_configured(&k, NULL);
    if (rc) {
        fb_strlcpy(detail, fiber_last_error(), size);
        return rc;
    }
    long status = 0;
    json_t *v = NULL;
    char version[64] = "?", path[300];
    rc = fb_k8s_json(&k, "GET", "/version", NULL, NULL, 10000, &status, &v);
    if (rc == 0 && status == 200 &&
        json_string_value(json_object_get(v, "gitVersion")))
        fb_strlcpy(version, json_string_value(json_object_get(v, "gitVersion")),
                   sizeof version);
    json_decref(v);
    v = NULL;
    if (rc == 0) {
        snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods?limit=1",
                 k.ns);
        rc = fb_k8s_json(&k, "GET", path, NULL, NULL, 10000, &status, &v);
        if (rc == 0 && status != 200) {
            char what[160];
            snprintf(what, sizeof what, "listing pods in namespace '%s'",
                     k.ns);
            rc = fb_k8s_refused(&k, FIBER_EUNREACHABLE, what, status, v);
        }
    }
    json_decref(v);
    if (rc)
        fb_strlcpy(detail, fiber_last_error(), size);
    else
        snprintf(detail, size, "Kubernetes %s at %s%s: namespace %s, pods "
                 "allowed", version, k.server,
                 k.in_cluster ? " (in-cluster)" : "", k.ns);
    fb_k8s_close(&k);
    return rc;
}

/* ---- fiber top: reaching a run's master through the cluster ------------ */

/* The value of variable name in the first container of pod, or NULL. */
static const char *pod_env(json_t *pod, const char *name)
{
    json_t *c = json_array_get(
        json_object_get(json_object_get(pod, "spec"), "containers"), 0);
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(c, "env"), i, v)
    {
        const char *n = json_string_value(json_object_get(v, "name"));
        if (n && strcmp(n, name) == 0)
            return json_string_value(json_object_get(v, "value"));
    }
    return NULL;
}

/* Address and encryption from the environment of one of run's job pods. */
static int contact_address(struct fb_k8s *k, const char *run, char *addr,
                           size_t size, int *encrypted)
{
    char path[400];
    snprintf(path, sizeof path,
             "/api/v1/namespaces/%s/pods?labelSelector=fiber.run%%3D%s"
             "%%2Cfiber.role%%3Djob",
             k->ns, run);
    long status = 0;
    json_t *l = NULL;
    int rc = fb_k8s_json(k, "GET", path, NULL, NULL, REQUEST_TIMEOUT_MS,
                         &status, &l);
    if (rc == 0 && status != 200)
        rc = fb_k8s_refused(k, FIBER_EBACKEND, "listing the run's pods",
                            status, l);
    const char *a = NULL, *enc = NULL;
    size_t i;
    json_t *pod;
    json_array_foreach(json_object_get(l, "items"), i, pod)
    {
        if ((a = pod_env(pod, "FIBER_BOOT_ADDR"))) {
            enc = pod_env(pod, "FIBER_ENCRYPTION");
            break;
        }
    }
    if (rc == 0 && !a)
        rc = fb_err(FIBER_ENOKEY,
                    "no pod of run '%s' in namespace '%s' names its master's "
                    "address (no job has started yet, or no such run)",
                    run, k->ns);
    if (rc == 0) {
        fb_strlcpy(addr, a, size);
        *encrypted = !enc || !(strcmp(enc, "false") == 0 ||
                               strcmp(enc, "0") == 0 ||
                               strcmp(enc, "off") == 0 ||
                               strcmp(enc, "no") == 0);
    }
    json_decref(l);
    return rc;
}

/* The token from the run's Secret <run>-boot. */
static int contact_token(struct fb_k8s *k, const char *run, uint8_t *token,
                         size_t len)
{
    char path[400], what[200];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/secrets/%s-boot",
             k->ns, run);
    snprintf(what, sizeof what, "reading Secret '%s-boot' (the run's token)",
             run);
    long status = 0;
    json_t *s = NULL;
    int rc = fb_k8s_json(k, "GET", path, NULL, NULL, REQUEST_TIMEOUT_MS,
                         &status, &s);
    if (rc == 0 && status == 404)
        rc = fb_err(FIBER_ENOKEY, "run '%s' has no Secret '%s-boot' in "
                    "namespace '%s'", run, run, k->ns);
    else if (rc == 0 && status != 200)
        rc = fb_k8s_refused(k, FIBER_EBACKEND, what, status, s);
    const char *b64 =
        json_string_value(json_object_get(json_object_get(s, "data"), "token"));
    size_t got = 0;
    if (rc == 0 &&
        (!b64 || sodium_base642bin(token, len, b64, strlen(b64), NULL, &got,
                                   NULL, sodium_base64_VARIANT_ORIGINAL) != 0 ||
         got != len))
        rc = fb_err(FIBER_EPROTO, "Secret '%s-boot' does not hold a token of "
                    "%zu bytes", run, len);
    json_decref(s); /* held the token */
    return rc;
}

int fb_k8s_run_contact(const char *run, char *addr, size_t size,
                       int *encrypted, uint8_t *token, size_t token_len)
{
    struct fb_k8s k;
    int rc = fb_k8s_open_configured(&k, NULL);
    if (rc)
        return rc;
    rc = contact_address(&k, run, addr, size, encrypted);
    if (rc == 0)
        rc = contact_token(&k, run, token, token_len);
    fb_k8s_close(&k);
    return rc;
}

/* ---- a requeueable master's start: its attempt, its predecessor -------- */

#define STARTS_ANNOTATION "fiber.starts"
#define BOOT_TRIES 10

/* Counts this start on the Job's annotation fiber.starts (a merge patch
 * that names the version it read, so two masters never count the same
 * start); the count before it in *before. */
static int count_start(struct fb_k8s *k, const char *job, int *before)
{
    char path[400], what[300], v[24];
    snprintf(path, sizeof path, "/apis/batch/v1/namespaces/%s/jobs/%s",
             k->ns, job);
    snprintf(what, sizeof what, "counting this master's start on Job %s "
             "(the account needs get and patch on jobs)", job);
    int rc = 0;
    for (int i = 0; rc == 0 && i < BOOT_TRIES; i++) {
        long status = 0;
        json_t *j = NULL, *reply = NULL;
        rc = get(k, path, &status, &j);
        if (rc == 0 && status != 200)
            rc = fb_k8s_refused(k, FIBER_EBACKEND, what, status, j);
        json_t *md = json_object_get(j, "metadata");
        const char *n = json_string_value(json_object_get(
            json_object_get(md, "annotations"), STARTS_ANNOTATION));
        const char *version =
            json_string_value(json_object_get(md, "resourceVersion"));
        long count = n ? strtol(n, NULL, 10) : 0;
        if (count < 0 || count > 1000000)
            count = 0;
        snprintf(v, sizeof v, "%ld", count + 1);
        json_t *patch = rc == 0 ? json_pack("{s:{s:s, s:{s:s}}}", "metadata",
                                            "resourceVersion",
                                            version ? version : "",
                                            "annotations", STARTS_ANNOTATION,
                                            v)
                                : NULL;
        json_decref(j);
        if (rc == 0)
            rc = fb_k8s_json(k, "PATCH", path, patch,
                             "application/merge-patch+json",
                             REQUEST_TIMEOUT_MS, &status, &reply);
        json_decref(patch);
        if (rc == 0 && status == 200) {
            *before = (int)count;
            json_decref(reply);
            return 0;
        }
        if (rc == 0 && status != 409) /* 409: another write came first */
            rc = fb_k8s_refused(k, FIBER_EBACKEND, what, status, reply);
        json_decref(reply);
    }
    return rc ? rc : fb_err(FIBER_EBACKEND, "%s: the Job kept changing", what);
}

/* Waits until every other master pod of run has ended or is gone (up to
 * its grace period and a minute), so that this master reads what its
 * predecessor's stop callbacks saved, and makes its jobs' pods and the
 * run's Secret once that master has removed its own. */
static int wait_predecessors(struct fb_k8s *k, const char *run)
{
    const char *self = getenv("HOSTNAME");
    uint64_t deadline = 0;
    for (;;) {
        json_t *l = NULL, *pod;
        int rc = master_pods(k, run, &l), waiting = 0, code;
        size_t i;
        json_array_foreach(json_object_get(l, "items"), i, pod)
        {
            if ((self && strcmp(name_of(pod), self) == 0) ||
                pod_exit(pod, &code))
                continue;
            if (!deadline) {
                json_t *g = json_object_get(json_object_get(pod, "spec"),
                                            "terminationGracePeriodSeconds");
                long grace = json_is_integer(g) ? (long)json_integer_value(g)
                                                : 30;
                deadline = fb_deadline_ms((int)(grace + 60) * 1000);
                fb_log_info("waiting for the master's previous pod %s to "
                            "end", name_of(pod));
            }
            waiting = 1;
        }
        json_decref(l);
        if (rc || !waiting)
            return rc;
        if (fb_ms_left(deadline) == 0) {
            fb_log_warn("the master's previous pod still runs: going on");
            return 0;
        }
        sleep_ms(POLL_MS);
    }
}

/* The status of an earlier master pod of the run that ended by itself
 * (an exit status that is neither FIBER_EXIT_REQUEUE nor a signal's,
 * 128 + n), or -1.  Such a master ended the run: its Job has backoffLimit
 * 0, but the Job controller can still start one more pod when it counts
 * that failure late (seen once in CI: a deleted master's pod counted
 * after its successor had started), and that pod must not run the
 * program again. */
static int ended_by_itself(struct fb_k8s *k, const char *run)
{
    const char *self = getenv("HOSTNAME");
    json_t *l = NULL, *pod;
    int found = -1, code;
    size_t i;
    if (master_pods(k, run, &l) != 0)
        return -1;
    json_array_foreach(json_object_get(l, "items"), i, pod)
    {
        if ((self && strcmp(name_of(pod), self) == 0) || !pod_exit(pod, &code))
            continue;
        if (code != 0 && ends_the_run(code)) {
            fb_log_error("the master's pod %s ended by itself with status %d: "
                         "the run is over, and this pod of its Job does not "
                         "run it again", name_of(pod), code);
            found = code;
        }
    }
    json_decref(l);
    return found;
}

int fb_k8s_master_boot(const struct fb_config *cfg, int *resumed)
{
    struct fb_k8s k;
    char run[48], job[64];
    fb_k8s_dns_name(fiber_run_id(), run, sizeof run);
    snprintf(job, sizeof job, "%s-master", run);
    int rc = fb_k8s_open(&k, cfg);
    if (rc)
        return rc;
    if (!k.in_cluster)
        rc = fb_err(FIBER_ECONFIG, "FIBER_BOOT_REQUEUE=1: a requeueable "
                    "kubernetes master runs in the pod of its Job (fiber "
                    "run --requeue), with the in-cluster configuration");
    int before = 0;
    if (rc == 0)
        rc = count_start(&k, job, &before);
    if (rc == 0 && before > 0)
        rc = wait_predecessors(&k, run);
    if (rc == 0 && before > 0) {
        int over = ended_by_itself(&k, run);
        if (over >= 0) {
            fb_k8s_close(&k);
            _exit(over); /* as that master did: fiber run reports it */
        }
    }
    if (rc == 0) {
        *resumed = before;
        fb_log_info("master of Job %s: start %d%s", job, before + 1,
                    before ? ", resuming the run" : "");
    }
    fb_k8s_close(&k);
    return rc;
}
