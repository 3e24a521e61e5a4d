/*
 * kubernetes.c -- the kubernetes backend: every job is a Pod, created,
 * watched and deleted through the Kubernetes REST API (k8s_api.c); kubectl
 * is never run.
 *
 * A job's pod:
 *
 *   - runs one container of the job's image (the job's `image` option or
 *     the `image` key; required, since a cluster pulls images from a
 *     registry and fiber builds none there) with the master's program at
 *     its own path as the command and the job's arguments, environment
 *     and working directory, restartPolicy Never;
 *   - shares one process namespace among its containers
 *     (shareProcessNamespace), so that the program is not the namespace's
 *     init (pid 1, which ignores every signal it has no handler for: its
 *     own raise(SIGKILL), a SIGTERM) and dies of signals as it would
 *     anywhere else; the sandbox's pause process reaps orphans;
 *   - has limits for cpu, memory and nvidia.com/gpu from the job options;
 *   - uses the node's network when k8s_host_network is set (a cluster
 *     without a pod network, such as the test cluster of
 *     scripts/k8s-local.sh), and the imagePullPolicy k8s_pull_policy
 *     when that is set (Never: the image must be on the node already);
 *   - mounts the persistent volume claims of k8s_volumes
 *     ("claim:/path[:ro],..."), so that input data reaches every worker;
 *   - reads the run's token from a Secret: one per run
 *     ("<run>-boot", created with the run's first job, deleted when the
 *     backend closes, and owned by the master's pod like the jobs' pods),
 *     mounted read-only at /var/run/secrets/fiber.io,
 *     with FIBER_BOOT_SECRET_FILE pointing at the file.  The token is
 *     never in the pod spec, where anyone allowed to read pods would see
 *     it;
 *   - is labelled fiber.run=<run> and fiber.role=job (and fiber.job=<id>),
 *     named "<run>-<job id>-<job name>" ("<run>-r<n>-<job id>-<job name>"
 *     in a master restarted n times: fiber_resumed()), and, when the master itself runs
 *     in a pod of the cluster, owned by the master's pod (an owner
 *     reference), so that deleting the master deletes its workers.
 *
 * Watching.  One thread per backend (started by init, stopped by fini)
 * lists the run's pods (label selector fiber.run=<run>) and then watches
 * them from the list's resourceVersion; when the server says the version
 * is too old (410 Gone, as a status or as an ERROR event) it lists again
 * and resumes, and a pod that vanished meanwhile counts as deleted (one
 * created while the list was under way is looked up instead: it may have
 * come and gone before the list's version, unseen by any watch).  The
 * thread keeps, per job, whether and how its pod ended, and signals the
 * job's eventfd, which event_fd hands to the runtime; poll_job only reads
 * that table, so it never talks to the server.  The exit status is the
 * container's terminated exitCode (128 + n reads as killed by signal n,
 * as with docker); a pod deleted before its container ended reads as
 * killed (-SIGKILL).
 *
 * Stopping.  signal_job deletes the pod with a grace period
 * (terminate_grace_ms, rounded up to seconds; 0 when forced): the kubelet
 * sends SIGTERM, then SIGKILL after the grace.  Since the kubelet
 * enforces that grace, the backend has FB_CAP_OWN_GRACE: the runtime
 * forces a deletion (grace 0) only FB_OWN_GRACE_SLACK_MS after it, so
 * that the container's own end, reported seconds late, is what a
 * terminated job reads (-SIGTERM, or -SIGKILL when the kubelet had to).
 * release_job deletes the pod at once whatever its state, so a run
 * leaves no pods behind.
 *
 * Batches.  Between begin_batch and end_batch (a pool's workers),
 * create_job only describes the pod and records it; end_batch POSTs the
 * recorded pods concurrently, on up to BATCH_THREADS connections of their
 * own, so that 32 workers cost about the time of 32 / BATCH_THREADS
 * requests instead of 32 in a row.  A pod whose create fails reads as
 * exited with status 127, and end_batch returns the first failure.
 *
 * The ops are called with the runtime lock held and make at most one or
 * two API requests each (create: the pod, plus the Secret for the run's
 * first job); end_batch makes one per recorded pod.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <sodium.h>

#include "backend/backend.h"
#include "backend/json_util.h"
#include "backend/kubernetes/k8s_api.h"
#include "backend/kubernetes/k8s_master.h"
#include "backend/kubernetes/kubernetes.h"
#include "base/common.h"
#include "base/log.h"
#include "base/thread.h"
#include "runtime/runid.h"

#define REQUEST_TIMEOUT_MS 30000L
#define WATCH_SECONDS 240   /* the server ends a watch after this */
#define RETRY_MS 1000
#define SECRET_DIR "/var/run/secrets/fiber.io"
#define SECRET_KEY "token"
#define SECRET_VAR FB_ENV_SECRET_FILE
#define CONTAINER "job"
#define BATCH_THREADS 8

/* What the watch thread knows of one job's pod.  Guarded by ks->mu. */
struct k8s_entry {
    struct k8s_entry *next;
    char pod[64];
    int efd;              /* signalled when the pod ends */
    uint64_t created_seq; /* UINT64_MAX until the create request succeeded */
    int ended;
    int exit_status;
    int signalled;        /* SIGTERM or SIGKILL once signal_job deleted it */
    int recheck;          /* a list missed it while its create was in
                             flight: create_job must look it up */
    char why[240];        /* how it ended, when that is worth a warning */
};

struct k8s_state {
    struct fb_k8s api;       /* the ops' (runtime lock) */
    struct fb_k8s watch_api; /* the watch thread's */
    char run[48];            /* the run id as a label value and name part */
    char secret[64];         /* the run's Secret, "" until made */
    char owner_name[254];    /* the master's own pod, "" outside a cluster */
    char owner_uid[64];
    long grace_s;
    pthread_t thread;
    int thread_running;
    int stop_fd;             /* eventfd: the thread must stop */
    int stopping;            /* guarded by mu */
    pthread_mutex_t mu;
    struct k8s_entry *entries;
    uint64_t create_seq;
    int batching;                /* between begin_batch and end_batch */
    struct k8s_pending *pending; /* the batch's pods, newest first */
};

struct k8s_job {
    struct k8s_entry *e;
};

/* A pod recorded by create_job during a batch, POSTed by end_batch. */
struct k8s_pending {
    struct k8s_pending *next;
    struct fb_job *job;
    json_t *body;
    int rc;            /* the create's result, set by end_batch */
    char why[1024];    /* its message when rc != 0 */
};

