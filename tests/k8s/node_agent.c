/*
 * node_agent.c -- TEST CODE: a stand-in for a kubelet, so that fiber's
 * kubernetes backend can be tested against a real kube-apiserver on a
 * machine without a packaged kubelet.  fiber itself knows nothing of it.
 *
 * It watches the pods of one namespace and, for each pod that no node
 * holds yet: binds it to its node (POST pods/<name>/binding), runs the
 * pod's first container's command and arguments as a local process (the
 * image is ignored: test programs run from the build tree), reports
 * Running through the pod's status, and, when the process exits,
 * Succeeded or Failed with the exit code in
 * containerStatuses[0].state.terminated (128 + n for signal n), as a
 * kubelet would.  A pod being deleted (deletionTimestamp) gets SIGTERM,
 * then SIGKILL after its grace period, and is then deleted with grace 0;
 * a pod deleted outright has its process killed.
 *
 * What a local process cannot see is mapped, test-only:
 *   - a Secret volume is read through the API and written under the
 *     agent's state directory (mode 0600); an environment value that names
 *     a path under the volume's mount path (FIBER_BOOT_SECRET_FILE) is
 *     rewritten to the copy;
 *   - a persistentVolumeClaim volume becomes <state>/pvc/<claim>;
 *   - unless automountServiceAccountToken is false, the service-account
 *     folder (/var/run/secrets/kubernetes.io/serviceaccount) becomes a
 *     copy holding --sa-token-file, the CA and the namespace, and the
 *     process gets KUBERNETES_SERVICE_HOST/PORT, HOSTNAME = the pod's
 *     name, and FIBER_K8S_CONFIG_DIR naming that copy.
 * Output goes to <state>/logs/<pod>.log (the apiserver's log endpoint
 * needs a real kubelet, so `pods/log` does not work here).
 *
 * Usage: node_agent --server URL --ca FILE --token-file FILE
 *                   --namespace NS --state-dir DIR [--sa-token-file FILE]
 *                   [--node NAME]
 * It runs until SIGTERM/SIGINT, then kills what it started.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "backend/kubernetes/k8s_api.h"
#include "core/common.h"

#define MAX_PODS 1024
#define MAX_MAPS 16
#define TIMEOUT_MS 20000L
#define SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"

struct path_map {
    char from[512];
    char to[1024];
};

struct pod {
    int used;
    char name[254];
    char uid[64];
    char container[64];
    char image[256];
    pid_t pid;           /* > 1 while started */
    int exited;
    int deleting;        /* deletionTimestamp seen */
    int gone;            /* the object was deleted: report nothing */
    uint64_t kill_at_ms; /* SIGKILL then, while deleting */
    char started_at[32];
    int unreported;      /* the exit is not in the pod's status yet */
    int exit_code;
    uint64_t retry_at_ms;
};

static struct {
    struct fb_k8s api;
    char ns[64];
    char node[64];
    char state_dir[512];
    char sa_dir[600];
    char host[128], port[16];
    struct pod pods[MAX_PODS];
    volatile sig_atomic_t stop;
} A;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char ts[32];
    time_t t = time(NULL);
    strftime(ts, sizeof ts, "%H:%M:%S", localtime(&t));
    fprintf(stderr, "node_agent %s: ", ts);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static void now_rfc3339(char *buf, size_t size)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static int write_file(const char *path, const void *data, size_t len,
                      mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0)
        return -1;
    int ok = write(fd, data, len) == (ssize_t)len;
    close(fd);
    return ok ? 0 : -1;
}

