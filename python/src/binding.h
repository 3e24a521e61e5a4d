/*
 * binding.h -- what the parts of the Python extension fiber._fiber share.
 *
 * The extension is a thin layer over libfiber's public API (fiber.h),
 * which is linked in statically.  It moves bytes: pickling, the envelope
 * of a task and everything else that is simpler in Python lives in the
 * package's Python modules, except a queue's pickling, which queue.c does
 * (one call into C a message; its puts are batched there).  Rules every
 * part keeps:
 *
 *   - The GIL is released around every libfiber call that may wait or move
 *     bytes (FB_NOGIL), and never held while libfiber holds one of its own
 *     locks: libfiber calls back into the extension (tasks, completion
 *     callbacks) from its threads, and those take the GIL themselves.
 *   - A libfiber failure becomes fiber.FiberError (or a subclass chosen by
 *     its code) carrying .code, .errname and fiber_last_error()'s text,
 *     read on the thread that failed, before the GIL is taken back by
 *     anything else.
 *   - Long waits are cut into slices of FB_SLICE_MS so that Ctrl-C
 *     (a pending KeyboardInterrupt) is seen within a slice.
 */
#ifndef FIBER_PY_BINDING_H
#define FIBER_PY_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <fiber/fiber.h>

#define FB_SLICE_MS 100

/* Runs stmt with the GIL released. */
#define FB_NOGIL(stmt)                                                         \
    do {                                                                       \
        Py_BEGIN_ALLOW_THREADS stmt;                                           \
        Py_END_ALLOW_THREADS                                                   \
    } while (0)

/* Runs the libfiber call expr with the GIL released, storing its code in
 * rc and, when it failed, the calling thread's fiber_last_error() in the
 * char array msg (read before the GIL is taken back). */
#define FBP_CALL(rc, msg, expr)                                                \
    do {                                                                       \
        Py_BEGIN_ALLOW_THREADS(rc) = (expr);                                   \
        if (rc)                                                                \
            snprintf(msg, sizeof msg, "%s", fiber_last_error());               \
        Py_END_ALLOW_THREADS                                                   \
    } while (0)

/* Sets the Python exception for libfiber code rc (with msg, the failing
 * thread's fiber_last_error() copied before the GIL was retaken) and
 * returns NULL. */
PyObject *fbp_raise(int rc, const char *msg);

/* fbp_raise with fiber_last_error() of the calling thread. */
PyObject *fbp_raise_last(int rc);

/* Converts a Python timeout in seconds (None = forever) to milliseconds
 * (-1 = forever).  Returns 0, or -1 with an exception set. */
int fbp_timeout_ms(PyObject *timeout, int *ms);

/* Waits in slices: calls step(ctx, slice_ms) with the GIL released until
 * it returns something other than FIBER_ETIMEDOUT or the total timeout
 * (ms, -1 = forever) passes, checking for signals between slices.  Returns
 * step's last code, or -2 (with the signal's exception set) when a signal
 * handler raised.  *msg receives fiber_last_error() of the last step. */
typedef int (*fbp_step_fn)(void *ctx, int slice_ms);
int fbp_wait_sliced(fbp_step_fn step, void *ctx, int timeout_ms, char *msg,
                    size_t msg_size);

/* A bytes object holding a copy of b's content. */
PyObject *fbp_bytes_of(const fiber_buf *b);

/* Reads fiber_job_opts fields from keyword values: name (str|None), cpu,
 * memory (MiB), gpu (ints, 0 = unset).  The struct points into the
 * Python objects, which must outlive its use. */
int fbp_job_opts(fiber_job_opts *o, PyObject *name, int cpu, int memory,
                 int gpu);

/* The Python function the worker side runs for each task (set by
 * fiber._worker through _fiber.set_handlers), and for each method call on
 * a custom manager object; borrowed, may be NULL before set. */
extern PyObject *fbp_task_handler;
extern PyObject *fbp_method_handler;

/* Types and their module-level registration (each part's init adds its
 * types to the module). */
extern PyTypeObject FbpProcessType, FbpPoolType, FbpFutureType,
    FbpQueueType, FbpPipeType, FbpManagerType, FbpMobjType, FbpRingType;

int fbp_process_init(PyObject *m);
int fbp_pool_init(PyObject *m);
int fbp_queue_init(PyObject *m);
/* Hands every queue handle's gathered puts to the C queue (queue.c);
 * GIL held.  task.c calls it when a task returns. */
void fbp_queue_flush_all(void);
int fbp_manager_init(PyObject *m);
int fbp_ring_init(PyObject *m);
int fbp_object_init(PyObject *m);
/* Keeps a few freed pymalloc arenas for reuse (arena.c). */
void fbp_arena_init(void);
void fbp_arena_config_changed(const char *key); /* after config_set */
PyObject *fbp_arenas_kept(PyObject *self, PyObject *noargs);
void fbp_object_config_changed(const char *key); /* after config_set */
/* An integer configuration key's value, or dflt when it cannot be read. */
long long fbp_config_int(const char *key, long long dflt);
/* A fiber._fiber.Shared calling func with the value of ref key first. */
PyObject *fbp_shared_make(PyObject *func, const unsigned char *key);

/* A future over a fiber_future: the result of Pool.apply_async, and of
 * every asynchronous manager call.  kind says how its bytes read: 0 raw
 * bytes, 1 an int64 (8 bytes in host order). */
PyObject *fbp_future_new(fiber_future *f, PyObject *owner, int kind);

/* The per-task paths of the Python envelope in C (envelope.c): its
 * module functions (task_envelope, decode_answer, ...), the worker-side
 * helpers of the rare paths (fiber._worker's load_callable, task_raised,
 * answer_ok; set through set_handlers), and the run of one task: 0 with
 * the answer appended to out, 1 when the task is not one the fast path
 * runs (the Python handler runs it; nothing of it has run), -1 with a
 * Python exception set.  GIL held. */
extern PyMethodDef fbp_envelope_methods[];
int fbp_envelope_helpers(PyObject *load, PyObject *raised, PyObject *ok);
int fbp_envelope_run(const void *arg, size_t len, fiber_buf *out);

/* fiber's compact encoding of small values (codec.c): a value of its
 * kinds written in a few tens of nanoseconds where pickle.dumps costs
 * about 0.3 us; every other value is pickled.  An encoded message starts
 * with FBP_CODEC_MAGIC, a pickle of protocol 2+ with 0x80. */
#define FBP_CODEC_MAGIC 0xFB

/* A growable write buffer with inline room for a small message, so that
 * encoding one mallocs nothing. */
typedef struct fbp_wbuf {
    char *p;
    size_t len, cap;
    int heap;
    char inline_data[256];
} fbp_wbuf;
void fbp_wbuf_init(fbp_wbuf *w);
void fbp_wbuf_free(fbp_wbuf *w);

/* Appends obj's encoding to w: 1 done, 0 obj is no value of the codec
 * (w unchanged: pickle it), -1 out of memory (exception set). */
int fbp_codec_encode(PyObject *obj, fbp_wbuf *w);
/* The value encoded in data[0..len), or NULL with ValueError naming what
 * is malformed. */
PyObject *fbp_codec_decode(const void *data, size_t len);
extern PyMethodDef fbp_codec_methods[];

/* The names of the C tasks the package registers (task.c). */
#define FBP_TASK "fiber_py_task"
#define FBP_METHOD "fiber_py_method"

#endif /* FIBER_PY_BINDING_H */
