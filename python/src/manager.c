/*
 * manager.c -- _fiber.Manager over fiber_manager and _fiber.Mobj over
 * fiber_mobj.
 *
 * fiber.managers maps Python's manager types onto two kinds of objects:
 * the manager's native synchronisation objects (locks, rlocks, events,
 * semaphores, barriers, conditions) and queues; and "custom" objects
 * whose methods are the C task fiber_py_method, which runs the Python
 * object's method inside the manager (dict, list, Value, Namespace and
 * every class given to BaseManager.register).
 *
 * Mobj.op(op, timeout_ms, n, data, asynchronous) is the one entry point of
 * an object: it makes the operation op (OP_* below) and returns its answer
 * (None, an int or bytes), or with asynchronous a Future of that answer.
 * A failure raises FiberError whose .code the Python side maps to
 * Python's exceptions (FIBER_EAGAIN and FIBER_ETIMEDOUT: a wait that gave
 * up; FIBER_ESTATE: a release of a lock not held, a broken barrier).
 */
#include <string.h>

#include "binding.h"

PyObject *fbp_queue_wrap(fiber_queue *q);

typedef struct {
    PyObject_HEAD
    fiber_manager *m;
} FbpManager;

typedef struct {
    PyObject_HEAD
    fiber_mobj *o;
    PyObject *manager; /* keeps the manager's handle alive, or NULL */
} FbpMobj;

enum {
    K_LOCK,
    K_RLOCK,
    K_EVENT,
    K_SEMAPHORE,
    K_BARRIER,
    K_CONDITION,
    K_CUSTOM,
    K_VALUE, /* an int64 (fiber.Value, RawValue, JoinableQueue's count) */
    K_DICT,  /* bytes to bytes (fiber.Array's chunks) */
};

enum {
    OP_LOCK_ACQUIRE, /* lock, rlock: timeout */
    OP_LOCK_RELEASE,
    OP_SEM_ACQUIRE,  /* semaphore: timeout */
    OP_SEM_RELEASE,
    OP_COND_ACQUIRE, /* condition: timeout */
    OP_COND_RELEASE,
    OP_EVENT_SET,
    OP_EVENT_CLEAR,
    OP_EVENT_IS_SET, /* -> int */
    OP_EVENT_WAIT,   /* timeout */
    OP_BARRIER_WAIT, /* timeout -> int index */
    OP_BARRIER_RESET,
    OP_COND_WAIT,       /* timeout */
    OP_COND_NOTIFY,     /* n */
    OP_COND_NOTIFY_ALL,
    OP_CALL, /* custom: data -> bytes */
};

static int manager_init(FbpManager *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name", "cpu", "memory", "gpu", NULL};
    PyObject *name = Py_None;
    int cpu = 0, memory = 0, gpu = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|Oiii", kwlist, &name, &cpu,
                                     &memory, &gpu))
        return -1;
    if (self->m) {
        PyErr_SetString(PyExc_RuntimeError, "manager already started");
        return -1;
    }
    fiber_job_opts o;
    if (fbp_job_opts(&o, name, cpu, memory, gpu) != 0)
        return -1;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_manager_start(&self->m, &o));
    if (rc) {
        fbp_raise(rc, msg);
        return -1;
    }
    return 0;
}

static void manager_stop_now(FbpManager *self)
{
    fiber_manager *m = self->m;
    self->m = NULL;
    if (m)
        FB_NOGIL(fiber_manager_free(m));
}

