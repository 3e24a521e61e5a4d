/*
 * test_kubernetes.c -- the kubernetes backend against a real single-node
 * cluster (scripts/k8s-local.sh: kube-apiserver, kube-controller-manager,
 * kube-scheduler, and a kubelet that runs every pod as a container of this
 * host's Docker Engine, from image fiber-test/test_kubernetes:ci made by
 * `fiber image build`, on the node's network).
 *
 * tests/k8s/run.sh runs each case with the configuration of that cluster
 * in the environment (FIBER_BACKEND=kubernetes, FIBER_K8S_SERVER,
 * FIBER_K8S_CA_FILE, FIBER_K8S_TOKEN_FILE for user "fiber", allowed pods
 * and secrets in namespace fiber-test only, FIBER_K8S_NAMESPACE), and the
 * administrator's token in K8S_ADMIN_TOKEN_FILE, with which the cases look
 * at the cluster as an administrator would.  Without it every case is
 * skipped (exit 77; a failure under CI).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "backend/backend.h"
#include "backend/kubernetes/k8s_api.h"
#include "backend/kubernetes/kubernetes.h"
#include "base/common.h"
#include "runtime/runtime.h"
#include "harness.h"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int arg_int(const void *arg, size_t len)
{
    int v = 0;
    if (len == sizeof v)
        memcpy(&v, arg, sizeof v);
    return v;
}

/* ---- tasks the pods run ---------------------------------------------------- */

FIBER_TASK(ret_arg) { return arg_int(arg, len); }

FIBER_TASK(kill_self)
{
    raise(SIGKILL);
    return 0;
}

FIBER_TASK(sleeper)
{
    sleep_ms(arg_int(arg, len));
    return 0;
}

/* Returns 0 if the bootstrap is gone from the environment and the
 * transport is tcp. */
FIBER_TASK(in_pod)
{
    if (getenv("FIBER_BOOT_SECRET_FILE") || getenv("FIBER_BOOT_ADDR"))
        return 3;
    char tr[16];
    if (fiber_config_get("transport", tr, sizeof tr) != 0 ||
        strcmp(tr, "tcp") != 0)
        return 4;
    return 0;
}

FIBER_TASK(square_slow)
{
    sleep_ms(5);
    int x = arg_int(arg, len);
    x *= x;
    return fiber_buf_append(out, &x, sizeof x);
}

/* ---- the cluster, as its administrator -------------------------------------- */

#define NEED_CLUSTER()                                                         \
    do {                                                                       \
        if (!getenv("FIBER_K8S_SERVER") || !getenv("K8S_ADMIN_TOKEN_FILE"))    \
            TH_SKIP_ENGINE("no Kubernetes test cluster (run through "          \
                           "tests/k8s/run.sh after tests/k8s/cluster.sh "     \
                           "start)");                                          \
    } while (0)

static struct fb_k8s admin;

static void admin_open(void)
{
    struct fb_config c;
    fb_config_defaults(&c);
    fb_strlcpy(c.k8s_server, getenv("FIBER_K8S_SERVER"), sizeof c.k8s_server);
    fb_strlcpy(c.k8s_ca_file, getenv("FIBER_K8S_CA_FILE"),
               sizeof c.k8s_ca_file);
    fb_strlcpy(c.k8s_token_file, getenv("K8S_ADMIN_TOKEN_FILE"),
               sizeof c.k8s_token_file);
    fb_strlcpy(c.k8s_namespace, getenv("FIBER_K8S_NAMESPACE"),
               sizeof c.k8s_namespace);
    CHECK_OK(fb_k8s_open(&admin, &c));
}

/* GET as the administrator; returns the status, the body in *out. */
static long admin_get(const char *path, json_t **out)
{
    long status = 0;
    CHECK_OK(fb_k8s_json(&admin, "GET", path, NULL, NULL, 20000, &status,
                         out));
    return status;
}

/* The run's pods, as a JSON list (the caller decrefs). */
static json_t *run_pods(void)
{
    char run[64], path[300];
    fb_k8s_dns_name(fiber_run_id(), run, sizeof run);
    snprintf(path, sizeof path,
             "/api/v1/namespaces/%s/pods?labelSelector=fiber.run%%3D%s",
             admin.ns, run);
    json_t *l = NULL;
    CHECK_EQ(admin_get(path, &l), 200);
    return l;
}

/* Deletes pod name at once, as an administrator (or a node failure) would. */
static void admin_delete_pod(const char *name)
{
    char path[400];
    snprintf(path, sizeof path,
             "/api/v1/namespaces/%s/pods/%s?gracePeriodSeconds=0", admin.ns,
             name);
    long status = 0;
    json_t *r = NULL;
    CHECK_OK(fb_k8s_json(&admin, "DELETE", path, NULL, NULL, 20000, &status,
                         &r));
    json_decref(r);
    CHECK(status == 200 || status == 404);
}

static int exitcode_of(const char *task, int arg, const fiber_job_opts *o)
{
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, task, &arg, sizeof arg, o));
    CHECK_OK(fiber_process_join(p, 60000));
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    fiber_process_free(p);
    return code;
}

static const char *json_str(json_t *o, const char *path0, const char *path1,
                            const char *path2)
{
    json_t *v = json_object_get(o, path0);
    if (path1)
        v = json_object_get(v, path1);
    if (path2)
        v = json_object_get(v, path2);
    return json_string_value(v) ? json_string_value(v) : "";
}

/* ---- processes as pods -------------------------------------------------------- */

TEST(process_exit_codes_in_pods)
{
    NEED_CLUSTER();
    CHECK_EQ(exitcode_of("ret_arg", 7, NULL), 7);
    CHECK_EQ(exitcode_of("ret_arg", 0, NULL), 0);
    CHECK_EQ(exitcode_of("kill_self", 0, NULL), -SIGKILL);
    CHECK_EQ(exitcode_of("in_pod", 0, NULL), 0);
}

/* A watch from a resourceVersion the server has forgotten gets 410 Gone:
 * the backend lists again and resumes, and no exit is missed. */
