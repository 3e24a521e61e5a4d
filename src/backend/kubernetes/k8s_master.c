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
#include "core/common.h"
#include "core/runid.h"

#define REQUEST_TIMEOUT_MS 30000L
#define POLL_MS 200

/* Reads the caller's kubernetes keys (fiber_config_get: the defaults,
 * .fiberconfig and FIBER_* variables) into c. */
static int read_config(struct fb_config *c)
{
    static const char *const keys[] = {"k8s_server",       "k8s_token_file",
                                       "k8s_ca_file",      "k8s_namespace",
                                       "k8s_config_dir",   "k8s_host_network",
                                       "k8s_pull_policy"};
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
    char path[300], what[200];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods", k.ns);
    snprintf(what, sizeof what, "creating the master's pod %s in namespace "
             "'%s'", name, k.ns);
    long status = 0;
    json_t *reply = NULL;
    rc = body ? fb_k8s_json(&k, "POST", path, body, NULL, REQUEST_TIMEOUT_MS,
                            &status, &reply)
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

/* Reads the pod's end: 1 and *code once it ended, 0 while it runs, or a
 * negative code. */
static int pod_ended(struct fb_k8s *k, const char *pod, int *code)
{
    char path[400], what[300];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods/%s", k->ns, pod);
    long status = 0;
    json_t *p = NULL;
    int rc = fb_k8s_json(k, "GET", path, NULL, NULL, REQUEST_TIMEOUT_MS,
                         &status, &p);
    if (rc == 0 && status == 404) {
        *code = 137; /* deleted before it ended */
        rc = 1;
    } else if (rc == 0 && status != 200) {
        snprintf(what, sizeof what, "reading pod %s", pod);
        rc = fb_k8s_refused(k, FIBER_EBACKEND, what, status, p);
    } else if (rc == 0) {
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
            rc = 1;
        } else if (phase && (strcmp(phase, "Succeeded") == 0 ||
                             strcmp(phase, "Failed") == 0)) {
            *code = strcmp(phase, "Succeeded") == 0 ? 0 : 137;
            rc = 1;
        }
    }
    json_decref(p);
    return rc;
}

int fb_k8s_master_wait(const char *pod, int timeout_ms, int *exit_code)
{
    struct fb_k8s k;
    int rc = fb_k8s_open_configured(&k, NULL);
    if (rc)
        return rc;
    uint64_t deadline = fb_deadline_ms(timeout_ms);
    int code = 0;
    while ((rc = pod_ended(&k, pod, &code)) == 0) {
        int left = fb_ms_left(deadline);
        if (left == 0) {
            rc = fb_err(FIBER_ETIMEDOUT, "pod %s is still running", pod);
            break;
        }
        struct timespec ts = {0, (long)(left >= 0 && left < POLL_MS
                                            ? left
                                            : POLL_MS) *
                                     1000000L};
        nanosleep(&ts, NULL);
    }
    fb_k8s_close(&k);
    if (rc == 1) {
        if (exit_code)
            *exit_code = code;
        return 0;
    }
    return rc;
}

int fb_k8s_master_follow(const char *pod, int fd)
{
    struct fb_k8s k;
    int rc = fb_k8s_open_configured(&k, NULL);
    if (rc)
        return rc;
    /* The log endpoint refuses a pod whose container has not started. */
    char path[400];
    for (;;) {
        snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods/%s", k.ns,
                 pod);
        long status = 0;
        json_t *p = NULL;
        rc = fb_k8s_json(&k, "GET", path, NULL, NULL, REQUEST_TIMEOUT_MS,
                         &status, &p);
        const char *phase = json_string_value(
            json_object_get(json_object_get(p, "status"), "phase"));
        int pending = rc == 0 && status == 200 && phase &&
                      strcmp(phase, "Pending") == 0;
        json_decref(p);
        if (!pending)
            break;
        struct timespec ts = {0, POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (rc) {
        fb_k8s_close(&k);
        return rc;
    }
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods/%s/log?follow=true",
             k.ns, pod);
    struct fb_k8s_watch w = {0};
    rc = fb_k8s_watch_start(&k, &w, path, NULL, NULL);
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
        rc = fb_k8s_refused(&k, FIBER_EBACKEND, what, w.status, reply);
        json_decref(reply);
    } else if (rc == 0 && w.failed) {
        rc = fb_err(FIBER_EUNREACHABLE, "following the log of pod %s: %s",
                    pod, w.curl_error);
    }
    fb_k8s_watch_free(&w);
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