/* The watch thread's view of one watch. */
struct watch_ctx {
    struct k8s_state *ks;
    char rv[64];  /* resourceVersion to resume from */
    int gone;     /* the server said 410: list again */
};

/* ---- small helpers --------------------------------------------------------- */

static void pods_path(const struct k8s_state *ks, char *buf, size_t size,
                      const char *pod, const char *tail)
{
    snprintf(buf, size, "/api/v1/namespaces/%s/pods%s%s%s", ks->api.ns,
             pod ? "/" : "", pod ? pod : "", tail ? tail : "");
}

/* ---- the table of jobs ----------------------------------------------------- */

static struct k8s_entry *find_entry(struct k8s_state *ks, const char *pod)
{
    for (struct k8s_entry *e = ks->entries; e; e = e->next)
        if (strcmp(e->pod, pod) == 0)
            return e;
    return NULL;
}

/* Marks e ended (once) and wakes whoever polls it.  Called with mu held. */
static void entry_ended(struct k8s_entry *e, int status, const char *why)
{
    if (e->ended)
        return;
    e->ended = 1;
    e->exit_status = status;
    if (why)
        fb_strlcpy(e->why, why, sizeof e->why);
    uint64_t one = 1;
    if (write(e->efd, &one, sizeof one) < 0) {
        /* Saturated: it is readable already. */
    }
}

/* The status of a job whose pod vanished before its container ended: as
 * signal_job asked (a pod not yet on a node is deleted at once, its
 * program never having run: fiber_process_terminate still reads as
 * SIGTERM), else killed. */
static int deleted_status(const struct k8s_entry *e)
{
    return e->signalled ? -e->signalled : -SIGKILL;
}

static int fatal_waiting(const char *reason)
{
    static const char *const fatal[] = {
        "ErrImagePull",        "ImagePullBackOff",     "InvalidImageName",
        "ErrImageNeverPull",   "CreateContainerConfigError",
        "CreateContainerError", "RunContainerError",
    };
    for (size_t i = 0; reason && i < FB_ARRAY_LEN(fatal); i++)
        if (strcmp(reason, fatal[i]) == 0)
            return 1;
    return 0;
}

/* Reads what a pod object says about its end into its entry.  deleted:
 * the object is gone (a DELETED event, or missing from a list). */
static void note_pod(struct k8s_state *ks, json_t *pod, int deleted)
{
    const char *name = json_string_value(
        json_object_get(json_object_get(pod, "metadata"), "name"));
    if (!name)
        return;
    json_t *status = json_object_get(pod, "status");
    const char *phase = json_string_value(json_object_get(status, "phase"));
    json_t *cs = json_array_get(json_object_get(status, "containerStatuses"),
                                0);
    json_t *state = json_object_get(cs, "state");
    json_t *term = json_object_get(state, "terminated");
    const char *waiting = json_string_value(
        json_object_get(json_object_get(state, "waiting"), "reason"));
    const char *reason = json_string_value(json_object_get(status, "reason"));
    const char *message =
        json_string_value(json_object_get(status, "message"));
    char why[240] = "";
    pthread_mutex_lock(&ks->mu);
    struct k8s_entry *e = find_entry(ks, name);
    if (!e || e->ended) {
        pthread_mutex_unlock(&ks->mu);
        return;
    }
    /* A container that never started (no startedAt: the kubelet gave up
     * on it when signal_job deleted the pod, and says 137 or Failed) ran
     * no program: it reads as the signal asked for, as a pod deleted
     * before any node took it. */
    int never_ran = e->signalled && (!term || !json_string_value(json_object_get(
                                                  term, "startedAt")));
    if (never_ran && (term || (phase && strcmp(phase, "Failed") == 0))) {
        entry_ended(e, deleted_status(e), NULL);
    } else if (json_is_integer(json_object_get(term, "exitCode"))) {
        entry_ended(e, fb_exit_status_of_code(json_integer_value(
                           json_object_get(term, "exitCode"))),
                    NULL);
    } else if (phase && strcmp(phase, "Succeeded") == 0) {
        entry_ended(e, 0, NULL);
    } else if (phase && strcmp(phase, "Failed") == 0) {
        snprintf(why, sizeof why, "the pod failed without an exit code (%s%s%s)",
                 reason ? reason : "no reason given", message ? ": " : "",
                 message ? message : "");
        entry_ended(e, -SIGKILL, why);
    } else if (deleted) {
        entry_ended(e, deleted_status(e), NULL);
    } else if (fatal_waiting(waiting)) {
        const char *wm = json_string_value(json_object_get(
            json_object_get(state, "waiting"), "message"));
        snprintf(why, sizeof why, "its container cannot start: %s%s%s",
                 waiting, wm ? ": " : "", wm ? wm : "");
        entry_ended(e, 127, why);
    }
    pthread_mutex_unlock(&ks->mu);
}

/* ---- the watch thread -------------------------------------------------------- */

/* Test hooks (kubernetes.h); process-wide, atomic. */
static int expire_next_watch;
static unsigned lists_made;

void fb_k8s_test_expire_next_watch(void)
{
    __atomic_store_n(&expire_next_watch, 1, __ATOMIC_SEQ_CST);
}

unsigned fb_k8s_test_lists(void)
{
    return __atomic_load_n(&lists_made, __ATOMIC_SEQ_CST);
}

static int stopping(struct k8s_state *ks)
{
    pthread_mutex_lock(&ks->mu);
    int s = ks->stopping;
    pthread_mutex_unlock(&ks->mu);
    return s;
}

/* Sleeps up to ms, or until fini asks the thread to stop. */
static void nap(struct k8s_state *ks, int ms)
{
    struct pollfd p = {.fd = ks->stop_fd, .events = POLLIN};
    poll(&p, 1, ms);
}

