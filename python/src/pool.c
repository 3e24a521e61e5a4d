/*
 * pool.c -- _fiber.Pool over fiber_pool, and _fiber.Future over
 * fiber_future (pool results and asynchronous manager calls).
 *
 * Every task is the C task fiber_py_task with an envelope the Python side
 * built.  Waiting happens on the caller's thread (fiber_future_get), which
 * then runs the pool's I/O itself: a result goes from the worker's socket
 * to the caller without a thread hop.
 *
 * Callbacks.  apply_async with a token asks for a completion record: the C
 * callback (on whichever libfiber thread completed the task, without the
 * GIL) copies the result into a record on the pool's done list, and the
 * Python side's callback thread takes records with next_done() and runs
 * the user's callbacks with the GIL held, off the caller's thread.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "binding.h"

struct done {
    struct done *next;
    uint64_t token;
    int rc;
    size_t len;
    unsigned char data[];
};

typedef struct {
    PyObject_HEAD
    fiber_pool *p;
    pthread_mutex_t mu; /* guards the done list */
    pthread_cond_t cv;
    struct done *head, *tail;
    int mu_ready;
} FbpPool;

/* The parts of a list of payloads (gather_parts): a payload is bytes (one
 * part) or a tuple of contiguous buffers sent back to back (the header
 * and a pickle's out-of-band buffers: fiber._envelope.task(parts=True)),
 * whose exports are held in views until gather_free. */
struct gather {
    fiber_iov *iov;   /* every payload's parts */
    size_t *first;    /* payload i: iov[first[i]] .. iov[first[i + 1] - 1] */
    Py_buffer *views; /* the parts that are not bytes: held exports */
    Py_ssize_t nviews;
};

static void gather_free(struct gather *g)
{
    for (Py_ssize_t i = 0; i < g->nviews; i++)
        PyBuffer_Release(&g->views[i]);
    PyMem_RawFree(g->iov);
    PyMem_RawFree(g->first);
    PyMem_RawFree(g->views);
    memset(g, 0, sizeof *g);
}

enum { FUT_BYTES = 0, FUT_INT64 = 1, FUT_NONE = 2, FUT_MAP = 3 };

typedef struct {
    PyObject_HEAD
    fiber_future *f;
    PyObject *owner; /* keeps the pool or manager object alive */
    int kind;
    int taken;       /* get() returned a final answer */
    PyObject *answer;/* that answer (or NULL) */
    int answer_rc;
    char answer_msg[1024];
    /* map: inputs kept alive, and where results land */
    PyObject *inputs;
    struct gather g;      /* their parts (gather_parts) */
    fiber_buf *outs;
    int *codes;
    Py_ssize_t n;
} FbpFuture;

/* ---- completion records ------------------------------------------------ */

static void on_done(void *ud, int rc, const void *data, size_t len)
{
    struct done *d = malloc(sizeof *d + len);
    FbpPool *self = ud ? *(FbpPool **)ud : NULL;
    uint64_t token = ud ? ((uint64_t *)ud)[1] : 0;
    free(ud);
    if (!d || !self)
        return; /* out of memory: the result still reaches get() */
    d->next = NULL;
    d->token = token;
    d->rc = rc;
    d->len = len;
    if (len)
        memcpy(d->data, data, len);
    pthread_mutex_lock(&self->mu);
    if (self->tail)
        self->tail->next = d;
    else
        self->head = d;
    self->tail = d;
    pthread_cond_signal(&self->cv);
    pthread_mutex_unlock(&self->mu);
}

/* ---- the pool ----------------------------------------------------------- */

