/*
 * codec.c -- fiber's compact encoding of the small values queues and
 * tasks move most: None, bool, int (64-bit), float, str, bytes, and
 * tuples, lists and dicts of these.
 *
 * pickle.dumps costs about 0.3 us a call on the machines fiber is
 * measured on even for a lone int, most of it in making and freeing a
 * Pickler (a 4 KiB output buffer, a memo table), and pickle.loads about
 * 0.15 us: at a million queue messages a second that is half of a
 * producer's time.  A value of the kinds above is written here in a few
 * tens of nanoseconds instead; anything else (a subclass of any of them,
 * an int beyond 64 bits, a str with lone surrogates, a numpy array, any
 * other object) is pickled as before, so what a reader gets is what
 * pickle would have given it, but for the identity of equal immutable
 * values (pickle's memo makes `(s, s)` share one str; here the two are
 * equal copies).  A value in which one list or dict appears twice, or
 * inside itself, is pickle's, whose memo keeps the sharing; so is one
 * with more than SEEN_MAX lists and dicts, which that check would make
 * slow.
 *
 * The format: one byte FBP_CODEC_MAGIC (a pickle of protocol 2 or more
 * starts with 0x80, PROTO, so a reader tells the two apart by the first
 * byte), then the value:
 *
 *   'N' None   'T' True   'F' False
 *   'c', 'h', 'i' int in 1, 4 or 8 bytes, little-endian two's
 *              complement (the fewest that hold it)
 *   'd' float  8 bytes, IEEE 754 binary64, little-endian
 *   'b' bytes, 's' str (UTF-8): u32 length, then the bytes; 'B' and 'S'
 *              the same with a u8 length, for 255 bytes or fewer
 *   't' tuple, 'l' list: u32 count, then the items
 *   'D' dict: u32 count, then key, value, key, value ...
 *
 * Containers nest up to FBP_CODEC_DEPTH.  The decoder checks every
 * length against what is left of the message and names what is
 * malformed (ValueError); it never trusts a count to size an allocation
 * beyond the message's own bytes.
 */
#include <stdint.h>
#include <string.h>

#include "binding.h"

#define FBP_CODEC_DEPTH 32

/* The writer: an inline buffer that spills to the heap. */
static int w_grow(fbp_wbuf *w, size_t n)
{
    if (w->len + n <= w->cap)
        return 0;
    size_t cap = w->cap * 2;
    while (cap < w->len + n)
        cap *= 2;
    char *p = w->heap ? realloc(w->p, cap) : malloc(cap);
    if (!p)
        return -1;
    if (!w->heap)
        memcpy(p, w->p, w->len);
    w->p = p;
    w->cap = cap;
    w->heap = 1;
    return 0;
}

static int w_put(fbp_wbuf *w, const void *p, size_t n)
{
    if (w_grow(w, n))
        return -1;
    memcpy(w->p + w->len, p, n);
    w->len += n;
    return 0;
}

/* tag, then the low nbytes bytes of v, little-endian. */
static int w_tag_le(fbp_wbuf *w, char tag, uint64_t v, int nbytes)
{
    char b[9];
    b[0] = tag;
    for (int i = 0; i < nbytes; i++)
        b[1 + i] = (char)(v >> (8 * i));
    return w_put(w, b, (size_t)nbytes + 1);
}

/* An int in the fewest of 1, 4 or 8 bytes ('c', 'h', 'i'). */
static int w_int(fbp_wbuf *w, long long v)
{
    if (v >= INT8_MIN && v <= INT8_MAX)
        return w_tag_le(w, 'c', (uint64_t)v, 1);
    if (v >= INT32_MIN && v <= INT32_MAX)
        return w_tag_le(w, 'h', (uint64_t)v, 4);
    return w_tag_le(w, 'i', (uint64_t)v, 8);
}

/* A str's or bytes' length and bytes: tag with a u8 length up to 255
 * ('S', 'B'), else the long tag with a u32 ('s', 'b'). */
static int w_text(fbp_wbuf *w, char tag, const void *p, size_t n)
{
    int rc = n <= UINT8_MAX ? w_tag_le(w, tag == 's' ? 'S' : 'B', n, 1)
                            : w_tag_le(w, tag, n, 4);
    return rc ? -1 : w_put(w, p, n);
}

