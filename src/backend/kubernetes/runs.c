/*
 * runs.c -- the kubernetes backend's run ops (backend/runops.h): a run's
 * pods in the configured namespace, found by their fiber.run label
 * (runtime/runid.h; its value is the run id made a DNS label, which is the
 * run id itself for the ids fiber makes), and a master started as a pod
 * (k8s_master.c).
 *
 * A pod cannot be stopped and kept: kill deletes the run's pods that run
 * or wait to (the kubelet gives each terminate_grace_ms to stop), and
 * their logs go with them; pods that ended by themselves are kept, with
 * their logs, until clean deletes them, with any Secret of the run that
 * a master did not live to delete.
 *
 * Where kubernetes is not configured (no k8s_server, not in a cluster),
 * list finds nothing and says nothing.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/kubernetes/k8s_api.h"
#include "backend/kubernetes/k8s_master.h"
#include "backend/runops.h"
#include "base/common.h"
#include "runtime/runid.h"

#define REQUEST_TIMEOUT_MS 30000L
#define POLL_MS 200
/* How long kill waits, beyond the grace period, for deleted pods to go. */
#define GONE_SLACK_MS 20000

static json_t *at(json_t *o, const char *k1, const char *k2)
{
    json_t *v = json_object_get(o, k1);
    return k2 ? json_object_get(v, k2) : v;
}

static const char *str_at(json_t *o, const char *k1, const char *k2)
{
    const char *v = json_string_value(at(o, k1, k2));
    return v ? v : "";
}

/* ======================================================================
 * list
 * ====================================================================== */

/* The pods of run (all fiber runs' when run is NULL) as parsed JSON. */
static int list_pods(struct fb_k8s *k, const char *run, json_t **out)
{
    char label[48], path[400];
    if (run)
        snprintf(path, sizeof path,
                 "/api/v1/namespaces/%s/pods?labelSelector=%s%%3D%s", k->ns,
                 FB_LABEL_RUN, fb_k8s_dns_name(run, label, sizeof label));
    else
        snprintf(path, sizeof path,
                 "/api/v1/namespaces/%s/pods?labelSelector=%s", k->ns,
                 FB_LABEL_RUN);
    long status = 0;
    int rc = fb_k8s_json(k, "GET", path, NULL, NULL, REQUEST_TIMEOUT_MS,
                         &status, out);
    if (rc == 0 && status != 200) {
        char what[160];
        snprintf(what, sizeof what, "listing pods in namespace '%s'", k->ns);
        rc = fb_k8s_refused(k, FIBER_EBACKEND, what, status, *out);
    }
    return rc;
}

/* A pod's state in fiber's words ("pending", "running", "exited",
 * "terminating", "unknown") and in the cluster's (status). */
static const char *pod_state(json_t *pod, char *status, size_t size)
{
    const char *phase = str_at(pod, "status", "phase");
    json_t *cs = at(json_array_get(at(pod, "status", "containerStatuses"), 0),
                    "state", NULL);
    json_t *term = at(cs, "terminated", NULL);
    const char *waiting = str_at(cs, "waiting", "reason");
    if (json_is_integer(at(term, "exitCode", NULL)))
        snprintf(status, size, "%s (exit %lld)", phase,
                 (long long)json_integer_value(at(term, "exitCode", NULL)));
    else if (*waiting)
        snprintf(status, size, "%s (%s)", phase, waiting);
    else
        snprintf(status, size, "%s", phase);
    if (json_string_value(at(pod, "metadata", "deletionTimestamp")))
        return "terminating";
    if (strcmp(phase, "Pending") == 0)
        return "pending";
    if (strcmp(phase, "Running") == 0)
        return "running";
    if (strcmp(phase, "Succeeded") == 0 || strcmp(phase, "Failed") == 0)
        return "exited";
    return "unknown";
}

static int add_pod(fiber_run_list *l, const char *only, json_t *pod)
{
    json_t *meta = at(pod, "metadata", NULL);
    const char *run = only ? only : str_at(meta, "labels", FB_LABEL_RUN);
    if (!fb_run_id_valid(run))
        return 0;
    fiber_run_info *r = fb_runs_add_run(l, run, "kubernetes");
    if (!r)
        return FIBER_ENOMEM;
    fb_strlcpy(r->backend, "kubernetes", sizeof r->backend);
    const char *role = str_at(meta, "labels", FB_LABEL_ROLE);
    const char *name = str_at(meta, "annotations", FB_LABEL_NAME);
    if (!*name)
        name = strcmp(role, "master") == 0 ? "master"
                                           : str_at(meta, "name", NULL);
    char status[200];
    const char *state = pod_state(pod, status, sizeof status);
    if (!fb_runs_add_job(r, name, *role ? role : "job", state, status, -1,
                         str_at(meta, "name", NULL)))
        return FIBER_ENOMEM;
    /* A pod that runs or is about to: its master, or a job, which lives
     * only as long as its master. */
    if (strcmp(state, "running") == 0 || strcmp(state, "pending") == 0)
        r->alive = 1;
    return 0;
}