static int pool_init(FbpPool *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"workers", "initializer", "maxtasksperchild",
                             "max_task_crashes", "name", "cpu", "memory",
                             "gpu", NULL};
    int workers = 0, maxtasks = 0, crashes = 0, cpu = 0, memory = 0, gpu = 0;
    PyObject *init = Py_None, *name = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iOiiOiii", kwlist, &workers,
                                     &init, &maxtasks, &crashes, &name, &cpu,
                                     &memory, &gpu))
        return -1;
    if (self->p) {
        PyErr_SetString(PyExc_RuntimeError, "pool already created");
        return -1;
    }
    if (workers < 0 || maxtasks < 0 || crashes < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "workers, maxtasksperchild and max_task_crashes must "
                        "be >= 0");
        return -1;
    }
    if (init != Py_None && !PyBytes_Check(init)) {
        PyErr_SetString(PyExc_TypeError, "initializer must be bytes or None");
        return -1;
    }
    fiber_job_opts job;
    if (fbp_job_opts(&job, name, cpu, memory, gpu) != 0)
        return -1;
    fiber_pool_opts o = {.workers = workers,
                         .job = &job,
                         .maxtasksperchild = maxtasks,
                         .max_task_crashes = crashes};
    if (init != Py_None) {
        o.initializer = FBP_TASK;
        o.initarg = PyBytes_AS_STRING(init);
        o.initarg_len = (size_t)PyBytes_GET_SIZE(init);
    }
    if (!self->mu_ready) {
        pthread_mutex_init(&self->mu, NULL);
        pthread_cond_init(&self->cv, NULL);
        self->mu_ready = 1;
    }
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_pool_create(&self->p, &o));
    if (rc) {
        fbp_raise(rc, msg);
        return -1;
    }
    return 0;
}