void fbp_wbuf_init(fbp_wbuf *w)
{
    w->p = w->inline_data;
    w->len = 0;
    w->cap = sizeof w->inline_data;
    w->heap = 0;
}

void fbp_wbuf_free(fbp_wbuf *w)
{
    if (w->heap)
        free(w->p);
    fbp_wbuf_init(w);
}

/* Encoding: 1 written, 0 not a value of this codec (the caller rewinds),
 * -1 out of memory (MemoryError set). */
enum { ENC_NO = 0, ENC_YES = 1, ENC_NOMEM = -1 };

/* The lists and dicts met so far in one value: one met twice (shared, or
 * containing itself) makes the value pickle's, whose memo keeps it. */
#define SEEN_MAX 64
struct enc {
    fbp_wbuf *w;
    int nseen;
    PyObject *seen[SEEN_MAX];
};

static int enc_value(struct enc *e, PyObject *o, int depth);

static int first_sight(struct enc *e, PyObject *o)
{
    if (e->nseen == SEEN_MAX)
        return 0;
    for (int i = 0; i < e->nseen; i++)
        if (e->seen[i] == o)
            return 0;
    e->seen[e->nseen++] = o;
    return 1;
}

static int enc_items(struct enc *e, char tag, PyObject *const *items,
                     Py_ssize_t n, int depth)
{
    if ((size_t)n > UINT32_MAX)
        return ENC_NO;
    if (w_tag_le(e->w, tag, (uint64_t)n, 4))
        return ENC_NOMEM;
    for (Py_ssize_t i = 0; i < n; i++) {
        int rc = enc_value(e, items[i], depth + 1);
        if (rc != ENC_YES)
            return rc;
    }
    return ENC_YES;
}

static int enc_str(fbp_wbuf *w, PyObject *o)
{
    if (PyUnicode_IS_ASCII(o)) {
        Py_ssize_t n = PyUnicode_GET_LENGTH(o);
        if ((size_t)n > UINT32_MAX)
            return ENC_NO;
        return w_text(w, 's', PyUnicode_DATA(o), (size_t)n) ? ENC_NOMEM
                                                             : ENC_YES;
    }
    /* Not cached on the str (PyUnicode_AsUTF8 would keep a copy there);
     * a str that is no valid UTF-8 (lone surrogates) is pickle's. */
    PyObject *b = PyUnicode_AsUTF8String(o);
    if (!b) {
        if (PyErr_ExceptionMatches(PyExc_MemoryError))
            return ENC_NOMEM;
        PyErr_Clear();
        return ENC_NO;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(b);
    int rc = (size_t)n > UINT32_MAX ? ENC_NO
             : w_text(w, 's', PyBytes_AS_STRING(b), (size_t)n) ? ENC_NOMEM
                                                              : ENC_YES;
    Py_DECREF(b);
    return rc;
}

/* No Python code runs while a value is encoded (exact types only, and
 * nothing here calls into one), so no list or dict can change under the
 * loops that read them. */
static int enc_value(struct enc *e, PyObject *o, int depth)
{
    fbp_wbuf *w = e->w;
    PyTypeObject *t = Py_TYPE(o);
    int rc;
    if (o == Py_None)
        rc = w_put(w, "N", 1);
    else if (o == Py_True)
        rc = w_put(w, "T", 1);
    else if (o == Py_False)
        rc = w_put(w, "F", 1);
    else if (t == &PyLong_Type) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow)
            return ENC_NO;
        rc = w_int(w, v);
    } else if (t == &PyFloat_Type) {
        double d = PyFloat_AS_DOUBLE(o);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        rc = w_tag_le(w, 'd', bits, 8);
    } else if (t == &PyBytes_Type) {
        Py_ssize_t n = PyBytes_GET_SIZE(o);
        if ((size_t)n > UINT32_MAX)
            return ENC_NO;
        rc = w_text(w, 'b', PyBytes_AS_STRING(o), (size_t)n);
    } else if (t == &PyUnicode_Type) {
        return enc_str(w, o);
    } else if (depth >= FBP_CODEC_DEPTH) {
        return ENC_NO;
    } else if (t == &PyTuple_Type) {
        return enc_items(e, 't', &PyTuple_GET_ITEM(o, 0), PyTuple_GET_SIZE(o),
                         depth);
    } else if (t == &PyList_Type) {
        if (!first_sight(e, o))
            return ENC_NO;
        return enc_items(e, 'l', &PyList_GET_ITEM(o, 0), PyList_GET_SIZE(o),
                         depth);
    } else if (t == &PyDict_Type) {
        Py_ssize_t n = PyDict_GET_SIZE(o), pos = 0;
        PyObject *k, *v;
        if ((size_t)n > UINT32_MAX || !first_sight(e, o))
            return ENC_NO;
        if (w_tag_le(w, 'D', (uint64_t)n, 4))
            return ENC_NOMEM;
        while (PyDict_Next(o, &pos, &k, &v)) {
            if ((rc = enc_value(e, k, depth + 1)) != ENC_YES ||
                (rc = enc_value(e, v, depth + 1)) != ENC_YES)
                return rc;
        }
        return ENC_YES;
    } else {
        return ENC_NO;
    }
    return rc ? ENC_NOMEM : ENC_YES;
}

