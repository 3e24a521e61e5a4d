/*
 * module.c -- the module fiber._fiber: errors (the one mapping of fiber's
 * codes to exceptions), the runtime (init, config, the job command) and
 * the helpers the other parts share.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binding.h"

static PyObject *fiber_error;         /* FiberError */
static PyObject *config_error;        /* ConfigError(FiberError, ValueError) */
static PyObject *timeout_error;       /* FiberTimeoutError(.., TimeoutError) */
static PyObject *crashed_error;       /* TaskCrashedError */
static PyObject *closed_error;        /* ClosedError */
static PyObject *notask_error;        /* NoTaskError */
static PyObject *spawn_error; /* SpawnError(FiberError, mp.ProcessError) */

PyObject *fbp_task_handler;
PyObject *fbp_method_handler;

/* ---- the one mapping of fiber's error codes to Python exceptions -------- *
 * Every code of FIBER_ERRNO_MAP (fiber.h) has a row, generated from the
 * map itself, so a code added there is mapped here without an edit: to
 * FiberError, unless the row's class is one of its subclasses below (or
 * MemoryError).  The C calls raise through it (fbp_raise) and Python
 * reads it as _fiber.ERRORS and _fiber.error(code, text) (fiber.pool
 * turns a failed task's code into its exception with it). */

static PyObject *memory_error; /* PyExc_MemoryError, set at import */

struct error_row {
    int code;
    const char *name;  /* "ETIMEDOUT": the constant _fiber.ETIMEDOUT */
    PyObject **cls;    /* the class it raises */
};

static struct error_row error_rows[] = {
#define ERROR_ROW(NAME, value, text) {FIBER_##NAME, #NAME, NULL},
    FIBER_ERRNO_MAP(ERROR_ROW)
#undef ERROR_ROW
};
#define N_ERROR_ROWS (sizeof error_rows / sizeof error_rows[0])

/* Fills in each row's class (at import, once the classes exist): the
 * codes whose exception is not plain FiberError, then FiberError. */
static void error_rows_link(void)
{
    static const struct {
        int code;
        PyObject **cls;
    } own[] = {
        {FIBER_ECONFIG, &config_error},   /* also a ValueError */
        {FIBER_ETIMEDOUT, &timeout_error}, /* also a TimeoutError */
        {FIBER_ECRASHED, &crashed_error},
        {FIBER_ECLOSED, &closed_error},
        {FIBER_ENOTASK, &notask_error},
        {FIBER_ESPAWN, &spawn_error}, /* also multiprocessing's */
        {FIBER_ENOMEM, &memory_error},
    };
    memory_error = PyExc_MemoryError;
    for (size_t i = 0; i < N_ERROR_ROWS; i++) {
        error_rows[i].cls = &fiber_error;
        for (size_t k = 0; k < sizeof own / sizeof own[0]; k++)
            if (own[k].code == error_rows[i].code)
                error_rows[i].cls = own[k].cls;
    }
}

/* The class code raises: its row's, FiberError for a code not in fiber.h. */
static PyObject *error_class(int code)
{
    for (size_t i = 0; i < N_ERROR_ROWS; i++)
        if (error_rows[i].code == code)
            return *error_rows[i].cls;
    return fiber_error;
}

/* The exception code raises with text (fiber_strerror's when empty): a
 * FiberError (or subclass) carries .code and .errname; MemoryError is
 * Python's own.  A new reference, or NULL with an exception set. */
static PyObject *error_new(int rc, const char *msg)
{
    PyObject *cls = error_class(rc);
    const char *text = msg && *msg ? msg : fiber_strerror(rc);
    PyObject *exc = PyObject_CallFunction(cls, "s", text);
    if (!exc || cls == memory_error)
        return exc;
    PyObject *code = PyLong_FromLong(rc);
    PyObject *name = PyUnicode_FromString(fiber_errname(rc));
    if (code && name) {
        PyObject_SetAttrString(exc, "code", code);
        PyObject_SetAttrString(exc, "errname", name);
    }
    Py_XDECREF(code);
    Py_XDECREF(name);
    return exc;
}