TEST(watch_resumes_after_410_gone)
{
    NEED_CLUSTER();
    fb_k8s_test_expire_next_watch();
    CHECK_EQ(exitcode_of("ret_arg", 9, NULL), 9);
    for (int i = 0; i < 50 && fb_k8s_test_lists() < 2; i++)
        sleep_ms(100);
    CHECK(fb_k8s_test_lists() >= 2);
    fb_k8s_test_expire_next_watch();
    /* The current watch goes on; exits keep arriving. */
    for (int i = 0; i < 3; i++)
        CHECK_EQ(exitcode_of("ret_arg", i + 1, NULL), i + 1);
    fprintf(stderr, "lists: %u\n", fb_k8s_test_lists());
}

/* Waits (up to 60 s) until the run's one pod's container runs: a pod
 * deleted while the kubelet is still starting its container may be
 * stopped only by the SIGKILL at the end of its grace period. */
static void wait_container_running(void)
{
    for (int i = 0; i < 600; i++) {
        json_t *l = run_pods();
        json_t *pod = json_array_get(json_object_get(l, "items"), 0);
        json_t *st = json_object_get(
            json_array_get(json_object_get(json_object_get(pod, "status"),
                                           "containerStatuses"),
                           0),
            "state");
        int running = json_object_get(st, "running") != NULL;
        json_decref(l);
        if (running)
            return;
        sleep_ms(100);
    }
    TH_FAIL("the pod's container did not run within 60 s");
}

TEST(terminate_deletes_the_pod_politely)
{
    NEED_CLUSTER();
    admin_open();
    fiber_process *p;
    int ms = 60000;
    CHECK_OK(fiber_process_start(&p, "sleeper", &ms, sizeof ms, NULL));
    wait_container_running();
    sleep_ms(300);
    uint64_t t0 = fb_now_ms();
    CHECK_OK(fiber_process_terminate(p));
    CHECK_OK(fiber_process_join(p, 2000 + FB_OWN_GRACE_SLACK_MS + 10000));
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    uint64_t took = fb_now_ms() - t0;
    fprintf(stderr, "terminated in %llu ms, exit code %d\n",
            (unsigned long long)took, code);
    /* The pod was deleted with its grace period (2 s): the kubelet stops
     * the container with SIGTERM (on the test node about 1-2 s after the
     * deletion), then SIGKILL if the grace runs out, and reports the
     * container's end seconds later.  The backend has FB_CAP_OWN_GRACE,
     * so fiber forces the deletion only FB_OWN_GRACE_SLACK_MS after the
     * grace: the sleeper, ended by the SIGTERM, reads -SIGTERM (it read
     * -SIGKILL when fiber forced at the grace and the pod went before its
     * end was reported). */
    CHECK_EQ(code, -SIGTERM);
    CHECK(took < 2000 + FB_OWN_GRACE_SLACK_MS + 5000);
    fiber_process_free(p);
    size_t left = 1;
    for (int i = 0; i < 300 && left > 0; i++) {
        json_t *l = run_pods();
        left = json_array_size(json_object_get(l, "items"));
        json_decref(l);
        if (left)
            sleep_ms(100);
    }
    CHECK_EQ(left, 0);
}

/* The pod spec: labels, restartPolicy, limits, the token in a Secret and
 * nowhere in the spec; the Secret goes with the run. */
TEST(pod_spec_labels_limits_and_secret)
{
    NEED_CLUSTER();
    admin_open();
    const char *env[] = {"K8S_TEST_VAR=hello", NULL};
    fiber_job_opts o = {.cpu = 1, .memory_mb = 64, .gpu = 1, .env = env,
                        .name = "spec-check"};
    fiber_process *p;
    int ms = 30000;
    CHECK_OK(fiber_process_start(&p, "sleeper", &ms, sizeof ms, &o));
    json_t *l = run_pods();
    CHECK_EQ(json_array_size(json_object_get(l, "items")), 1);
    json_t *pod = json_array_get(json_object_get(l, "items"), 0);
    CHECK_STR(json_str(pod, "metadata", "labels", "fiber.role"), "job");
    CHECK_STR(json_str(pod, "spec", "restartPolicy", NULL), "Never");
    json_t *c = json_array_get(json_object_get(json_object_get(pod, "spec"),
                                               "containers"),
                               0);
    json_t *lim = json_object_get(json_object_get(c, "resources"), "limits");
    CHECK_STR(json_str(lim, "cpu", NULL, NULL), "1");
    CHECK_STR(json_str(lim, "memory", NULL, NULL), "64Mi");
    CHECK_STR(json_str(lim, "nvidia.com/gpu", NULL, NULL), "1");
    CHECK_STR(json_str(pod, "metadata", "annotations", "fiber.name"),
              "spec-check");
    /* Neither the token nor any encoding of it is in the pod. */
    char *dump = json_dumps(pod, JSON_COMPACT);
    CHECK(dump);
    CHECK_CONTAINS(dump, "K8S_TEST_VAR");
    CHECK_CONTAINS(dump, "FIBER_BOOT_SECRET_FILE");
    char hex[2 * sizeof fb_rt()->token + 1], b64[128];
    fb_hex(fb_rt()->token, sizeof fb_rt()->token, hex, sizeof hex);
    sodium_bin2base64(b64, sizeof b64, fb_rt()->token, sizeof fb_rt()->token,
                      sodium_base64_VARIANT_ORIGINAL);
    CHECK(!strstr(dump, hex));
    CHECK(!strstr(dump, b64));
    free(dump);
    /* The Secret holds it, labelled with the run. */
    const char *secret = json_str(
        json_array_get(json_object_get(json_object_get(pod, "spec"),
                                       "volumes"),
                       0),
        "secret", "secretName", NULL);
    CHECK(secret[0]);
    char path[300], secret_name[128];
    fb_strlcpy(secret_name, secret, sizeof secret_name);
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/secrets/%s", admin.ns,
             secret_name);
    json_t *s = NULL;
    CHECK_EQ(admin_get(path, &s), 200);
    CHECK_STR(json_str(s, "data", "token", NULL), b64);
    json_decref(s);
    json_decref(l);
    CHECK_OK(fiber_process_terminate(p));
    CHECK_OK(fiber_process_join(p, 30000));
    fiber_process_free(p);
    /* The run ends: its Secret and pods are gone. */
    fiber_shutdown();
    s = NULL;
    CHECK_EQ(admin_get(path, &s), 404);
    json_decref(s);
    l = run_pods();
    CHECK_EQ(json_array_size(json_object_get(l, "items")), 0);
    json_decref(l);
}

/* k8s_volumes: each claim a persistentVolumeClaim volume, mounted at its
 * path, read-only with :ro. */
