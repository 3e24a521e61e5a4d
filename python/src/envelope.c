/*
 * envelope.c -- the per-task paths of the Python task envelope, in C.
 *
 * fiber._envelope defines the format (its docstring) and keeps a Python
 * version of every path; this file does the three that run once per task
 * of a map, where the Python versions cost about 0.5 us each in struct
 * packing, joins and frames (more than the pickling they wrap):
 *
 *   task_envelope / task_envelopes   build one task, or one per item
 *   decode_answer / decode_answers   read one answer, or a map's list
 *   fbp_envelope_run                 run a task in a worker (task.c)
 *
 * Every rare path stays in Python and is reached through a function
 * fiber's modules register: an answer that holds an exception or
 * out-of-band buffers is read by fiber._envelope's Python decoder; a
 * callable that does not load, a task that raises and a result that does
 * not pickle are answered by fiber._worker, as before.  A body is
 * codec.c's encoding when the value is one of its (both versions call
 * the same encoder), else Python's own pickle (pickle.dumps and loads,
 * protocol 5, buffers of OOB_MIN bytes or more out of band), so both
 * versions produce the same bytes, which a test checks.
 */
#include <string.h>

#include "binding.h"

#define TASK_HEAD 20   /* "FPY1" kind flags 0:u16 func_len body_len nbufs */
#define ANSWER_HEAD 16 /* "FPR1" status form 0:u16 body_len nbufs */

/* An answer's form: a pickle, or a chunk's results packed (ints that fit
 * in 64 bits, or floats), 8 bytes each (fiber._envelope's docstring). */
enum { FORM_PICKLE = 0, FORM_INT64S = 1, FORM_FLOAT64S = 2 };
#define OOB_MIN (1 << 16)

enum { K_CALL = 0, K_ONE = 1, K_STAR = 2, K_INIT = 3, K_PROC = 4, K_CHUNK = 5 };
enum { F_STAR = 1 };

static PyObject *dumps_fn, *loads_fn; /* pickle.dumps, pickle.loads */
static PyObject *kw_buffer_callback;  /* ("buffer_callback",) */
static PyObject *kw_buffers;          /* ("buffers",) */
static PyObject *decode_slow;         /* fiber._envelope._decode_py */

/* The worker's Python helpers (fiber._worker, through set_handlers):
 * load_callable(func_bytes) -> callable; task_raised(kind, flags, func,
 * exc) -> answer bytes; answer_ok(value, name) -> answer bytes. */
static PyObject *load_callable, *task_raised, *answer_ok;

static int setup_pickle(void)
{
    if (dumps_fn)
        return 0;
    PyObject *m = PyImport_ImportModule("pickle");
    if (!m)
        return -1;
    dumps_fn = PyObject_GetAttrString(m, "dumps");
    loads_fn = PyObject_GetAttrString(m, "loads");
    Py_DECREF(m);
    kw_buffer_callback = Py_BuildValue("(s)", "buffer_callback");
    kw_buffers = Py_BuildValue("(s)", "buffers");
    if (!dumps_fn || !loads_fn || !kw_buffer_callback || !kw_buffers) {
        Py_CLEAR(dumps_fn);
        Py_CLEAR(loads_fn);
        Py_CLEAR(kw_buffer_callback);
        Py_CLEAR(kw_buffers);
        return -1;
    }
    return 0;
}

static void put_u32(char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get_u64(const char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* ---- pickling with out-of-band buffers ------------------------------- */

/* The buffer_callback: a PickleBuffer of OOB_MIN bytes or more goes into
 * the list (self) and out of band; a smaller one stays in the pickle. */
static PyObject *keep_buffer(PyObject *list, PyObject *pb)
{
    Py_buffer v;
    if (PyObject_GetBuffer(pb, &v, PyBUF_ANY_CONTIGUOUS) != 0)
        return NULL;
    Py_ssize_t n = v.len;
    PyBuffer_Release(&v);
    if (n < OOB_MIN)
        Py_RETURN_TRUE;
    if (PyList_Append(list, pb) != 0)
        return NULL;
    Py_RETURN_FALSE;
}

static PyMethodDef keep_def = {"keep", (PyCFunction)keep_buffer, METH_O, NULL};

/* pickle.dumps(obj, 5, buffer_callback=...) -> bytes; the large buffers
 * are appended to bufs (a list). */
static PyObject *dumps5(PyObject *obj, PyObject *bufs)
{
    PyObject *cb = PyCFunction_New(&keep_def, bufs);
    if (!cb)
        return NULL;
    PyObject *five = PyLong_FromLong(5);
    PyObject *args[3] = {obj, five, cb};
    PyObject *r = five ? PyObject_Vectorcall(dumps_fn, args, 2,
                                             kw_buffer_callback)
                       : NULL;
    Py_XDECREF(five);
    Py_DECREF(cb);
    if (r && !PyBytes_Check(r)) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "pickle.dumps returned no bytes");
        return NULL;
    }
    return r;
}

