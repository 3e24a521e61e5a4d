/*
 * task.c -- the two C tasks every Python program of fiber registers, which
 * run Python in a job:
 *
 *   fiber_py_task    a Process target, a pool task or a pool initializer:
 *                    the argument is an envelope built by fiber._envelope.
 *                    A call, a map's task or a chunk runs in C
 *                    (envelope.c: fbp_envelope_run); the rest is handed,
 *                    as a read-only memoryview valid during the call, to
 *                    the worker-side handler (fiber._worker).
 *   fiber_py_method  a method of a Python object hosted by a manager: the
 *                    object's state (the manager keeps it) and the call
 *                    go to the method handler.
 *
 * Both take the GIL for the call: libfiber runs them with it released
 * (fiber._fiber.init releases it in a job), on the job's main thread or
 * the manager's serving thread.
 *
 * What the task handler returns says what the task did: bytes are a
 * result (code 0); an int is a Process target's exit code; a str is a
 * failure message (an initializer that raised: the worker exits).
 */
#include <string.h>

#include "binding.h"

/* The handler's answer as a task's return code. */
static int take_answer(PyObject *res, fiber_buf *out)
{
    if (PyBytes_Check(res)) {
        if (fiber_buf_append(out, PyBytes_AS_STRING(res),
                             (size_t)PyBytes_GET_SIZE(res)) != 0)
            return fiber_task_fail("out of memory for a %zd-byte result",
                                   PyBytes_GET_SIZE(res));
        return 0;
    }
    if (PyLong_Check(res))
        return (int)PyLong_AsLong(res);
    if (PyUnicode_Check(res))
        return fiber_task_fail("%s", PyUnicode_AsUTF8(res));
    return fiber_task_fail("fiber's worker handler returned %s",
                           Py_TYPE(res)->tp_name);
}

/* The text of the pending Python exception, which is cleared. */
static void fail_with_exception(const char *where)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *s = value ? PyObject_Str(value) : NULL;
    const char *text = s ? PyUnicode_AsUTF8(s) : NULL;
    fiber_task_fail("%s: %s: %s", where,
                    type ? ((PyTypeObject *)type)->tp_name : "error",
                    text ? text : "(no message)");
    PyErr_Clear();
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* Releases the memoryview so that nothing can read the task's argument
 * after libfiber reuses it; a view still exported (the handler kept a
 * slice, which it never does) is reported rather than left dangling. */
static void release_view(PyObject *mv)
{
    PyObject *r = PyObject_CallMethod(mv, "release", NULL);
    if (!r) {
        PyErr_Clear();
        fiber_log(FIBER_LOG_ERROR, "a task kept a view of its argument");
    }
    Py_XDECREF(r);
    Py_DECREF(mv);
}

FIBER_TASK(fiber_py_task)
{
    PyGILState_STATE g = PyGILState_Ensure();
    int rc;
    if (!fbp_task_handler) {
        rc = fiber_task_fail("fiber's Python worker is not set up in this "
                             "process (was it started by fiber.Process or "
                             "fiber.Pool?)");
        PyGILState_Release(g);
        return rc;
    }
    /* A call, a map's task or a chunk runs in C (envelope.c); the rest,
     * and a task whose callable or arguments do not load, in Python. */
    int fast = fbp_envelope_run(arg, len, out);
    if (fast == 0) {
        fbp_queue_flush_all();
        PyGILState_Release(g);
        return 0;
    }
    if (fast < 0) {
        fail_with_exception("fiber's worker could not answer a task");
        fbp_queue_flush_all();
        PyGILState_Release(g);
        return FIBER_ETASK;
    }
    PyObject *mv = PyMemoryView_FromMemory((char *)arg, (Py_ssize_t)len,
                                           PyBUF_READ);
    PyObject *res = mv ? PyObject_CallOneArg(fbp_task_handler, mv) : NULL;
    if (mv)
        release_view(mv);
    /* The puts the task gathered reach the C queue before its result
     * leaves and before the job's exit waits for the pipelined puts. */
    fbp_queue_flush_all();
    if (res) {
        rc = take_answer(res, out);
        Py_DECREF(res);
    } else {
        fail_with_exception("fiber's worker handler failed");
        rc = FIBER_ETASK;
    }
    PyGILState_Release(g);
    return rc;
}

/* Replaces the manager's state of the object with new_state. */
static int store_state(fiber_buf *state, PyObject *new_state)
{
    if (new_state == Py_None)
        return 0;
    if (!PyBytes_Check(new_state))
        return fiber_task_fail("a method handler's state must be bytes");
    state->len = 0;
    if (fiber_buf_append(state, PyBytes_AS_STRING(new_state),
                         (size_t)PyBytes_GET_SIZE(new_state)) != 0)
        return fiber_task_fail("out of memory for an object's state");
    return 0;
}

FIBER_TASK(fiber_py_method)
{
    fiber_buf *state;
    if (fiber_manager_state(&state) != 0)
        return fiber_task_fail("fiber_py_method runs only inside a manager");
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = 0;
    PyObject *st = fbp_bytes_of(state);
    PyObject *mv = PyMemoryView_FromMemory((char *)arg, (Py_ssize_t)len,
                                           PyBUF_READ);
    PyObject *res = st && mv && fbp_method_handler
                        ? PyObject_CallFunctionObjArgs(fbp_method_handler, st,
                                                       mv, NULL)
                        : NULL;
    if (mv)
        release_view(mv);
    Py_XDECREF(st);
    if (!fbp_method_handler && !PyErr_Occurred()) {
        rc = fiber_task_fail("fiber's Python manager is not set up");
    } else if (!res) {
        fail_with_exception("a manager method failed");
        rc = FIBER_ETASK;
    } else if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != 2 ||
               !PyBytes_Check(PyTuple_GET_ITEM(res, 1))) {
        rc = fiber_task_fail("a method handler must return (state, bytes)");
    } else if ((rc = store_state(state, PyTuple_GET_ITEM(res, 0))) == 0) {
        rc = take_answer(PyTuple_GET_ITEM(res, 1), out);
    }
    Py_XDECREF(res);
    PyGILState_Release(g);
    return rc;
}