TEST(claims_are_mounted_into_every_pod)
{
    NEED_CLUSTER();
    admin_open();
    CHECK_OK(fiber_config_set("k8s_volumes",
                              "datasets:/data:ro,scratch:/scratch"));
    fiber_process *p;
    int ms = 30000;
    CHECK_OK(fiber_process_start(&p, "sleeper", &ms, sizeof ms, NULL));
    json_t *l = run_pods();
    json_t *pod = json_array_get(json_object_get(l, "items"), 0);
    CHECK(pod);
    json_t *spec = json_object_get(pod, "spec");
    json_t *c = json_array_get(json_object_get(spec, "containers"), 0);
    int claims = 0, mounts = 0;
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(spec, "volumes"), i, v)
    {
        json_t *pvc = json_object_get(v, "persistentVolumeClaim");
        const char *claim = json_str(pvc, "claimName", NULL, NULL);
        if (strcmp(claim, "datasets") == 0) {
            CHECK(json_is_true(json_object_get(pvc, "readOnly")));
            claims++;
        } else if (strcmp(claim, "scratch") == 0) {
            CHECK(!json_is_true(json_object_get(pvc, "readOnly")));
            claims++;
        }
    }
    json_array_foreach(json_object_get(c, "volumeMounts"), i, v)
    {
        const char *at = json_str(v, "mountPath", NULL, NULL);
        if (strcmp(at, "/data") == 0) {
            CHECK(json_is_true(json_object_get(v, "readOnly")));
            mounts++;
        } else if (strcmp(at, "/scratch") == 0) {
            mounts++;
        }
    }
    CHECK_EQ(claims, 2);
    CHECK_EQ(mounts, 2);
    json_decref(l);
    CHECK_OK(fiber_process_terminate(p));
    CHECK_OK(fiber_process_join(p, 30000));
    fiber_process_free(p);
}

/* ---- pools --------------------------------------------------------------------- */

struct killer {
    int killed;
    char victim[128];
};

static void *kill_a_worker(void *arg)
{
    struct killer *k = arg;
    sleep_ms(1500);
    json_t *l = run_pods();
    json_t *pod = json_array_get(json_object_get(l, "items"), 0);
    if (pod) {
        fb_strlcpy(k->victim, json_str(pod, "metadata", "name", NULL),
                   sizeof k->victim);
        admin_delete_pod(k->victim);
        k->killed = 1;
    }
    json_decref(l);
    return NULL;
}

TEST(deleted_worker_pod_loses_no_result)
{
    NEED_CLUSTER();
    admin_open();
    fiber_pool *pool;
    fiber_pool_opts o = {.workers = 2};
    CHECK_OK(fiber_pool_create(&pool, &o));
    enum { N = 600 };
    static int in[N], out[N];
    for (int i = 0; i < N; i++) {
        in[i] = i;
        out[i] = -1;
    }
    struct killer k = {0};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, kill_a_worker, &k) == 0);
    CHECK_OK(fiber_pool_map(pool, "square_slow", in, sizeof in[0], N, out,
                            sizeof out[0], 1));
    pthread_join(t, NULL);
    CHECK(k.killed);
    for (int i = 0; i < N; i++)
        CHECK_EQ(out[i], i * i);
    fiber_pool_stats st;
    CHECK_OK(fiber_pool_stats_get(pool, &st));
    fprintf(stderr, "deleted pod %s; workers started %llu, lost %llu, tasks "
                    "retried %llu\n",
            k.victim, (unsigned long long)st.workers_started,
            (unsigned long long)st.workers_lost,
            (unsigned long long)st.tasks_retried);
    CHECK(st.workers_lost >= 1);
    CHECK(st.workers_started >= 3);
    CHECK_EQ(st.tasks_done, N);
    fiber_pool_free(pool);
}

/* ---- errors -------------------------------------------------------------------- */

/* Starts a process that must fail with code; returns its message. */
static const char *start_fails(int code, const fiber_job_opts *o)
{
    static char msg[2048];
    fiber_process *p = NULL;
    int arg = 0;
    CHECK_ERR(fiber_process_start(&p, "ret_arg", &arg, sizeof arg, o), code);
    fb_strlcpy(msg, fiber_last_error(), sizeof msg);
    fprintf(stderr, "message: %s\n", msg);
    return msg;
}

static void temp_file(char *path, size_t size, const char *text)
{
    snprintf(path, size, "/tmp/fiber-k8s-test-XXXXXX");
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
}

TEST(wrong_token_is_refused_with_401)
{
    NEED_CLUSTER();
    char path[64];
    temp_file(path, sizeof path, "not-a-token-of-this-cluster\n");
    CHECK_OK(fiber_config_set("k8s_token_file", path));
    const char *m = start_fails(FIBER_EAUTH, NULL);
    CHECK_CONTAINS(m, "HTTP 401 Unauthorized");
    CHECK_CONTAINS(m, path);
    CHECK_CONTAINS(m, getenv("FIBER_K8S_SERVER"));
    unlink(path);
}

TEST(forbidden_namespace_is_refused_with_403)
{
    NEED_CLUSTER();
    CHECK_OK(fiber_config_set("k8s_namespace", "fiber-forbidden"));
    const char *m = start_fails(FIBER_EAUTH, NULL);
    CHECK_CONTAINS(m, "HTTP 403 Forbidden");
    CHECK_CONTAINS(m, "namespace 'fiber-forbidden'");
    CHECK_CONTAINS(m, "User \"fiber\" cannot list resource \"pods\"");
}

TEST(invalid_pod_spec_is_refused_with_422)
{
    NEED_CLUSTER();
    /* An environment variable name Kubernetes does not accept. */
    const char *env[] = {"1BAD=x", NULL};
    fiber_job_opts o = {.env = env};
    const char *m = start_fails(FIBER_ESPAWN, &o);
    CHECK_CONTAINS(m, "HTTP 422 Unprocessable Entity, Invalid");
    CHECK_CONTAINS(m, "spec.containers[0].env[");
    CHECK_CONTAINS(m, "\"1BAD\"");
    /* Two claims mounted at one path. */
    CHECK_OK(fiber_config_set("k8s_volumes", "claim-a:/data,claim-b:/data:ro"));
    m = start_fails(FIBER_ESPAWN, NULL);
    CHECK_CONTAINS(m, "HTTP 422");
    CHECK_CONTAINS(m, "mountPath");
    CHECK_CONTAINS(m, "must be unique");
}