static int k8s_list(fiber_run_list *l, const char *only)
{
    struct fb_k8s k = {0};
    int configured;
    int rc = fb_k8s_open_configured(&k, &configured);
    if (rc == 0 && !configured)
        return 0;
    json_t *pods = NULL;
    if (rc == 0)
        rc = list_pods(&k, only, &pods);
    fb_k8s_close(&k);
    if (rc) {
        fb_runs_warn(l, "pods not listed: %s", fiber_last_error());
        json_decref(pods);
        return 0;
    }
    size_t i;
    json_t *pod;
    json_array_foreach(json_object_get(pods, "items"), i, pod)
    {
        if ((rc = add_pod(l, only, pod)) != 0)
            break;
    }
    json_decref(pods);
    return rc;
}

/* ======================================================================
 * logs
 * ====================================================================== */

static int pod_log(struct fb_k8s *k, const fiber_job_info *j, fiber_buf *out)
{
    char path[400];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods/%s/log", k->ns,
             j->engine_id);
    fiber_buf reply = {0};
    long status = 0;
    int rc = fb_k8s_request(k, "GET", path, NULL, NULL, 0,
                            REQUEST_TIMEOUT_MS, &status, &reply);
    if (rc == 0 && status == 200 && reply.len &&
        fiber_buf_append(out, reply.data, reply.len))
        rc = fb_err(FIBER_ENOMEM, "out of memory");
    if (rc == 0 && status != 200) {
        json_t *why = json_loadb((const char *)reply.data, reply.len, 0, NULL);
        char what[400];
        snprintf(what, sizeof what, "reading the log of pod %s (%s)",
                 j->engine_id, j->name);
        rc = fb_k8s_refused(k, FIBER_EBACKEND, what, status, why);
        json_decref(why);
    }
    fiber_buf_free(&reply);
    return rc;
}

/* Pods that have not started have no log yet. */
static int k8s_logs(const fiber_run_info *r, const char *job, int headings,
                    fiber_buf *out)
{
    struct fb_k8s k = {0};
    int rc = 0, opened = 0, found = 0;
    for (size_t i = 0; rc == 0 && i < r->n_jobs; i++) {
        const fiber_job_info *j = &r->jobs[i];
        if (!j->engine_id[0] || strcmp(j->state, "pending") == 0 ||
            (job && strcmp(job, j->name) != 0))
            continue;
        if (!opened && (rc = fb_k8s_open_configured(&k, NULL)) != 0)
            break;
        opened = 1;
        if (headings)
            rc = fb_runs_heading(out, j->name);
        if (rc == 0)
            rc = pod_log(&k, j, out);
        found++;
    }
    fb_k8s_close(&k);
    return rc == 0 && !found ? FIBER_ENOKEY : rc;
}

/* ======================================================================
 * kill and clean
 * ====================================================================== */

/* Deletes pod, giving it grace_s seconds to stop.  0 also when it is
 * already gone. */
static int delete_pod(struct fb_k8s *k, const char *pod, int grace_s)
{
    char path[400], what[300];
    snprintf(path, sizeof path,
             "/api/v1/namespaces/%s/pods/%s?gracePeriodSeconds=%d", k->ns,
             pod, grace_s);
    long status = 0;
    json_t *reply = NULL;
    int rc = fb_k8s_json(k, "DELETE", path, NULL, NULL, REQUEST_TIMEOUT_MS,
                         &status, &reply);
    if (rc == 0 && status != 200 && status != 202 && status != 404) {
        snprintf(what, sizeof what, "deleting pod %s", pod);
        rc = fb_k8s_refused(k, FIBER_EBACKEND, what, status, reply);
    }
    json_decref(reply);
    return rc;
}

/* Deletes the Job of run's master (a requeueable master, fiber run
 * --requeue), if there is one, so that its controller makes no new pod;
 * its pods stay (orphaned), for the caller to delete.  1 when it was
 * deleted, 0 when there was none (or the account may not see Jobs: then
 * it cannot have made one), or a negative code. */
