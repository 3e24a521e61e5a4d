/*
 * task.c -- the registry of task functions.
 *
 * FIBER_TASK constructors call fiber_task_register() before main(), so the
 * registry is a plain linked list built single-threaded at load time and
 * only read afterwards.  Problems found at load time cannot be reported
 * from a constructor; they are remembered and fiber_init() reports them.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "runtime/task.h"

static struct fiber_task_def *registry;
static char registry_problem[256];

static _Thread_local char task_failure[1024];

int fb_task_name_valid(const char *name, size_t len)
{
    if (len == 0 || len > 63)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_'))
            return 0;
    }
    return 1;
}

FIBER_API void fiber_task_register(struct fiber_task_def *def)
{
    if (!def || !def->name || !def->fn) {
        snprintf(registry_problem, sizeof registry_problem,
                 "fiber_task_register called with an incomplete definition");
        return;
    }
    if (!fb_task_name_valid(def->name, strlen(def->name))) {
        snprintf(registry_problem, sizeof registry_problem,
                 "task name '%.80s' is invalid: use 1..63 of [A-Za-z0-9_]",
                 def->name);
        return;
    }
    for (struct fiber_task_def *d = registry; d; d = d->next) {
        if (d == def)
            return; /* the same definition twice (a library loaded twice) */
        if (strcmp(d->name, def->name) == 0) {
            snprintf(registry_problem, sizeof registry_problem,
                     "task '%s' is registered twice", def->name);
            return;
        }
    }
    def->next = registry;
    registry = def;
}

int fb_task_registry_check(void)
{
    if (registry_problem[0])
        return fb_err(FIBER_EINVAL, "%s", registry_problem);
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Writes "a, b, c" (sorted) into buf, or "none". */
static void list_names(char *buf, size_t size)
{
    size_t n = 0;
    for (struct fiber_task_def *d = registry; d; d = d->next)
        n++;
    if (n == 0) {
        fb_strlcpy(buf, "none", size);
        return;
    }
    const char **names = malloc(n * sizeof *names);
    if (!names) {
        fb_strlcpy(buf, "(out of memory listing them)", size);
        return;
    }
    size_t i = 0;
    for (struct fiber_task_def *d = registry; d; d = d->next)
        names[i++] = d->name;
    qsort(names, n, sizeof *names, cmp_names);
    size_t used = 0;
    buf[0] = '\0';
    for (i = 0; i < n && used + 1 < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%s", i ? ", " : "",
                         names[i]);
        if (w < 0 || (size_t)w >= size - used) {
            /* Out of room: end with an ellipsis the reader can see. */
            if (size > 4)
                memcpy(buf + size - 4, "...", 4);
            break;
        }
        used += (size_t)w;
    }
    free(names);
}

FIBER_API int fiber_task_lookup(const char *name, fiber_task_fn *fn)
{
    if (!name)
        return fb_err(FIBER_EINVAL, "task name is NULL");
    for (struct fiber_task_def *d = registry; d; d = d->next) {
        if (strcmp(d->name, name) == 0) {
            if (fn)
                *fn = d->fn;
            return 0;
        }
    }
    char names[700];
    list_names(names, sizeof names);
    return fb_err(FIBER_ENOTASK,
                  "task '%.100s' is not registered; registered tasks: %s",
                  name, names);
}

FIBER_API int fiber_task_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(task_failure, sizeof task_failure, fmt, ap);
    va_end(ap);
    return FIBER_ETASK;
}

const char *fb_task_failure(void) { return task_failure; }

FB_HOT void fb_task_failure_clear(void) { task_failure[0] = '\0'; }

static struct {
    int running;
    int owes_end;
} current;

FB_HOT void fb_task_enter(void) { current.running = 1; }

FB_HOT int fb_task_leave(void)
{
    int owed = current.owes_end;
    current.running = 0;
    current.owes_end = 0;
    return owed;
}

int fb_task_running(void) { return current.running; }

void fb_task_owe_end(void) { current.owes_end = 1; }