TEST(bad_volume_list_is_a_config_error)
{
    NEED_CLUSTER();
    CHECK_OK(fiber_config_set("k8s_volumes", "claim-a:relative/path"));
    const char *m = start_fails(FIBER_ECONFIG, NULL);
    CHECK_CONTAINS(m, "claim-a:relative/path");
}

TEST(no_image_is_a_config_error)
{
    NEED_CLUSTER();
    CHECK_OK(fiber_config_set("image", ""));
    const char *m = start_fails(FIBER_ECONFIG, NULL);
    CHECK_CONTAINS(m, "has no image");
}

TEST(unreachable_server_is_named)
{
    NEED_CLUSTER();
    CHECK_OK(fiber_config_set("k8s_server", "https://127.0.0.1:1"));
    const char *m = start_fails(FIBER_EUNREACHABLE, NULL);
    CHECK_CONTAINS(m, "https://127.0.0.1:1");
    CHECK_CONTAINS(m, "Connection refused");
}

TEST(wrong_ca_fails_tls_verification)
{
    NEED_CLUSTER();
    /* The system's CAs did not sign the test cluster's certificate. */
    const char *bundle = "/etc/ssl/certs/ca-certificates.crt";
    if (access(bundle, R_OK) != 0)
        TH_SKIP("%s is absent", bundle);
    CHECK_OK(fiber_config_set("k8s_ca_file", bundle));
    const char *m = start_fails(FIBER_EAUTH, NULL);
    CHECK_CONTAINS(m, "TLS verification failed");
    CHECK_CONTAINS(m, bundle);
}

/* The HTTP layer's contract (backend/http/http.h) over TLS, on the
 * cluster's API server itself: a token it refuses is FIBER_EAUTH with
 * the status and the server's message; so is a certificate that does not
 * verify. */
TEST(http_layer_refused_token_is_eauth)
{
    NEED_CLUSTER();
    const char *server = getenv("FIBER_K8S_SERVER");
    struct fb_http h;
    CHECK_OK(fb_http_open_url(&h, "the Kubernetes API server", server,
                              getenv("FIBER_K8S_CA_FILE")));
    CHECK_OK(fb_http_set_token(&h, "not-a-token-of-this-cluster"));
    char path[200];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods?limit=1",
             getenv("FIBER_K8S_NAMESPACE"));
    json_t *out = NULL;
    CHECK_ERR(fb_http_call(&h, "GET", path, NULL, 20000, &out,
                           "listing pods"),
              FIBER_EAUTH);
    const char *m = fiber_last_error();
    fprintf(stderr, "message: %s\n", m);
    CHECK_CONTAINS(m, "listing pods was refused by the Kubernetes API server");
    CHECK_CONTAINS(m, server);
    CHECK_CONTAINS(m, "(HTTP 401 Unauthorized)");
    CHECK_CONTAINS(m, "Unauthorized"); /* the Status object's message */
    fb_http_close(&h);
}

TEST(http_layer_unverified_certificate_is_eauth)
{
    NEED_CLUSTER();
    const char *bundle = "/etc/ssl/certs/ca-certificates.crt";
    if (access(bundle, R_OK) != 0)
        TH_SKIP("%s is absent", bundle);
    const char *server = getenv("FIBER_K8S_SERVER");
    struct fb_http h;
    CHECK_OK(fb_http_open_url(&h, "the Kubernetes API server", server,
                              bundle));
    struct fb_http_reply r;
    CHECK_ERR(fb_http_request(&h, "GET", "/version", NULL, 0, NULL, 20000,
                              &r),
              FIBER_EAUTH);
    fb_http_reply_free(&r);
    const char *m = fiber_last_error();
    fprintf(stderr, "message: %s\n", m);
    CHECK_CONTAINS(m, server);
    CHECK_CONTAINS(m, "(GET /version)");
    CHECK_CONTAINS(m, "TLS verification failed");
    CHECK_CONTAINS(m, bundle);
    fb_http_close(&h);
}

TEST(plain_http_to_a_remote_server_is_refused)
{
    NEED_CLUSTER();
    CHECK_OK(fiber_config_set("k8s_server", "http://10.1.2.3:8080"));
    const char *m = start_fails(FIBER_ECONFIG, NULL);
    CHECK_CONTAINS(m, "not an https:// URL");
}

/* In-cluster configuration: the service-account folder (token, ca.crt,
 * namespace) and KUBERNETES_SERVICE_HOST/PORT, as a pod sees them. */
TEST(in_cluster_config_from_a_folder)
{
    NEED_CLUSTER();
    char dir[] = "/tmp/fiber-k8s-sa-XXXXXX", cmd[1200];
    CHECK(mkdtemp(dir));
    snprintf(cmd, sizeof cmd,
             "cp '%s' %s/token && cp '%s' %s/ca.crt && printf %s > "
             "%s/namespace",
             getenv("FIBER_K8S_TOKEN_FILE"), dir, getenv("FIBER_K8S_CA_FILE"),
             dir, getenv("FIBER_K8S_NAMESPACE"), dir);
    CHECK_EQ(system(cmd), 0);
    /* https://127.0.0.1:16443 -> host and port */
    char host[128];
    fb_strlcpy(host, getenv("FIBER_K8S_SERVER") + strlen("https://"),
               sizeof host);
    char *colon = strrchr(host, ':');
    CHECK(colon);
    *colon = '\0';
    setenv("KUBERNETES_SERVICE_HOST", host, 1);
    setenv("KUBERNETES_SERVICE_PORT", colon + 1, 1);
    CHECK_OK(fiber_config_set("k8s_server", ""));
    CHECK_OK(fiber_config_set("k8s_token_file", ""));
    CHECK_OK(fiber_config_set("k8s_ca_file", ""));
    CHECK_OK(fiber_config_set("k8s_namespace", ""));
    CHECK_OK(fiber_config_set("k8s_config_dir", dir));
    CHECK_EQ(exitcode_of("ret_arg", 5, NULL), 5);
    fiber_shutdown();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK_EQ(system(cmd), 0);
}

TEST(in_cluster_without_a_service_host_says_what_to_set)
{
    NEED_CLUSTER();
    unsetenv("KUBERNETES_SERVICE_HOST");
    CHECK_OK(fiber_config_set("k8s_server", ""));
    const char *m = start_fails(FIBER_ECONFIG, NULL);
    CHECK_CONTAINS(m, "set k8s_server");
    CHECK_CONTAINS(m, "KUBERNETES_SERVICE_HOST");
}