static void manager_dealloc(FbpManager *self)
{
    manager_stop_now(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *manager_shutdown(FbpManager *self, PyObject *unused)
{
    (void)unused;
    manager_stop_now(self);
    Py_RETURN_NONE;
}

static PyObject *mobj_wrap(fiber_mobj *o, PyObject *manager)
{
    FbpMobj *self = PyObject_New(FbpMobj, &FbpMobjType);
    if (!self) {
        fiber_mobj_free(o);
        return NULL;
    }
    self->o = o;
    self->manager = Py_XNewRef(manager);
    return (PyObject *)self;
}

/* create(kind, name=None, n=0, state=b"") -> Mobj: opens (creating) an
 * object of kind on the manager; n is a semaphore's value or a barrier's
 * parties, state a custom object's initial state. */
static PyObject *manager_create(FbpManager *self, PyObject *args)
{
    int kind;
    const char *name = NULL;
    long long n = 0;
    Py_buffer state = {0};
    if (!PyArg_ParseTuple(args, "i|zLy*", &kind, &name, &n, &state))
        return NULL;
    if (!self->m) {
        PyBuffer_Release(&state);
        PyErr_SetString(PyExc_ValueError, "manager is shut down");
        return NULL;
    }
    fiber_mobj *o = NULL;
    int rc;
    char msg[1024] = "";
    Py_BEGIN_ALLOW_THREADS
    switch (kind) {
    case K_LOCK: rc = fiber_manager_lock(self->m, name, &o); break;
    case K_RLOCK: rc = fiber_manager_rlock(self->m, name, &o); break;
    case K_EVENT: rc = fiber_manager_event(self->m, name, &o); break;
    case K_SEMAPHORE:
        rc = fiber_manager_semaphore(self->m, name, n, &o);
        break;
    case K_BARRIER:
        rc = n < 1 || n > 1000000
                 ? FIBER_EINVAL
                 : fiber_manager_barrier(self->m, name, (unsigned)n, &o);
        break;
    case K_CONDITION: rc = fiber_manager_condition(self->m, name, &o); break;
    case K_VALUE: rc = fiber_manager_value(self->m, name, n, &o); break;
    case K_DICT: rc = fiber_manager_dict(self->m, name, &o); break;
    case K_CUSTOM:
        rc = fiber_manager_custom(self->m, name, state.buf,
                                  (size_t)state.len, &o);
        break;
    default: rc = FIBER_EINVAL; break;
    }
    if (rc && !(kind == K_BARRIER && (n < 1 || n > 1000000)))
        snprintf(msg, sizeof msg, "%s", fiber_last_error());
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&state);
    if (rc)
        return fbp_raise(rc, msg[0] ? msg : "bad object kind or size");
    return mobj_wrap(o, (PyObject *)self);
}

static PyObject *manager_queue(FbpManager *self, PyObject *args)
{
    Py_ssize_t capacity = 0;
    if (!PyArg_ParseTuple(args, "|n", &capacity))
        return NULL;
    if (!self->m || capacity < 0) {
        PyErr_SetString(PyExc_ValueError,
                        self->m ? "maxsize must be >= 0" : "manager is shut "
                                                           "down");
        return NULL;
    }
    fiber_queue *q;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_manager_queue(self->m, NULL, (size_t)capacity, &q));
    if (rc)
        return fbp_raise(rc, msg);
    return fbp_queue_wrap(q);
}

static PyMethodDef manager_methods[] = {
    {"create", (PyCFunction)manager_create, METH_VARARGS, NULL},
    {"queue", (PyCFunction)manager_queue, METH_VARARGS, NULL},
    {"shutdown", (PyCFunction)manager_shutdown, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject FbpManagerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fiber._fiber.Manager",
    .tp_basicsize = sizeof(FbpManager),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)manager_init,
    .tp_dealloc = (destructor)manager_dealloc,
    .tp_methods = manager_methods,
    .tp_doc = "Manager(name=None, ...): a manager job hosting objects.",
};

/* ---- objects --------------------------------------------------------------- */

static void mobj_dealloc(FbpMobj *self)
{
    fiber_mobj *o = self->o;
    self->o = NULL;
    FB_NOGIL(fiber_mobj_free(o));
    Py_XDECREF(self->manager);
    PyObject_Free(self);
}

static PyObject *mobj_open(PyObject *cls, PyObject *args)
{
    (void)cls;
    Py_buffer ser;
    if (!PyArg_ParseTuple(args, "y*", &ser))
        return NULL;
    fiber_mobj *o;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_mobj_open(&o, ser.buf, (size_t)ser.len));
    PyBuffer_Release(&ser);
    if (rc)
        return fbp_raise(rc, msg);
    return mobj_wrap(o, NULL);
}

static PyObject *mobj_serialize(FbpMobj *self, PyObject *unused)
{
    (void)unused;
    fiber_buf b = {0};
    int rc = fiber_mobj_serialize(self->o, &b);
    PyObject *res = rc ? fbp_raise_last(rc) : fbp_bytes_of(&b);
    fiber_buf_free(&b);
    return res;
}

/* What kind of answer an operation has (pool.c's future kinds). */
static int answer_kind(int op)
{
    switch (op) {
    case OP_EVENT_IS_SET:
    case OP_BARRIER_WAIT: return 1; /* int64 */
    case OP_CALL: return 0;         /* bytes */
    default: return 2;              /* none */
    }
}

struct op_args {
    fiber_mobj *o;
    int op, timeout_ms, n;
    const void *data;
    size_t len;
    fiber_buf *out;
    int64_t scalar;
    fiber_future **f;
};

