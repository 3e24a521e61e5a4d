/*
 * fuzz_util.h -- what the message-handler fuzz targets share: reading the
 * fuzz input as a stream of commands, writing seed inputs in the same
 * format, one-time set-up (fiber_init as a master, a private directory
 * for sockets), socket pairs, and the failure report.
 *
 * The input of every handler target is a script: a sequence of commands,
 * each a selector byte followed by the fields that command reads.  A
 * reader past the end of the input reads zeros, so any byte string is a
 * valid script; the target stops when the input is used up.  Seeds are
 * written with the fz_w_* writers in the same field order, by
 * fuzz_write_seeds() (run as `fuzz_X_replay --seeds DIR`).
 *
 * Header-only, static functions: each target is one program.
 */
#ifndef FIBER_FUZZ_UTIL_H
#define FIBER_FUZZ_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fiber/fiber.h"
#include "wire/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Writes the target's seed corpus into dir (replay_main.c --seeds). */
void fuzz_write_seeds(const char *dir);

#ifndef FZ_NAME
#define FZ_NAME "fuzz"
#endif

/* A broken invariant: report it and abort, which libFuzzer (or the
 * replay) counts as a crash. */
#define FZ_REQUIRE(cond, ...)                                                  \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s: %s:%d: invariant broken: ", FZ_NAME,          \
                    __FILE__, __LINE__);                                       \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
            abort();                                                           \
        }                                                                      \
    } while (0)

/* 1 when FUZZ_TRACE is set: the targets then say what they do. */
static inline int fz_trace(void)
{
    static int trace = -1;
    if (trace < 0)
        trace = getenv("FUZZ_TRACE") != NULL;
    return trace;
}

/* ---- reading the script -------------------------------------------------- */

struct fz_in {
    const uint8_t *p;
    size_t n;
};

static inline int fz_more(const struct fz_in *in) { return in->n > 0; }

static inline uint8_t fz_u8(struct fz_in *in)
{
    if (in->n == 0)
        return 0;
    in->n--;
    return *in->p++;
}

static inline uint16_t fz_u16(struct fz_in *in)
{
    uint16_t lo = fz_u8(in);
    return (uint16_t)(lo | (uint16_t)fz_u8(in) << 8);
}

static inline uint32_t fz_u32(struct fz_in *in)
{
    uint32_t lo = fz_u16(in);
    return lo | (uint32_t)fz_u16(in) << 16;
}

static inline uint64_t fz_u64(struct fz_in *in)
{
    uint64_t lo = fz_u32(in);
    return lo | (uint64_t)fz_u32(in) << 32;
}

/* Up to want bytes of the input (fewer at its end); *got says how many. */
static inline const uint8_t *fz_bytes(struct fz_in *in, size_t want,
                                      size_t *got)
{
    const uint8_t *p = in->p;
    *got = want < in->n ? want : in->n;
    in->p += *got;
    in->n -= *got;
    return p;
}

/* ---- writing seeds ------------------------------------------------------- */

static inline void fz_w_bytes(fiber_buf *b, const void *p, size_t n)
{
    if (fiber_buf_append(b, p, n) != 0)
        abort();
}

static inline void fz_w_u8(fiber_buf *b, unsigned v)
{
    uint8_t x = (uint8_t)v;
    fz_w_bytes(b, &x, 1);
}

static inline void fz_w_u16(fiber_buf *b, unsigned v)
{
    fz_w_u8(b, v & 0xff);
    fz_w_u8(b, (v >> 8) & 0xff);
}

static inline void fz_w_u32(fiber_buf *b, uint32_t v)
{
    fz_w_u16(b, v & 0xffff);
    fz_w_u16(b, v >> 16);
}

static inline void fz_w_u64(fiber_buf *b, uint64_t v)
{
    fz_w_u32(b, (uint32_t)v);
    fz_w_u32(b, (uint32_t)(v >> 32));
}

/* Writes b as the seed file dir/name and empties b. */
static inline void fz_seed(const char *dir, const char *name, fiber_buf *b)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b->data, 1, b->len, f) != b->len || fclose(f) != 0) {
        fprintf(stderr, "%s: cannot write %s\n", FZ_NAME, path);
        exit(1);
    }
    b->len = 0;
}

/* ---- set-up -------------------------------------------------------------- */

static char fz_dir_path[256];

static void fz_remove_dir(void)
{
    DIR *d = opendir(fz_dir_path);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[600];
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", fz_dir_path, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(fz_dir_path);
}

/* Once per process: fiber_init() as a master (the configuration, token
 * and build id the servers use), logs quiet unless FIBER_LOG_LEVEL says
 * otherwise, and a private directory for sockets, removed at exit.
 * Returns the directory. */
static inline const char *fz_setup(void)
{
    if (fz_dir_path[0])
        return fz_dir_path;
    setenv("FIBER_LOG_LEVEL", "error", 0);
    int rc = fiber_init(NULL, NULL);
    if (rc != 0 && rc != FIBER_ESTATE) {
        fprintf(stderr, "%s: fiber_init: %s\n", FZ_NAME, fiber_last_error());
        abort();
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(fz_dir_path, sizeof fz_dir_path, "%s/fiber-fuzz-XXXXXX",
             tmp && tmp[0] && strlen(tmp) < 150 ? tmp : "/tmp");
    if (!mkdtemp(fz_dir_path)) {
        fprintf(stderr, "%s: mkdtemp: %s\n", FZ_NAME, strerror(errno));
        abort();
    }
    atexit(fz_remove_dir);
    return fz_dir_path;
}

/* A connected pair of non-blocking, close-on-exec stream sockets with
 * large buffers, so that a script's whole output fits. */
static inline void fz_socketpair(int sv[2])
{
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
                   sv) != 0) {
        fprintf(stderr, "%s: socketpair: %s\n", FZ_NAME, strerror(errno));
        abort();
    }
    int big = 4 << 20;
    for (int i = 0; i < 2; i++) {
        setsockopt(sv[i], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
        setsockopt(sv[i], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    }
}

/* Writes what fits into the non-blocking socket fd; returns how much.  A
 * peer that closed is not an error here (MSG_NOSIGNAL: no SIGPIPE). */
static inline size_t fz_send(int fd, const void *p, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t k = send(fd, (const uint8_t *)p + done, n - done,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0)
            done += (size_t)k;
        else if (k < 0 && errno == EINTR)
            continue;
        else
            break;
    }
    return done;
}

#endif /* FIBER_FUZZ_UTIL_H */