/* ---- fiber run: the master as a pod ---------------------------------------- */

/* The master of a run that `fiber run --backend kubernetes` started: in
 * its pod, with the in-cluster configuration the pod gives it.  Starts a
 * job and checks that the job's pod is owned by this pod; exits 42 if all
 * is well, 10+ to say what was not. */
TEST(helper_master_in_pod)
{
    const char *self = getenv("HOSTNAME");
    char server[300];
    CHECK_OK(fiber_config_get("k8s_server", server, sizeof server));
    if (server[0] || !self || !getenv("KUBERNETES_SERVICE_HOST"))
        exit(10); /* not configured as a pod in a cluster */
    fiber_process *p;
    int ms = 20000;
    CHECK_OK(fiber_process_start(&p, "sleeper", &ms, sizeof ms, NULL));
    struct fb_config c;
    fb_config_defaults(&c);
    char dir[600];
    CHECK_OK(fiber_config_get("k8s_config_dir", dir, sizeof dir));
    fb_strlcpy(c.k8s_config_dir, dir, sizeof c.k8s_config_dir);
    CHECK_OK(fb_k8s_open(&admin, &c)); /* the pod's service account */
    json_t *l = run_pods();
    int code = 11;
    size_t i;
    json_t *pod;
    json_array_foreach(json_object_get(l, "items"), i, pod)
    {
        if (strcmp(json_str(pod, "metadata", "labels", "fiber.role"), "job"))
            continue;
        json_t *owner = json_array_get(
            json_object_get(json_object_get(pod, "metadata"),
                            "ownerReferences"),
            0);
        code = strcmp(json_str(owner, "name", NULL, NULL), self) == 0 &&
                       strcmp(json_str(owner, "kind", NULL, NULL), "Pod") == 0
                   ? 42
                   : 12;
    }
    json_decref(l);
    CHECK_OK(fiber_process_terminate(p));
    CHECK_OK(fiber_process_join(p, 30000));
    fiber_process_free(p);
    fiber_shutdown();
    exit(code);
}

/* This program's path, which is also its path in its image. */
static void self_exe(char *buf, size_t size)
{
    ssize_t n = readlink("/proc/self/exe", buf, size - 1);
    CHECK(n > 0);
    buf[n] = '\0';
}

/* Runs cmd (a shell command line) and collects what it prints into out;
 * returns its exit status. */
static int tool_output(const char *cmd, char *out, size_t size)
{
    FILE *f = popen(cmd, "r");
    CHECK(f);
    char line[1024];
    out[0] = '\0';
    while (fgets(line, sizeof line, f))
        strncat(out, line, size - strlen(out) - 1);
    int st = pclose(f);
    fprintf(stderr, "$ %s\n%s", cmd, out);
    CHECK(WIFEXITED(st));
    return WEXITSTATUS(st);
}

TEST(fiber_run_starts_the_master_as_a_pod)
{
    NEED_CLUSTER();
    admin_open();
    char self[4096];
    self_exe(self, sizeof self);
    char cmd[9000];
    snprintf(cmd, sizeof cmd,
             "%s run --backend kubernetes --image '%s' -- %s "
             "helper_master_in_pod 2>&1",
             FIBER_TOOL_PATH, getenv("FIBER_IMAGE"), self);
    FILE *f = popen(cmd, "r");
    CHECK(f);
    char out[8192] = "", line[1024];
    while (fgets(line, sizeof line, f))
        strncat(out, line, sizeof out - strlen(out) - 1);
    int st = pclose(f);
    fprintf(stderr, "%s", out);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 42);
    /* The master's pod is kept, labelled as the run's master. */
    const char *at = strstr(out, "master in pod ");
    CHECK(at);
    char pod[128];
    CHECK(sscanf(at, "master in pod %127s", pod) == 1);
    char path[300];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods/%s", admin.ns,
             pod);
    json_t *p = NULL;
    CHECK_EQ(admin_get(path, &p), 200);
    CHECK_STR(json_str(p, "metadata", "labels", "fiber.role"), "master");
    CHECK_STR(json_str(p, "status", "phase", NULL), "Failed"); /* 42 */
    json_t *term = json_object_get(
        json_object_get(json_array_get(json_object_get(json_object_get(
                                           p, "status"),
                                                       "containerStatuses"),
                                       0),
                        "state"),
        "terminated");
    CHECK_EQ(json_integer_value(json_object_get(term, "exitCode")), 42);
    char run[64];
    fb_strlcpy(run, json_str(p, "metadata", "labels", "fiber.run"),
               sizeof run);
    json_decref(p);
    /* fiber ps shows it ended, and fiber clean removes its pod. */
    snprintf(cmd, sizeof cmd, "%s ps %s 2>&1", FIBER_TOOL_PATH, run);
    CHECK_EQ(tool_output(cmd, out, sizeof out), 0);
    CHECK_CONTAINS(out, "kubernetes dead");
    char want[300];
    snprintf(want, sizeof want, "master           master   exited   pod %s",
             pod);
    CHECK_CONTAINS(out, want);
    CHECK_CONTAINS(out, "Failed (exit 42)");
    CHECK(strstr(out, "container") == NULL); /* not the kubelet's */
    snprintf(cmd, sizeof cmd, "%s clean %s 2>&1", FIBER_TOOL_PATH, run);
    CHECK_EQ(tool_output(cmd, out, sizeof out), 0);
    snprintf(want, sizeof want, "removed pod %s (master) of run %s", pod, run);
    CHECK_CONTAINS(out, want);
    for (int i = 0; i < 600 && admin_get(path, &p) != 404; i++) {
        json_decref(p);
        p = NULL;
        sleep_ms(100);
    }
    json_decref(p);
    CHECK_EQ(admin_get(path, &p), 404);
    json_decref(p);
}

/* The master of a run in its pod: starts two workers that sleep, says
 * "workers started" and sleeps until the test deletes its pod. */
TEST(helper_master_with_workers)
{
    fiber_process *p[2];
    int ms = 300000;
    for (int i = 0; i < 2; i++)
        CHECK_OK(fiber_process_start(&p[i], "sleeper", &ms, sizeof ms, NULL));
    printf("workers started\n");
    fflush(stdout);
    sleep_ms(ms);
    exit(3); /* the test deletes this pod long before */
}