PyObject *fbp_raise(int rc, const char *msg)
{
    PyObject *exc = error_new(rc, msg);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* error(code, text) -> the exception fiber raises for code. */
static PyObject *py_error(PyObject *self, PyObject *args)
{
    (void)self;
    int code;
    const char *text = NULL;
    if (!PyArg_ParseTuple(args, "i|z", &code, &text))
        return NULL;
    return error_new(code, text);
}

/* _fiber.ERRORS = {code: (name, class)} and _fiber.E<NAME> = code, for
 * every code of fiber.h.  0 or -1 with an exception set. */
static int error_table_add(PyObject *m)
{
    error_rows_link();
    PyObject *table = PyDict_New();
    if (!table)
        return -1;
    for (size_t i = 0; i < N_ERROR_ROWS; i++) {
        const struct error_row *r = &error_rows[i];
        PyObject *key = PyLong_FromLong(r->code);
        PyObject *val = Py_BuildValue("(sO)", fiber_errname(r->code), *r->cls);
        int rc = key && val ? PyDict_SetItem(table, key, val) : -1;
        Py_XDECREF(key);
        Py_XDECREF(val);
        if (rc != 0 || PyModule_AddIntConstant(m, r->name, r->code) != 0) {
            Py_DECREF(table);
            return -1;
        }
    }
    int rc = PyModule_AddObjectRef(m, "ERRORS", table);
    Py_DECREF(table);
    return rc;
}

PyObject *fbp_raise_last(int rc) { return fbp_raise(rc, fiber_last_error()); }

int fbp_timeout_ms(PyObject *timeout, int *ms)
{
    if (!timeout || timeout == Py_None) {
        *ms = -1;
        return 0;
    }
    double s = PyFloat_AsDouble(timeout);
    if (s == -1.0 && PyErr_Occurred())
        return -1;
    if (s < 0)
        s = 0; /* as threading and multiprocessing do: a poll */
    *ms = s * 1000.0 > 2147483000.0 ? 2147483000 : (int)(s * 1000.0 + 0.5);
    if (*ms == 0 && s > 0)
        *ms = 1;
    return 0;
}

int fbp_wait_sliced(fbp_step_fn step, void *ctx, int timeout_ms, char *msg,
                    size_t msg_size)
{
    /* The first slice is the whole wait when it is short, so a fast
     * answer costs one call; a timeout of 0 is one call with 0, whose
     * FIBER_EAGAIN ends the loop. */
    int left = timeout_ms;
    for (;;) {
        int slice = left < 0 || left > FB_SLICE_MS ? FB_SLICE_MS : left;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = step(ctx, slice);
        if (rc != 0 && msg)
            snprintf(msg, msg_size, "%s", fiber_last_error());
        Py_END_ALLOW_THREADS
        if (rc != FIBER_ETIMEDOUT)
            return rc;
        if (left >= 0) {
            left -= slice;
            if (left <= 0)
                return FIBER_ETIMEDOUT;
        }
        if (PyErr_CheckSignals() != 0)
            return -2;
    }
}

PyObject *fbp_bytes_of(const fiber_buf *b)
{
    return PyBytes_FromStringAndSize(b->data ? (const char *)b->data : "",
                                     (Py_ssize_t)b->len);
}

int fbp_job_opts(fiber_job_opts *o, PyObject *name, int cpu, int memory,
                 int gpu)
{
    memset(o, 0, sizeof *o);
    if (name && name != Py_None) {
        o->name = PyUnicode_AsUTF8(name);
        if (!o->name)
            return -1;
    }
    if (cpu < 0 || memory < 0 || gpu < 0) {
        PyErr_SetString(PyExc_ValueError, "cpu, memory and gpu must be >= 0");
        return -1;
    }
    o->cpu = cpu;
    o->memory_mb = memory;
    o->gpu = gpu;
    return 0;
}

/* ---- module functions ------------------------------------------------- */

long long fbp_config_int(const char *key, long long dflt)
{
    char buf[64], *end;
    if (fiber_config_get(key, buf, sizeof buf) != 0)
        return dflt;
    long long v = strtoll(buf, &end, 10);
    return end != buf && *end == '\0' ? v : dflt;
}

/* The extension's readers of configuration keys, told that key changed. */
static void config_changed(const char *key)
{
    fbp_object_config_changed(key);
    fbp_arena_config_changed(key);
}

static PyObject *py_config_set(PyObject *self, PyObject *args)
{
    (void)self;
    const char *key, *value;
    if (!PyArg_ParseTuple(args, "ss", &key, &value))
        return NULL;
    int rc = fiber_config_set(key, value);
    if (rc)
        return fbp_raise_last(rc);
    config_changed(key);
    Py_RETURN_NONE;
}

static PyObject *py_config_get(PyObject *self, PyObject *args)
{
    (void)self;
    const char *key;
    if (!PyArg_ParseTuple(args, "s", &key))
        return NULL;
    char buf[1024];
    int rc = fiber_config_get(key, buf, sizeof buf);
    if (rc)
        return fbp_raise_last(rc);
    return PyUnicode_FromString(buf);
}

/* A NULL-terminated array of the UTF-8 strings of a list of str, pointing
 * into the list's objects; NULL with an exception on error. */
static const char **str_array(PyObject *list, const char *what)
{
    if (!PyList_Check(list)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of str", what);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(list);
    const char **v = PyMem_Calloc((size_t)n + 1, sizeof *v);
    if (!v)
        return (const char **)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        v[i] = PyUnicode_AsUTF8(PyList_GET_ITEM(list, i));
        if (!v[i]) {
            PyMem_Free(v);
            return NULL;
        }
    }
    return v;
}

static PyObject *py_job_command_set(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *argv, *env;
    if (!PyArg_ParseTuple(args, "OO", &argv, &env))
        return NULL;
    const char **a = str_array(argv, "argv");
    if (!a)
        return NULL;
    const char **e = str_array(env, "env");
    if (!e) {
        PyMem_Free(a);
        return NULL;
    }
    int rc = fiber_job_command_set(a, e);
    PyMem_Free(a);
    PyMem_Free(e);
    if (rc)
        return fbp_raise_last(rc);
    Py_RETURN_NONE;
}

static PyObject *py_job_forkserver_set(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *argv;
    if (!PyArg_ParseTuple(args, "O", &argv))
        return NULL;
    const char **a = NULL;
    if (argv != Py_None && !(a = str_array(argv, "argv")))
        return NULL;
    int rc = fiber_job_forkserver_set(a);
    PyMem_Free(a);
    if (rc)
        return fbp_raise_last(rc);
    Py_RETURN_NONE;
}

/* A job ends with exit(), which does not flush Python's own buffers:
 * what a target printed would be lost when stdout is a pipe or a file. */
static void flush_python_stdio(void)
{
    if (!Py_IsInitialized())
        return;
    PyGILState_STATE g = PyGILState_Ensure();
    const char *names[] = {"stdout", "stderr"};
    for (int i = 0; i < 2; i++) {
        PyObject *f = PySys_GetObject(names[i]); /* borrowed */
        PyObject *r = f && f != Py_None
                          ? PyObject_CallMethod(f, "flush", NULL)
                          : NULL;
        Py_XDECREF(r);
        PyErr_Clear();
    }
    PyGILState_Release(g);
}

/* fiber_init().  In the master it returns True.  In a job a backend
 * started it runs the job's assignment (tasks call back into Python
 * through the handlers, taking the GIL) and ends the process: it never
 * returns. */
static PyObject *py_init(PyObject *self, PyObject *args)
{
    (void)self;
    const char *argv0 = "python";
    if (!PyArg_ParseTuple(args, "|s", &argv0))
        return NULL;
    static char name[256];
    snprintf(name, sizeof name, "%s", argv0);
    static char *argv_store[2];
    argv_store[0] = name;
    int argc = 1;
    char **argv = argv_store;
    if (getenv("FIBER_BOOT_ADDR"))
        atexit(flush_python_stdio);
    int rc;
    char msg[1024] = "";
    /* A job's fiber_init never returns: its FIBER_* values are read now. */
    config_changed("pymalloc_keep_mb");
    FBP_CALL(rc, msg, fiber_init(&argc, &argv));
    if (rc)
        return fbp_raise(rc, msg);
    config_changed("object_cache_mb"); /* a master's, read from now on */
    config_changed("pymalloc_keep_mb");
    return PyBool_FromLong(fiber_is_master() == 1);
}

static PyObject *py_is_master(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLong(fiber_is_master());
}

static PyObject *py_run_id(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyUnicode_FromString(fiber_run_id());
}

static PyObject *py_shutdown(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    FB_NOGIL(fiber_shutdown());
    Py_RETURN_NONE;
}

static PyObject *py_set_handlers(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *task, *method, *load = NULL, *raised = NULL, *ok = NULL;
    if (!PyArg_ParseTuple(args, "OO|OOO", &task, &method, &load, &raised,
                          &ok))
        return NULL;
    if (!PyCallable_Check(task) || !PyCallable_Check(method) ||
        (load && !PyCallable_Check(load)) ||
        (raised && !PyCallable_Check(raised)) || (ok && !PyCallable_Check(ok))) {
        PyErr_SetString(PyExc_TypeError, "handlers must be callable");
        return NULL;
    }
    if (fbp_envelope_helpers(load, raised, ok) != 0)
        return NULL;
    Py_XSETREF(fbp_task_handler, Py_NewRef(task));
    Py_XSETREF(fbp_method_handler, Py_NewRef(method));
    Py_RETURN_NONE;
}

/* Prints a stage of an image build on stderr (C's: no GIL needed). */
static void image_progress(void *ud, const char *line)
{
    (void)ud;
    fprintf(stderr, "fiber: %s\n", line);
    fflush(stderr);
}

/* image_build(program, trees, excludes, tag, progress=False) -> image id:
 * builds a container image of an interpreter and the trees it needs
 * (fiber_image_build_with), imported into the Docker Engine; with
 * progress, a line per stage goes to stderr. */
static PyObject *py_image_build(PyObject *self, PyObject *args)
{
    (void)self;
    const char *program, *tag = NULL;
    PyObject *trees, *excludes;
    int progress = 0;
    if (!PyArg_ParseTuple(args, "sOO|zp", &program, &trees, &excludes, &tag,
                          &progress))
        return NULL;
    const char **t = str_array(trees, "trees");
    const char **x = t ? str_array(excludes, "excludes") : NULL;
    if (!t || !x) {
        PyMem_Free(t);
        return NULL;
    }
    fiber_image_build_opts o = {.tag = tag, .trees = t, .excludes = x,
                                .progress = progress ? image_progress : NULL};
    fiber_buf id = {0};
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_image_build_with(program, &o, &id));
    PyMem_Free(t);
    PyMem_Free(x);
    PyObject *res = rc ? fbp_raise(rc, msg)
                       : PyUnicode_FromStringAndSize((char *)id.data,
                                                     (Py_ssize_t)id.len);
    fiber_buf_free(&id);
    return res;
}

