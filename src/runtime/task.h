/*
 * task.h -- the registry of task functions (FIBER_TASK).
 */
#ifndef FB_TASK_H
#define FB_TASK_H

#include "fiber/fiber.h"

/* Returns 1 if name is a valid task name: 1..63 bytes of [A-Za-z0-9_]. */
int fb_task_name_valid(const char *name, size_t len);

/* Reports a registration problem remembered from load time (an invalid or
 * duplicate name).  Returns 0 or FIBER_EINVAL with the message. */
int fb_task_registry_check(void);

/* Takes and clears the failure message a task set with fiber_task_fail()
 * on this thread ("" if none). */
const char *fb_task_failure(void);
void fb_task_failure_clear(void);

/* The pool task in progress in this process: the worker loop brackets each
 * task with fb_task_enter and fb_task_leave.  The object store tells a
 * task's pins from its caller's by fb_task_running, and calls
 * fb_task_owe_end when it pinned something the task's end must release;
 * fb_task_leave returns 1 then, and the loop calls the task_end hook
 * (runtime/hooks.h).  A task that pinned nothing costs the loop no call
 * into the store and no touch of its memory: at 2,048 workers on two
 * cores every page a task touches is cold (docs/performance.md). */
void fb_task_enter(void);
int fb_task_leave(void);
int fb_task_running(void);
void fb_task_owe_end(void);

#endif /* FB_TASK_H */
