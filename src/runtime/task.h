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

#endif /* FB_TASK_H */
