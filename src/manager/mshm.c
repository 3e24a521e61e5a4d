/*
 * mshm.c -- manager objects' segments in shared memory (see mshm.h): making
 * and sharing them on the manager, mapping them in a client, the life
 * page, and the value and lock operations both sides run on them.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "base/common.h"
#include "base/log.h"
#include "manager/mshm.h"

#define MSHM_MAGIC 0x316d68736d626966ull /* "fibmshm1" */
#define LIFE_MAGIC 0x3165666962626966ull /* "fibbife1" */
#define PAGE 4096
/* A sleeping waiter looks up at least this often: a manager that died
 * does not wake it. */
#define SLICE_MS 100

/* ---- the life page --------------------------------------------------- */

struct life {
    uint64_t magic;
    uint64_t nonce;
    pthread_mutex_t mu; /* held by the serving thread while it lives */
    uint32_t dead;      /* set by the first client that finds mu's owner
                           dead, for all: glibc answers a later trylock
                           EBUSY again */
};

/* The serving thread's life page, made with its first segment and never
 * unmapped: its mutex stays on the thread's robust list until the thread
 * ends, and unmapping a listed mutex would let glibc write to freed
 * pages. */
static _Thread_local struct life *my_life;
static _Thread_local int my_life_fd = -1;

static int life_get(void)
{
    if (my_life)
        return 0;
    int fd = memfd_create("fiber-manager-life", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    struct life *l = MAP_FAILED;
    if (ftruncate(fd, PAGE) == 0)
        l = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (l == MAP_FAILED) {
        close(fd);
        return -1;
    }
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&l->mu, &a);
    pthread_mutexattr_destroy(&a);
    pthread_mutex_lock(&l->mu);
    randombytes_buf(&l->nonce, sizeof l->nonce);
    l->magic = LIFE_MAGIC;
    my_life = l;
    my_life_fd = fd;
    return 0;
}

/* ---- the manager's side ---------------------------------------------- */