static void pool_dealloc(FbpPool *self)
{
    if (self->p) {
        fiber_pool *p = self->p;
        self->p = NULL;
        FB_NOGIL(fiber_pool_free(p)); /* runs the last callbacks */
    }
    if (self->mu_ready) {
        for (struct done *d = self->head, *n; d; d = n) {
            n = d->next;
            free(d);
        }
        pthread_mutex_destroy(&self->mu);
        pthread_cond_destroy(&self->cv);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int check_pool(FbpPool *self)
{
    if (!self->p) {
        PyErr_SetString(PyExc_ValueError, "pool is not running");
        return -1;
    }
    return 0;
}

static FbpFuture *future_alloc(PyObject *owner, int kind)
{
    FbpFuture *fu = PyObject_New(FbpFuture, &FbpFutureType);
    if (!fu)
        return NULL;
    fu->f = NULL;
    fu->owner = Py_XNewRef(owner);
    fu->kind = kind;
    fu->taken = 0;
    fu->answer = NULL;
    fu->answer_rc = 0;
    fu->answer_msg[0] = '\0';
    fu->inputs = NULL;
    memset(&fu->g, 0, sizeof fu->g);
    fu->outs = NULL;
    fu->codes = NULL;
    fu->n = 0;
    return fu;
}

PyObject *fbp_future_new(fiber_future *f, PyObject *owner, int kind)
{
    FbpFuture *fu = future_alloc(owner, kind);
    if (!fu) {
        fiber_future_free(f);
        return NULL;
    }
    fu->f = f;
    return (PyObject *)fu;
}

/* apply_async(payload, token=None) -> Future.  With a token (an int), a
 * completion record with that token is queued for next_done(). */
static PyObject *pool_apply_async(FbpPool *self, PyObject *args)
{
    Py_buffer payload;
    PyObject *token = Py_None;
    if (!PyArg_ParseTuple(args, "y*|O", &payload, &token))
        return NULL;
    if (check_pool(self)) {
        PyBuffer_Release(&payload);
        return NULL;
    }
    uint64_t *ud = NULL;
    if (token != Py_None) {
        unsigned long long t = PyLong_AsUnsignedLongLong(token);
        if (PyErr_Occurred() || !(ud = malloc(2 * sizeof *ud))) {
            PyBuffer_Release(&payload);
            return PyErr_Occurred() ? NULL : PyErr_NoMemory();
        }
        *(FbpPool **)ud = self;
        ud[1] = t;
    }
    fiber_future *f = NULL;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_pool_apply_async(self->p, FBP_TASK, payload.buf,
                                (size_t)payload.len, ud ? on_done : NULL, ud,
                                &f));
    PyBuffer_Release(&payload);
    if (rc) {
        free(ud); /* a failed call never calls the callback */
        return fbp_raise(rc, msg);
    }
    return fbp_future_new(f, (PyObject *)self, FUT_BYTES);
}

static void map_free(FbpFuture *fu)
{
    for (Py_ssize_t i = 0; fu->outs && i < fu->n; i++)
        fiber_buf_free(&fu->outs[i]);
    gather_free(&fu->g);
    PyMem_RawFree(fu->outs);
    PyMem_RawFree(fu->codes);
    fu->outs = NULL;
    fu->codes = NULL;
}

/* Fills g from a list of payloads (see struct gather); what names the
 * call in errors.  0, or -1 with an exception set (g is then freed by
 * gather_free as usual). */
static int gather_parts(struct gather *g, PyObject *list, const char *what)
{
    Py_ssize_t n = PyList_GET_SIZE(list), total = 0, views = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        if (PyBytes_Check(item)) {
            total++;
        } else if (PyTuple_Check(item)) {
            total += PyTuple_GET_SIZE(item);
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(item); j++)
                views += !PyBytes_Check(PyTuple_GET_ITEM(item, j));
        } else {
            PyErr_Format(PyExc_TypeError, "%s payload %zd must be bytes or "
                         "a tuple of buffers, not %s", what, i,
                         Py_TYPE(item)->tp_name);
            return -1;
        }
    }
    g->iov = PyMem_RawCalloc(total ? (size_t)total : 1, sizeof *g->iov);
    g->first = PyMem_RawCalloc((size_t)n + 1, sizeof *g->first);
    g->views = PyMem_RawCalloc(views ? (size_t)views : 1, sizeof *g->views);
    if (!g->iov || !g->first || !g->views) {
        PyErr_NoMemory();
        return -1;
    }
    size_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        g->first[i] = k;
        Py_ssize_t m = PyBytes_Check(item) ? 1 : PyTuple_GET_SIZE(item);
        for (Py_ssize_t j = 0; j < m; j++, k++) {
            PyObject *part = PyBytes_Check(item) ? item
                                                 : PyTuple_GET_ITEM(item, j);
            if (PyBytes_Check(part)) {
                g->iov[k].data = PyBytes_AS_STRING(part);
                g->iov[k].len = (size_t)PyBytes_GET_SIZE(part);
                continue;
            }
            Py_buffer *v = &g->views[g->nviews];
            if (PyObject_GetBuffer(part, v, PyBUF_SIMPLE) != 0) {
                PyErr_Format(PyExc_TypeError, "%s payload %zd: part %zd "
                             "is not a contiguous buffer (%s)", what, i, j,
                             Py_TYPE(part)->tp_name);
                return -1;
            }
            g->nviews++;
            g->iov[k].data = v->buf;
            g->iov[k].len = (size_t)v->len;
        }
    }
    g->first[n] = k;
    return 0;
}

/* map_async(payloads, chunksize) -> Future whose get() returns a list:
 * bytes for a task that returned, (code, message) for one that failed
 * (crashed its workers, or its worker could not run it).  A payload is
 * bytes, or a tuple of buffers that travel back to back without being
 * joined here (read when the task is sent: they must not change before
 * the map is ready). */
static PyObject *pool_map_async(FbpPool *self, PyObject *args)
{
    PyObject *list;
    Py_ssize_t chunksize = 0;
    if (!PyArg_ParseTuple(args, "O!|n", &PyList_Type, &list, &chunksize) ||
        check_pool(self))
        return NULL;
    if (chunksize < 0) {
        PyErr_SetString(PyExc_ValueError, "chunksize must be >= 0");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(list);
    FbpFuture *fu = future_alloc((PyObject *)self, FUT_MAP);
    if (!fu)
        return NULL;
    fu->inputs = PyList_GetSlice(list, 0, n); /* a private copy */
    fu->n = n;
    size_t cells = n ? (size_t)n : 1;
    fu->outs = PyMem_RawCalloc(cells, sizeof *fu->outs);
    fu->codes = PyMem_RawCalloc(cells, sizeof *fu->codes);
    if (!fu->inputs || !fu->outs || !fu->codes) {
        Py_DECREF(fu);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    if (gather_parts(&fu->g, fu->inputs, "map") != 0) {
        Py_DECREF(fu);
        return NULL;
    }
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_pool_map_gather_async(self->p, FBP_TASK, fu->g.iov,
                                                  fu->g.first, (size_t)n,
                                                  fu->outs, fu->codes,
                                                  (size_t)chunksize, &fu->f));
    if (rc) {
        Py_DECREF(fu);
        return fbp_raise(rc, msg);
    }
    return (PyObject *)fu;
}

/* ---- streamed imap ------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    fiber_imap *it;
    PyObject *owner; /* the pool */
} FbpIMap;

