/*
 * queue.c -- _fiber.Queue over fiber_queue and _fiber.Pipe over
 * fiber_pipe: byte messages; fiber.queues pickles what travels.
 *
 * A handle is created in the master (Queue.create, Pipe.create) or opened
 * from its serialised form in any process of the run (Queue.open,
 * Pipe.open), which is how the Python objects pickle.  Blocking calls
 * wait in slices (Ctrl-C is seen) with the GIL released.
 */
#include <pthread.h>

#include "binding.h"

/* Set in a process fork() made from one that had loaded the extension
 * (multiprocessing's 'fork' start method): the handles it inherited are
 * copies of its parent's, whose connections they share, so they are
 * never freed here (freeing would write on the parent's connections);
 * fiber.queues refuses to use them with a clear error. */
static int forked;

static void on_fork_child(void)
{
    forked = 1;
}

typedef struct {
    PyObject_HEAD
    fiber_queue *q;
    int shared; /* serialize() was called: copies may live elsewhere */
} FbpQueue;

typedef struct {
    PyObject_HEAD
    fiber_pipe *p;
} FbpPipe;

/* The Python result of a put/get-like code: None, or raise. */
static PyObject *status(int rc, const char *msg)
{
    if (rc == -2)
        return NULL;
    if (rc)
        return fbp_raise(rc, msg);
    Py_RETURN_NONE;
}

/* ---- queue ---------------------------------------------------------------- */

static FbpQueue *queue_wrap(fiber_queue *q)
{
    FbpQueue *self = PyObject_New(FbpQueue, &FbpQueueType);
    if (!self) {
        fiber_queue_free(q);
        return NULL;
    }
    self->q = q;
    self->shared = 0;
    return self;
}

PyObject *fbp_queue_wrap(fiber_queue *q) { return (PyObject *)queue_wrap(q); }

static PyObject *queue_create(PyObject *cls, PyObject *args)
{
    (void)cls;
    Py_ssize_t capacity = 0;
    if (!PyArg_ParseTuple(args, "|n", &capacity))
        return NULL;
    if (capacity < 0) {
        PyErr_SetString(PyExc_ValueError, "maxsize must be >= 0");
        return NULL;
    }
    fiber_queue *q;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_queue_create(&q, (size_t)capacity));
    if (rc)
        return fbp_raise(rc, msg);
    return (PyObject *)queue_wrap(q);
}

static PyObject *queue_open(PyObject *cls, PyObject *args)
{
    (void)cls;
    Py_buffer ser;
    if (!PyArg_ParseTuple(args, "y*", &ser))
        return NULL;
    fiber_queue *q;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_queue_open(&q, ser.buf, (size_t)ser.len));
    PyBuffer_Release(&ser);
    if (rc)
        return fbp_raise(rc, msg);
    return (PyObject *)queue_wrap(q);
}

/* A handle that was never serialised exists in this process only, so
 * when it goes nobody else can reach the queue: it is freed, and on the
 * creator's handle (Queue.create) the server frees the queue.  One that
 * was serialised (pickled into a child, a pool task, or anywhere) may
 * have copies that outlive this object: it is detached, and the queue
 * lives until the run ends.  On a handle that is not the creator's the
 * two are the same. */
static void queue_dealloc(FbpQueue *self)
{
    fiber_queue *q = self->q;
    self->q = NULL;
    if (forked)
        ; /* its parent's: left alone */
    else if (self->shared)
        FB_NOGIL(fiber_queue_detach(q));
    else
        FB_NOGIL(fiber_queue_free(q));
    PyObject_Free(self);
}

struct qput {
    fiber_queue *q;
    fiber_pipe *p;
    const void *data;
    size_t len;
};

static int put_step(void *ctx, int slice_ms)
{
    struct qput *c = ctx;
    return c->q ? fiber_queue_put(c->q, c->data, c->len, slice_ms)
                : fiber_pipe_send(c->p, c->data, c->len, slice_ms);
}

/* Puts with a timeout in ms (-1 forever, 0 no wait: one call, which fails
 * with FIBER_EAGAIN when it would wait). */
static PyObject *put_common(fiber_queue *q, fiber_pipe *p, PyObject *args)
{
    Py_buffer data;
    int timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "y*|i", &data, &timeout_ms))
        return NULL;
    struct qput c = {q, p, data.buf, (size_t)data.len};
    char msg[1024] = "";
    int rc = fbp_wait_sliced(put_step, &c, timeout_ms, msg, sizeof msg);
    PyBuffer_Release(&data);
    return status(rc, msg);
}

struct qget {
    fiber_queue *q;
    fiber_pipe *p;
    fiber_buf *out;
};

static int get_step(void *ctx, int slice_ms)
{
    struct qget *c = ctx;
    return c->q ? fiber_queue_get(c->q, c->out, slice_ms)
                : fiber_pipe_recv(c->p, c->out, slice_ms);
}

static PyObject *get_common(fiber_queue *q, fiber_pipe *p, PyObject *args)
{
    int timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "|i", &timeout_ms))
        return NULL;
    fiber_buf b = {0};
    struct qget c = {q, p, &b};
    char msg[1024] = "";
    int rc = fbp_wait_sliced(get_step, &c, timeout_ms, msg, sizeof msg);
    PyObject *res = rc == 0 ? fbp_bytes_of(&b) : status(rc, msg);
    fiber_buf_free(&b);
    return res;
}

static PyObject *queue_put(FbpQueue *self, PyObject *args)
{
    return put_common(self->q, NULL, args);
}

static PyObject *queue_get(FbpQueue *self, PyObject *args)
{
    return get_common(self->q, NULL, args);
}