static int run_op(struct op_args *a)
{
    int set = 0, index = 0, rc;
    fiber_mobj *o = a->o;
    switch (a->op) {
    case OP_LOCK_ACQUIRE: return fiber_lock_acquire(o, a->timeout_ms, a->f);
    case OP_LOCK_RELEASE: return fiber_lock_release(o, a->f);
    case OP_SEM_ACQUIRE: return fiber_sem_acquire(o, a->timeout_ms, a->f);
    case OP_SEM_RELEASE: return fiber_sem_release(o, a->f);
    case OP_COND_ACQUIRE: return fiber_cond_acquire(o, a->timeout_ms, a->f);
    case OP_COND_RELEASE: return fiber_cond_release(o, a->f);
    case OP_EVENT_SET: return fiber_event_set(o, a->f);
    case OP_EVENT_CLEAR: return fiber_event_clear(o, a->f);
    case OP_EVENT_IS_SET:
        rc = fiber_event_is_set(o, &set, a->f);
        a->scalar = set;
        return rc;
    case OP_EVENT_WAIT: return fiber_event_wait(o, a->timeout_ms, a->f);
    case OP_BARRIER_WAIT:
        rc = fiber_barrier_wait(o, a->timeout_ms, &index, a->f);
        a->scalar = index;
        return rc;
    case OP_BARRIER_RESET: return fiber_barrier_reset(o, a->f);
    case OP_COND_WAIT: return fiber_cond_wait(o, a->timeout_ms, a->f);
    case OP_COND_NOTIFY: return fiber_cond_notify(o, a->n, a->f);
    case OP_COND_NOTIFY_ALL: return fiber_cond_notify_all(o, a->f);
    case OP_CALL:
        return fiber_custom_call(o, FBP_METHOD, a->data, a->len, a->out,
                                 a->f);
    default: return FIBER_EINVAL;
    }
}

/* ---- waits that a signal ends ----
 * A blocking op waits in the manager, GIL released.  Made in one call, a
 * Lock().acquire() or an Event().wait() without a timeout could not be
 * ended by Ctrl-C (its KeyboardInterrupt came when the wait did, if
 * ever), while threading's and multiprocessing's can.  So:
 * - lock, rlock, semaphore and condition-lock acquires and event waits
 *   are made in slices of FB_SLICE_MS, each a call of its own (a slice
 *   that times out took nothing; a waiter joins the queue again each
 *   slice), with Python's signal handlers run between them;
 * - a condition wait and a barrier wait cannot be cut so (the pause
 *   between two slices would miss a notify; a barrier wait that times
 *   out breaks the barrier): the call is made asynchronously and its
 *   future waited for in slices.  When a handler raises, the condition is
 *   notified (all: its lock taken for that and given back) or the
 *   barrier reset, so that the call returns, which it does with the
 *   condition's lock held again, as threading's wait holds it when it
 *   raises; then the handler's exception propagates.
 *   The other waiters of that condition wake as from a spurious wakeup,
 *   and those of the barrier get BrokenBarrierError, as when a thread's
 *   wait on a threading.Barrier is interrupted. */
static int waits_in_slices(int op)
{
    return op == OP_LOCK_ACQUIRE || op == OP_SEM_ACQUIRE ||
           op == OP_COND_ACQUIRE || op == OP_EVENT_WAIT;
}

static int op_slice(void *ctx, int slice_ms)
{
    struct op_args *a = ctx;
    a->timeout_ms = slice_ms;
    return run_op(a);
}

static int future_slice(void *ctx, int slice_ms)
{
    return fiber_future_wait(ctx, slice_ms);
}

/* A condition or barrier wait (see above).  Returns the op's code, or -2
 * with the signal handler's exception set. */
static int wait_interruptibly(struct op_args *a, char *msg, size_t msg_size)
{
    fiber_future *f = NULL;
    int rc;
    a->f = &f;
    Py_BEGIN_ALLOW_THREADS
    rc = run_op(a);
    if (rc)
        snprintf(msg, msg_size, "%s", fiber_last_error());
    Py_END_ALLOW_THREADS
    a->f = NULL;
    if (rc)
        return rc;
    int waited = fbp_wait_sliced(future_slice, f, -1, NULL, 0);
    Py_BEGIN_ALLOW_THREADS
    if (waited == -2) {
        if (a->op == OP_COND_WAIT) {
            /* notify_all wants the lock, which the wait released */
            if (fiber_cond_acquire(a->o, -1, NULL) == 0) {
                fiber_cond_notify_all(a->o, NULL);
                fiber_cond_release(a->o, NULL);
            }
        } else
            fiber_barrier_reset(a->o, NULL);
        fiber_future_wait(f, -1);
    }
    rc = fiber_future_get(f, a->out, 0);
    if (rc)
        snprintf(msg, msg_size, "%s", fiber_last_error());
    fiber_future_free(f);
    Py_END_ALLOW_THREADS
    if (waited == -2)
        return -2;
    if (rc == 0 && a->op == OP_BARRIER_WAIT && a->out->len >= 8) {
        memcpy(&a->scalar, a->out->data, 8);
        a->out->len = 0;
    }
    return rc;
}