static int delete_master_job(struct fb_k8s *k, const char *run)
{
    char label[48], path[400], what[300];
    fb_k8s_dns_name(run, label, sizeof label);
    snprintf(path, sizeof path,
             "/apis/batch/v1/namespaces/%s/jobs/%s-master"
             "?propagationPolicy=Orphan",
             k->ns, label);
    long status = 0;
    json_t *reply = NULL;
    int rc = fb_k8s_json(k, "DELETE", path, NULL, NULL, REQUEST_TIMEOUT_MS,
                         &status, &reply);
    if (rc == 0 && (status == 200 || status == 202))
        rc = 1;
    else if (rc == 0 && status != 404 && status != 403) {
        snprintf(what, sizeof what, "deleting Job %s-master", label);
        rc = fb_k8s_refused(k, FIBER_EBACKEND, what, status, reply);
    }
    json_decref(reply);
    return rc;
}

/* 1 once pod no longer exists, 0 while it does, or a negative code. */
static int pod_gone(struct fb_k8s *k, const char *pod)
{
    char path[400];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods/%s", k->ns, pod);
    long status = 0;
    json_t *reply = NULL;
    int rc = fb_k8s_json(k, "GET", path, NULL, NULL, REQUEST_TIMEOUT_MS,
                         &status, &reply);
    json_decref(reply);
    return rc ? rc : status == 404;
}

static int is_live_pod(const fiber_job_info *j)
{
    return j->engine_id[0] && (fb_runs_job_running(j) ||
                               strcmp(j->state, "pending") == 0);
}