/* The total length of the buffers in bufs, or -1 with an exception. */
static Py_ssize_t bufs_len(PyObject *bufs)
{
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(bufs); i++) {
        Py_buffer v;
        if (PyObject_GetBuffer(PyList_GET_ITEM(bufs, i), &v,
                               PyBUF_ANY_CONTIGUOUS) != 0)
            return -1;
        total += v.len;
        PyBuffer_Release(&v);
    }
    return total;
}

/* Writes the buffers' lengths (u64 each) at p, then, with data, their
 * bytes; returns the end, or NULL with an exception. */
static char *put_bufs(char *p, PyObject *bufs, int data)
{
    Py_ssize_t n = PyList_GET_SIZE(bufs);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer v;
        if (PyObject_GetBuffer(PyList_GET_ITEM(bufs, i), &v,
                               PyBUF_ANY_CONTIGUOUS) != 0)
            return NULL;
        put_u64(p, (uint64_t)v.len);
        p += 8;
        PyBuffer_Release(&v);
    }
    for (Py_ssize_t i = 0; data && i < n; i++) {
        Py_buffer v;
        if (PyObject_GetBuffer(PyList_GET_ITEM(bufs, i), &v,
                               PyBUF_ANY_CONTIGUOUS) != 0)
            return NULL;
        memcpy(p, v.buf, (size_t)v.len);
        p += v.len;
        PyBuffer_Release(&v);
    }
    return p;
}

/* ---- building tasks --------------------------------------------------- */

/* One task's envelope (see fiber._envelope.task): bytes, or with parts
 * and out-of-band buffers a tuple (the bytes up to the buffers, then a
 * memoryview of each buffer). */
static PyObject *build_task(int kind, int flags, const char *func,
                            Py_ssize_t flen, PyObject *obj, int parts)
{
    /* The arguments in codec.c's encoding when they are its values, else
     * pickled. */
    fbp_wbuf w;
    fbp_wbuf_init(&w);
    int simple = fbp_codec_encode(obj, &w);
    if (simple < 0)
        return NULL;
    PyObject *bufs = simple ? NULL : PyList_New(0);
    PyObject *body = bufs ? dumps5(obj, bufs) : NULL;
    PyObject *out = NULL;
    if (!simple && !body)
        goto done;
    const char *bp = simple ? w.p : PyBytes_AS_STRING(body);
    Py_ssize_t blen = simple ? (Py_ssize_t)w.len : PyBytes_GET_SIZE(body);
    Py_ssize_t nb = simple ? 0 : PyList_GET_SIZE(bufs);
    if (flen > UINT32_MAX || blen > UINT32_MAX || nb > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError,
                        "a task's callable or arguments are over 4 GiB");
        goto done;
    }
    Py_ssize_t data = nb && !parts ? bufs_len(bufs) : 0;
    if (data < 0)
        goto done;
    out = PyBytes_FromStringAndSize(NULL, TASK_HEAD + flen + blen + 8 * nb +
                                              data);
    if (!out)
        goto done;
    char *p = PyBytes_AS_STRING(out);
    memcpy(p, "FPY1", 4);
    p[4] = (char)kind;
    p[5] = (char)flags;
    p[6] = p[7] = 0;
    put_u32(p + 8, (uint32_t)flen);
    put_u32(p + 12, (uint32_t)blen);
    put_u32(p + 16, (uint32_t)nb);
    p += TASK_HEAD;
    memcpy(p, func, (size_t)flen);
    p += flen;
    memcpy(p, bp, (size_t)blen);
    p += blen;
    if (nb && !put_bufs(p, bufs, !parts))
        Py_CLEAR(out);
    if (out && nb && parts) {
        PyObject *t = PyTuple_New(1 + nb);
        if (!t) {
            Py_CLEAR(out);
            goto done;
        }
        PyTuple_SET_ITEM(t, 0, out);
        out = t;
        for (Py_ssize_t i = 0; i < nb; i++) {
            PyObject *mv = PyObject_CallMethod(PyList_GET_ITEM(bufs, i),
                                               "raw", NULL);
            if (!mv) {
                Py_CLEAR(out);
                break;
            }
            PyTuple_SET_ITEM(t, 1 + i, mv);
        }
    }