static void copy_rv(json_t *obj, char *rv, size_t size)
{
    const char *v = json_string_value(
        json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
    if (v)
        fb_strlcpy(rv, v, size);
}

static void on_watch_event(void *ud, const char *type, json_t *obj)
{
    struct watch_ctx *c = ud;
    if (strcmp(type, "ERROR") == 0) {
        json_int_t code = json_integer_value(json_object_get(obj, "code"));
        if (code == 410)
            c->gone = 1;
        else
            fb_log_debug("kubernetes watch: error event %lld: %s",
                         (long long)code, fb_k8s_status_message(obj));
        return;
    }
    copy_rv(obj, c->rv, sizeof c->rv);
    if (strcmp(type, "BOOKMARK") != 0)
        note_pod(c->ks, obj, strcmp(type, "DELETED") == 0);
}

/* GETs path on the watch thread's connection, abandoning it as soon as
 * fini asks the thread to stop.  Returns the parsed body of a 200 answer,
 * or NULL (with a warning). */
static json_t *get_interruptible(struct k8s_state *ks, const char *path,
                                 const char *what, long *status)
{
    struct fb_k8s_watch w = {0};
    json_t *body = NULL;
    *status = 0;
    if (fb_k8s_watch_start(&ks->watch_api, &w, path, NULL, NULL) != 0) {
        fb_log_warn("kubernetes backend: %s: %s", what, fiber_last_error());
        fb_k8s_watch_free(&w);
        return NULL;
    }
    uint64_t deadline = fb_now_ms() + REQUEST_TIMEOUT_MS;
    while (!fb_k8s_watch_pump(&w, ks->stop_fd, 1000) && !stopping(ks) &&
           fb_now_ms() < deadline)
        ;
    if (w.done && !w.failed)
        *status = w.status;
    if (w.done && !w.failed && w.status == 200)
        body = json_loadb((const char *)w.line.data, w.line.len, 0, NULL);
    else if (w.done && !w.failed && w.status == 404) {
        /* The caller's answer, not a failure. */
    } else if (w.done && !w.failed) {
        json_t *reply = json_loadb((const char *)w.error_body.data,
                                   w.error_body.len, 0, NULL);
        fb_k8s_refused(&ks->watch_api, FIBER_EBACKEND, what, w.status, reply);
        fb_log_warn("kubernetes backend: %s (retrying)", fiber_last_error());
        json_decref(reply);
    } else if (!stopping(ks)) {
        fb_log_warn("kubernetes backend: %s: %s (retrying)", what,
                    w.failed ? w.curl_error : "no answer in time");
    }
    fb_k8s_watch_free(&w);
    return body;
}

static int listed(json_t *list, const char *pod)
{
    size_t i;
    json_t *item;
    json_array_foreach(json_object_get(list, "items"), i, item)
    {
        const char *n = json_string_value(
            json_object_get(json_object_get(item, "metadata"), "name"));
        if (n && strcmp(n, pod) == 0)
            return 1;
    }
    return 0;
}

/* Notes what pod `name` says now (404: gone).  On the watch thread. */
static void look_up(struct k8s_state *ks, const char *name)
{
    char path[400];
    pods_path(ks, path, sizeof path, name, NULL);
    long status;
    json_t *pod = get_interruptible(ks, path, "looking up a pod", &status);
    if (pod) {
        note_pod(ks, pod, 0);
    } else if (status == 404) {
        pthread_mutex_lock(&ks->mu);
        struct k8s_entry *e = find_entry(ks, name);
        if (e)
            entry_ended(e, deleted_status(e), NULL);
        pthread_mutex_unlock(&ks->mu);
    }
    json_decref(pod);
}

/* Lists the run's pods: notes each, marks the jobs whose pods are gone,
 * and keeps the list's resourceVersion.  Returns 0 or -1. */
static int relist(struct watch_ctx *c)
{
    struct k8s_state *ks = c->ks;
    pthread_mutex_lock(&ks->mu);
    uint64_t seq = ks->create_seq; /* pods created by now are in the list */
    pthread_mutex_unlock(&ks->mu);
    char path[512], tail[200];
    snprintf(tail, sizeof tail, "?labelSelector=" FB_LABEL_RUN "%%3D%s", ks->run);
    pods_path(ks, path, sizeof path, NULL, tail);
    long status;
    json_t *list = get_interruptible(ks, path, "listing the run's pods",
                                     &status);
    if (!list)
        return -1;
    __atomic_add_fetch(&lists_made, 1, __ATOMIC_SEQ_CST);
    size_t i;
    json_t *pod;
    json_array_foreach(json_object_get(list, "items"), i, pod)
        note_pod(ks, pod, 0);
    /* A job's pod missing from the list is gone if it was created before
     * the list was asked for.  One created while the list was under way
     * may have been created and deleted before the list's version, which
     * the watch that follows would never mention: look each such pod up
     * (here, or in create_job if its create is still in flight). */
    char check[64][64];
    size_t n_check = 0;
    pthread_mutex_lock(&ks->mu);
    for (struct k8s_entry *e = ks->entries; e; e = e->next) {
        if (e->ended || listed(list, e->pod))
            continue;
        if (e->created_seq <= seq)
            entry_ended(e, deleted_status(e), NULL);
        else if (e->created_seq == UINT64_MAX)
            e->recheck = 1;
        else if (n_check < FB_ARRAY_LEN(check))
            fb_strlcpy(check[n_check++], e->pod, sizeof check[0]);
    }
    pthread_mutex_unlock(&ks->mu);
    for (size_t k = 0; k < n_check && !stopping(ks); k++)
        look_up(ks, check[k]);
    copy_rv(list, c->rv, sizeof c->rv);
    json_decref(list);
    return 0;
}

/* Follows one watch until it ends; returns 1 if a list must come first. */
static int follow(struct watch_ctx *c)
{
    struct k8s_state *ks = c->ks;
    char path[700], tail[400];
    snprintf(tail, sizeof tail,
             "?labelSelector=" FB_LABEL_RUN "%%3D%s&watch=1&allowWatchBookmarks=true"
             "&timeoutSeconds=%d&resourceVersion=%s",
             ks->run, WATCH_SECONDS, c->rv);
    int expire = __atomic_exchange_n(&expire_next_watch, 0, __ATOMIC_SEQ_CST);
    pods_path(ks, path, sizeof path, NULL, tail);
    struct fb_k8s_watch w = {0};
    c->gone = 0;
    int relist_first = 0;
    if (fb_k8s_watch_start(&ks->watch_api, &w, path, on_watch_event, c) != 0) {
        fb_log_warn("kubernetes backend: cannot watch pods: %s",
                    fiber_last_error());
        nap(ks, RETRY_MS);
    } else {
        if (expire) { /* the test hook: as the server would say it */
            json_t *gone = json_pack("{s:s, s:s, s:s, s:i}", "kind", "Status",
                                     "status", "Failure", "reason", "Expired",
                                     "code", 410);
            on_watch_event(c, "ERROR", gone);
            json_decref(gone);
        }
        while (!c->gone && !fb_k8s_watch_pump(&w, ks->stop_fd, 1000) &&
               !c->gone && !stopping(ks))
            ;
        if (c->gone || w.status == 410) {
            relist_first = 1;
        } else if (w.failed && !stopping(ks)) {
            fb_log_debug("kubernetes watch broke: %s", w.curl_error);
            nap(ks, 200);
        } else if (w.status && w.status != 200) {
            json_t *reply = json_loadb((const char *)w.error_body.data,
                                       w.error_body.len, 0, NULL);
            fb_k8s_refused(&ks->watch_api, FIBER_EBACKEND,
                           "watching the run's pods", w.status, reply);
            json_decref(reply);
            fb_log_warn("kubernetes backend: %s (retrying)",
                        fiber_last_error());
            relist_first = 1;
            nap(ks, RETRY_MS);
        }
    }
    fb_k8s_watch_free(&w);
    return relist_first;
}

static void *watch_main(void *arg)
{
    struct watch_ctx c = {.ks = arg};
    int need_list = 1;
    while (!stopping(c.ks)) {
        if (need_list) {
            if (relist(&c) != 0) {
                nap(c.ks, RETRY_MS);
                continue;
            }
            need_list = 0;
        }
        need_list = follow(&c);
    }
    return NULL;
}

/* ---- init and fini ------------------------------------------------------------ */

/* Checks that the server answers and lets us use pods in the namespace. */
static int check_access(struct k8s_state *ks)
{
    char path[512], tail[200], what[200];
    snprintf(tail, sizeof tail, "?labelSelector=" FB_LABEL_RUN "%%3D%s&limit=1",
             ks->run);
    pods_path(ks, path, sizeof path, NULL, tail);
    long status;
    json_t *reply = NULL;
    int rc = fb_k8s_json(&ks->api, "GET", path, NULL, NULL,
                         REQUEST_TIMEOUT_MS, &status, &reply);
    snprintf(what, sizeof what, "listing pods in namespace '%s'",
             ks->api.ns);
    if (rc == 0 && status != 200)
        rc = fb_k8s_refused(&ks->api, FIBER_EBACKEND, what, status, reply);
    json_decref(reply);
    return rc;
}

/* In a pod of the cluster, finds that pod (its name is the hostname) so
 * that the jobs' pods can name it as their owner. */
static void find_own_pod(struct k8s_state *ks)
{
    const char *host = getenv("HOSTNAME");
    char name[254];
    if (!ks->api.in_cluster)
        return;
    if (!host || !host[0]) {
        if (gethostname(name, sizeof name) != 0)
            return;
        name[sizeof name - 1] = '\0';
        host = name;
    }
    char path[600];
    pods_path(ks, path, sizeof path, host, NULL);
    long status;
    json_t *pod = NULL;
    if (fb_k8s_json(&ks->api, "GET", path, NULL, NULL, REQUEST_TIMEOUT_MS,
                    &status, &pod) == 0 &&
        status == 200) {
        json_t *md = json_object_get(pod, "metadata");
        const char *uid = json_string_value(json_object_get(md, "uid"));
        if (uid) {
            fb_strlcpy(ks->owner_name, host, sizeof ks->owner_name);
            fb_strlcpy(ks->owner_uid, uid, sizeof ks->owner_uid);
            fb_log_debug("kubernetes backend: jobs are owned by pod %s", host);
        }
    } else {
        fb_log_info("kubernetes backend: in a cluster, but pod '%s' was not "
                    "found in namespace %s: jobs get no owner reference",
                    host, ks->api.ns);
        fb_err_clear();
    }
    json_decref(pod);
}

static int k8s_init(struct fb_backend *be)
{
    struct k8s_state *ks = be->state;
    ks->stop_fd = -1;
    fb_k8s_dns_name(be->run_id, ks->run, sizeof ks->run);
    if (!ks->run[0])
        fb_strlcpy(ks->run, "fiber", sizeof ks->run);
    ks->grace_s = (be->cfg->terminate_grace_ms + 999) / 1000;
    int rc = fb_k8s_open(&ks->api, be->cfg);
    if (rc == 0)
        rc = check_access(ks);
    if (rc == 0)
        find_own_pod(ks);
    if (rc == 0)
        rc = fb_k8s_clone(&ks->watch_api, &ks->api);
    if (rc == 0) {
        ks->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (ks->stop_fd < 0)
            rc = fb_err_errno(FIBER_ESYS, "eventfd");
    }
    if (rc == 0) {
        pthread_mutex_init(&ks->mu, NULL);
        rc = fb_thread_start(&ks->thread, watch_main, ks, "the pod watcher");
        if (rc)
            pthread_mutex_destroy(&ks->mu);
        else
            ks->thread_running = 1;
    }
    if (rc) {
        if (ks->stop_fd >= 0)
            close(ks->stop_fd);
        fb_k8s_close(&ks->watch_api);
        fb_k8s_close(&ks->api);
        return rc;
    }
    fb_log_debug("kubernetes backend: server %s, namespace %s%s",
                 ks->api.server, ks->api.ns,
                 ks->api.in_cluster ? " (in-cluster)" : "");
    return 0;
}

static void delete_secret(struct k8s_state *ks)
{
    if (!ks->secret[0])
        return;
    char path[300];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/secrets/%s",
             ks->api.ns, ks->secret);
    long status;
    json_t *reply = NULL;
    int rc = fb_k8s_json(&ks->api, "DELETE", path, NULL, NULL,
                         REQUEST_TIMEOUT_MS, &status, &reply);
    if (rc == 0 && status != 200 && status != 202 && status != 404)
        rc = fb_k8s_refused(&ks->api, FIBER_EBACKEND, "deleting the run's "
                            "Secret", status, reply);
    if (rc)
        fb_log_warn("kubernetes backend: %s", fiber_last_error());
    json_decref(reply);
    ks->secret[0] = '\0';
}