/* The run's objects of a kind ("pods", "secrets") with label fiber.run =
 * run, as the administrator sees them; role "" matches any. */
static size_t count_run_objects(const char *kind, const char *run,
                                const char *role)
{
    char path[400];
    snprintf(path, sizeof path,
             "/api/v1/namespaces/%s/%s?labelSelector=fiber.run%%3D%s%s%s",
             admin.ns, kind, run, role[0] ? "%2Cfiber.role%3D" : "", role);
    json_t *l = NULL;
    CHECK_EQ(admin_get(path, &l), 200);
    size_t n = json_array_size(json_object_get(l, "items"));
    json_decref(l);
    return n;
}

/* Owner references at work: the master runs in a pod (fiber run), its
 * workers' pods and the run's Secret name that pod as their owner, and
 * when the pod is deleted (at once: the master gets no chance to clean
 * up), the cluster's garbage collector deletes them. */
TEST(deleting_the_master_pod_deletes_its_workers_and_secret)
{
    NEED_CLUSTER();
    admin_open();
    char self[4096];
    self_exe(self, sizeof self);
    char cmd[9000];
    snprintf(cmd, sizeof cmd,
             "%s run --detach --backend kubernetes --image '%s' -- %s "
             "helper_master_with_workers 2>&1",
             FIBER_TOOL_PATH, getenv("FIBER_IMAGE"), self);
    FILE *f = popen(cmd, "r");
    CHECK(f);
    char out[8192] = "", line[1024];
    while (fgets(line, sizeof line, f))
        strncat(out, line, sizeof out - strlen(out) - 1);
    CHECK_EQ(pclose(f), 0);
    fprintf(stderr, "%s", out);
    const char *at = strstr(out, "master in pod ");
    CHECK(at);
    char pod[128], path[300];
    CHECK(sscanf(at, "master in pod %127s", pod) == 1);
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods/%s", admin.ns,
             pod);
    json_t *p = NULL;
    CHECK_EQ(admin_get(path, &p), 200);
    char run[64];
    fb_strlcpy(run, json_str(p, "metadata", "labels", "fiber.run"),
               sizeof run);
    json_decref(p);
    CHECK(run[0]);
    /* Both workers' pods and the Secret exist (the master made them). */
    int i;
    for (i = 0; i < 900 && (count_run_objects("pods", run, "job") < 2 ||
                            count_run_objects("secrets", run, "") < 1);
         i++)
        sleep_ms(100);
    CHECK_EQ(count_run_objects("pods", run, "job"), 2);
    CHECK_EQ(count_run_objects("secrets", run, ""), 1);
    uint64_t t0 = fb_now_ms();
    admin_delete_pod(pod);
    /* Bound: the garbage collector notices within seconds; the pods then
     * take their grace period (terminate_grace_ms, 2 s) on the kubelet. */
    enum { BOUND_MS = 90000 };
    while (fb_now_ms() - t0 < BOUND_MS &&
           (count_run_objects("pods", run, "job") > 0 ||
            count_run_objects("secrets", run, "") > 0))
        sleep_ms(200);
    fprintf(stderr, "run %s: workers' pods and Secret gone %llu ms after "
                    "the master's pod was deleted\n",
            run, (unsigned long long)(fb_now_ms() - t0));
    CHECK_EQ(count_run_objects("pods", run, "job"), 0);
    CHECK_EQ(count_run_objects("secrets", run, ""), 0);
    CHECK_EQ(count_run_objects("pods", run, "master"), 0);
}

/* fiber run --requeue: the master is the Job <run>-master (backoffLimit 0,
 * FIBER_BOOT_REQUEUE=1 in its pod template), whose master counts its
 * start on the Job; fiber ps lists the run, and fiber kill deletes the Job
 * before the pods, so that no new master pod follows the killed one. */
TEST(fiber_kill_ends_a_requeueable_master_for_good)
{
    NEED_CLUSTER();
    admin_open();
    char self[4096];
    self_exe(self, sizeof self);
    char cmd[9000], out[8192];
    snprintf(cmd, sizeof cmd,
             "%s run --detach --requeue --backend kubernetes --image '%s' "
             "-- %s helper_master_with_workers 2>&1",
             FIBER_TOOL_PATH, getenv("FIBER_IMAGE"), self);
    CHECK_EQ(tool_output(cmd, out, sizeof out), 0);
    const char *at = strstr(out, "master in job ");
    CHECK(at);
    char job[128], path[300], run[64];
    CHECK(sscanf(at, "master in job %127s", job) == 1);
    size_t len = strlen(job);
    CHECK(len > 7 && strcmp(job + len - 7, "-master") == 0);
    fb_strlcpy(run, job, sizeof run);
    run[len - 7] = '\0';
    snprintf(path, sizeof path, "/apis/batch/v1/namespaces/%s/jobs/%s",
             admin.ns, job);
    json_t *j = NULL;
    CHECK_EQ(admin_get(path, &j), 200);
    json_t *spec = json_object_get(j, "spec");
    CHECK_EQ(json_integer_value(json_object_get(spec, "backoffLimit")), 0);
    CHECK_STR(json_str(json_object_get(spec, "template"), "metadata",
                       "labels", "fiber.role"),
              "master");
    json_t *c = json_array_get(
        json_object_get(json_object_get(json_object_get(spec, "template"),
                                        "spec"),
                        "containers"),
        0);
    int requeue_env = 0;
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(c, "env"), i, v)
    {
        requeue_env |= strcmp(json_str(v, "name", NULL, NULL),
                              "FIBER_BOOT_REQUEUE") == 0 &&
                       strcmp(json_str(v, "value", NULL, NULL), "1") == 0;
    }
    CHECK(requeue_env);
    json_decref(j);
    /* The master runs, has counted its start, and has started its two
     * workers. */
    int k;
    for (k = 0; k < 900 && count_run_objects("pods", run, "job") < 2; k++)
        sleep_ms(100);
    CHECK_EQ(count_run_objects("pods", run, "job"), 2);
    CHECK_EQ(admin_get(path, &j), 200);
    CHECK_STR(json_str(j, "metadata", "annotations", "fiber.starts"), "1");
    json_decref(j);
    snprintf(cmd, sizeof cmd, "%s ps %s 2>&1", FIBER_TOOL_PATH, run);
    CHECK_EQ(tool_output(cmd, out, sizeof out), 0);
    CHECK_CONTAINS(out, "kubernetes");
    CHECK_CONTAINS(out, "master");
    snprintf(cmd, sizeof cmd, "%s kill %s 2>&1", FIBER_TOOL_PATH, run);
    CHECK_EQ(tool_output(cmd, out, sizeof out), 0);
    char want[300];
    snprintf(want, sizeof want, "deleted Job %s", job);
    CHECK_CONTAINS(out, want);
    j = NULL;
    for (k = 0; k < 300 && admin_get(path, &j) != 404; k++) {
        json_decref(j);
        j = NULL;
        sleep_ms(100);
    }
    json_decref(j);
    j = NULL;
    CHECK_EQ(admin_get(path, &j), 404);
    json_decref(j);
    /* No new master pod comes: the run's pods go and stay gone.  Up to
     * 150 s: a pod still being created when it was deleted took more
     * than 90 s to go on a loaded machine (a CI run beside three builds,
     * load 12). */
    uint64_t gone_by = fb_now_ms() + 150000;
    while (count_run_objects("pods", run, "") > 0 && fb_now_ms() < gone_by)
        sleep_ms(100);
    sleep_ms(3000);
    CHECK_EQ(count_run_objects("pods", run, ""), 0);
}