done:
    Py_XDECREF(body);
    Py_XDECREF(bufs);
    fbp_wbuf_free(&w);
    return out;
}

/* task_envelope(kind, func_bytes, obj, flags=0, parts=False) */
static PyObject *py_task_envelope(PyObject *self, PyObject *args)
{
    (void)self;
    int kind, flags = 0, parts = 0;
    const char *func;
    Py_ssize_t flen;
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "iy#O|ip", &kind, &func, &flen, &obj, &flags,
                          &parts))
        return NULL;
    if (setup_pickle() != 0)
        return NULL;
    return build_task(kind, flags, func, flen, obj, parts);
}

/* task_envelopes(kind, func_bytes, iterable, flags=0) -> a list of
 * envelopes in parts form, one per item. */
static PyObject *py_task_envelopes(PyObject *self, PyObject *args)
{
    (void)self;
    int kind, flags = 0;
    const char *func;
    Py_ssize_t flen;
    PyObject *items;
    if (!PyArg_ParseTuple(args, "iy#O|i", &kind, &func, &flen, &items, &flags))
        return NULL;
    if (setup_pickle() != 0)
        return NULL;
    PyObject *it = PyObject_GetIter(items);
    if (!it)
        return NULL;
    PyObject *out = PyList_New(0);
    PyObject *item;
    while (out && (item = PyIter_Next(it)) != NULL) {
        PyObject *env = build_task(kind, flags, func, flen, item, 1);
        Py_DECREF(item);
        if (!env || PyList_Append(out, env) != 0)
            Py_CLEAR(out);
        Py_XDECREF(env);
    }
    Py_DECREF(it);
    if (out && PyErr_Occurred())
        Py_CLEAR(out);
    return out;
}

/* ---- reading answers -------------------------------------------------- */

/* A body with no out-of-band buffer read where it lies: codec.c's
 * encoding (its first byte FBP_CODEC_MAGIC) or a pickle. */
static PyObject *loads_body(const char *p, Py_ssize_t blen)
{
    if (blen > 0 && (unsigned char)p[0] == FBP_CODEC_MAGIC)
        return fbp_codec_decode(p, (size_t)blen);
    PyObject *mv = PyMemoryView_FromMemory((char *)p, blen, PyBUF_READ);
    if (!mv)
        return NULL;
    PyObject *r = PyObject_CallOneArg(loads_fn, mv);
    Py_DECREF(mv);
    return r;
}

/* The list a packed answer holds (blen bytes of form at p). */
static PyObject *unpack_list(const char *p, Py_ssize_t blen, int form)
{
    Py_ssize_t n = blen / 8;
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        uint64_t bits = get_u64(p + 8 * i);
        PyObject *v;
        if (form == FORM_INT64S) {
            v = PyLong_FromLongLong((long long)bits);
        } else {
            double d;
            memcpy(&d, &bits, sizeof d);
            v = PyFloat_FromDouble(d);
        }
        if (!v)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, v);
    }
    return out;
}

/* The value of an answer that holds a value and no out-of-band buffer;
 * NULL without an exception for any other answer (the slow path, which
 * also names a malformed packed answer). */
static PyObject *decode_fast(PyObject *data)
{
    if (!PyBytes_Check(data))
        return NULL;
    const char *p = PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (n < ANSWER_HEAD || memcmp(p, "FPR1", 4) != 0 || p[4] != 0 ||
        get_u32(p + 12) != 0 || (Py_ssize_t)get_u32(p + 8) > n - ANSWER_HEAD)
        return NULL;
    if (p[5] != FORM_PICKLE) {
        Py_ssize_t blen = (Py_ssize_t)get_u32(p + 8);
        if ((p[5] != FORM_INT64S && p[5] != FORM_FLOAT64S) || blen % 8)
            return NULL;
        return unpack_list(p + ANSWER_HEAD, blen, p[5]);
    }
    return loads_body(p + ANSWER_HEAD, (Py_ssize_t)get_u32(p + 8));
}

