/*
 * ring.c -- _fiber.Ring: a handle of a fiber_ring (include/fiber/fiber.h,
 * "Rings"), the creator's or a member's.  fiber.experimental.ring builds
 * Fiber's Ring API on it.
 *
 * Collectives work on any object with the buffer protocol that is
 * writable and C-contiguous (numpy arrays, bytearray, memoryview, array,
 * torch tensors through .numpy()), in place and without a copy: the GIL
 * is released while libfiber moves the bytes.  allreduce wants elements
 * of float32 ('f') or float64 ('d'); broadcast takes bytes of any format.
 */
#include "binding.h"

typedef struct {
    PyObject_HEAD
    fiber_ring *r;
    int member; /* joined (collectives allowed), not the creator's handle */
} FbpRing;

static int ring_check(FbpRing *self, int member)
{
    if (!self->r) {
        PyErr_SetString(PyExc_ValueError, "the ring handle is closed");
        return -1;
    }
    if (member && !self->member) {
        PyErr_SetString(PyExc_ValueError,
                        "the creator's handle of a ring is not a member: "
                        "join it (Ring.join) to run collectives");
        return -1;
    }
    return 0;
}

static PyObject *ring_new_handle(fiber_ring *r, int member)
{
    FbpRing *self = PyObject_New(FbpRing, &FbpRingType);
    if (!self) {
        fiber_ring_free(r);
        return NULL;
    }
    self->r = r;
    self->member = member;
    return (PyObject *)self;
}

/* Ring.create(n) -> the creator's handle (master only). */
static PyObject *ring_create(PyObject *cls, PyObject *args)
{
    (void)cls;
    int n;
    if (!PyArg_ParseTuple(args, "i", &n))
        return NULL;
    fiber_ring *r = NULL;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_ring_create(&r, n));
    if (rc)
        return fbp_raise(rc, msg);
    return ring_new_handle(r, 0);
}

/* Ring.join(serialized, rank, timeout_ms=-1) -> a member's handle. */
static PyObject *ring_join(PyObject *cls, PyObject *args)
{
    (void)cls;
    Py_buffer ser;
    int rank, timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "y*i|i", &ser, &rank, &timeout_ms))
        return NULL;
    fiber_ring *r = NULL;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_ring_join(&r, ser.buf, (size_t)ser.len, rank,
                                      timeout_ms));
    PyBuffer_Release(&ser);
    if (rc)
        return fbp_raise(rc, msg);
    return ring_new_handle(r, 1);
}

static PyObject *ring_serialize(FbpRing *self, PyObject *unused)
{
    (void)unused;
    if (ring_check(self, 0))
        return NULL;
    fiber_buf b = {0};
    int rc = fiber_ring_serialize(self->r, &b);
    if (rc) {
        fiber_buf_free(&b);
        return fbp_raise_last(rc);
    }
    PyObject *out = fbp_bytes_of(&b);
    fiber_buf_free(&b);
    return out;
}

/* The element type of a buffer's format for allreduce, or 0. */
static int dtype_of(const char *format)
{
    if (!format)
        return 0; /* unsigned bytes: not a float array */
    if (*format == '@' || *format == '=' || *format == '<')
        format++;
    if (strcmp(format, "f") == 0)
        return FIBER_FLOAT32;
    if (strcmp(format, "d") == 0)
        return FIBER_FLOAT64;
    return 0;
}

static int op_of(const char *name)
{
    if (strcmp(name, "sum") == 0)
        return FIBER_SUM;
    if (strcmp(name, "mean") == 0)
        return FIBER_MEAN;
    if (strcmp(name, "max") == 0)
        return FIBER_MAX;
    return 0;
}