int fb_mshm_create(struct fb_mshm *m, int kind, const char *name,
                   size_t reserve, size_t initial)
{
    memset(m, 0, sizeof *m);
    m->fd = -1;
    if (life_get() == 0)
        m->fd = memfd_create("fiber-manager-object", MFD_CLOEXEC);
    if (m->fd >= 0 && ftruncate(m->fd, (off_t)initial) != 0) {
        close(m->fd);
        m->fd = -1;
    }
    void *p;
    if (m->fd >= 0) {
        p = mmap(NULL, reserve, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_NORESERVE, m->fd, 0);
    } else { /* private: served by the manager alone */
        fb_log_debug("manager: %s '%s' is not shared: %s",
                     kind == FB_MSHM_DICT ? "dict" : "object", name,
                     strerror(errno));
        p = mmap(NULL, reserve, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    }
    if (p == MAP_FAILED) {
        if (m->fd >= 0)
            close(m->fd);
        m->fd = -1;
        return fb_err(FIBER_ENOMEM, "no memory for %s '%s'",
                      kind == FB_MSHM_DICT ? "dict" : "an object", name);
    }
    m->h = p;
    m->map_len = reserve;
    m->h->kind = (uint32_t)kind;
    m->h->reserve = reserve;
    fb_strlcpy(m->h->name, name, sizeof m->h->name);
    randombytes_buf(&m->h->nonce, sizeof m->h->nonce);
    __atomic_store_n(&m->h->magic, MSHM_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

static void futex_wake(uint32_t *w, int n)
{
    syscall(SYS_futex, w, FUTEX_WAKE, n, NULL, NULL, 0);
}

void fb_mshm_destroy(struct fb_mshm *m, uint32_t why)
{
    if (!m->h)
        return;
    __atomic_store_n(&m->h->freed, why, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&m->h->seq, 1, __ATOMIC_SEQ_CST);
    futex_wake(&m->h->seq, INT_MAX);
    munmap(m->h, m->map_len);
    if (m->fd >= 0)
        close(m->fd);
    memset(m, 0, sizeof *m);
    m->fd = -1;
}

/* The M_SHARE answer, one item of these bytes. */
struct share {
    uint32_t pid;
    int32_t life_fd;
    uint64_t life_nonce;
    int32_t fd;
    uint32_t conn_id;
    uint64_t nonce;
    uint64_t reserve;
};

int fb_mshm_share(const struct fb_mshm *m, uint32_t conn_id, fiber_buf *out)
{
    if (!m->h || m->fd < 0 || !my_life)
        return fb_err(FIBER_ENOTSUP, "the object is not in shared memory");
    struct share s = {(uint32_t)getpid(), my_life_fd, my_life->nonce,
                      m->fd, conn_id, m->h->nonce, m->h->reserve};
    return fiber_buf_append(out, &s, sizeof s);
}

/* ---- the client's side ------------------------------------------------ */

/* Opens descriptor fd of process pid (the manager's memfd). */
static int open_theirs(uint32_t pid, int fd)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/fd/%d", pid, fd);
    return open(path, O_RDWR | O_CLOEXEC);
}

int fb_mshm_attach(struct fb_mshm *m, const void *share, size_t len, int kind,
                   uint32_t *conn_id)
{
    struct share s;
    memset(m, 0, sizeof *m);
    m->fd = -1;
    if (len != sizeof s)
        return fb_err(FIBER_EPROTO, "M_SHARE answered %zu bytes", len);
    memcpy(&s, share, sizeof s);
    if (s.reserve < PAGE || s.reserve > ((uint64_t)1 << 40) ||
        s.reserve % PAGE)
        return fb_err(FIBER_EPROTO, "M_SHARE named a bad size");
    int lfd = open_theirs(s.pid, s.life_fd);
    if (lfd < 0)
        return fb_err_errno(FIBER_ESYS, "cannot open the manager's "
                            "descriptors (pid %u)", s.pid);
    struct life *l = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED,
                          lfd, 0);
    close(lfd);
    if (l == MAP_FAILED)
        return fb_err_errno(FIBER_ESYS, "mapping the manager's life page");
    if (l->magic != LIFE_MAGIC || l->nonce != s.life_nonce) {
        munmap(l, PAGE);
        return fb_err(FIBER_EPROTO, "the manager's life page is not it");
    }
    m->life = l;
    m->fd = open_theirs(s.pid, s.fd);
    void *p = m->fd < 0 ? MAP_FAILED
                        : mmap(NULL, s.reserve, PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_NORESERVE, m->fd, 0);
    if (p == MAP_FAILED) {
        int rc = fb_err_errno(FIBER_ESYS, "mapping the object's segment");
        fb_mshm_detach(m);
        return rc;
    }
    m->h = p;
    m->map_len = s.reserve;
    if (__atomic_load_n(&m->h->magic, __ATOMIC_ACQUIRE) != MSHM_MAGIC ||
        m->h->nonce != s.nonce || m->h->kind != (uint32_t)kind ||
        m->h->reserve != s.reserve) {
        fb_mshm_detach(m);
        return fb_err(FIBER_EPROTO, "the object's segment is not it");
    }
    if (kind != FB_MSHM_DICT) { /* a page, never grown: no need of fd */
        close(m->fd);
        m->fd = -1;
    }
    *conn_id = s.conn_id;
    return 0;
}

void fb_mshm_detach(struct fb_mshm *m)
{
    if (m->h)
        munmap(m->h, m->map_len);
    if (m->life)
        munmap(m->life, PAGE);
    if (m->fd >= 0)
        close(m->fd);
    memset(m, 0, sizeof *m);
    m->fd = -1;
}

/* 1 while the manager's serving thread lives. */
static int alive(const struct fb_mshm *m)
{
    struct life *l = m->life;
    if (__atomic_load_n(&l->dead, __ATOMIC_ACQUIRE))
        return 0;
    int rc = pthread_mutex_trylock(&l->mu);
    if (rc == EBUSY)
        return 1;
    __atomic_store_n(&l->dead, 1, __ATOMIC_RELEASE);
    if (rc == EOWNERDEAD)
        pthread_mutex_consistent(&l->mu);
    if (rc == 0 || rc == EOWNERDEAD) /* ours now: not kept */
        pthread_mutex_unlock(&l->mu);
    return 0;
}

int fb_mshm_usable(const struct fb_mshm *m, const char *what)
{
    uint32_t f = __atomic_load_n(&m->h->freed, __ATOMIC_ACQUIRE);
    if (f == FB_MSHM_RELEASED)
        return fb_err(FIBER_ECLOSED, "%s '%s' was freed "
                      "(fiber_mobj_release)", what, m->h->name);
    if (f != 0)
        return fb_err(FIBER_ECLOSED, "the manager of %s '%s' stopped", what,
                      m->h->name);
    if (m->life && !alive(m))
        return fb_err(FIBER_ECLOSED, "the manager of %s '%s' is gone", what,
                      m->h->name);
    return 0;
}

/* ---- values ----------------------------------------------------------- */

int64_t fb_mshm_value_get(struct fb_mshm_hdr *h)
{
    return __atomic_load_n(&h->value, __ATOMIC_SEQ_CST);
}

void fb_mshm_value_set(struct fb_mshm_hdr *h, int64_t v)
{
    __atomic_store_n(&h->value, v, __ATOMIC_SEQ_CST);
}

int64_t fb_mshm_value_add(struct fb_mshm_hdr *h, int64_t d)
{
    /* Wraps as two's complement, as the manager's int64 always did. */
    uint64_t r = __atomic_add_fetch((uint64_t *)&h->value, (uint64_t)d,
                                    __ATOMIC_SEQ_CST);
    int64_t v;
    memcpy(&v, &r, sizeof v);
    return v;
}

int64_t fb_mshm_value_cas(struct fb_mshm_hdr *h, int64_t expect,
                          int64_t desire)
{
    __atomic_compare_exchange_n(&h->value, &expect, desire, 0,
                                __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expect; /* the old value either way */
}

/* ---- locks ------------------------------------------------------------- */

int fb_mshm_lock_try(struct fb_mshm_hdr *h, uint64_t me, int recursive)
{
    uint64_t free_ = 0;
    if (__atomic_compare_exchange_n(&h->owner, &free_, me, 0,
                                    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        if (recursive)
            h->depth = 1;
        return 1;
    }
    if (recursive && free_ == me) { /* only its holder touches depth */
        h->depth++;
        return 1;
    }
    return 0;
}

/* After the owner word went to 0: wakes a local sleeper. */
static void released(struct fb_mshm_hdr *h)
{
    __atomic_add_fetch(&h->seq, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&h->sleepers, __ATOMIC_SEQ_CST))
        futex_wake(&h->seq, 1);
}

int fb_mshm_lock_release(struct fb_mshm_hdr *h, uint64_t me, int recursive,
                         int *why, int *wake_srv)
{
    *wake_srv = 0;
    uint64_t cur = __atomic_load_n(&h->owner, __ATOMIC_SEQ_CST);
    for (;;) {
        if (cur == 0) {
            *why = 0;
            return FIBER_ESTATE;
        }
        if (recursive && cur != me) {
            *why = 1;
            return FIBER_ESTATE;
        }
        if (recursive && h->depth > 1) {
            h->depth--;
            return 0;
        }
        if (recursive)
            h->depth = 0;
        /* A plain lock may be released by anyone: cur, whoever it is. */
        if (__atomic_compare_exchange_n(&h->owner, &cur, 0, 0,
                                        __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            break;
    }
    released(h);
    /* Read after the owner word went to 0 (both seq_cst): a manager that
     * flagged itself before failing to take the lock is seen here. */
    *wake_srv = __atomic_load_n(&h->srv_waiting, __ATOMIC_SEQ_CST) != 0;
    return 0;
}

void fb_mshm_lock_clear(struct fb_mshm_hdr *h)
{
    h->depth = 0;
    __atomic_store_n(&h->owner, 0, __ATOMIC_SEQ_CST);
    released(h);
}

int fb_mshm_lock_wait(const struct fb_mshm *m, uint64_t me, int recursive,
                      int timeout_ms, const char *what)
{
    struct fb_mshm_hdr *h = m->h;
    uint64_t deadline = fb_deadline_ms(timeout_ms);
    for (;;) {
        int rc = fb_mshm_usable(m, what);
        if (rc)
            return rc;
        uint32_t s = __atomic_load_n(&h->seq, __ATOMIC_SEQ_CST);
        if (fb_mshm_lock_try(h, me, recursive))
            return 0;
        if (timeout_ms == 0)
            return fb_err(FIBER_EAGAIN, "%s '%s' is held", what, h->name);
        int left = fb_ms_left(deadline);
        if (timeout_ms > 0 && left == 0) {
            /* A release may have woken this waiter alone: pass it on. */
            if (__atomic_load_n(&h->owner, __ATOMIC_SEQ_CST) == 0 &&
                __atomic_load_n(&h->sleepers, __ATOMIC_SEQ_CST))
                futex_wake(&h->seq, 1);
            return fb_err(FIBER_ETIMEDOUT, "timed out");
        }
        if (left < 0 || left > SLICE_MS)
            left = SLICE_MS;
        struct timespec ts = {left / 1000, (long)(left % 1000) * 1000000L};
        __atomic_add_fetch(&h->sleepers, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&h->owner, __ATOMIC_SEQ_CST) != 0)
            syscall(SYS_futex, &h->seq, FUTEX_WAIT, s, &ts, NULL, 0);
        __atomic_sub_fetch(&h->sleepers, 1, __ATOMIC_SEQ_CST);
    }
}