static PyObject *decode_one(PyObject *data, PyObject *slow)
{
    PyObject *r = decode_fast(data);
    if (r || PyErr_Occurred())
        return r;
    return PyObject_CallOneArg(slow, data);
}

/* decode_answer(data): the value an answer holds; anything but a value
 * without out-of-band buffers goes to the Python decoder (which raises a
 * task's exception). */
static PyObject *py_decode_answer(PyObject *self, PyObject *data)
{
    (void)self;
    if (!decode_slow) {
        PyErr_SetString(PyExc_RuntimeError,
                        "fiber._envelope has not registered its decoder");
        return NULL;
    }
    if (setup_pickle() != 0)
        return NULL;
    return decode_one(data, decode_slow);
}

/* The answers of a map (a list) decoded: each value, or with concat the
 * concatenation of the lists they hold (a map in chunks).  An answer the
 * fast path does not read goes to slow(answer) (a map's failures are
 * tuples, which slow raises). */
static PyObject *decode_list(PyObject *args, int concat)
{
    PyObject *answers, *slow;
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &answers, &slow))
        return NULL;
    if (setup_pickle() != 0)
        return NULL;
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out && i < PyList_GET_SIZE(answers); i++) {
        PyObject *v = decode_one(PyList_GET_ITEM(answers, i), slow);
        int rc = !v ? -1
                 : concat ? PyList_SetSlice(out, PY_SSIZE_T_MAX,
                                            PY_SSIZE_T_MAX, v)
                          : PyList_Append(out, v);
        if (rc != 0)
            Py_CLEAR(out);
        Py_XDECREF(v);
    }
    return out;
}

/* decode_answers(answers, slow) -> [value] */
static PyObject *py_decode_answers(PyObject *self, PyObject *args)
{
    (void)self;
    return decode_list(args, 0);
}

/* decode_chunks(answers, slow) -> the values of the chunks, concatenated */
static PyObject *py_decode_chunks(PyObject *self, PyObject *args)
{
    (void)self;
    return decode_list(args, 1);
}

/* envelope_setup(decode_py): the Python decoder for the slow path. */
static PyObject *py_envelope_setup(PyObject *self, PyObject *fn)
{
    (void)self;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "the decoder must be callable");
        return NULL;
    }
    Py_XSETREF(decode_slow, Py_NewRef(fn));
    Py_RETURN_NONE;
}

/* ---- running a task in a worker -------------------------------------- */

int fbp_envelope_helpers(PyObject *load, PyObject *raised, PyObject *ok)
{
    if (setup_pickle() != 0)
        return -1;
    Py_XSETREF(load_callable, Py_XNewRef(load));
    Py_XSETREF(task_raised, Py_XNewRef(raised));
    Py_XSETREF(answer_ok, Py_XNewRef(ok));
    return 0;
}

/* The last callable loaded, by its pickled bytes: a pool sends the same
 * one again and again. */
static PyObject *last_func_bytes, *last_func;
/* A call with shared= names its callable as "FSH1", the value's 40-byte
 * ref, then the function's own bytes (fiber._envelope.dumps_callable):
 * an ES run's new policy every iteration then costs each worker a C
 * Shared, not an unpickling of the function. */
#define SHARED_HEAD (4 + FIBER_REF_LEN)
static PyObject *last_inner_bytes, *last_inner;

static int same_bytes(PyObject *bytes, const char *p, Py_ssize_t n)
{
    return bytes && PyBytes_GET_SIZE(bytes) == n &&
           memcmp(PyBytes_AS_STRING(bytes), p, (size_t)n) == 0;
}

/* The callable pickled in p[0..n), from the cache (*bytes, *func) when
 * those are its bytes, else loaded by fiber._worker._callable and kept
 * there.  A new reference, or NULL with an exception set. */
static PyObject *load_cached(const char *p, Py_ssize_t n, PyObject **bytes,
                             PyObject **func)
{
    if (same_bytes(*bytes, p, n))
        return Py_NewRef(*func);
    PyObject *b = PyBytes_FromStringAndSize(p, n);
    PyObject *f = b ? PyObject_CallOneArg(load_callable, b) : NULL;
    if (f) {
        Py_XSETREF(*bytes, b);
        Py_XSETREF(*func, Py_NewRef(f));
    } else {
        Py_XDECREF(b);
    }
    return f;
}