/* A Python stop callback, on fiber's stop thread (or, registered late, on
 * the caller's): takes the GIL and calls fn(signum).  An exception is
 * reported as unraisable (it cannot reach the program's main thread). */
static void py_stop_trampoline(void *user, int sig)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction((PyObject *)user, "i", sig);
    if (!r)
        PyErr_WriteUnraisable((PyObject *)user);
    Py_XDECREF(r);
    /* A requeued master ends right after its callbacks, without Python's
     * own exit: what they printed must be out by then. */
    const char *streams[] = {"stdout", "stderr"};
    for (int i = 0; i < 2; i++) {
        PyObject *f = PySys_GetObject(streams[i]); /* borrowed */
        PyObject *res = f && f != Py_None
                            ? PyObject_CallMethod(f, "flush", NULL)
                            : NULL;
        if (!res)
            PyErr_Clear();
        Py_XDECREF(res);
    }
    PyGILState_Release(g);
}

/* stop_arm(fn or None): fiber_on_stop_requested; fn stays referenced for
 * the life of the process (the event holds it). */
static PyObject *py_stop_arm(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *fn;
    if (!PyArg_ParseTuple(args, "O", &fn))
        return NULL;
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError,
                        "on_stop_requested: the callback must be callable");
        return NULL;
    }
    if (fn != Py_None)
        Py_INCREF(fn);
    /* The GIL stays held: a late registration calls fn at once, here. */
    int rc = fn == Py_None ? fiber_on_stop_requested(NULL, NULL)
                           : fiber_on_stop_requested(py_stop_trampoline, fn);
    if (rc) {
        if (fn != Py_None)
            Py_DECREF(fn);
        return fbp_raise_last(rc);
    }
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_stop_requested(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLong(fiber_stop_requested());
}