static PyObject *mobj_op(FbpMobj *self, PyObject *args)
{
    struct op_args a = {.o = self->o, .timeout_ms = -1};
    Py_buffer data = {0};
    int asynchronous = 0;
    if (!PyArg_ParseTuple(args, "i|iiy*p", &a.op, &a.timeout_ms, &a.n, &data,
                          &asynchronous))
        return NULL;
    a.data = data.buf;
    a.len = (size_t)data.len;
    fiber_buf out = {0};
    fiber_future *f = NULL;
    a.out = &out;
    a.f = asynchronous ? &f : NULL;
    int rc;
    char msg[1024] = "";
    if (asynchronous || a.timeout_ms == 0)
        FBP_CALL(rc, msg, run_op(&a));
    else if (waits_in_slices(a.op))
        rc = fbp_wait_sliced(op_slice, &a, a.timeout_ms, msg, sizeof msg);
    else if (a.op == OP_COND_WAIT || a.op == OP_BARRIER_WAIT)
        rc = wait_interruptibly(&a, msg, sizeof msg);
    else
        FBP_CALL(rc, msg, run_op(&a));
    PyBuffer_Release(&data);
    PyObject *res;
    if (rc == -2)
        res = NULL;     /* a signal handler raised */
    else if (rc)
        res = fbp_raise(rc, msg[0] ? msg : "operation not valid for this "
                                           "object");
    else if (asynchronous)
        res = fbp_future_new(f, (PyObject *)self, answer_kind(a.op));
    else if (answer_kind(a.op) == 1)
        res = PyLong_FromLongLong(a.scalar);
    else if (answer_kind(a.op) == 0)
        res = fbp_bytes_of(&out);
    else
        res = Py_NewRef(Py_None);
    fiber_buf_free(&out);
    return res;
}

/* ---- int64 values, dicts, release: what fiber.sharedctypes and
 * fiber.synchronize use, so that a Value, an Array or a lock of a local
 * client is changed in shared memory (docs/manager.md). ---- */

enum { VOP_GET, VOP_SET, VOP_ADD, VOP_CAS };

/* value(vop, a=0, b=0) -> int: VOP_GET the value; VOP_SET to a (returns
 * a); VOP_ADD a, returning the new value; VOP_CAS from a to b, returning
 * the value found (the swap happened when it equals a). */
static PyObject *mobj_value(FbpMobj *self, PyObject *args)
{
    int vop;
    long long a = 0, b = 0;
    if (!PyArg_ParseTuple(args, "i|LL", &vop, &a, &b))
        return NULL;
    int64_t x = a;
    int rc;
    char msg[1024] = "";
    switch (vop) {
    case VOP_GET: FBP_CALL(rc, msg, fiber_value_get(self->o, &x, NULL)); break;
    case VOP_SET: FBP_CALL(rc, msg, fiber_value_set(self->o, a, NULL)); break;
    case VOP_ADD:
        FBP_CALL(rc, msg, fiber_value_add(self->o, a, &x, NULL));
        break;
    case VOP_CAS:
        FBP_CALL(rc, msg, fiber_value_cas(self->o, a, b, &x, NULL));
        break;
    default:
        PyErr_Format(PyExc_ValueError, "bad value operation %d", vop);
        return NULL;
    }
    if (rc)
        return fbp_raise(rc, msg);
    return PyLong_FromLongLong(x);
}

/* dict_get(key) -> bytes, or None when the key is absent. */
static PyObject *mobj_dict_get(FbpMobj *self, PyObject *args)
{
    Py_buffer key;
    if (!PyArg_ParseTuple(args, "y*", &key))
        return NULL;
    fiber_buf out = {0};
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_dict_get(self->o, key.buf, (size_t)key.len,
                                     &out, NULL));
    PyBuffer_Release(&key);
    PyObject *res;
    if (rc == FIBER_ENOKEY)
        res = Py_NewRef(Py_None);
    else if (rc)
        res = fbp_raise(rc, msg);
    else
        res = fbp_bytes_of(&out);
    fiber_buf_free(&out);
    return res;
}