static void k8s_fini(struct fb_backend *be)
{
    struct k8s_state *ks = be->state;
    if (ks->thread_running) {
        pthread_mutex_lock(&ks->mu);
        ks->stopping = 1;
        pthread_mutex_unlock(&ks->mu);
        uint64_t one = 1;
        if (write(ks->stop_fd, &one, sizeof one) < 0) {
            /* Cannot fail on a fresh eventfd. */
        }
        pthread_join(ks->thread, NULL);
        ks->thread_running = 0;
    }
    delete_secret(ks);
    while (ks->entries) { /* every job was released: none, normally */
        struct k8s_entry *e = ks->entries;
        ks->entries = e->next;
        close(e->efd);
        free(e);
    }
    pthread_mutex_destroy(&ks->mu);
    if (ks->stop_fd >= 0)
        close(ks->stop_fd);
    fb_k8s_close(&ks->watch_api);
    fb_k8s_close(&ks->api);
}

/* ---- creating a job ------------------------------------------------------------ */

/* Creates the run's Secret holding the bootstrap token (replacing one of
 * the same name left by an earlier run of the same id). */
static int make_secret(struct k8s_state *ks, const struct fb_job_spec *spec)
{
    if (ks->secret[0])
        return 0;
    char name[64], path[300], b64[128];
    snprintf(name, sizeof name, "%s-boot", ks->run);
    if (spec->secret_len * 4 / 3 + 4 >= sizeof b64)
        return fb_err(FIBER_EINVAL, "bootstrap secret is too long");
    sodium_bin2base64(b64, sizeof b64, spec->secret, spec->secret_len,
                      sodium_base64_VARIANT_ORIGINAL);
    json_t *body = json_pack(
        "{s:s, s:s, s:{s:s, s:{s:s, s:s, s:s}}, s:s, s:{s:s}}", "apiVersion",
        "v1", "kind", "Secret", "metadata", "name", name, "labels",
        FB_LABEL_RUN, ks->run, FB_LABEL_ROLE, "secret",
        "app.kubernetes.io/managed-by", "fiber", "type", "Opaque", "data",
        SECRET_KEY, b64);
    sodium_memzero(b64, sizeof b64);
    if (!body)
        return fb_err(FIBER_ENOMEM, "out of memory describing a Secret");
    if (ks->owner_uid[0]) /* goes with the master's pod, as the jobs do */
        json_object_set_new(
            json_object_get(body, "metadata"), "ownerReferences",
            json_pack("[{s:s, s:s, s:s, s:s}]", "apiVersion", "v1", "kind",
                      "Pod", "name", ks->owner_name, "uid", ks->owner_uid));
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/secrets", ks->api.ns);
    long status;
    json_t *reply = NULL;
    int rc = fb_k8s_json(&ks->api, "POST", path, body, NULL,
                         REQUEST_TIMEOUT_MS, &status, &reply);
    if (rc == 0 && status == 409) {
        json_decref(reply);
        reply = NULL;
        snprintf(path, sizeof path, "/api/v1/namespaces/%s/secrets/%s",
                 ks->api.ns, name);
        rc = fb_k8s_json(&ks->api, "PUT", path, body, NULL,
                         REQUEST_TIMEOUT_MS, &status, &reply);
    }
    json_decref(body); /* held the token: free it now */
    char what[200];
    snprintf(what, sizeof what, "creating Secret '%s' (the run's token) "
             "in namespace '%s'", name, ks->api.ns);
    if (rc == 0 && status != 200 && status != 201)
        rc = fb_k8s_refused(&ks->api, FIBER_ESPAWN, what, status, reply);
    json_decref(reply);
    if (rc == 0)
        fb_strlcpy(ks->secret, name, sizeof ks->secret);
    return rc;
}