/* Not a ctest case: run by hand while restarting the API server
 * (scripts/k8s-local.sh stop; start) to see the watch come back. */
/* ---- run ops on pods: fiber ps, logs, kill, clean ----------------------------- */

/* A pod's program that says hello and ends (made by the test, below). */
TEST(helper_say_hello)
{
    printf("hello from a pod\n");
    fflush(stdout);
    exit(0);
}

/* Waits until fiber_runs_list(run) satisfies ok(), up to 120 s; returns
 * the list (the caller frees it). */
static fiber_run_list wait_list(const char *run,
                                int (*ok)(const fiber_run_info *r))
{
    fiber_run_list l = {0};
    for (int i = 0; i < 1200; i++) {
        fiber_run_list_free(&l);
        if (fiber_runs_list(run, &l) == 0 && ok(&l.runs[0]))
            return l;
        sleep_ms(100);
    }
    for (size_t i = 0; i < l.n; i++)
        for (size_t j = 0; j < l.runs[i].n_jobs; j++)
            fprintf(stderr, "  %s %s %s %s\n", l.runs[i].jobs[j].name,
                    l.runs[i].jobs[j].state, l.runs[i].jobs[j].status,
                    l.runs[i].jobs[j].engine_id);
    TH_FAIL("run %s did not reach the state waited for", run);
}

static const fiber_job_info *job_named(const fiber_run_info *r,
                                       const char *name)
{
    for (size_t i = 0; i < r->n_jobs; i++)
        if (strcmp(r->jobs[i].name, name) == 0)
            return &r->jobs[i];
    return NULL;
}

static int running(const fiber_run_info *r, const char *name)
{
    const fiber_job_info *j = job_named(r, name);
    return j && strcmp(j->state, "running") == 0;
}

static int master_and_workers_run(const fiber_run_info *r)
{
    return running(r, "master") && running(r, "Process-1") &&
           running(r, "Process-2");
}

/* Longer than 64 bytes, as a job of another tool may be named. */
static const char long_name[] =
    "a-job-whose-name-is-much-longer-than-sixty-four-bytes-of-the-old-"
    "fixed-field";

static int long_job_ended(const fiber_run_info *r)
{
    const fiber_job_info *j = job_named(r, long_name);
    return j && strcmp(j->state, "exited") == 0;
}

static int nothing_runs(const fiber_run_info *r)
{
    return r->alive == 0;
}

/* A pod of run, made as an administrator: named by a long fiber.name
 * annotation, running helper_say_hello. */
static void admin_create_hello_pod(const char *run, const char *pod)
{
    char self[4096], path[300];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    self[n] = '\0';
    json_t *body = json_pack(
        "{s:s, s:s, s:{s:s, s:{s:s, s:s, s:s}, s:{s:s}},"
        " s:{s:s, s:b, s:[{s:s, s:s, s:s, s:[s], s:[s]}]}}",
        "apiVersion", "v1", "kind", "Pod", "metadata", "name", pod, "labels",
        "fiber.run", run, "fiber.role", "job", "app.kubernetes.io/managed-by",
        "fiber", "annotations", "fiber.name", long_name, "spec",
        "restartPolicy", "Never", "hostNetwork", 1, "containers", "name", "c",
        "image", getenv("FIBER_IMAGE"), "imagePullPolicy", "Never", "command",
        self, "args", "helper_say_hello");
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods", admin.ns);
    long status = 0;
    json_t *reply = NULL;
    CHECK_OK(fb_k8s_json(&admin, "POST", path, body, NULL, 20000, &status,
                         &reply));
    json_decref(body);
    json_decref(reply);
    CHECK_EQ(status, 201);
}

/* A run started with fiber_run_start on the cluster: listed with its
 * master's and workers' pods, logged (its master, and a job of a long
 * name), killed (its pods deleted), cleaned (the ended pod removed), and
 * then gone. */
