/*
 * object.c -- the run's object store from Python: _fiber.object_put,
 * object_get, object_release, object_stats (include/fiber/fiber.h,
 * "Shared objects").  fiber.objects builds fiber.put / ObjectRef on them;
 * this layer moves bytes only.
 *
 * object_put takes any C-contiguous buffer or a sequence of them (the
 * pickle and the out-of-band buffers of one object), joined into the
 * store with one copy per byte.  In a child, object_get returns a Blob:
 * a read-only buffer over libfiber's own copy of the blob (on the
 * master's host, the master's shared memory mapped), held with
 * fiber_object_hold and released when the Blob goes, so the Python value
 * and every array that views it never point into memory that libfiber
 * may unmap, and nothing is copied: 256 workers resolving a 400 KB
 * policy no longer make 256 private copies of it.  In the master it
 * returns a bytes copy (the master's blobs live while put's references
 * do, which a Python value must not depend on).
 */
#include <stdlib.h>
#include <string.h>

#include "binding.h"

static int ref_of(PyObject *obj, fiber_ref *ref)
{
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_SIMPLE) != 0)
        return -1;
    if (v.len != FIBER_REF_LEN) {
        PyErr_Format(PyExc_ValueError,
                     "not an object ref: %zd bytes, want %d", v.len,
                     FIBER_REF_LEN);
        PyBuffer_Release(&v);
        return -1;
    }
    memcpy(ref->bytes, v.buf, FIBER_REF_LEN);
    PyBuffer_Release(&v);
    return 0;
}

/* Joins the buffers of parts (one buffer, or a list/tuple of them) into
 * one malloc'd block; *len its size.  NULL with an exception set. */
static unsigned char *join_parts(PyObject *parts, size_t *len)
{
    PyObject *seq = PyObject_CheckBuffer(parts)
                        ? PyTuple_Pack(1, parts)
                        : PySequence_Fast(parts, "object_put wants a buffer "
                                                 "or a sequence of buffers");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer *views = PyMem_Calloc((size_t)(n ? n : 1), sizeof *views);
    unsigned char *out = NULL;
    Py_ssize_t got = 0;
    size_t total = 0;
    if (!views) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < n; got++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, got);
        if (PyObject_GetBuffer(item, &views[got], PyBUF_C_CONTIGUOUS) != 0)
            goto done;
        total += (size_t)views[got].len;
    }
    out = malloc(total ? total : 1);
    if (!out) {
        PyErr_NoMemory();
        goto done;
    }
    size_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(out + at, views[i].buf, (size_t)views[i].len);
        at += (size_t)views[i].len;
    }
    *len = total;
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_DECREF(seq);
    return out;
}

/* object_put(parts) -> the 40-byte ref (master only). */
static PyObject *py_object_put(PyObject *self, PyObject *parts)
{
    (void)self;
    size_t len = 0;
    unsigned char *data = join_parts(parts, &len);
    if (!data)
        return NULL;
    fiber_ref ref;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_object_put(data, len, &ref));
    free(data);
    if (rc)
        return fbp_raise(rc, msg);
    return PyBytes_FromStringAndSize((const char *)ref.bytes, FIBER_REF_LEN);
}

/* ---- Blob: a held blob as a read-only buffer ------------------------ */

typedef struct {
    PyObject_HEAD
    fiber_ref ref;
    const void *data;
    Py_ssize_t len;
    int held;      /* one fiber_object_hold to release */
} FbpBlob;

static int blob_getbuffer(PyObject *o, Py_buffer *view, int flags)
{
    FbpBlob *b = (FbpBlob *)o;
    /* read-only: the arrays that view it refuse writes */
    return PyBuffer_FillInfo(view, o, (void *)b->data, b->len, 1, flags);
}

static void blob_dealloc(PyObject *o)
{
    FbpBlob *b = (FbpBlob *)o;
    if (b->held)
        (void)fiber_object_release(&b->ref); /* a lock, no wait */
    Py_TYPE(o)->tp_free(o);
}

static Py_ssize_t blob_length(PyObject *o)
{
    return ((FbpBlob *)o)->len;
}

static PyBufferProcs blob_as_buffer = {blob_getbuffer, NULL};
static PySequenceMethods blob_as_sequence = {.sq_length = blob_length};