int fb_k8s_add_claims(const char *list, json_t *volumes, json_t *mounts)
{
    int bad = 0, n = 0;
    for (const char *p = list; *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *start = p;
        char item[512], *claim = item, *path, *mode;
        if (len >= sizeof item)
            return fb_err(FIBER_ECONFIG, "k8s_volumes entry is too long");
        memcpy(item, p, len);
        item[len] = '\0';
        p += len + (comma ? 1 : 0);
        if (!len)
            continue;
        path = strchr(item, ':');
        if (path)
            *path++ = '\0';
        mode = path ? strchr(path, ':') : NULL;
        if (mode)
            *mode++ = '\0';
        if (!claim[0] || !path || path[0] != '/' ||
            (mode && strcmp(mode, "ro") != 0 && strcmp(mode, "rw") != 0))
            return fb_err(FIBER_ECONFIG,
                          "k8s_volumes entry '%.*s' is not "
                          "claim:/mount/path[:ro|:rw]",
                          (int)len, start);
        char vol[32];
        snprintf(vol, sizeof vol, "data-%d", n++);
        int ro = mode && strcmp(mode, "ro") == 0;
        fb_json_push(volumes,
             json_pack("{s:s, s:{s:s, s:b}}", "name", vol,
                       "persistentVolumeClaim", "claimName", claim,
                       "readOnly", ro),
             &bad);
        fb_json_push(mounts,
             json_pack("{s:s, s:s, s:b}", "name", vol, "mountPath", path,
                       "readOnly", ro),
             &bad);
    }
    return bad ? fb_err(FIBER_ENOMEM, "out of memory") : 0;
}

static json_t *limits_of(const fiber_job_opts *o, int *bad)
{
    json_t *l = json_object();
    char q[32];
    if (!l)
        *bad = 1;
    if (l && o && o->cpu > 0) {
        snprintf(q, sizeof q, "%d", o->cpu);
        fb_json_put(l, "cpu", json_string(q), bad);
    }
    if (l && o && o->memory_mb > 0) {
        snprintf(q, sizeof q, "%dMi", o->memory_mb);
        fb_json_put(l, "memory", json_string(q), bad);
    }
    if (l && o && o->gpu > 0) {
        snprintf(q, sizeof q, "%d", o->gpu);
        fb_json_put(l, "nvidia.com/gpu", json_string(q), bad);
    }
    return l;
}

static json_t *container_of(const struct fb_config *cfg,
                            const struct fb_job_spec *spec, const char *image,
                            const char *program, json_t *mounts)
{
    json_t *c = json_object(), *cmd = json_array(), *args = json_array();
    json_t *env = json_array();
    int bad = !c || !cmd || !args || !env;
    fb_json_put(c, "name", json_string(CONTAINER), &bad);
    fb_json_put(c, "image", json_string(image), &bad);
    if (cfg->k8s_pull_policy[0])
        fb_json_put(c, "imagePullPolicy", json_string(cfg->k8s_pull_policy),
                    &bad);
    fb_json_push(cmd, json_string(program), &bad);
    fb_json_put(c, "command", cmd, &bad);
    for (size_t i = 1; spec->argv[0] && spec->argv[i]; i++)
        fb_json_push(args, json_string(spec->argv[i]), &bad);
    fb_json_put(c, "args", args, &bad);
    for (size_t i = 0; spec->env && spec->env[i]; i++) {
        const char *eq = strchr(spec->env[i], '=');
        if (!eq)
            continue;
        fb_json_push(env,
             json_pack("{s:s%, s:s}", "name", spec->env[i],
                       (size_t)(eq - spec->env[i]), "value", eq + 1),
             &bad);
    }
    fb_json_push(env,
         json_pack("{s:s, s:s}", "name", SECRET_VAR, "value",
                   SECRET_DIR "/" SECRET_KEY),
         &bad);
    fb_json_put(c, "env", env, &bad);
    if (spec->opts && spec->opts->workdir)
        fb_json_put(c, "workingDir", json_string(spec->opts->workdir), &bad);
    fb_json_put(c, "resources", json_pack("{s:o}", "limits", limits_of(spec->opts,
                                                              &bad)),
        &bad);
    fb_json_put(c, "volumeMounts", json_incref(mounts), &bad);
    if (bad) {
        json_decref(c);
        return NULL;
    }
    return c;
}