/* dict_set(key, value): sets key to a copy of value. */
static PyObject *mobj_dict_set(FbpMobj *self, PyObject *args)
{
    Py_buffer key, val;
    if (!PyArg_ParseTuple(args, "y*y*", &key, &val))
        return NULL;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_dict_set(self->o, key.buf, (size_t)key.len,
                                     val.buf, (size_t)val.len, NULL));
    PyBuffer_Release(&key);
    PyBuffer_Release(&val);
    if (rc)
        return fbp_raise(rc, msg);
    Py_RETURN_NONE;
}

/* release(): destroys the object for every process and frees this handle
 * (fiber_mobj_release); later calls on this handle fail with ValueError. */
static PyObject *mobj_release(FbpMobj *self, PyObject *unused)
{
    (void)unused;
    fiber_mobj *o = self->o;
    if (!o) {
        PyErr_SetString(PyExc_ValueError, "object already released");
        return NULL;
    }
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_mobj_release(o));
    if (rc != FIBER_EINVAL)
        self->o = NULL;
    if (rc)
        return fbp_raise(rc, msg);
    Py_RETURN_NONE;
}

static PyMethodDef mobj_methods[] = {
    {"open", (PyCFunction)mobj_open, METH_VARARGS | METH_CLASS, NULL},
    {"serialize", (PyCFunction)mobj_serialize, METH_NOARGS, NULL},
    {"op", (PyCFunction)mobj_op, METH_VARARGS, NULL},
    {"value", (PyCFunction)mobj_value, METH_VARARGS, NULL},
    {"dict_get", (PyCFunction)mobj_dict_get, METH_VARARGS, NULL},
    {"dict_set", (PyCFunction)mobj_dict_set, METH_VARARGS, NULL},
    {"release", (PyCFunction)mobj_release, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject FbpMobjType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fiber._fiber.Mobj",
    .tp_basicsize = sizeof(FbpMobj),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)mobj_dealloc,
    .tp_methods = mobj_methods,
    .tp_doc = "An object hosted by a manager.",
};

int fbp_manager_init(PyObject *m)
{
    if (PyType_Ready(&FbpManagerType) < 0 || PyType_Ready(&FbpMobjType) < 0)
        return -1;
    if (PyModule_AddObjectRef(m, "Manager", (PyObject *)&FbpManagerType) ||
        PyModule_AddObjectRef(m, "Mobj", (PyObject *)&FbpMobjType))
        return -1;
    static const struct {
        const char *name;
        int value;
    } consts[] = {
        {"K_LOCK", K_LOCK},
        {"K_RLOCK", K_RLOCK},
        {"K_EVENT", K_EVENT},
        {"K_SEMAPHORE", K_SEMAPHORE},
        {"K_BARRIER", K_BARRIER},
        {"K_CONDITION", K_CONDITION},
        {"K_CUSTOM", K_CUSTOM},
        {"K_VALUE", K_VALUE},
        {"K_DICT", K_DICT},
        {"VOP_GET", VOP_GET},
        {"VOP_SET", VOP_SET},
        {"VOP_ADD", VOP_ADD},
        {"VOP_CAS", VOP_CAS},
        {"OP_LOCK_ACQUIRE", OP_LOCK_ACQUIRE},
        {"OP_LOCK_RELEASE", OP_LOCK_RELEASE},
        {"OP_SEM_ACQUIRE", OP_SEM_ACQUIRE},
        {"OP_SEM_RELEASE", OP_SEM_RELEASE},
        {"OP_COND_ACQUIRE", OP_COND_ACQUIRE},
        {"OP_COND_RELEASE", OP_COND_RELEASE},
        {"OP_EVENT_SET", OP_EVENT_SET},
        {"OP_EVENT_CLEAR", OP_EVENT_CLEAR},
        {"OP_EVENT_IS_SET", OP_EVENT_IS_SET},
        {"OP_EVENT_WAIT", OP_EVENT_WAIT},
        {"OP_BARRIER_WAIT", OP_BARRIER_WAIT},
        {"OP_BARRIER_RESET", OP_BARRIER_RESET},
        {"OP_COND_WAIT", OP_COND_WAIT},
        {"OP_COND_NOTIFY", OP_COND_NOTIFY},
        {"OP_COND_NOTIFY_ALL", OP_COND_NOTIFY_ALL},
        {"OP_CALL", OP_CALL},
    };
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++)
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].value))
            return -1;
    return 0;
}