static PyObject *callable_of(const char *p, Py_ssize_t n)
{
    if (n < SHARED_HEAD || memcmp(p, "FSH1", 4) != 0)
        return load_cached(p, n, &last_func_bytes, &last_func);
    if (same_bytes(last_func_bytes, p, n))
        return Py_NewRef(last_func);
    PyObject *inner = load_cached(p + SHARED_HEAD, n - SHARED_HEAD,
                                  &last_inner_bytes, &last_inner);
    PyObject *f = inner ? fbp_shared_make(inner, (const unsigned char *)p + 4)
                        : NULL;
    Py_XDECREF(inner);
    PyObject *b = f ? PyBytes_FromStringAndSize(p, n) : NULL;
    if (!b) {
        Py_XDECREF(f);
        return NULL;
    }
    Py_XSETREF(last_func_bytes, b);
    Py_XSETREF(last_func, Py_NewRef(f));
    return f;
}

/* The task's arguments, decoded from its body, or unpickled from it and
 * its buffers (each buffer copied into a bytearray, as the Python version
 * does). */
static PyObject *load_body(const char *p, Py_ssize_t blen, const char *b,
                           uint32_t nbufs, const char *end)
{
    if (nbufs == 0)
        return loads_body(p, blen);
    PyObject *mv = PyMemoryView_FromMemory((char *)p, blen, PyBUF_READ);
    if (!mv)
        return NULL;
    PyObject *list = NULL, *r = NULL;
    if ((size_t)(end - b) / 8 < nbufs) {
        PyErr_SetString(PyExc_ValueError, "a task's buffers are cut short");
        goto done;
    }
    const char *data = b + 8 * (size_t)nbufs;
    list = PyList_New(nbufs);
    for (uint32_t i = 0; list && i < nbufs; i++) {
        uint64_t len = get_u64(b + 8 * (size_t)i);
        if (len > (uint64_t)(end - data)) {
            PyErr_SetString(PyExc_ValueError, "a task's buffers are cut short");
            goto done;
        }
        PyObject *ba = PyByteArray_FromStringAndSize(data, (Py_ssize_t)len);
        if (!ba)
            goto done;
        PyList_SET_ITEM(list, i, ba);
        data += len;
    }
    if (list) {
        PyObject *args[2] = {mv, list};
        r = PyObject_Vectorcall(loads_fn, args, 1, kw_buffers);
    }
done:
    Py_XDECREF(list);
    Py_DECREF(mv);
    return r;
}

/* func(item), or with star func(*item). */
static PyObject *call_item(PyObject *func, PyObject *item, int star)
{
    if (!star)
        return PyObject_CallOneArg(func, item);
    PyObject *t = PySequence_Tuple(item);
    PyObject *v = t ? PyObject_Call(func, t, NULL) : NULL;
    Py_XDECREF(t);
    return v;
}

/* func applied to body as kind says (fiber._worker.run_task's cases). */
static PyObject *apply(int kind, int flags, PyObject *func, PyObject *body)
{
    switch (kind) {
    case K_ONE:
    case K_STAR:
        return call_item(func, body, kind == K_STAR);
    case K_CHUNK: {
        /* A list, or a range (a map's chunk of a range). */
        PyObject *seq = PySequence_Fast(body, "a chunk must be a sequence");
        if (!seq)
            return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        PyObject *out = PyList_New(n);
        for (Py_ssize_t i = 0; out && i < n; i++) {
            PyObject *v = call_item(func, PySequence_Fast_GET_ITEM(seq, i),
                                    flags & F_STAR);
            if (!v)
                Py_CLEAR(out);
            else
                PyList_SET_ITEM(out, i, v);
        }
        Py_DECREF(seq);
        return out;
    }
    case K_CALL:
        if (!PyTuple_Check(body) || PyTuple_GET_SIZE(body) != 2 ||
            !PyTuple_Check(PyTuple_GET_ITEM(body, 0)) ||
            !PyDict_Check(PyTuple_GET_ITEM(body, 1)))
            break;
        return PyObject_Call(func, PyTuple_GET_ITEM(body, 0),
                             PyTuple_GET_ITEM(body, 1));
    }
    PyErr_Format(PyExc_TypeError, "a task of kind %d has arguments of type %s",
                 kind, Py_TYPE(body)->tp_name);
    return NULL;
}