/* The body of POST pods. */
static int pod_of(struct fb_backend *be, const struct fb_job_spec *spec,
                  const char *pod, const char *image, const char *program,
                  json_t **out)
{
    struct k8s_state *ks = be->state;
    json_t *volumes = json_array(), *mounts = json_array();
    int bad = !volumes || !mounts;
    fb_json_push(volumes,
         json_pack("{s:s, s:{s:s, s:i}}", "name", "fiber-boot", "secret",
                   "secretName", ks->secret, "defaultMode", 0444),
         &bad);
    fb_json_push(mounts,
         json_pack("{s:s, s:s, s:b}", "name", "fiber-boot", "mountPath",
                   SECRET_DIR, "readOnly", 1),
         &bad);
    int rc = bad ? fb_err(FIBER_ENOMEM, "out of memory")
                 : fb_k8s_add_claims(be->cfg->k8s_volumes, volumes, mounts);
    char id[32];
    snprintf(id, sizeof id, "%llu", (unsigned long long)spec->job_id);
    json_t *p = rc ? NULL : json_pack(
        "{s:s, s:s, s:{s:s, s:{s:s, s:s, s:s, s:s}, s:{s:s}},"
        " s:{s:s, s:I, s:b, s:b, s:b, s:[o], s:o}}",
        "apiVersion", "v1", "kind", "Pod", "metadata", "name", pod, "labels",
        FB_LABEL_RUN, ks->run, FB_LABEL_JOB, id, FB_LABEL_ROLE, "job",
        "app.kubernetes.io/managed-by", "fiber", "annotations", FB_LABEL_NAME,
        spec->name, "spec", "restartPolicy", "Never",
        "terminationGracePeriodSeconds", (json_int_t)ks->grace_s,
        "enableServiceLinks", 0, "automountServiceAccountToken", 0,
        "shareProcessNamespace", 1,
        "containers", container_of(be->cfg, spec, image, program, mounts),
        "volumes", json_incref(volumes));
    if (!rc && !p)
        rc = fb_err(FIBER_ENOMEM, "out of memory describing pod %s", pod);
    if (p && be->cfg->k8s_host_network)
        json_object_set_new(json_object_get(p, "spec"), "hostNetwork",
                            json_true());
    if (p && ks->owner_uid[0])
        json_object_set_new(
            json_object_get(p, "metadata"), "ownerReferences",
            json_pack("[{s:s, s:s, s:s, s:s}]", "apiVersion", "v1", "kind",
                      "Pod", "name", ks->owner_name, "uid", ks->owner_uid));
    json_decref(volumes);
    json_decref(mounts);
    *out = p;
    return rc;
}

/* The job's image and the program's path; the image is required. */
static int check_spec(struct fb_backend *be, const struct fb_job_spec *spec,
                      const char **image, char *program, size_t size)
{
    const fiber_job_opts *o = spec->opts;
    *image = o && o->image && o->image[0] ? o->image : be->cfg->image;
    if (!(*image)[0])
        return fb_err(FIBER_ECONFIG,
                      "job '%s' has no image: the kubernetes backend runs "
                      "every job in an image that holds this program at the "
                      "same path, pulled by the cluster; set the `image` key "
                      "(FIBER_IMAGE) or the job's image option (`fiber image "
                      "build` makes one; push it to the cluster's registry)",
                      spec->name);
    return fb_job_program(spec, program, size);
}

static int delete_pod(struct k8s_state *ks, const char *pod, long grace_s);
static int unrecord(struct k8s_state *ks, struct fb_job *job);

static struct k8s_entry *add_entry(struct k8s_state *ks, const char *pod)
{
    struct k8s_entry *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (e->efd < 0) {
        free(e);
        return NULL;
    }
    fb_strlcpy(e->pod, pod, sizeof e->pod);
    e->created_seq = UINT64_MAX;
    pthread_mutex_lock(&ks->mu);
    e->next = ks->entries;
    ks->entries = e;
    pthread_mutex_unlock(&ks->mu);
    return e;
}

static void drop_entry(struct k8s_state *ks, struct k8s_entry *e)
{
    pthread_mutex_lock(&ks->mu);
    for (struct k8s_entry **p = &ks->entries; *p; p = &(*p)->next) {
        if (*p == e) {
            *p = e->next;
            break;
        }
    }
    pthread_mutex_unlock(&ks->mu);
    close(e->efd);
    free(e);
}

/* A list ran while this pod's create was in flight and did not hold it:
 * if the pod is gone already, no watch event will say so. */
static void recheck_created(struct k8s_state *ks, struct k8s_entry *e)
{
    char path[400];
    pods_path(ks, path, sizeof path, e->pod, NULL);
    long status = 0;
    json_t *pod = NULL;
    if (fb_k8s_json(&ks->api, "GET", path, NULL, NULL, REQUEST_TIMEOUT_MS,
                    &status, &pod) != 0)
        fb_err_clear(); /* the watch will tell, as for any pod */
    if (status == 200) {
        note_pod(ks, pod, 0);
    } else if (status == 404) {
        pthread_mutex_lock(&ks->mu);
        entry_ended(e, deleted_status(e), NULL);
        pthread_mutex_unlock(&ks->mu);
    }
    json_decref(pod);
}

/* POSTs a pod body on connection api; returns 0 or FIBER_ESPAWN (or
 * another code) with the message; on a lost answer the pod is deleted, in
 * case the server made it. */