static int copy_file(const char *from, const char *to, mode_t mode)
{
    char buf[16384];
    int fd = open(from, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    return n < 0 ? -1 : write_file(to, buf, (size_t)n, mode);
}

static void mkdirs(const char *path)
{
    char p[1024];
    fb_strlcpy(p, path, sizeof p);
    for (char *s = p + 1; *s; s++) {
        if (*s == '/') {
            *s = '\0';
            mkdir(p, 0700);
            *s = '/';
        }
    }
    mkdir(p, 0700);
}

/* ---- API helpers --------------------------------------------------------- */

static long call(const char *method, const char *path, json_t *body,
                 const char *ctype, json_t **out)
{
    long status = 0;
    if (fb_k8s_json(&A.api, method, path, body, ctype, TIMEOUT_MS, &status,
                    out) != 0) {
        say("%s %s: %s", method, path, fiber_last_error());
        return 0;
    }
    return status;
}

static void delete_now(const char *name)
{
    char path[512];
    snprintf(path, sizeof path,
             "/api/v1/namespaces/%s/pods/%s?gracePeriodSeconds=0", A.ns, name);
    json_t *r = NULL;
    long st = call("DELETE", path, NULL, NULL, &r);
    if (st != 200 && st != 404)
        say("deleting %s: HTTP %ld %s", name, st, fb_k8s_status_message(r));
    json_decref(r);
}

/* Returns 1 once the server took the status (or the pod is gone). */
static int patch_status(struct pod *p, json_t *status)
{
    char path[512];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods/%s/status", A.ns,
             p->name);
    json_t *body = json_pack("{s:o}", "status", status);
    json_t *r = NULL;
    long st = call("PATCH", path, body, "application/merge-patch+json", &r);
    if (st != 200 && st != 404)
        say("patching the status of %s: HTTP %ld %s", p->name, st,
            fb_k8s_status_message(r));
    json_decref(body);
    json_decref(r);
    return st == 200 || st == 404;
}

/* ---- starting a pod ------------------------------------------------------ */

static struct pod *find_pod(const char *name, const char *uid)
{
    for (int i = 0; i < MAX_PODS; i++)
        if (A.pods[i].used && strcmp(A.pods[i].name, name) == 0 &&
            (!uid || strcmp(A.pods[i].uid, uid) == 0))
            return &A.pods[i];
    return NULL;
}

static struct pod *new_pod(void)
{
    for (int i = 0; i < MAX_PODS; i++)
        if (!A.pods[i].used) {
            memset(&A.pods[i], 0, sizeof A.pods[i]);
            A.pods[i].used = 1;
            return &A.pods[i];
        }
    return NULL;
}

/* Writes the keys of Secret `secret` into dir. */
static int copy_secret(const char *secret, const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/secrets/%s", A.ns,
             secret);
    json_t *s = NULL;
    long st = call("GET", path, NULL, NULL, &s);
    if (st != 200) {
        say("reading secret %s: HTTP %ld %s", secret, st,
            fb_k8s_status_message(s));
        json_decref(s);
        return -1;
    }
    mkdirs(dir);
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(s, "data"), key, v)
    {
        const char *b64 = json_string_value(v);
        unsigned char bin[8192];
        size_t len = 0;
        if (!b64 || sodium_base642bin(bin, sizeof bin, b64, strlen(b64), NULL,
                                      &len, NULL,
                                      sodium_base64_VARIANT_ORIGINAL) != 0)
            continue;
        char file[1200];
        snprintf(file, sizeof file, "%s/%s", dir, key);
        write_file(file, bin, len, 0600);
    }
    json_decref(s);
    return 0;
}

/* The mount path of volume vol in container c, or NULL. */
static const char *mount_of(json_t *c, const char *vol)
{
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(c, "volumeMounts"), i, m)
    {
        const char *n = json_string_value(json_object_get(m, "name"));
        if (n && strcmp(n, vol) == 0)
            return json_string_value(json_object_get(m, "mountPath"));
    }
    return NULL;
}

/* Maps the pod's volumes to folders of this host; returns how many. */
static int map_volumes(struct pod *p, json_t *spec, json_t *c,
                       struct path_map *maps)
{
    int n = 0;
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(spec, "volumes"), i, v)
    {
        const char *vol = json_string_value(json_object_get(v, "name"));
        const char *mp = vol ? mount_of(c, vol) : NULL;
        if (!mp || n >= MAX_MAPS - 1)
            continue;
        json_t *sec = json_object_get(v, "secret");
        json_t *pvc = json_object_get(v, "persistentVolumeClaim");
        char dir[1024] = "";
        if (sec) {
            snprintf(dir, sizeof dir, "%s/pods/%s/%s", A.state_dir, p->name,
                     vol);
            if (copy_secret(json_string_value(json_object_get(
                                sec, "secretName")),
                            dir) != 0)
                continue;
        } else if (pvc) {
            snprintf(dir, sizeof dir, "%s/pvc/%s", A.state_dir,
                     json_string_value(json_object_get(pvc, "claimName")));
            mkdirs(dir);
        }
        if (!dir[0])
            continue;
        fb_strlcpy(maps[n].from, mp, sizeof maps[n].from);
        fb_strlcpy(maps[n].to, dir, sizeof maps[n].to);
        n++;
    }
    json_t *am = json_object_get(spec, "automountServiceAccountToken");
    if (!json_is_false(am) && n < MAX_MAPS) {
        fb_strlcpy(maps[n].from, SA_DIR, sizeof maps[n].from);
        fb_strlcpy(maps[n].to, A.sa_dir, sizeof maps[n].to);
        n++;
    }
    return n;
}

