/*
 * process.c -- _fiber.Process: a started fiber_process running the
 * fiber_py_task task with an envelope (fiber.process.Process builds it).
 */
#include "binding.h"

typedef struct {
    PyObject_HEAD
    fiber_process *p;
} FbpProcess;

static int process_init(FbpProcess *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"payload", "name", "cpu", "memory", "gpu",
                             NULL};
    Py_buffer payload;
    PyObject *name = Py_None;
    int cpu = 0, memory = 0, gpu = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|Oiii", kwlist, &payload,
                                     &name, &cpu, &memory, &gpu))
        return -1;
    if (self->p) {
        PyBuffer_Release(&payload);
        PyErr_SetString(PyExc_RuntimeError, "process already started");
        return -1;
    }
    fiber_job_opts o;
    if (fbp_job_opts(&o, name, cpu, memory, gpu) != 0) {
        PyBuffer_Release(&payload);
        return -1;
    }
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_process_start(&self->p, FBP_TASK, payload.buf,
                             (size_t)payload.len, &o));
    PyBuffer_Release(&payload);
    if (rc) {
        fbp_raise(rc, msg);
        return -1;
    }
    return 0;
}

static void process_dealloc(FbpProcess *self)
{
    if (self->p) {
        fiber_process *p = self->p;
        self->p = NULL;
        FB_NOGIL(fiber_process_free(p));
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int check(FbpProcess *self)
{
    if (!self->p) {
        PyErr_SetString(PyExc_ValueError, "process was not started");
        return -1;
    }
    return 0;
}

static int join_step(void *ctx, int slice_ms)
{
    return fiber_process_join(ctx, slice_ms);
}

/* join(timeout_ms) -> True once the job has ended, False on timeout. */
static PyObject *process_join(FbpProcess *self, PyObject *args)
{
    int timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "|i", &timeout_ms) || check(self))
        return NULL;
    char msg[1024];
    int rc = fbp_wait_sliced(join_step, self->p, timeout_ms, msg, sizeof msg);
    if (rc == -2)
        return NULL;
    if (rc == FIBER_ETIMEDOUT)
        Py_RETURN_FALSE;
    if (rc)
        return fbp_raise(rc, msg);
    Py_RETURN_TRUE;
}

static PyObject *process_signal(FbpProcess *self, int kill)
{
    if (check(self))
        return NULL;
    int rc;
    FB_NOGIL(rc = kill ? fiber_process_kill(self->p)
                       : fiber_process_terminate(self->p));
    if (rc)
        return fbp_raise_last(rc);
    Py_RETURN_NONE;
}

static PyObject *process_terminate(FbpProcess *self, PyObject *unused)
{
    (void)unused;
    return process_signal(self, 0);
}

static PyObject *process_kill(FbpProcess *self, PyObject *unused)
{
    (void)unused;
    return process_signal(self, 1);
}

static PyObject *process_is_alive(FbpProcess *self, PyObject *unused)
{
    (void)unused;
    if (check(self))
        return NULL;
    int rc = fiber_process_is_alive(self->p);
    if (rc < 0)
        return fbp_raise_last(rc);
    return PyBool_FromLong(rc);
}

/* exitcode() -> int, or None while it runs. */
static PyObject *process_exitcode(FbpProcess *self, PyObject *unused)
{
    (void)unused;
    if (check(self))
        return NULL;
    int code;
    int rc = fiber_process_exitcode(self->p, &code);
    if (rc == FIBER_ESTATE)
        Py_RETURN_NONE;
    if (rc)
        return fbp_raise_last(rc);
    return PyLong_FromLong(code);
}

static PyObject *process_pid(FbpProcess *self, PyObject *unused)
{
    (void)unused;
    if (check(self))
        return NULL;
    long pid = fiber_process_pid(self->p);
    if (pid < 0)
        Py_RETURN_NONE;
    return PyLong_FromLong(pid);
}

static PyObject *process_name(FbpProcess *self, PyObject *unused)
{
    (void)unused;
    if (check(self))
        return NULL;
    return PyUnicode_FromString(fiber_process_name(self->p));
}

static PyMethodDef process_methods[] = {
    {"join", (PyCFunction)process_join, METH_VARARGS, NULL},
    {"terminate", (PyCFunction)process_terminate, METH_NOARGS, NULL},
    {"kill", (PyCFunction)process_kill, METH_NOARGS, NULL},
    {"is_alive", (PyCFunction)process_is_alive, METH_NOARGS, NULL},
    {"exitcode", (PyCFunction)process_exitcode, METH_NOARGS, NULL},
    {"pid", (PyCFunction)process_pid, METH_NOARGS, NULL},
    {"name", (PyCFunction)process_name, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject FbpProcessType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fiber._fiber.Process",
    .tp_basicsize = sizeof(FbpProcess),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)process_init,
    .tp_dealloc = (destructor)process_dealloc,
    .tp_methods = process_methods,
    .tp_doc = "Process(payload, name=None, cpu=0, memory=0, gpu=0): a job "
              "running a Python target.",
};

int fbp_process_init(PyObject *m)
{
    if (PyType_Ready(&FbpProcessType) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "Process", (PyObject *)&FbpProcessType);
}