int fbp_codec_encode(PyObject *obj, fbp_wbuf *w)
{
    size_t start = w->len;
    unsigned char magic = FBP_CODEC_MAGIC;
    struct enc e;
    e.w = w;
    e.nseen = 0;
    int rc = w_put(w, &magic, 1) ? ENC_NOMEM : enc_value(&e, obj, 0);
    if (rc != ENC_YES)
        w->len = start;
    if (rc == ENC_NOMEM) {
        PyErr_NoMemory();
        return -1;
    }
    return rc;
}

/* ---- decoding ---------------------------------------------------------- */

struct reader {
    const unsigned char *p, *end;
};

static PyObject *malformed(const char *what)
{
    PyErr_Format(PyExc_ValueError, "fiber: a malformed message (%s)",
                 what);
    return NULL;
}

static int r_u32(struct reader *r, uint32_t *v)
{
    if (r->end - r->p < 4)
        return -1;
    *v = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 |
         (uint32_t)r->p[2] << 16 | (uint32_t)r->p[3] << 24;
    r->p += 4;
    return 0;
}

static int r_u64(struct reader *r, uint64_t *v)
{
    if (r->end - r->p < 8)
        return -1;
    uint64_t x = 0;
    for (int i = 0; i < 8; i++)
        x |= (uint64_t)r->p[i] << (8 * i);
    *v = x;
    r->p += 8;
    return 0;
}

static PyObject *dec_value(struct reader *r, int depth);

/* A count of items, each at least one byte: no more than what is left. */
static int r_count(struct reader *r, uint32_t *n, size_t per_item)
{
    return r_u32(r, n) || (size_t)(r->end - r->p) / per_item < *n ? -1 : 0;
}