static char *mapped(const char *value, const struct path_map *maps, int n)
{
    for (int i = 0; i < n; i++) {
        size_t k = strlen(maps[i].from);
        if (strncmp(value, maps[i].from, k) == 0 &&
            (value[k] == '/' || value[k] == '\0')) {
            char *s = NULL;
            if (asprintf(&s, "%s%s", maps[i].to, value + k) < 0)
                return NULL;
            return s;
        }
    }
    return strdup(value);
}

static void add_env(char **env, size_t *n, const char *name, const char *val)
{
    char *s = NULL;
    if (asprintf(&s, "%s=%s", name, val) >= 0)
        env[(*n)++] = s;
}

static int has_env(char **env, size_t n, const char *name)
{
    size_t k = strlen(name);
    for (size_t i = 0; i < n; i++)
        if (strncmp(env[i], name, k) == 0 && env[i][k] == '=')
            return 1;
    return 0;
}

static char **pod_env(struct pod *p, json_t *pod, json_t *c,
                      const struct path_map *maps, int n_maps, int sa)
{
    size_t cap = json_array_size(json_object_get(c, "env")) + 16, n = 0;
    char **env = calloc(cap, sizeof *env);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(c, "env"), i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *val = json_string_value(json_object_get(e, "value"));
        const char *field = json_string_value(json_object_get(
            json_object_get(json_object_get(e, "valueFrom"), "fieldRef"),
            "fieldPath"));
        if (field && strcmp(field, "metadata.name") == 0)
            val = p->name;
        else if (field && strcmp(field, "metadata.namespace") == 0)
            val = A.ns;
        else if (field && (strcmp(field, "status.podIP") == 0 ||
                           strcmp(field, "status.hostIP") == 0))
            val = "127.0.0.1"; /* the pod is a process of this host */
        if (!name)
            continue;
        char *m = mapped(val ? val : "", maps, n_maps);
        if (m)
            add_env(env, &n, name, m);
        free(m);
    }
    add_env(env, &n, "HOSTNAME", p->name);
    if (!has_env(env, n, "PATH"))
        add_env(env, &n, "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                                 "/usr/bin:/sbin:/bin");
    if (sa) {
        add_env(env, &n, "KUBERNETES_SERVICE_HOST", A.host);
        add_env(env, &n, "KUBERNETES_SERVICE_PORT", A.port);
        if (!has_env(env, n, "FIBER_K8S_CONFIG_DIR"))
            add_env(env, &n, "FIBER_K8S_CONFIG_DIR", A.sa_dir);
    }
    (void)pod;
    return env;
}