/* allreduce(buffer, op='sum', timeout_ms=-1): in place. */
static PyObject *ring_allreduce(FbpRing *self, PyObject *args)
{
    PyObject *obj;
    const char *opname = "sum";
    int timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "O|si", &obj, &opname, &timeout_ms) ||
        ring_check(self, 1))
        return NULL;
    int op = op_of(opname);
    if (!op)
        return PyErr_Format(PyExc_ValueError,
                            "allreduce: unknown op '%s' (sum, mean, max)",
                            opname);
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_WRITABLE | PyBUF_FORMAT |
                                        PyBUF_C_CONTIGUOUS) != 0)
        return NULL;
    int dtype = dtype_of(v.format);
    if (!dtype) {
        PyErr_Format(PyExc_TypeError,
                     "allreduce: the buffer's elements are '%s'; a ring "
                     "reduces float32 ('f') or float64 ('d')",
                     v.format ? v.format : "B");
        PyBuffer_Release(&v);
        return NULL;
    }
    size_t count = (size_t)v.len / (size_t)v.itemsize;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_ring_allreduce(self->r, v.buf, count, dtype, op,
                                           timeout_ms));
    PyBuffer_Release(&v);
    if (rc)
        return fbp_raise(rc, msg);
    Py_RETURN_NONE;
}

/* broadcast(buffer, root=0, timeout_ms=-1): root's bytes to every member,
 * in place. */
static PyObject *ring_broadcast(FbpRing *self, PyObject *args)
{
    PyObject *obj;
    int root = 0, timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "O|ii", &obj, &root, &timeout_ms) ||
        ring_check(self, 1))
        return NULL;
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) !=
        0)
        return NULL;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_ring_broadcast(self->r, v.buf, (size_t)v.len,
                                           root, timeout_ms));
    PyBuffer_Release(&v);
    if (rc)
        return fbp_raise(rc, msg);
    Py_RETURN_NONE;
}

static PyObject *ring_rank(FbpRing *self, void *closure)
{
    (void)closure;
    if (ring_check(self, 1))
        return NULL;
    return PyLong_FromLong(fiber_ring_rank(self->r));
}

static PyObject *ring_size(FbpRing *self, void *closure)
{
    (void)closure;
    if (ring_check(self, 0))
        return NULL;
    return PyLong_FromLong(fiber_ring_size(self->r));
}

static PyObject *ring_is_member(FbpRing *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->r && self->member);
}

static PyObject *ring_close(FbpRing *self, PyObject *unused)
{
    (void)unused;
    fiber_ring *r = self->r;
    self->r = NULL;
    if (r)
        FB_NOGIL(fiber_ring_free(r));
    Py_RETURN_NONE;
}

static void ring_dealloc(FbpRing *self)
{
    fiber_ring *r = self->r;
    self->r = NULL;
    if (r)
        FB_NOGIL(fiber_ring_free(r));
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef ring_methods[] = {
    {"create", (PyCFunction)ring_create, METH_VARARGS | METH_CLASS,
     "create(n) -> the creator's handle of a new ring of n members."},
    {"join", (PyCFunction)ring_join, METH_VARARGS | METH_CLASS,
     "join(serialized, rank, timeout_ms=-1) -> a member's handle."},
    {"serialize", (PyCFunction)ring_serialize, METH_NOARGS,
     "serialize() -> bytes that Ring.join takes."},
    {"allreduce", (PyCFunction)ring_allreduce, METH_VARARGS,
     "allreduce(buffer, op='sum', timeout_ms=-1): in place."},
    {"broadcast", (PyCFunction)ring_broadcast, METH_VARARGS,
     "broadcast(buffer, root=0, timeout_ms=-1): in place."},
    {"close", (PyCFunction)ring_close, METH_NOARGS,
     "close(): frees the handle (a member leaves the ring)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ring_getset[] = {
    {"rank", (getter)ring_rank, NULL, "the member's rank", NULL},
    {"size", (getter)ring_size, NULL, "the ring's number of members", NULL},
    {"is_member", (getter)ring_is_member, NULL,
     "True for a joined member's open handle", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject FbpRingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fiber._fiber.Ring",
    .tp_basicsize = sizeof(FbpRing),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_methods = ring_methods,
    .tp_getset = ring_getset,
    .tp_doc = "A handle of a fiber_ring: Ring.create(n) in the master, "
              "Ring.join(serialized, rank) in a member.",
};

int fbp_ring_init(PyObject *m)
{
    if (PyType_Ready(&FbpRingType) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "Ring", (PyObject *)&FbpRingType);
}