static PyObject *dec_value(struct reader *r, int depth)
{
    if (r->p >= r->end)
        return malformed("it ends inside a value");
    unsigned char tag = *r->p++;
    uint64_t u;
    uint32_t n;
    switch (tag) {
    case 'N':
        Py_RETURN_NONE;
    case 'T':
        Py_RETURN_TRUE;
    case 'F':
        Py_RETURN_FALSE;
    case 'c':
        if (r->p >= r->end)
            return malformed("a truncated int");
        return PyLong_FromLong((int8_t)*r->p++);
    case 'h':
        if (r_u32(r, &n))
            return malformed("a truncated int");
        return PyLong_FromLong((int32_t)n);
    case 'i':
        if (r_u64(r, &u))
            return malformed("a truncated int");
        return PyLong_FromLongLong((long long)u);
    case 'd': {
        if (r_u64(r, &u))
            return malformed("a truncated float");
        double d;
        memcpy(&d, &u, 8);
        return PyFloat_FromDouble(d);
    }
    case 'b':
    case 's':
    case 'B':
    case 'S': {
        int is_bytes = tag == 'b' || tag == 'B';
        if (tag == 'B' || tag == 'S') {
            if (r->p >= r->end)
                return malformed("a truncated length");
            n = *r->p++;
        } else if (r_u32(r, &n)) {
            return malformed("a truncated length");
        }
        if ((size_t)(r->end - r->p) < n)
            return malformed(is_bytes ? "a truncated bytes"
                                      : "a truncated str");
        const char *s = (const char *)r->p;
        r->p += n;
        if (is_bytes)
            return PyBytes_FromStringAndSize(s, n);
        return PyUnicode_DecodeUTF8(s, n, "strict");
    }
    case 't':
    case 'l': {
        if (depth >= FBP_CODEC_DEPTH)
            return malformed("containers nested too deep");
        if (r_count(r, &n, 1))
            return malformed("a count beyond the message");
        PyObject *o = tag == 't' ? PyTuple_New(n) : PyList_New(n);
        for (uint32_t i = 0; o && i < n; i++) {
            PyObject *v = dec_value(r, depth + 1);
            if (!v)
                Py_CLEAR(o);
            else if (tag == 't')
                PyTuple_SET_ITEM(o, i, v);
            else
                PyList_SET_ITEM(o, i, v);
        }
        return o;
    }
    case 'D': {
        if (depth >= FBP_CODEC_DEPTH)
            return malformed("containers nested too deep");
        if (r_count(r, &n, 2))
            return malformed("a count beyond the message");
        PyObject *o = PyDict_New();
        for (uint32_t i = 0; o && i < n; i++) {
            PyObject *k = dec_value(r, depth + 1);
            PyObject *v = k ? dec_value(r, depth + 1) : NULL;
            if (v && PyDict_SetItem(o, k, v) != 0) {
                /* Only a hostile message has a key that does not hash
                 * (a list, or a tuple holding one). */
                if (PyErr_ExceptionMatches(PyExc_TypeError)) {
                    PyErr_Clear();
                    malformed("a dict key that cannot be hashed");
                }
                Py_CLEAR(v);
            }
            if (!v)
                Py_CLEAR(o);
            Py_XDECREF(k);
            Py_XDECREF(v);
        }
        return o;
    }
    default:
        PyErr_Format(PyExc_ValueError,
                     "fiber: a malformed message (unknown tag 0x%02x)",
                     tag);
        return NULL;
    }
}

PyObject *fbp_codec_decode(const void *data, size_t len)
{
    struct reader r = {data, (const unsigned char *)data + len};
    if (len < 1 || *r.p != FBP_CODEC_MAGIC)
        return malformed("no codec header");
    r.p++;
    PyObject *o = dec_value(&r, 0);
    if (o && r.p != r.end) {
        Py_DECREF(o);
        return malformed("bytes after the value");
    }
    return o;
}

/* codec_dumps(obj) -> bytes in this encoding, or None when obj is not a
 * value of it; codec_loads(data) -> the value.  For tests and for the
 * Python side's readers of queue messages. */
static PyObject *py_codec_dumps(PyObject *self, PyObject *obj)
{
    (void)self;
    fbp_wbuf w;
    fbp_wbuf_init(&w);
    int rc = fbp_codec_encode(obj, &w);
    PyObject *out = rc < 0   ? NULL
                    : rc > 0 ? PyBytes_FromStringAndSize(w.p, (Py_ssize_t)w.len)
                             : Py_NewRef(Py_None);
    fbp_wbuf_free(&w);
    return out;
}

static PyObject *py_codec_loads(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) != 0)
        return NULL;
    PyObject *o = fbp_codec_decode(v.buf, (size_t)v.len);
    PyBuffer_Release(&v);
    return o;
}

PyMethodDef fbp_codec_methods[] = {
    {"codec_dumps", py_codec_dumps, METH_O,
     "codec_dumps(obj) -> bytes of fiber's compact encoding, or None when "
     "obj is not one of its values (python/src/codec.c)"},
    {"codec_loads", py_codec_loads, METH_O,
     "codec_loads(data) -> the value data encodes (ValueError when "
     "malformed)"},
    {NULL, NULL, 0, NULL},
};