TEST(runs_on_pods_are_listed_logged_killed_cleaned)
{
    NEED_CLUSTER();
    admin_open();
    char self[4096];
    self_exe(self, sizeof self);
    const char *argv[] = {self, "helper_master_with_workers", NULL};
    fiber_run_opts o = {.backend = "kubernetes",
                        .image = getenv("FIBER_IMAGE")};
    fiber_run *run = NULL;
    CHECK_OK(fiber_run_start(&run, argv, &o));
    char name[64], master_pod[256];
    fb_strlcpy(name, fiber_run_name(run), sizeof name);
    fb_strlcpy(master_pod, fiber_run_container(run), sizeof master_pod);

    fiber_run_list l = wait_list(name, master_and_workers_run);
    const fiber_run_info *r = &l.runs[0];
    CHECK_STR(r->backend, "kubernetes");
    CHECK_EQ(r->alive, 1);
    CHECK_STR(r->jobs[0].name, "master"); /* the master first */
    CHECK_STR(r->jobs[0].role, "master");
    CHECK_STR(r->jobs[0].engine_kind, "pod");
    CHECK_STR(r->jobs[0].engine_id, master_pod);
    CHECK_STR(job_named(r, "Process-1")->role, "job");
    fiber_run_list_free(&l);

    /* Every run the account sees is listed, this one among them. */
    CHECK_OK(fiber_runs_list(NULL, &l));
    int seen = 0;
    for (size_t i = 0; i < l.n; i++)
        seen |= strcmp(l.runs[i].run, name) == 0;
    CHECK(seen);
    fiber_run_list_free(&l);

    fiber_buf out = {0};
    for (int i = 0; i < 600; i++) {
        out.len = 0;
        CHECK_OK(fiber_run_logs(name, "master", &out));
        if (out.len && memmem(out.data, out.len, "workers started", 15))
            break;
        sleep_ms(100);
    }
    CHECK(out.len && memmem(out.data, out.len, "workers started", 15));
    CHECK_ERR(fiber_run_logs(name, "Process-9", &out), FIBER_ENOKEY);
    CHECK_CONTAINS(fiber_last_error(), "has no job Process-9");

    char extra[80], head[160];
    snprintf(extra, sizeof extra, "%s-extra", name);
    admin_create_hello_pod(name, extra);
    l = wait_list(name, long_job_ended);
    CHECK_STR(job_named(&l.runs[0], long_name)->engine_id, extra);
    CHECK_CONTAINS(job_named(&l.runs[0], long_name)->status,
                   "Succeeded (exit 0)");
    fiber_run_list_free(&l);
    out.len = 0;
    CHECK_OK(fiber_run_logs(name, long_name, &out));
    CHECK_OK(fiber_buf_append(&out, "", 1));
    /* (beside the harness's "-- helper_say_hello" line) */
    CHECK_CONTAINS((const char *)out.data, "hello from a pod\n");
    CHECK(strncmp((const char *)out.data, "==>", 3) != 0); /* no heading */
    out.len = 0;
    CHECK_OK(fiber_run_logs(name, NULL, &out)); /* all, with headings */
    CHECK_OK(fiber_buf_append(&out, "", 1));
    snprintf(head, sizeof head, "==> %s <==\n", long_name);
    CHECK_CONTAINS((const char *)out.data, head);
    CHECK_CONTAINS((const char *)out.data, "==> master <==\n");

    fiber_buf rep = {0};
    CHECK_ERR(fiber_run_clean(name, &rep), FIBER_ESTATE); /* alive */
    CHECK_CONTAINS(fiber_last_error(), "is alive; stop it first");
    uint64_t t0 = fb_now_ms();
    CHECK_OK(fiber_run_kill(name, &rep));
    CHECK_OK(fiber_buf_append(&rep, "", 1));
    fprintf(stderr, "kill (%.1f s):\n%s", (double)(fb_now_ms() - t0) / 1e3,
            (const char *)rep.data);
    char want[400];
    snprintf(want, sizeof want, "pod %s (master)", master_pod);
    CHECK_CONTAINS((const char *)rep.data, want);
    CHECK_CONTAINS((const char *)rep.data, "(Process-1)");
    CHECK_CONTAINS((const char *)rep.data, "(Process-2)");
    int code = 0;
    CHECK_OK(fiber_run_wait(run, 120000, &code));
    CHECK_EQ(code, 137); /* its pod was deleted */
    fiber_run_free(run);

    /* What is left: the ended pod, which kill leaves for its logs. */
    l = wait_list(name, nothing_runs);
    CHECK_EQ(l.runs[0].alive, 0);
    CHECK(job_named(&l.runs[0], "master") == NULL ||
          strcmp(job_named(&l.runs[0], "master")->state, "terminating") ==
              0);
    fiber_run_list_free(&l);
    CHECK_ERR(fiber_run_kill(name, NULL), FIBER_ENOKEY);
    CHECK_CONTAINS(fiber_last_error(), "nothing of run");
    rep.len = 0;
    CHECK_OK(fiber_run_clean(name, &rep));
    CHECK_OK(fiber_buf_append(&rep, "", 1));
    snprintf(want, sizeof want, "removed pod %s (%s) of run %s", extra,
             long_name, name);
    CHECK_CONTAINS((const char *)rep.data, want);
    char path[300];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods/%s", admin.ns,
             extra);
    json_t *p = NULL;
    for (int i = 0; i < 600 && admin_get(path, &p) != 404; i++) {
        json_decref(p);
        p = NULL;
        sleep_ms(100);
    }
    json_decref(p);
    CHECK_EQ(admin_get(path, &p), 404);
    json_decref(p);
    CHECK_ERR(fiber_runs_list(name, &l), FIBER_ENOKEY);
    CHECK_CONTAINS(fiber_last_error(), "no run ");
    fiber_buf_free(&out);
    fiber_buf_free(&rep);
}

TEST(helper_job_across_an_api_server_restart)
{
    NEED_CLUSTER();
    int ms = 15000;
    CHECK_EQ(exitcode_of("sleeper", ms, NULL), 0);
    fprintf(stderr, "lists: %u\n", fb_k8s_test_lists());
}

/* ---- start-up figures ----------------------------------------------------------- */

/* Rough start-up figures (bench/bench_k8s.c measures pod create to worker
 * connected properly): one process at a time, start to exit; then 32 at
 * once. */
static double now_ms(void) { return (double)fb_now_ns() / 1e6; }

TEST(start_latency_figures)
{
    NEED_CLUSTER();
    enum { ONE = 5, MANY = 32 };
    double one[ONE];
    for (int i = 0; i < ONE; i++) {
        double t0 = now_ms();
        CHECK_EQ(exitcode_of("ret_arg", 0, NULL), 0);
        one[i] = now_ms() - t0;
    }
    double t0 = now_ms();
    fiber_process *ps[MANY];
    for (int i = 0; i < MANY; i++) {
        int a = 0;
        CHECK_OK(fiber_process_start(&ps[i], "ret_arg", &a, sizeof a, NULL));
    }
    double created = now_ms() - t0;
    for (int i = 0; i < MANY; i++) {
        CHECK_OK(fiber_process_join(ps[i], 120000));
        fiber_process_free(ps[i]);
    }
    double all = now_ms() - t0;
    double sum = 0;
    for (int i = 0; i < ONE; i++)
        sum += one[i];
    printf("kubernetes: one pod start-to-exit %.0f ms (mean of %d); %d pods "
           "at once: created in %.0f ms, all exited after %.0f ms\n",
           sum / ONE, ONE, MANY, created, all);
}

TH_MAIN()