static PyTypeObject FbpIMapType;

/* imap_stream(chunksize=0, ordered=True, window=0) -> IMap over
 * fiber_pool_imap_stream: the pool chooses chunks (chunksize 0) and
 * retries each input alone. */
static PyObject *pool_imap_stream(FbpPool *self, PyObject *args)
{
    Py_ssize_t chunksize = 0, window = 0;
    int ordered = 1;
    if (!PyArg_ParseTuple(args, "|npn", &chunksize, &ordered, &window) ||
        check_pool(self))
        return NULL;
    if (chunksize < 0 || window < 0) {
        PyErr_SetString(PyExc_ValueError, "chunksize and window must be >= 0");
        return NULL;
    }
    FbpIMap *m = PyObject_New(FbpIMap, &FbpIMapType);
    if (!m)
        return NULL;
    m->it = NULL;
    m->owner = Py_NewRef((PyObject *)self);
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_pool_imap_stream(self->p, FBP_TASK,
                                             (size_t)chunksize, ordered,
                                             (size_t)window, &m->it));
    if (rc) {
        Py_DECREF(m);
        return fbp_raise(rc, msg);
    }
    return (PyObject *)m;
}

/* put(payloads) -> how many were taken (as many as the window has room
 * for; 0 when it is full).  Each payload is copied before put returns. */
static PyObject *imap_put(FbpIMap *m, PyObject *args)
{
    PyObject *list;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &list))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(list);
    struct gather g = {0};
    PyObject *hold = PyList_GetSlice(list, 0, n); /* items stay alive */
    if (!hold || gather_parts(&g, hold, "imap") != 0) {
        gather_free(&g);
        Py_XDECREF(hold);
        return NULL;
    }
    size_t accepted = 0;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_imap_put_gather(m->it, g.iov, g.first, (size_t)n,
                                            &accepted));
    gather_free(&g);
    Py_DECREF(hold);
    if (rc == FIBER_EAGAIN)
        return PyLong_FromLong(0);
    if (rc)
        return fbp_raise(rc, msg);
    return PyLong_FromSize_t(accepted);
}

static PyObject *imap_end(FbpIMap *m, PyObject *unused)
{
    (void)unused;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_imap_end(m->it));
    if (rc)
        return fbp_raise(rc, msg);
    Py_RETURN_NONE;
}

struct next_ctx {
    fiber_imap *it;
    size_t index;
    fiber_buf *out;
};

static int next_step(void *ctx, int slice_ms)
{
    struct next_ctx *c = ctx;
    c->out->len = 0;
    return fiber_imap_next(c->it, &c->index, c->out, slice_ms);
}

/* next(timeout_ms=-1) -> (index, code, bytes): code 0 and the answer, or
 * the task's failure code (it crashed its workers) and its message.
 * Raises FiberTimeoutError, or FiberError when the iterator has nothing
 * to give (FIBER_ESTATE: every input put was taken; FIBER_ECLOSED: ended
 * and all taken, or the pool was terminated). */