static PyObject *queue_size(FbpQueue *self, PyObject *unused)
{
    (void)unused;
    size_t n = 0;
    int rc;
    FB_NOGIL(rc = fiber_queue_size(self->q, &n));
    if (rc)
        return fbp_raise_last(rc);
    return PyLong_FromSize_t(n);
}

static PyObject *queue_close(FbpQueue *self, PyObject *unused)
{
    (void)unused;
    int rc;
    FB_NOGIL(rc = fiber_queue_close(self->q));
    if (rc)
        return fbp_raise_last(rc);
    Py_RETURN_NONE;
}

static PyObject *queue_serialize(FbpQueue *self, PyObject *unused)
{
    (void)unused;
    fiber_buf b = {0};
    int rc = fiber_queue_serialize(self->q, &b);
    if (rc == 0)
        self->shared = 1; /* before the bytes exist anywhere */
    PyObject *res = rc ? fbp_raise_last(rc) : fbp_bytes_of(&b);
    fiber_buf_free(&b);
    return res;
}

static PyMethodDef queue_methods[] = {
    {"create", (PyCFunction)queue_create, METH_VARARGS | METH_CLASS, NULL},
    {"open", (PyCFunction)queue_open, METH_VARARGS | METH_CLASS, NULL},
    {"put", (PyCFunction)queue_put, METH_VARARGS, NULL},
    {"get", (PyCFunction)queue_get, METH_VARARGS, NULL},
    {"size", (PyCFunction)queue_size, METH_NOARGS, NULL},
    {"close", (PyCFunction)queue_close, METH_NOARGS, NULL},
    {"serialize", (PyCFunction)queue_serialize, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject FbpQueueType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fiber._fiber.Queue",
    .tp_basicsize = sizeof(FbpQueue),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)queue_dealloc,
    .tp_methods = queue_methods,
    .tp_doc = "A fiber_queue of byte messages.",
};

/* ---- pipe ------------------------------------------------------------------ */

static FbpPipe *pipe_wrap(fiber_pipe *p)
{
    FbpPipe *self = PyObject_New(FbpPipe, &FbpPipeType);
    if (!self) {
        fiber_pipe_free(p);
        return NULL;
    }
    self->p = p;
    return self;
}

static PyObject *pipe_create(PyObject *cls, PyObject *args)
{
    (void)cls;
    int duplex = 1;
    if (!PyArg_ParseTuple(args, "|p", &duplex))
        return NULL;
    fiber_pipe *a, *b;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_pipe_create(&a, &b, duplex));
    if (rc)
        return fbp_raise(rc, msg);
    FbpPipe *pa = pipe_wrap(a);
    FbpPipe *pb = pipe_wrap(b);
    if (!pa || !pb) {
        Py_XDECREF(pa);
        Py_XDECREF(pb);
        return NULL;
    }
    PyObject *t = PyTuple_Pack(2, pa, pb);
    Py_DECREF(pa);
    Py_DECREF(pb);
    return t;
}

static PyObject *pipe_open(PyObject *cls, PyObject *args)
{
    (void)cls;
    Py_buffer ser;
    if (!PyArg_ParseTuple(args, "y*", &ser))
        return NULL;
    fiber_pipe *p;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_pipe_open(&p, ser.buf, (size_t)ser.len));
    PyBuffer_Release(&ser);
    if (rc)
        return fbp_raise(rc, msg);
    return (PyObject *)pipe_wrap(p);
}

static void pipe_dealloc(FbpPipe *self)
{
    fiber_pipe *p = self->p;
    self->p = NULL;
    if (!forked) /* in a forked process, its parent's: left alone */
        FB_NOGIL(fiber_pipe_free(p));
    PyObject_Free(self);
}

static PyObject *pipe_send(FbpPipe *self, PyObject *args)
{
    return put_common(NULL, self->p, args);
}

static PyObject *pipe_recv(FbpPipe *self, PyObject *args)
{
    return get_common(NULL, self->p, args);
}

static PyObject *pipe_close(FbpPipe *self, PyObject *unused)
{
    (void)unused;
    int rc;
    FB_NOGIL(rc = fiber_pipe_close(self->p));
    if (rc)
        return fbp_raise_last(rc);
    Py_RETURN_NONE;
}

static PyObject *pipe_serialize(FbpPipe *self, PyObject *unused)
{
    (void)unused;
    fiber_buf b = {0};
    int rc = fiber_pipe_serialize(self->p, &b);
    PyObject *res = rc ? fbp_raise_last(rc) : fbp_bytes_of(&b);
    fiber_buf_free(&b);
    return res;
}

static PyMethodDef pipe_methods[] = {
    {"create", (PyCFunction)pipe_create, METH_VARARGS | METH_CLASS, NULL},
    {"open", (PyCFunction)pipe_open, METH_VARARGS | METH_CLASS, NULL},
    {"send", (PyCFunction)pipe_send, METH_VARARGS, NULL},
    {"recv", (PyCFunction)pipe_recv, METH_VARARGS, NULL},
    {"close", (PyCFunction)pipe_close, METH_NOARGS, NULL},
    {"serialize", (PyCFunction)pipe_serialize, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject FbpPipeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fiber._fiber.Pipe",
    .tp_basicsize = sizeof(FbpPipe),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)pipe_dealloc,
    .tp_methods = pipe_methods,
    .tp_doc = "One end of a fiber_pipe.",
};

int fbp_queue_init(PyObject *m)
{
    if (PyType_Ready(&FbpQueueType) < 0 || PyType_Ready(&FbpPipeType) < 0)
        return -1;
    pthread_atfork(NULL, NULL, on_fork_child);
    if (PyModule_AddObjectRef(m, "Queue", (PyObject *)&FbpQueueType) != 0)
        return -1;
    return PyModule_AddObjectRef(m, "Pipe", (PyObject *)&FbpPipeType);
}