static PyObject *py_resumed(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLong(fiber_resumed());
}

static PyObject *py_strerror(PyObject *self, PyObject *args)
{
    (void)self;
    int code;
    if (!PyArg_ParseTuple(args, "i", &code))
        return NULL;
    return Py_BuildValue("(ss)", fiber_errname(code), fiber_strerror(code));
}

static PyMethodDef module_methods[] = {
    {"arenas_kept", fbp_arenas_kept, METH_NOARGS,
     "arenas_kept() -> (n, bytes each, most bytes): the freed pymalloc "
     "arenas kept for reuse (arena.c, pymalloc_keep_mb)."},
    {"config_set", py_config_set, METH_VARARGS,
     "config_set(key, value): fiber_config_set."},
    {"config_get", py_config_get, METH_VARARGS,
     "config_get(key) -> str: the effective value of a key."},
    {"job_command_set", py_job_command_set, METH_VARARGS,
     "job_command_set(argv, env): the command every job starts with."},
    {"job_forkserver_set", py_job_forkserver_set, METH_VARARGS,
     "job_forkserver_set(argv or None): the fork server of the job "
     "command."},
    {"init", py_init, METH_VARARGS,
     "init(argv0) -> True in the master; never returns in a job."},
    {"is_master", py_is_master, METH_NOARGS,
     "1 in the master, 0 in a job, -1 before init."},
    {"run_id", py_run_id, METH_NOARGS, "The run's name."},
    {"shutdown", py_shutdown, METH_NOARGS, "fiber_shutdown()."},
    {"set_handlers", py_set_handlers, METH_VARARGS,
     "set_handlers(task, method, load_callable=None, task_raised=None, "
     "answer_ok=None): the worker side's Python entry points; with the "
     "last three, tasks of a call, a map or a chunk run in C (envelope.c) "
     "and reach Python only for their rare paths."},
    {"image_build", py_image_build, METH_VARARGS,
     "image_build(program, trees, excludes, tag=None, progress=False) "
     "-> image id."},
    {"stop_arm", py_stop_arm, METH_VARARGS,
     "stop_arm(fn or None): fiber_on_stop_requested."},
    {"stop_requested", py_stop_requested, METH_NOARGS,
     "fiber_stop_requested(): 0 or the signal that asked."},
    {"resumed", py_resumed, METH_NOARGS,
     "fiber_resumed(): times the run was restarted."},
    {"strerror", py_strerror, METH_VARARGS,
     "strerror(code) -> (name, text)."},
    {"error", py_error, METH_VARARGS,
     "error(code, text=None) -> the exception fiber raises for code "
     "(ERRORS[code][1]), with .code and .errname."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "fiber._fiber",
    "The C core of fiber: a thin layer over libfiber.", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

static PyObject *new_error(PyObject *m, const char *name, PyObject *bases)
{
    char full[96];
    snprintf(full, sizeof full, "fiber.%s", name);
    PyObject *cls = PyErr_NewException(full, bases, NULL);
    if (!cls || PyModule_AddObjectRef(m, name, cls) != 0) {
        Py_XDECREF(cls);
        return NULL;
    }
    return cls;
}

PyMODINIT_FUNC PyInit__fiber(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (!(fiber_error = new_error(m, "FiberError", NULL)))
        goto fail;
    PyObject *b = PyTuple_Pack(2, fiber_error, PyExc_ValueError);
    config_error = b ? new_error(m, "ConfigError", b) : NULL;
    Py_XDECREF(b);
    b = PyTuple_Pack(2, fiber_error, PyExc_TimeoutError);
    timeout_error = b ? new_error(m, "FiberTimeoutError", b) : NULL;
    Py_XDECREF(b);
    /* A job that cannot start: multiprocessing.ProcessError too, which is
     * what Uber Fiber raised and its programs catch. */
    PyObject *mp = PyImport_ImportModule("multiprocessing");
    PyObject *mp_process_error = mp ? PyObject_GetAttrString(mp,
                                                             "ProcessError")
                                    : NULL;
    Py_XDECREF(mp);
    b = mp_process_error ? PyTuple_Pack(2, fiber_error, mp_process_error)
                         : NULL;
    Py_XDECREF(mp_process_error);
    spawn_error = b ? new_error(m, "SpawnError", b) : NULL;
    Py_XDECREF(b);
    if (!config_error || !timeout_error || !spawn_error ||
        !(crashed_error = new_error(m, "TaskCrashedError", fiber_error)) ||
        !(closed_error = new_error(m, "ClosedError", fiber_error)) ||
        !(notask_error = new_error(m, "NoTaskError", fiber_error)))
        goto fail;
    if (PyModule_AddFunctions(m, fbp_envelope_methods) != 0 ||
        PyModule_AddFunctions(m, fbp_codec_methods) != 0)
        goto fail;
    fbp_arena_init();
    if (fbp_process_init(m) || fbp_pool_init(m) || fbp_queue_init(m) ||
        fbp_manager_init(m) || fbp_ring_init(m) || fbp_object_init(m))
        goto fail;
    if (error_table_add(m) != 0)
        goto fail;
    PyModule_AddStringConstant(m, "VERSION", fiber_version());
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