static PyObject *imap_next(FbpIMap *m, PyObject *args)
{
    int timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "|i", &timeout_ms))
        return NULL;
    fiber_buf out = {0};
    struct next_ctx c = {m->it, 0, &out};
    char msg[1024] = "";
    int rc = fbp_wait_sliced(next_step, &c, timeout_ms, msg, sizeof msg);
    PyObject *res = NULL;
    if (rc == -2)
        ;
    else if (rc == 0 || rc == FIBER_ETASK || rc == FIBER_ECRASHED ||
             rc == FIBER_ESPAWN || rc == FIBER_ENOMEM)
        res = Py_BuildValue("(niy#)", (Py_ssize_t)c.index, rc,
                            out.data ? (char *)out.data : "",
                            (Py_ssize_t)out.len);
    else
        fbp_raise(rc, msg);
    fiber_buf_free(&out);
    return res;
}

static void imap_dealloc(FbpIMap *m)
{
    if (m->it) {
        fiber_imap *it = m->it;
        m->it = NULL;
        FB_NOGIL(fiber_imap_free(it));
    }
    Py_XDECREF(m->owner);
    PyObject_Free(m);
}

static PyMethodDef imap_methods[] = {
    {"put", (PyCFunction)imap_put, METH_VARARGS, NULL},
    {"end", (PyCFunction)imap_end, METH_NOARGS, NULL},
    {"next", (PyCFunction)imap_next, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FbpIMapType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fiber._fiber.IMap",
    .tp_basicsize = sizeof(FbpIMap),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)imap_dealloc,
    .tp_methods = imap_methods,
    .tp_doc = "A streamed imap over a fiber_pool (Pool.imap_stream).",
};

/* next_done(timeout_ms) -> list of (token, code, bytes), empty on timeout.
 * Waits with the GIL released. */
static PyObject *pool_next_done(FbpPool *self, PyObject *args)
{
    int timeout_ms = 100;
    if (!PyArg_ParseTuple(args, "|i", &timeout_ms))
        return NULL;
    struct done *got = NULL;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mu);
    if (!self->head && timeout_ms != 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        while (!self->head &&
               pthread_cond_timedwait(&self->cv, &self->mu, &ts) == 0)
            ;
    }
    got = self->head;
    self->head = self->tail = NULL;
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    PyObject *list = PyList_New(0);
    for (struct done *d = got, *n; d; d = n) {
        n = d->next;
        PyObject *item = list ? Py_BuildValue("(Kiy#)", d->token, d->rc,
                                              (const char *)d->data,
                                              (Py_ssize_t)d->len)
                              : NULL;
        if (item) {
            PyList_Append(list, item);
            Py_DECREF(item);
        }
        free(d);
    }
    return list;
}

static int pool_join_step(void *ctx, int slice_ms)
{
    return fiber_pool_join(ctx, slice_ms);
}

static PyObject *pool_join(FbpPool *self, PyObject *args)
{
    int timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "|i", &timeout_ms) || check_pool(self))
        return NULL;
    char msg[1024];
    int rc = fbp_wait_sliced(pool_join_step, self->p, timeout_ms, msg,
                             sizeof msg);
    if (rc == -2)
        return NULL;
    if (rc == FIBER_ETIMEDOUT)
        Py_RETURN_FALSE;
    if (rc)
        return fbp_raise(rc, msg);
    Py_RETURN_TRUE;
}

struct ready_ctx {
    fiber_pool *p;
    int n;
};

static int ready_step(void *ctx, int slice_ms)
{
    struct ready_ctx *r = ctx;
    return fiber_pool_wait_ready(r->p, r->n, slice_ms);
}

/* wait_ready(n, timeout_ms) -> True once n workers are connected, False
 * on timeout (fiber_pool_wait_ready). */
static PyObject *pool_wait_ready(FbpPool *self, PyObject *args)
{
    int n, timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "i|i", &n, &timeout_ms) || check_pool(self))
        return NULL;
    struct ready_ctx r = {self->p, n};
    char msg[1024];
    int rc = fbp_wait_sliced(ready_step, &r, timeout_ms, msg, sizeof msg);
    if (rc == -2)
        return NULL;
    if (rc == FIBER_ETIMEDOUT)
        Py_RETURN_FALSE;
    if (rc)
        return fbp_raise(rc, msg);
    Py_RETURN_TRUE;
}

