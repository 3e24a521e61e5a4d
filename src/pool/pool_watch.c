/*
 * pool_watch.c -- the registry of the master's live pools, which is what
 * `fiber top` shows: runtime/stats_srv.c asks it for every pool's name and
 * counters (fb_stats_set_pools) when a monitor sends STATS.
 *
 * Locking: registry_mu guards the list and is taken before a pool's mu
 * (fiber_pool_stats_get), never while one is held: fiber_pool_create
 * adds a pool, and fiber_pool_free removes it, before taking its lock.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "pool/pool_int.h"
#include "runtime/stats_srv.h"

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fiber_pool *registry;

/* The pool's name in `fiber top`: its workers' job name when it has one
 * (bytes outside [A-Za-z0-9_.-] become '_'), else "Pool<n>". */
static void pool_name(const struct fiber_pool *p, char *out, size_t size)
{
    if (!p->job_strs[0] || !p->job_strs[0][0]) {
        snprintf(out, size, "Pool%u", p->pool_no);
        return;
    }
    size_t i = 0;
    for (const char *s = p->job_strs[0]; *s && i + 1 < size && i < 63; s++) {
        char c = *s;
        int ok = (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ||
                 (c >= 'a' && c <= 'z') || c == '_' || c == '.' || c == '-';
        out[i++] = ok ? c : '_';
    }
    out[i] = '\0';
}

static size_t list_pools(struct fb_monitor_pool *rows, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&registry_mu);
    for (struct fiber_pool *p = registry; p && n < max; p = p->reg_next) {
        pool_name(p, rows[n].name, sizeof rows[n].name);
        if (fiber_pool_stats_get(p, &rows[n].st) == 0)
            n++;
    }
    pthread_mutex_unlock(&registry_mu);
    return n;
}

void fb_pool_registry_add(struct fiber_pool *p)
{
    pthread_mutex_lock(&registry_mu);
    p->reg_prev = NULL;
    p->reg_next = registry;
    if (registry)
        registry->reg_prev = p;
    registry = p;
    p->registered = 1;
    pthread_mutex_unlock(&registry_mu);
    fb_stats_set_pools(list_pools);
}

void fb_pool_registry_remove(struct fiber_pool *p)
{
    pthread_mutex_lock(&registry_mu);
    if (p->registered) {
        if (p->reg_prev)
            p->reg_prev->reg_next = p->reg_next;
        else
            registry = p->reg_next;
        if (p->reg_next)
            p->reg_next->reg_prev = p->reg_prev;
        p->reg_prev = p->reg_next = NULL;
        p->registered = 0;
    }
    pthread_mutex_unlock(&registry_mu);
}