static int post_pod(struct k8s_state *ks, struct fb_k8s *api, json_t *body,
                    const char *pod)
{
    char path[400], what[200];
    pods_path(ks, path, sizeof path, NULL, NULL);
    long status = 0;
    json_t *reply = NULL;
    int rc = fb_k8s_json(api, "POST", path, body, NULL, REQUEST_TIMEOUT_MS,
                         &status, &reply);
    const char *job_name = json_string_value(json_object_get(
        json_object_get(json_object_get(body, "metadata"), "annotations"),
        FB_LABEL_NAME));
    snprintf(what, sizeof what, "creating pod %s for job '%s' in namespace "
             "'%s'", pod, job_name ? job_name : "?", ks->api.ns);
    if (rc == 0 && status != 201 && status != 200)
        rc = fb_k8s_refused(api, FIBER_ESPAWN, what, status, reply);
    else if (rc)
        rc = fb_err(FIBER_ESPAWN, "%s: %s", what, fiber_last_error());
    json_decref(reply);
    if (rc && status == 0) {
        char why[1024];
        fb_strlcpy(why, fiber_last_error(), sizeof why);
        char del[400], tail[64];
        snprintf(tail, sizeof tail, "?gracePeriodSeconds=0");
        pods_path(ks, del, sizeof del, pod, tail);
        long st;
        json_t *r = NULL;
        if (fb_k8s_json(api, "DELETE", del, NULL, NULL, REQUEST_TIMEOUT_MS,
                        &st, &r) != 0)
            fb_log_debug("kubernetes backend: %s", fiber_last_error());
        json_decref(r);
        fb_err(rc, "%s", why);
    }
    return rc;
}

/* The pod exists: its entry counts for lists from now on. */
static void pod_created(struct k8s_state *ks, struct k8s_entry *e)
{
    pthread_mutex_lock(&ks->mu);
    e->created_seq = ++ks->create_seq;
    int recheck = e->recheck;
    pthread_mutex_unlock(&ks->mu);
    if (recheck)
        recheck_created(ks, e);
}

static int k8s_create_job(struct fb_backend *be,
                          const struct fb_job_spec *spec, struct fb_job *job)
{
    struct k8s_state *ks = be->state;
    struct k8s_job *kj = job->priv;
    const char *image;
    char program[PATH_MAX], pod[64], part[64];
    int rc = check_spec(be, spec, &image, program, sizeof program);
    if (rc == 0)
        rc = make_secret(ks, spec);
    if (rc)
        return rc;
    /* A restarted master's jobs (fiber run --requeue) are named apart
     * from its predecessor's, whose pods may not be gone yet. */
    if (be->cfg->resumed > 0)
        snprintf(part, sizeof part, "%s-r%d-%llu-%s", ks->run,
                 be->cfg->resumed, (unsigned long long)spec->job_id,
                 spec->name);
    else
        snprintf(part, sizeof part, "%s-%llu-%s", ks->run,
                 (unsigned long long)spec->job_id, spec->name);
    fb_k8s_dns_name(part, pod, sizeof pod);
    json_t *body = NULL;
    rc = pod_of(be, spec, pod, image, program, &body);
    if (rc)
        return rc;
    /* The entry exists before the pod does, so that no event of the pod
     * can pass the watch thread unseen. */
    struct k8s_entry *e = add_entry(ks, pod);
    if (!e) {
        json_decref(body);
        return fb_err_errno(FIBER_ESYS, "cannot make an eventfd");
    }
    kj->e = e;
    job->pid = -1;
    job->state = FB_JOB_RUNNING;
    if (ks->batching) { /* end_batch POSTs it */
        struct k8s_pending *pd = calloc(1, sizeof *pd);
        if (!pd) {
            json_decref(body);
            drop_entry(ks, e);
            kj->e = NULL;
            return fb_err(FIBER_ENOMEM, "out of memory");
        }
        pd->job = job;
        pd->body = body;
        pd->next = ks->pending;
        ks->pending = pd;
        return 0;
    }
    uint64_t t0 = fb_now_ms();
    rc = post_pod(ks, &ks->api, body, pod);
    json_decref(body);
    if (rc) {
        drop_entry(ks, e);
        kj->e = NULL;
        return rc;
    }
    pod_created(ks, e);
    fb_strlcpy(job->engine_id, pod, sizeof job->engine_id);
    fb_log_debug("job %llu '%s': pod %s (created in %llu ms)",
                 (unsigned long long)spec->job_id, spec->name, pod,
                 (unsigned long long)(fb_now_ms() - t0));
    return 0;
}

/* ---- watching, stopping, reading ----------------------------------------------- */

static int k8s_event_fd(struct fb_backend *be, struct fb_job *job)
{
    FB_UNUSED(be);
    struct k8s_job *kj = job->priv;
    return kj->e->efd;
}

static int k8s_poll_job(struct fb_backend *be, struct fb_job *job)
{
    struct k8s_state *ks = be->state;
    struct k8s_entry *e = ((struct k8s_job *)job->priv)->e;
    uint64_t n;
    if (read(e->efd, &n, sizeof n) < 0) {
        /* EAGAIN: nothing new. */
    }
    pthread_mutex_lock(&ks->mu);
    if (e->ended) {
        fb_job_exited(job, e->exit_status);
        if (e->why[0])
            fb_log_warn("job %llu (pod %s): %s", (unsigned long long)job->id,
                        e->pod, e->why);
    }
    pthread_mutex_unlock(&ks->mu);
    return 0;
}

/* DELETE the pod with a grace period; a pod already gone is fine. */
static int delete_pod(struct k8s_state *ks, const char *pod, long grace_s)
{
    char path[400], tail[64], what[160];
    snprintf(tail, sizeof tail, "?gracePeriodSeconds=%ld", grace_s);
    pods_path(ks, path, sizeof path, pod, tail);
    long status;
    json_t *reply = NULL;
    int rc = fb_k8s_json(&ks->api, "DELETE", path, NULL, NULL,
                         REQUEST_TIMEOUT_MS, &status, &reply);
    snprintf(what, sizeof what, "deleting pod %s", pod);
    if (rc == 0 && status != 200 && status != 202 && status != 404)
        rc = fb_k8s_refused(&ks->api, FIBER_EBACKEND, what, status, reply);
    json_decref(reply);
    return rc;
}

static int k8s_signal_job(struct fb_backend *be, struct fb_job *job,
                          int force)
{
    struct k8s_state *ks = be->state;
    struct k8s_entry *e = ((struct k8s_job *)job->priv)->e;
    pthread_mutex_lock(&ks->mu);
    if (force || !e->signalled)
        e->signalled = force ? SIGKILL : SIGTERM;
    pthread_mutex_unlock(&ks->mu);
    if (unrecord(ks, job)) { /* never submitted: it ends here */
        pthread_mutex_lock(&ks->mu);
        entry_ended(e, deleted_status(e), NULL);
        pthread_mutex_unlock(&ks->mu);
        return 0;
    }
    return delete_pod(ks, e->pod, force ? 0 : ks->grace_s);
}