static void free_strv(char **v)
{
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

/* Reports the exit; if the server cannot take it now, reap() tries again
 * (a kubelet keeps trying too). */
static void report_exit(struct pod *p, int code)
{
    p->exit_code = code;
    char now[32];
    now_rfc3339(now, sizeof now);
    json_t *status = json_pack(
        "{s:s, s:[{s:s, s:s, s:s, s:b, s:i, s:{s:{s:i, s:s, s:s, s:s}}}]}",
        "phase", code == 0 ? "Succeeded" : "Failed", "containerStatuses",
        "name", p->container, "image", p->image, "imageID", "", "ready", 0,
        "restartCount", 0, "state", "terminated", "exitCode", code, "reason",
        code == 0 ? "Completed" : "Error", "startedAt",
        p->started_at[0] ? p->started_at : now, "finishedAt", now);
    p->unreported = !patch_status(p, status);
    p->retry_at_ms = fb_now_ms() + 500;
}

static void start_pod(json_t *pod, const char *name, const char *uid)
{
    struct pod *p = new_pod();
    if (!p) {
        say("too many pods");
        return;
    }
    fb_strlcpy(p->name, name, sizeof p->name);
    fb_strlcpy(p->uid, uid, sizeof p->uid);
    char path[512];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods/%s/binding", A.ns,
             name);
    json_t *binding = json_pack(
        "{s:s, s:s, s:{s:s}, s:{s:s, s:s, s:s}}", "apiVersion", "v1", "kind",
        "Binding", "metadata", "name", name, "target", "apiVersion", "v1",
        "kind", "Node", "name", A.node);
    json_t *r = NULL;
    long st = call("POST", path, binding, NULL, &r);
    json_decref(binding);
    if (st != 201 && st != 200) {
        say("binding %s: HTTP %ld %s", name, st, fb_k8s_status_message(r));
        json_decref(r);
        p->used = 0;
        return;
    }
    json_decref(r);
    json_t *spec = json_object_get(pod, "spec");
    json_t *c = json_array_get(json_object_get(spec, "containers"), 0);
    fb_strlcpy(p->container,
               json_string_value(json_object_get(c, "name"))
                   ? json_string_value(json_object_get(c, "name"))
                   : "c",
               sizeof p->container);
    const char *img = json_string_value(json_object_get(c, "image"));
    fb_strlcpy(p->image, img ? img : "", sizeof p->image);
    struct path_map maps[MAX_MAPS];
    int n_maps = map_volumes(p, spec, c, maps);
    int sa = !json_is_false(json_object_get(spec,
                                            "automountServiceAccountToken"));
    json_t *cmd = json_object_get(c, "command");
    json_t *args = json_object_get(c, "args");
    size_t argc = json_array_size(cmd) + json_array_size(args);
    if (json_array_size(cmd) == 0) {
        say("pod %s has no command (the agent cannot read images)", name);
        report_exit(p, 127);
        p->exited = 1;
        return;
    }
    char **argv = calloc(argc + 1, sizeof *argv);
    size_t k = 0, i;
    json_t *a;
    json_array_foreach(cmd, i, a) argv[k++] = strdup(json_string_value(a));
    json_array_foreach(args, i, a) argv[k++] = strdup(json_string_value(a));
    char **env = pod_env(p, pod, c, maps, n_maps, sa);
    const char *wd = json_string_value(json_object_get(c, "workingDir"));
    char log[1200];
    snprintf(log, sizeof log, "%s/logs/%s.log", A.state_dir, name);
    now_rfc3339(p->started_at, sizeof p->started_at);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        int nul = open("/dev/null", O_RDONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (nul >= 0)
            dup2(nul, 0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        if (wd && chdir(wd) != 0) {
            fprintf(stderr, "node_agent: chdir %s: %s\n", wd, strerror(errno));
            _exit(127);
        }
        execve(argv[0], argv, env);
        fprintf(stderr, "node_agent: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    free_strv(argv);
    free_strv(env);
    if (pid < 0) {
        say("fork: %s", strerror(errno));
        report_exit(p, 127);
        p->exited = 1;
        return;
    }
    p->pid = pid;
    json_t *status = json_pack(
        "{s:s, s:s, s:s, s:s, s:[{s:s, s:s}], s:[{s:s, s:s, s:s, s:b, s:b, "
        "s:i, s:{s:{s:s}}}]}",
        "phase", "Running", "hostIP", "127.0.0.1", "podIP", "127.0.0.1",
        "startTime", p->started_at, "conditions", "type", "Ready", "status",
        "True", "containerStatuses", "name", p->container, "image", p->image,
        "imageID", "", "ready", 1, "started", 1, "restartCount", 0, "state",
        "running", "startedAt", p->started_at);
    patch_status(p, status);
}

/* ---- events -------------------------------------------------------------- */

static void signal_pod(struct pod *p, int sig)
{
    if (p->pid > 1 && !p->exited)
        kill(-p->pid, sig); /* its process group (setpgid in the child) */
}

static void on_pod(json_t *pod, int deleted)
{
    json_t *md = json_object_get(pod, "metadata");
    const char *name = json_string_value(json_object_get(md, "name"));
    const char *uid = json_string_value(json_object_get(md, "uid"));
    if (!name || !uid)
        return;
    json_t *spec = json_object_get(pod, "spec");
    const char *node = json_string_value(json_object_get(spec, "nodeName"));
    const char *phase = json_string_value(
        json_object_get(json_object_get(pod, "status"), "phase"));
    int deleting = json_object_get(md, "deletionTimestamp") != NULL;
    struct pod *p = find_pod(name, uid);
    if (deleted) {
        if (p) {
            p->gone = 1;
            signal_pod(p, SIGKILL);
            if (p->exited || p->pid <= 1)
                p->used = 0;
        }
        return;
    }
    if (!p) {
        if (deleting)
            delete_now(name); /* nothing of ours runs it */
        else if ((!node || !node[0]) && phase && strcmp(phase, "Pending") == 0)
            start_pod(pod, name, uid);
        return;
    }
    if (deleting && !p->deleting) {
        p->deleting = 1;
        if (p->exited || p->pid <= 1) {
            delete_now(name);
        } else {
            json_int_t grace = json_integer_value(
                json_object_get(md, "deletionGracePeriodSeconds"));
            signal_pod(p, SIGTERM);
            p->kill_at_ms = fb_now_ms() + (uint64_t)(grace > 0 ? grace : 0) *
                                              1000u;
        }
    }
}

static void on_event(void *ud, const char *type, json_t *obj)
{
    int *gone = ud;
    if (strcmp(type, "ERROR") == 0) {
        if (json_integer_value(json_object_get(obj, "code")) == 410)
            *gone = 1;
        return;
    }
    if (strcmp(type, "BOOKMARK") == 0)
        return;
    on_pod(obj, strcmp(type, "DELETED") == 0);
}

static void reap(void)
{
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        for (int i = 0; i < MAX_PODS; i++) {
            struct pod *p = &A.pods[i];
            if (!p->used || p->pid != pid)
                continue;
            int code = WIFEXITED(st) ? WEXITSTATUS(st)
                                     : 128 + WTERMSIG(st);
            p->exited = 1;
            if (!p->gone)
                report_exit(p, code);
            if (p->deleting && !p->gone)
                delete_now(p->name);
            char dir[1200];
            snprintf(dir, sizeof dir, "rm -rf '%s/pods/%s'", A.state_dir,
                     p->name);
            if (system(dir) != 0) {
                /* Best effort. */
            }
            if ((p->gone || p->deleting) && !p->unreported)
                p->used = 0;
        }
    }
    uint64_t now = fb_now_ms();
    for (int i = 0; i < MAX_PODS; i++) {
        struct pod *p = &A.pods[i];
        if (p->used && p->unreported && !p->gone && now >= p->retry_at_ms) {
            report_exit(p, p->exit_code);
            if (!p->unreported && p->deleting)
                delete_now(p->name);
        }
    }
    for (int i = 0; i < MAX_PODS; i++) {
        struct pod *p = &A.pods[i];
        if (p->used && p->deleting && !p->exited && p->kill_at_ms &&
            now >= p->kill_at_ms) {
            signal_pod(p, SIGKILL);
            p->kill_at_ms = 0;
        }
    }
}

static int list_pods(char *rv, size_t size)
{
    char path[300];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods", A.ns);
    json_t *l = NULL;
    long st = call("GET", path, NULL, NULL, &l);
    if (st != 200) {
        say("listing pods: HTTP %ld %s", st, fb_k8s_status_message(l));
        json_decref(l);
        return -1;
    }
    size_t i;
    json_t *pod;
    json_array_foreach(json_object_get(l, "items"), i, pod) on_pod(pod, 0);
    const char *v = json_string_value(json_object_get(
        json_object_get(l, "metadata"), "resourceVersion"));
    fb_strlcpy(rv, v ? v : "", size);
    json_decref(l);
    return 0;
}

static void on_signal(int sig)
{
    (void)sig;
    A.stop = 1;
}

static void setup_sa_dir(const char *sa_token, const char *ca)
{
    snprintf(A.sa_dir, sizeof A.sa_dir, "%s/serviceaccount", A.state_dir);
    mkdirs(A.sa_dir);
    char path[700];
    snprintf(path, sizeof path, "%s/token", A.sa_dir);
    copy_file(sa_token, path, 0600);
    snprintf(path, sizeof path, "%s/ca.crt", A.sa_dir);
    copy_file(ca, path, 0644);
    snprintf(path, sizeof path, "%s/namespace", A.sa_dir);
    write_file(path, A.ns, strlen(A.ns), 0644);
}

int main(int argc, char **argv)
{
    struct fb_config cfg;
    fb_config_defaults(&cfg);
    const char *sa_token = NULL;
    fb_strlcpy(A.node, "fiber-test-node", sizeof A.node);
    static const struct option opts[] = {
        {"server", required_argument, NULL, 's'},
        {"ca", required_argument, NULL, 'c'},
        {"token-file", required_argument, NULL, 't'},
        {"namespace", required_argument, NULL, 'n'},
        {"state-dir", required_argument, NULL, 'd'},
        {"sa-token-file", required_argument, NULL, 'a'},
        {"node", required_argument, NULL, 'N'},
        {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 's': fb_strlcpy(cfg.k8s_server, optarg, sizeof cfg.k8s_server); break;
        case 'c': fb_strlcpy(cfg.k8s_ca_file, optarg, sizeof cfg.k8s_ca_file); break;
        case 't': fb_strlcpy(cfg.k8s_token_file, optarg, sizeof cfg.k8s_token_file); break;
        case 'n': fb_strlcpy(cfg.k8s_namespace, optarg, sizeof cfg.k8s_namespace); break;
        case 'd': fb_strlcpy(A.state_dir, optarg, sizeof A.state_dir); break;
        case 'a': sa_token = optarg; break;
        case 'N': fb_strlcpy(A.node, optarg, sizeof A.node); break;
        default: return 2;
        }
    }
    if (!cfg.k8s_server[0] || !A.state_dir[0] || !cfg.k8s_namespace[0]) {
        fprintf(stderr, "usage: node_agent --server URL --ca FILE "
                        "--token-file FILE --namespace NS --state-dir DIR "
                        "[--sa-token-file FILE] [--node NAME]\n");
        return 2;
    }
    fb_strlcpy(A.ns, cfg.k8s_namespace, sizeof A.ns);
    /* host and port of the server, for KUBERNETES_SERVICE_HOST/PORT */
    const char *h = strstr(cfg.k8s_server, "://");
    h = h ? h + 3 : cfg.k8s_server;
    const char *colon = strrchr(h, ':');
    snprintf(A.host, sizeof A.host, "%.*s",
             (int)(colon ? (size_t)(colon - h) : strlen(h)), h);
    snprintf(A.port, sizeof A.port, "%s", colon ? colon + 1 : "443");
    char *slash = strchr(A.port, '/');
    if (slash)
        *slash = '\0';
    if (sodium_init() < 0 || fb_k8s_open(&A.api, &cfg) != 0) {
        fprintf(stderr, "node_agent: %s\n", fiber_last_error());
        return 1;
    }
    char dir[700];
    snprintf(dir, sizeof dir, "%s/logs", A.state_dir);
    mkdirs(dir);
    setup_sa_dir(sa_token ? sa_token : cfg.k8s_token_file, cfg.k8s_ca_file);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    char rv[64] = "";
    int need_list = 1, announced = 0;
    while (!A.stop) {
        if (need_list) {
            if (list_pods(rv, sizeof rv) != 0) {
                sleep(1);
                continue;
            }
            need_list = 0;
            if (!announced) {
                char ready[700];
                snprintf(ready, sizeof ready, "%s/ready", A.state_dir);
                write_file(ready, "ok\n", 3, 0644);
                say("watching pods in %s as node %s", A.ns, A.node);
                announced = 1;
            }
        }
        char path[512];
        snprintf(path, sizeof path,
                 "/api/v1/namespaces/%s/pods?watch=1&allowWatchBookmarks=true"
                 "&timeoutSeconds=120&resourceVersion=%s",
                 A.ns, rv);
        struct fb_k8s_watch w = {0};
        int gone = 0;
        if (fb_k8s_watch_start(&A.api, &w, path, on_event, &gone) != 0) {
            say("watch: %s", fiber_last_error());
            fb_k8s_watch_free(&w);
            sleep(1);
            continue;
        }
        while (!A.stop && !gone && !fb_k8s_watch_pump(&w, -1, 20))
            reap();
        /* Whatever ended the watch (410 Gone, a timeout, a break): list
         * again, which also catches up on what was missed. */
        need_list = 1;
        fb_k8s_watch_free(&w);
        reap();
    }
    for (int i = 0; i < MAX_PODS; i++)
        if (A.pods[i].used)
            signal_pod(&A.pods[i], SIGKILL);
    while (waitpid(-1, NULL, 0) > 0)
        ;
    fb_k8s_close(&A.api);
    say("stopped");
    return 0;
}