/* Appends an answer (bytes) the Python helper returned to out. */
static int take_bytes(PyObject *ans, fiber_buf *out)
{
    int rc;
    if (!ans)
        return -1;
    if (!PyBytes_Check(ans)) {
        Py_DECREF(ans);
        PyErr_SetString(PyExc_TypeError, "an answer must be bytes");
        return -1;
    }
    rc = fiber_buf_append(out, PyBytes_AS_STRING(ans),
                          (size_t)PyBytes_GET_SIZE(ans));
    Py_DECREF(ans);
    if (rc != 0)
        PyErr_NoMemory();
    return rc ? -1 : 0;
}

/* An answer's head: "FPR1", status OK, form, body_len, nbufs. */
static void put_answer_head(char *p, int form, uint32_t blen, uint32_t nb)
{
    memcpy(p, "FPR1", 4);
    p[4] = 0;
    p[5] = (char)form;
    p[6] = p[7] = 0;
    put_u32(p + 8, blen);
    put_u32(p + 12, nb);
}

/* Writes a chunk's results packed (FORM_INT64S or FORM_FLOAT64S) when
 * every one is an exact int that fits in 64 bits, or every one an exact
 * float.  Returns 1 when written, 0 when they are not (nothing written),
 * -1 out of memory. */
static int answer_packed(PyObject *list, fiber_buf *out)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (n == 0 || (size_t)n > UINT32_MAX / 8)
        return 0;
    PyObject *first = PyList_GET_ITEM(list, 0);
    int form = PyLong_CheckExact(first)    ? FORM_INT64S
               : PyFloat_CheckExact(first) ? FORM_FLOAT64S
                                           : FORM_PICKLE;
    if (form == FORM_PICKLE)
        return 0;
    size_t total = ANSWER_HEAD + 8 * (size_t)n;
    if (fiber_buf_reserve(out, total) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    char *p = (char *)out->data + out->len;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(list, i);
        uint64_t bits;
        if (form == FORM_INT64S) {
            int overflow;
            if (!PyLong_CheckExact(v))
                return 0;
            long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow)
                return 0;
            bits = (uint64_t)x;
        } else {
            if (!PyFloat_CheckExact(v))
                return 0;
            double d = PyFloat_AS_DOUBLE(v);
            memcpy(&bits, &d, sizeof bits);
        }
        put_u64(p + ANSWER_HEAD + 8 * i, bits);
    }
    put_answer_head(p, form, (uint32_t)(8 * n), 0);
    out->len += total;
    return 1;
}

/* Writes the answer of a value of codec.c's into out: 1 written, 0 value
 * is none of its values (nothing written), -1 out of memory. */
static int answer_simple(PyObject *value, fiber_buf *out)
{
    fbp_wbuf w;
    fbp_wbuf_init(&w);
    int rc = fbp_codec_encode(value, &w);
    if (rc == 1 && w.len > UINT32_MAX)
        rc = 0;
    if (rc == 1) {
        if (fiber_buf_reserve(out, ANSWER_HEAD + w.len) != 0) {
            PyErr_NoMemory();
            rc = -1;
        } else {
            char *p = (char *)out->data + out->len;
            put_answer_head(p, FORM_PICKLE, (uint32_t)w.len, 0);
            memcpy(p + ANSWER_HEAD, w.p, w.len);
            out->len += ANSWER_HEAD + w.len;
        }
    }
    fbp_wbuf_free(&w);
    return rc;
}

/* Writes value's answer into out (codec.c's encoding, or a pickle); a
 * value that does not pickle is answered by the Python helper (which
 * says so in a PicklingError). */