static int k8s_logs(struct fb_backend *be, struct fb_job *job, fiber_buf *out)
{
    struct k8s_state *ks = be->state;
    struct k8s_entry *e = ((struct k8s_job *)job->priv)->e;
    char path[400], what[160];
    pods_path(ks, path, sizeof path, e->pod, "/log?container=" CONTAINER);
    long status;
    fiber_buf body = {0};
    int rc = fb_k8s_request(&ks->api, "GET", path, NULL, NULL, 0,
                            REQUEST_TIMEOUT_MS, &status, &body);
    if (rc == 0 && status == 200) {
        if (body.len && fiber_buf_append(out, body.data, body.len) != 0)
            rc = fb_err(FIBER_ENOMEM, "out of memory reading logs");
    } else if (rc == 0) {
        json_t *reply = json_loadb((const char *)body.data, body.len, 0, NULL);
        snprintf(what, sizeof what, "reading the log of pod %s", e->pod);
        rc = fb_k8s_refused(&ks->api, FIBER_EBACKEND, what, status, reply);
        json_decref(reply);
    }
    fiber_buf_free(&body);
    return rc;
}

static void k8s_release_job(struct fb_backend *be, struct fb_job *job)
{
    struct k8s_state *ks = be->state;
    struct k8s_job *kj = job->priv;
    struct k8s_entry *e = kj->e;
    if (!e)
        return;
    /* Ended or not, the pod goes now: a run leaves none behind (one still
     * recorded in a batch was never made). */
    if (!unrecord(ks, job) && delete_pod(ks, e->pod, 0) != 0)
        fb_log_warn("kubernetes backend: %s", fiber_last_error());
    if (job->state != FB_JOB_EXITED) {
        pthread_mutex_lock(&ks->mu);
        fb_job_exited(job, e->ended ? e->exit_status : -SIGKILL);
        pthread_mutex_unlock(&ks->mu);
    }
    drop_entry(ks, e);
    kj->e = NULL;
}

/* ---- batches ------------------------------------------------------------------ */

static void k8s_begin_batch(struct fb_backend *be)
{
    struct k8s_state *ks = be->state;
    ks->batching = 1;
}

/* Takes job's recorded pod out of the batch (it is never POSTed);
 * returns 1 if it was there. */
static int unrecord(struct k8s_state *ks, struct fb_job *job)
{
    for (struct k8s_pending **p = &ks->pending; *p; p = &(*p)->next) {
        if ((*p)->job == job) {
            struct k8s_pending *pd = *p;
            *p = pd->next;
            json_decref(pd->body);
            free(pd);
            return 1;
        }
    }
    return 0;
}

/* The batch's POSTs, shared by the threads of end_batch. */
struct batch_run {
    struct k8s_state *ks;
    pthread_mutex_t mu;
    struct k8s_pending *next; /* the next pod to POST */
};

static void *batch_worker(void *arg)
{
    struct batch_run *b = arg;
    struct fb_k8s api;
    int open_rc = fb_k8s_clone(&api, &b->ks->api);
    for (;;) {
        pthread_mutex_lock(&b->mu);
        struct k8s_pending *pd = b->next;
        if (pd)
            b->next = pd->next;
        pthread_mutex_unlock(&b->mu);
        if (!pd)
            break;
        struct k8s_entry *e = ((struct k8s_job *)pd->job->priv)->e;
        pd->rc = open_rc ? open_rc
                         : post_pod(b->ks, &api, pd->body, e->pod);
        if (pd->rc) {
            fb_strlcpy(pd->why, open_rc ? "out of memory" : fiber_last_error(),
                       sizeof pd->why);
            fb_err_clear();
        }
    }
    if (open_rc == 0)
        fb_k8s_close(&api);
    return NULL;
}

static int k8s_end_batch(struct fb_backend *be)
{
    struct k8s_state *ks = be->state;
    ks->batching = 0;
    struct k8s_pending *list = NULL; /* oldest first, as created */
    while (ks->pending) {
        struct k8s_pending *pd = ks->pending;
        ks->pending = pd->next;
        pd->next = list;
        list = pd;
    }
    if (!list)
        return 0;
    size_t n = 0;
    for (struct k8s_pending *pd = list; pd; pd = pd->next)
        n++;
    uint64_t t0 = fb_now_ms();
    struct batch_run b = {.ks = ks, .next = list};
    pthread_mutex_init(&b.mu, NULL);
    pthread_t threads[BATCH_THREADS];
    size_t started = 0;
    for (; started < BATCH_THREADS && started < n; started++)
        if (fb_thread_start(&threads[started], batch_worker, &b,
                            "a pod creation thread") != 0)
            break;
    if (started == 0)
        batch_worker(&b); /* no thread to be had: one after the other */
    for (size_t i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    pthread_mutex_destroy(&b.mu);
    int first_rc = 0;
    char first_why[1024] = "";
    for (struct k8s_pending *pd = list; pd;) {
        struct k8s_pending *next = pd->next;
        struct k8s_entry *e = ((struct k8s_job *)pd->job->priv)->e;
        if (pd->rc == 0) {
            fb_strlcpy(pd->job->engine_id, e->pod, sizeof pd->job->engine_id);
            pod_created(ks, e);
        } else {
            pthread_mutex_lock(&ks->mu);
            entry_ended(e, 127, pd->why);
            pthread_mutex_unlock(&ks->mu);
            if (!first_rc) {
                first_rc = pd->rc;
                fb_strlcpy(first_why, pd->why, sizeof first_why);
            }
        }
        json_decref(pd->body);
        free(pd);
        pd = next;
    }
    fb_log_debug("kubernetes backend: %zu pods created at once in %llu ms",
                 n, (unsigned long long)(fb_now_ms() - t0));
    return first_rc ? fb_err(first_rc, "%s", first_why) : 0;
}

const struct fb_backend_ops fb_backend_kubernetes = {
    .name = "kubernetes",
    /* Pods do not share this host's unix sockets; the kubelet enforces
     * the grace of a deletion (SIGKILL after it) and reports a container's
     * end seconds after it: forcing the deletion at the grace lost the
     * status of a job that SIGTERM had ended (read -SIGKILL). */
    .caps = FB_CAP_OWN_GRACE,
    .state_size = sizeof(struct k8s_state),
    .job_size = sizeof(struct k8s_job),
    .init = k8s_init,
    .fini = k8s_fini,
    .create_job = k8s_create_job,
    .event_fd = k8s_event_fd,
    .poll_job = k8s_poll_job,
    .signal_job = k8s_signal_job,
    .logs = k8s_logs,
    .begin_batch = k8s_begin_batch,
    .end_batch = k8s_end_batch,
    .release_job = k8s_release_job,
    .master_boot = fb_k8s_master_boot,
};