static PyObject *pool_simple(FbpPool *self, int (*fn)(fiber_pool *))
{
    if (check_pool(self))
        return NULL;
    int rc;
    FB_NOGIL(rc = fn(self->p));
    if (rc)
        return fbp_raise_last(rc);
    Py_RETURN_NONE;
}

static PyObject *pool_close(FbpPool *self, PyObject *unused)
{
    (void)unused;
    return pool_simple(self, fiber_pool_close);
}

static PyObject *pool_terminate(FbpPool *self, PyObject *unused)
{
    (void)unused;
    return pool_simple(self, fiber_pool_terminate);
}

static PyObject *pool_resize(FbpPool *self, PyObject *args)
{
    int n;
    if (!PyArg_ParseTuple(args, "i", &n) || check_pool(self))
        return NULL;
    int rc;
    FB_NOGIL(rc = fiber_pool_resize(self->p, n));
    if (rc)
        return fbp_raise_last(rc);
    Py_RETURN_NONE;
}

static PyObject *pool_stats(FbpPool *self, PyObject *unused)
{
    (void)unused;
    if (check_pool(self))
        return NULL;
    fiber_pool_stats st;
    int rc;
    FB_NOGIL(rc = fiber_pool_stats_get(self->p, &st));
    if (rc)
        return fbp_raise_last(rc);
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsisisnsnsK}", "tasks_submitted", st.tasks_submitted,
        "tasks_done", st.tasks_done, "tasks_failed", st.tasks_failed,
        "tasks_retried", st.tasks_retried, "tasks_crashed", st.tasks_crashed,
        "duplicates_dropped", st.duplicates_dropped, "workers_started",
        st.workers_started, "workers_lost", st.workers_lost, "workers_alive",
        st.workers_alive, "workers_target", st.workers_target, "tasks_queued",
        (Py_ssize_t)st.tasks_queued, "tasks_in_flight",
        (Py_ssize_t)st.tasks_in_flight, "workers_retired_at_limit",
        (unsigned long long)st.workers_retired_at_limit);
}