static PyTypeObject FbpBlobType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fiber._fiber.Blob",
    .tp_basicsize = sizeof(FbpBlob),
    .tp_dealloc = blob_dealloc,
    .tp_as_buffer = &blob_as_buffer,
    .tp_as_sequence = &blob_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A shared object's bytes held in this process (read-only "
              "buffer); released when the last reference goes.",
};

/* object_get(ref, child=False) -> Blob (child: the bytes in place, held
 * until the Blob goes) or bytes (the master: a copy). */
static PyObject *py_object_get(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *refobj;
    int child = 0;
    if (!PyArg_ParseTuple(args, "O|p", &refobj, &child))
        return NULL;
    fiber_ref ref;
    if (ref_of(refobj, &ref) != 0)
        return NULL;
    const void *data = NULL;
    size_t len = 0;
    int rc;
    char msg[1024] = "";
    if (child) {
        FbpBlob *b = PyObject_New(FbpBlob, &FbpBlobType);
        if (!b)
            return NULL;
        b->held = 0;
        b->ref = ref;
        FBP_CALL(rc, msg, fiber_object_hold(&ref, &data, &len));
        if (rc) {
            Py_DECREF(b);
            return fbp_raise(rc, msg);
        }
        b->held = 1;
        b->data = data;
        b->len = (Py_ssize_t)len;
        return (PyObject *)b;
    }
    FBP_CALL(rc, msg, fiber_object_get(&ref, &data, &len));
    if (rc)
        return fbp_raise(rc, msg);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
    if (out) {
        char *dst = PyBytes_AS_STRING(out);
        FB_NOGIL(memcpy(dst, data, len));
    }
    return out;
}

/* object_release(ref): the master drops one reference put counted. */
static PyObject *py_object_release(PyObject *self, PyObject *refobj)
{
    (void)self;
    fiber_ref ref;
    if (ref_of(refobj, &ref) != 0)
        return NULL;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_object_release(&ref));
    if (rc)
        return fbp_raise(rc, msg);
    Py_RETURN_NONE;
}

/* object_released(ref) -> bool: the master released the blob this
 * process cached (fiber_object_released). */
static PyObject *py_object_released(PyObject *self, PyObject *refobj)
{
    (void)self;
    fiber_ref ref;
    if (ref_of(refobj, &ref) != 0)
        return NULL;
    return PyBool_FromLong(fiber_object_released(&ref));
}

/* object_stats() -> dict of this process's fiber_object_stats. */
static PyObject *py_object_stats(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    fiber_object_stats st;
    int rc = fiber_object_stats_get(&st);
    if (rc)
        return fbp_raise_last(rc);
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsK}", "objects",
        (unsigned long long)st.objects, "bytes_held",
        (unsigned long long)st.bytes_held, "bytes_served",
        (unsigned long long)st.bytes_served, "transfers",
        (unsigned long long)st.transfers, "redirects",
        (unsigned long long)st.redirects, "fetches",
        (unsigned long long)st.fetches, "fetch_retries",
        (unsigned long long)st.fetch_retries, "cache_hits",
        (unsigned long long)st.cache_hits, "evictions",
        (unsigned long long)st.evictions, "shm_bytes",
        (unsigned long long)st.shm_bytes, "maps",
        (unsigned long long)st.maps);
}

static PyMethodDef object_methods[] = {
    {"object_put", py_object_put, METH_O,
     "object_put(buffer or [buffers]) -> ref: the bytes, joined, into the "
     "run's object store (master only)."},
    {"object_get", py_object_get, METH_VARARGS,
     "object_get(ref, child=False) -> a Blob over the bytes, held until it "
     "goes (child), or a bytes copy (the master)."},
    {"object_release", py_object_release, METH_O,
     "object_release(ref): drops a reference object_put counted."},
    {"object_released", py_object_released, METH_O,
     "object_released(ref) -> bool: the master released the blob this "
     "process cached."},
    {"object_stats", py_object_stats, METH_NOARGS,
     "object_stats() -> dict: this process's shared-object counters."},
    {NULL, NULL, 0, NULL},
};

int fbp_object_init(PyObject *m)
{
    if (PyType_Ready(&FbpBlobType) < 0 ||
        PyModule_AddFunctions(m, object_methods) != 0)
        return -1;
    return PyModule_AddIntConstant(m, "REF_LEN", FIBER_REF_LEN);
}
