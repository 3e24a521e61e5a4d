/*
 * ldso.c -- the library listing of ldso.h.
 *
 * Which libraries does the program need, and where are they?  The answer
 * must be the one the dynamic loader gives when the program starts, which
 * depends on DT_NEEDED recursively, DT_RPATH versus DT_RUNPATH (and which
 * object's applies to which dependency), $ORIGIN and $LIB expansion,
 * glibc-hwcaps subdirectories chosen by the CPU, /etc/ld.so.cache and the
 * loader's built-in directories.  Rewriting that resolver would be a
 * second, subtly different loader.  So we ask the loader itself: the
 * program's own PT_INTERP run as `<interp> --list <program>` (what ldd
 * does) loads the dependency tree without running any of the program's
 * code and prints each object's path.
 *
 * It runs with every LD_* variable removed from the environment: the
 * container will not have LD_LIBRARY_PATH or LD_PRELOAD either, so what it
 * resolves without them is what the image must hold (plus
 * /etc/ld.so.cache, which the image carries so that libraries found
 * through ld.so.conf are found the same way in the container).
 *
 * The caveat ldd's manual gives (never run it on an untrusted binary)
 * does not apply more than building an image of the program does: the
 * image exists to run it.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/docker/ldso.h"
#include "backend/http/curl_dl.h"
#include "base/common.h"

extern char **environ;

/* The environment without LD_* variables. */
static char **loader_env(void)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 1, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "LD_", 3) != 0)
            env[k++] = environ[i];
    return env;
}

/* Runs `interp --list program` and collects its output and exit status. */
static int run_loader(const struct fb_program *pi, fiber_buf *output,
                      int *status)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return fb_err_errno(FIBER_ESYS, "pipe");
    char **env = loader_env();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY,
                                     0);
    char *argv[] = {(char *)pi->interp, "--list", (char *)pi->path, NULL};
    pid_t pid;
    int err = env ? posix_spawn(&pid, pi->interp, &fa, NULL, argv, env)
                  : ENOMEM;
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    close(fds[1]);
    if (err) {
        close(fds[0]);
        errno = err;
        return fb_err_errno(FIBER_ESYS,
                            "cannot run %s's dynamic loader %s to list its "
                            "libraries",
                            pi->path, pi->interp);
    }
    int rc = 0;
    char chunk[4096];
    ssize_t n;
    while ((n = read(fds[0], chunk, sizeof chunk)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 || (rc == 0 && fiber_buf_append(output, chunk, (size_t)n)))
            rc = rc ? rc : fb_err(FIBER_ENOMEM, "out of memory");
        if (n < 0)
            break;
    }
    close(fds[0]);
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
    return rc;
}

/* Parses the loader's listing.  Lines look like
 *     libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)
 *     /lib64/ld-linux-x86-64.so.2 (0x...)
 *     linux-vdso.so.1 (0x...)              (in the kernel: skipped)
 *     libfoo.so.1 => not found             (an error) */
static int parse_listing(const struct fb_program *pi, const char *text,
                         struct fb_pathset *libs, int lenient)
{
    const char *line = text;
    while (*line) {
        const char *eol = strchr(line, '\n');
        size_t len = eol ? (size_t)(eol - line) : strlen(line);
        const char *p = line, *end = line + len;
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        const char *arrow = memmem(p, (size_t)(end - p), " => ", 4);
        const char *path = arrow ? arrow + 4 : p;
        if (arrow && end - path >= 9 && memcmp(path, "not found", 9) == 0 &&
            lenient) {
            line = eol ? eol + 1 : end; /* an optional module's library */
            continue;
        }
        if (arrow && end - path >= 9 && memcmp(path, "not found", 9) == 0)
            return fb_err(FIBER_EINVAL,
                          "%s needs %.*s, which the dynamic loader cannot "
                          "find (without LD_LIBRARY_PATH, as in a "
                          "container): install it in a system directory, "
                          "add its directory to /etc/ld.so.conf.d and run "
                          "ldconfig, or link the program with -Wl,-rpath",
                          pi->path, (int)(arrow - p), p);
        if (path < end && *path == '/') {
            const char *stop = memmem(path, (size_t)(end - path), " (0x", 4);
            size_t plen = stop ? (size_t)(stop - path) : (size_t)(end - path);
            int rc = fb_pathset_add(libs, path, plen);
            if (rc)
                return rc;
        }
        line = eol ? eol + 1 : end;
    }
    return 0;
}

/* Adds what `interp --list` says pi->path needs (pi may be a library). */
int fb_ldso_list(const struct fb_program *pi, struct fb_pathset *libs,
                 int lenient)
{
    fiber_buf out = {0};
    int status = 0;
    int rc = run_loader(pi, &out, &status);
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (rc == 0)
        rc = fiber_buf_append(&out, "", 1); /* NUL-terminate */
    if (rc == 0 && !ok && !lenient)
        rc = fb_err(FIBER_EINVAL,
                    "the dynamic loader %s could not list %s's libraries "
                    "(it said: %.400s)",
                    pi->interp, pi->path,
                    out.len > 1 ? (const char *)out.data : "nothing");
    if (rc == 0 && ok)
        rc = parse_listing(pi, (const char *)out.data, libs, lenient);
    fiber_buf_free(&out);
    return rc;
}

/* libcurl, which fiber dlopen()s for its docker and kubernetes backends
 * (curl_dl.h), and the libraries it needs: a master in a container (fiber
 * run, a pod of the kubernetes backend) talks to its engine with it.
 * Where this host has no libcurl, nothing is added. */
static int add_libcurl(const struct fb_program *pi, struct fb_pathset *libs)
{
    if (fb_curl_load() != 0) {
        fb_err_clear(); /* no libcurl here: the image goes without */
        return 0;
    }
    void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_NOLOAD);
    struct link_map *lm = NULL;
    if (!h)
        return 0;
    int found = dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name &&
                lm->l_name[0] == '/';
    struct fb_program lib = *pi;
    if (found)
        fb_strlcpy(lib.path, lm->l_name, sizeof lib.path);
    dlclose(h);
    if (!found)
        return 0;
    int rc = fb_ldso_list(&lib, libs, 0);
    return rc ? rc : fb_pathset_add(libs, lib.path, strlen(lib.path));
}

int fb_ldso_libraries(const struct fb_program *pi, struct fb_pathset *libs)
{
    if (!pi->interp[0])
        return 0; /* statically linked: nothing to add */
    int rc = fb_ldso_list(pi, libs, 0);
    if (rc == 0)
        rc = add_libcurl(pi, libs);
    if (rc == 0)
        rc = fb_pathset_add(libs, pi->interp, strlen(pi->interp));
    return rc;
}