static PyMethodDef pool_methods[] = {
    {"apply_async", (PyCFunction)pool_apply_async, METH_VARARGS, NULL},
    {"map_async", (PyCFunction)pool_map_async, METH_VARARGS, NULL},
    {"imap_stream", (PyCFunction)pool_imap_stream, METH_VARARGS, NULL},
    {"next_done", (PyCFunction)pool_next_done, METH_VARARGS, NULL},
    {"join", (PyCFunction)pool_join, METH_VARARGS, NULL},
    {"wait_ready", (PyCFunction)pool_wait_ready, METH_VARARGS, NULL},
    {"close", (PyCFunction)pool_close, METH_NOARGS, NULL},
    {"terminate", (PyCFunction)pool_terminate, METH_NOARGS, NULL},
    {"resize", (PyCFunction)pool_resize, METH_VARARGS, NULL},
    {"stats", (PyCFunction)pool_stats, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject FbpPoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fiber._fiber.Pool",
    .tp_basicsize = sizeof(FbpPool),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pool_init,
    .tp_dealloc = (destructor)pool_dealloc,
    .tp_methods = pool_methods,
    .tp_doc = "Pool(workers=0, initializer=None, ...): a fiber_pool running "
              "Python tasks.",
};

/* ---- futures ------------------------------------------------------------ */

struct get_ctx {
    fiber_future *f;
    fiber_buf *out;
};

static int get_step(void *ctx, int slice_ms)
{
    struct get_ctx *g = ctx;
    return fiber_future_get(g->f, g->out, slice_ms);
}

static PyObject *map_results(FbpFuture *fu)
{
    PyObject *list = PyList_New(fu->n);
    for (Py_ssize_t i = 0; list && i < fu->n; i++) {
        PyObject *item =
            fu->codes[i] == 0
                ? fbp_bytes_of(&fu->outs[i])
                : Py_BuildValue("(is#)", fu->codes[i],
                                fu->outs[i].data ? (char *)fu->outs[i].data
                                                 : "",
                                (Py_ssize_t)fu->outs[i].len);
        if (!item) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

/* The answer of a finished call as a Python object, by kind. */
static PyObject *answer_of(FbpFuture *fu, fiber_buf *b)
{
    switch (fu->kind) {
    case FUT_INT64: {
        int64_t v = 0;
        if (b->len >= sizeof v)
            memcpy(&v, b->data, sizeof v);
        return PyLong_FromLongLong(v);
    }
    case FUT_NONE:
        Py_RETURN_NONE;
    case FUT_MAP:
        return map_results(fu);
    default:
        return fbp_bytes_of(b);
    }
}

/* get(timeout_ms=-1): the answer, or raises FiberError (its code tells
 * the Python side what failed) or FiberTimeoutError.  After a final
 * answer, get() returns (or raises) the same again. */
static PyObject *future_get(FbpFuture *fu, PyObject *args)
{
    int timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "|i", &timeout_ms))
        return NULL;
    if (!fu->taken) {
        fiber_buf b = {0};
        struct get_ctx g = {fu->f, &b};
        char msg[1024] = "";
        int rc = fbp_wait_sliced(get_step, &g, timeout_ms, msg, sizeof msg);
        if (rc == -2 || rc == FIBER_ETIMEDOUT) {
            fiber_buf_free(&b);
            return rc == -2 ? NULL : fbp_raise(rc, "not ready");
        }
        fu->taken = 1;
        fu->answer_rc = rc;
        if (rc == 0 || fu->kind == FUT_MAP)
            fu->answer = answer_of(fu, &b);
        snprintf(fu->answer_msg, sizeof fu->answer_msg, "%s", msg);
        fiber_buf_free(&b);
        if (fu->kind == FUT_MAP)
            map_free(fu);
        if ((rc == 0 || fu->kind == FUT_MAP) && !fu->answer)
            return NULL;
    }
    if (fu->kind == FUT_MAP || fu->answer_rc == 0)
        return Py_NewRef(fu->answer);
    return fbp_raise(fu->answer_rc, fu->answer_msg);
}

static int wait_step(void *ctx, int slice_ms)
{
    return fiber_future_wait(ctx, slice_ms);
}

static PyObject *future_wait(FbpFuture *fu, PyObject *args)
{
    int timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "|i", &timeout_ms))
        return NULL;
    if (fu->taken)
        Py_RETURN_TRUE;
    char msg[1024];
    int rc = fbp_wait_sliced(wait_step, fu->f, timeout_ms, msg, sizeof msg);
    if (rc == -2)
        return NULL;
    return PyBool_FromLong(rc == 0);
}

static PyObject *future_ready(FbpFuture *fu, PyObject *unused)
{
    (void)unused;
    if (fu->taken)
        Py_RETURN_TRUE;
    return PyBool_FromLong(fiber_future_ready(fu->f) == 1);
}

static void future_dealloc(FbpFuture *fu)
{
    if (fu->f) {
        fiber_future *f = fu->f;
        fu->f = NULL;
        FB_NOGIL(fiber_future_free(f)); /* a map's waits for its tasks */
    }
    map_free(fu);
    Py_XDECREF(fu->inputs);
    Py_XDECREF(fu->answer);
    Py_XDECREF(fu->owner);
    PyObject_Free(fu);
}

static PyMethodDef future_methods[] = {
    {"get", (PyCFunction)future_get, METH_VARARGS, NULL},
    {"wait", (PyCFunction)future_wait, METH_VARARGS, NULL},
    {"ready", (PyCFunction)future_ready, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject FbpFutureType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fiber._fiber.Future",
    .tp_basicsize = sizeof(FbpFuture),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)future_dealloc,
    .tp_methods = future_methods,
    .tp_doc = "The answer of an asynchronous fiber call.",
};

int fbp_pool_init(PyObject *m)
{
    if (PyType_Ready(&FbpPoolType) < 0 || PyType_Ready(&FbpFutureType) < 0 ||
        PyType_Ready(&FbpIMapType) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "Pool", (PyObject *)&FbpPoolType);
}