/* Waits until each deleted pod is gone, or deadline. */
static void report_gone(struct fb_k8s *k, const fiber_run_info *r,
                        uint64_t deadline, fiber_buf *rep)
{
    for (size_t i = 0; i < r->n_jobs; i++) {
        const fiber_job_info *j = &r->jobs[i];
        if (!is_live_pod(j))
            continue;
        int gone;
        while ((gone = pod_gone(k, j->engine_id)) == 0 && fb_ms_left(deadline)) {
            struct timespec ts = {0, POLL_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (gone == 1)
            fb_runs_report(rep, "stopped pod %s (%s): deleted", j->engine_id,
                           j->name);
        else
            fb_runs_report(rep, "deleted pod %s (%s); it is still "
                                "terminating",
                           j->engine_id, j->name);
    }
}

static int k8s_kill(const fiber_run_info *r, fiber_buf *rep, int *stopped)
{
    int any = 0;
    for (size_t i = 0; i < r->n_jobs; i++)
        any |= is_live_pod(&r->jobs[i]);
    if (!any)
        return 0;
    struct fb_k8s k = {0};
    int rc = fb_k8s_open_configured(&k, NULL);
    if (rc)
        return rc;
    int grace_ms = fb_runs_grace_ms();
    int grace_s = grace_ms > 0 ? (grace_ms + 999) / 1000 : 1;
    rc = delete_master_job(&k, r->run);
    if (rc == 1)
        fb_runs_report(rep, "deleted Job %s-master (the requeueable "
                            "master's): no new master pod",
                       r->run);
    rc = rc == 1 ? 0 : rc;
    for (size_t i = 0; rc == 0 && i < r->n_jobs; i++) {
        const fiber_job_info *j = &r->jobs[i];
        if (!is_live_pod(j))
            continue;
        int d = delete_pod(&k, j->engine_id, grace_s);
        if (d) {
            fb_runs_report(rep, "cannot delete pod %s (%s): %s", j->engine_id,
                           j->name, fiber_last_error());
            rc = d;
        } else {
            (*stopped)++;
        }
    }
    if (rc == 0)
        report_gone(&k, r, fb_deadline_ms(grace_s * 1000 + GONE_SLACK_MS),
                    rep);
    fb_k8s_close(&k);
    return rc;
}

/* Deletes the run's Secrets (the bootstrap token a master keeps while it
 * lives; one that was killed leaves it). */
static int delete_secrets(struct fb_k8s *k, const fiber_run_info *r,
                          fiber_buf *rep)
{
    char label[48], path[400];
    snprintf(path, sizeof path,
             "/api/v1/namespaces/%s/secrets?labelSelector=%s%%3D%s", k->ns,
             FB_LABEL_RUN, fb_k8s_dns_name(r->run, label, sizeof label));
    long status = 0;
    json_t *reply = NULL;
    int rc = fb_k8s_json(k, "DELETE", path, NULL, NULL, REQUEST_TIMEOUT_MS,
                         &status, &reply);
    if (rc == 0 && status != 200) {
        char what[200];
        snprintf(what, sizeof what, "deleting the Secrets of run %s", r->run);
        rc = fb_k8s_refused(k, FIBER_EBACKEND, what, status, reply);
    }
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(reply, "items"), i, s)
        fb_runs_report(rep, "removed Secret %s of run %s",
                       str_at(s, "metadata", "name"), r->run);
    json_decref(reply);
    return rc;
}

static int k8s_clean(const fiber_run_info *r, int named, fiber_buf *rep)
{
    FB_UNUSED(named);
    struct fb_k8s k = {0};
    int rc = fb_k8s_open_configured(&k, NULL);
    if (rc == 0 && !r->alive && (rc = delete_master_job(&k, r->run)) == 1)
        fb_runs_report(rep, "removed Job %s-master of run %s", r->run, r->run);
    rc = rc == 1 ? 0 : rc;
    for (size_t i = 0; rc == 0 && i < r->n_jobs; i++) {
        const fiber_job_info *j = &r->jobs[i];
        if (!j->engine_id[0])
            continue;
        if (is_live_pod(j)) {
            fb_runs_report(rep, "left pod %s (%s) of run %s: it still runs; "
                                "fiber kill %s stops it",
                           j->engine_id, j->name, r->run, r->run);
            continue;
        }
        if (strcmp(j->state, "terminating") == 0)
            continue; /* going already */
        rc = delete_pod(&k, j->engine_id, 0);
        if (rc == 0)
            fb_runs_report(rep, "removed pod %s (%s) of run %s",
                           j->engine_id, j->name, r->run);
    }
    if (rc == 0)
        rc = delete_secrets(&k, r, rep);
    fb_k8s_close(&k);
    return rc;
}

/* ======================================================================
 * start, follow, wait
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

static int k8s_start(const struct fb_run_start *s, struct fiber_run *r)
{
    char image[320], program[PATH_MAX], var[340];
    int rc = k8s_image(s->opts->image, image, sizeof image);
    if (rc)
        return rc;
    fiber_image_info img = {0};
    fb_strlcpy(img.tag, image, sizeof img.tag);
    rc = fb_run_program_in_image(s->argv[0], &img, program, sizeof program);
    if (rc)
        return rc;
    size_t argc = 0, n_vars;
    while (s->argv[argc])
        argc++;
    const char **args = calloc(argc + 1, sizeof *args);
    snprintf(var, sizeof var, "FIBER_IMAGE=%s", image);
    const char **vars = args ? fb_run_vars_with(s, var, &n_vars) : NULL;
    if (vars) {
        memcpy(args, s->argv, argc * sizeof *args);
        args[0] = program;
        rc = fb_k8s_master_start(s->run, args, s->opts, vars, n_vars, image,
                                 r->engine_id, sizeof r->engine_id);
        if (rc == 0 && s->opts->requeue)
            fb_strlcpy(r->noun, "job", sizeof r->noun);
    } else {
        rc = fb_err(FIBER_ENOMEM, "out of memory");
    }
    free(vars);
    free(args);
    return rc;
}

static int is_job(const struct fiber_run *r)
{
    return strcmp(r->noun, "job") == 0;
}

/* A pod's log is one stream: err_fd only says where a Job's pod follows
 * another. */
static int k8s_follow(struct fiber_run *r, int out_fd, int err_fd)
{
    return fb_k8s_master_follow(r->engine_id, is_job(r), out_fd, err_fd);
}

static int k8s_wait(struct fiber_run *r, int timeout_ms, int *exit_code)
{
    return fb_k8s_master_wait(r->engine_id, is_job(r), timeout_ms,
                              exit_code);
}

/* fiber top's way to a master in a pod: when the configuration names a
 * cluster (backend kubernetes, or k8s_server), the cluster is asked
 * (fb_k8s_run_contact).  Returns 0 (found), 1 (no cluster configured), or
 * the error (FIBER_ENOKEY: the cluster has no job pod or Secret of run). */
static int k8s_contact(const char *run, char *addr, size_t size,
                       int *encrypted, uint8_t *token, size_t token_len)
{
    char backend[64] = "", server[600] = "";
    fiber_config_get("backend", backend, sizeof backend);
    fiber_config_get("k8s_server", server, sizeof server);
    if (strcmp(backend, "kubernetes") != 0 && !server[0])
        return 1;
    int rc = fb_k8s_run_contact(run, addr, size, encrypted, token, token_len);
    return rc == FIBER_ECONFIG ? 1 : rc;
}

const struct fb_run_ops fb_run_ops_kubernetes = {
    .name = "kubernetes",
    .job_noun = "pod",
    .can_requeue = 1,
    .describe = fb_k8s_describe,
    .start = k8s_start,
    .follow = k8s_follow,
    .wait = k8s_wait,
    .list = k8s_list,
    .logs = k8s_logs,
    .kill = k8s_kill,
    .clean = k8s_clean,
    .contact = k8s_contact,
    .contact_where = "on the Kubernetes cluster",
    .contact_missing =
        "has its master in a Kubernetes pod, and no job pod or Secret of it "
        "was found through the configured cluster (backend = kubernetes, or "
        "k8s_server): fiber top needs both, since the pod's run directory is "
        "not on this host",
};