static int answer_value(PyObject *value, PyObject *func, fiber_buf *out)
{
    int simple = answer_simple(value, out);
    if (simple != 0)
        return simple < 0 ? -1 : 0;
    PyObject *bufs = PyList_New(0);
    PyObject *body = bufs ? dumps5(value, bufs) : NULL;
    int rc = -1;
    if (!body) {
        Py_XDECREF(bufs);
        PyErr_Clear();
        PyObject *name = PyObject_GetAttrString(func, "__qualname__");
        if (!name) {
            PyErr_Clear();
            name = PyUnicode_FromString("?");
        }
        PyObject *ans = name ? PyObject_CallFunctionObjArgs(answer_ok, value,
                                                            name, NULL)
                             : NULL;
        Py_XDECREF(name);
        return take_bytes(ans, out);
    }
    Py_ssize_t blen = PyBytes_GET_SIZE(body), nb = PyList_GET_SIZE(bufs);
    Py_ssize_t data = nb ? bufs_len(bufs) : 0;
    if (data < 0 || blen > UINT32_MAX || nb > UINT32_MAX)
        goto done;
    size_t total = ANSWER_HEAD + (size_t)blen + 8 * (size_t)nb + (size_t)data;
    if (fiber_buf_reserve(out, total) != 0) {
        PyErr_NoMemory();
        goto done;
    }
    char *p = (char *)out->data + out->len;
    put_answer_head(p, FORM_PICKLE, (uint32_t)blen, (uint32_t)nb);
    memcpy(p + ANSWER_HEAD, PyBytes_AS_STRING(body), (size_t)blen);
    p += ANSWER_HEAD + blen;
    if (nb && !put_bufs(p, bufs, 1))
        goto done;
    out->len += total;
    rc = 0;
done:
    Py_DECREF(body);
    Py_DECREF(bufs);
    return rc;
}

int fbp_envelope_run(const void *arg, size_t len, fiber_buf *out)
{
    const char *p = arg, *end = p + len;
    if (!load_callable || !task_raised || !answer_ok || len < TASK_HEAD ||
        memcmp(p, "FPY1", 4) != 0)
        return 1;
    int kind = (unsigned char)p[4], flags = (unsigned char)p[5];
    size_t flen = get_u32(p + 8), blen = get_u32(p + 12);
    uint32_t nbufs = get_u32(p + 16);
    if ((kind != K_ONE && kind != K_STAR && kind != K_CHUNK &&
         kind != K_CALL) ||
        flen > len - TASK_HEAD || blen > len - TASK_HEAD - flen)
        return 1;
    const char *fp = p + TASK_HEAD, *bp = fp + flen;
    PyObject *func = callable_of(fp, (Py_ssize_t)flen);
    PyObject *body = func ? load_body(bp, (Py_ssize_t)blen, bp + blen, nbufs,
                                      end)
                          : NULL;
    if (!body) {
        /* The Python handler reads the task again and answers with the
         * error it meets (nothing of the task has run). */
        PyErr_Clear();
        Py_XDECREF(func);
        return 1;
    }
    PyObject *value = apply(kind, flags, func, body);
    Py_DECREF(body);
    int rc;
    if (value) {
        rc = kind == K_CHUNK ? answer_packed(value, out) : 0;
        if (rc == 0)
            rc = answer_value(value, func, out);
        else if (rc == 1)
            rc = 0;
        Py_DECREF(value);
    } else {
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        if (exc && tb)
            PyException_SetTraceback(exc, tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
        if (!exc)
            exc = Py_NewRef(Py_None);
        PyObject *k = PyLong_FromLong(kind), *f = PyLong_FromLong(flags);
        PyObject *ans = k && f ? PyObject_CallFunctionObjArgs(
                                     task_raised, k, f, func, exc, NULL)
                               : NULL;
        Py_XDECREF(k);
        Py_XDECREF(f);
        Py_XDECREF(exc);
        rc = take_bytes(ans, out);
    }
    Py_DECREF(func);
    return rc < 0 ? -1 : 0;
}

PyMethodDef fbp_envelope_methods[] = {
    {"task_envelope", py_task_envelope, METH_VARARGS,
     "task_envelope(kind, func_bytes, obj, flags=0, parts=False): a task's "
     "envelope (fiber._envelope.task without its error wrapping)."},
    {"task_envelopes", py_task_envelopes, METH_VARARGS,
     "task_envelopes(kind, func_bytes, iterable, flags=0) -> [envelope in "
     "parts form] one per item."},
    {"decode_answer", py_decode_answer, METH_O,
     "decode_answer(data): the value an answer holds (fiber._envelope.decode)."},
    {"decode_answers", py_decode_answers, METH_VARARGS,
     "decode_answers(answers, slow) -> [value]; slow(answer) reads the rest."},
    {"decode_chunks", py_decode_chunks, METH_VARARGS,
     "decode_chunks(answers, slow) -> the concatenation of the lists the "
     "answers hold."},
    {"envelope_setup", py_envelope_setup, METH_O,
     "envelope_setup(decode_py): the Python decoder for the slow path."},
    {NULL, NULL, 0, NULL},
};
