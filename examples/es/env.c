/*
 * env.c -- the registry of environments (see env.h).
 */
#include "env.h"

#include <stdio.h>
#include <string.h>

/* Ids are indices here; they travel in task records, so append only. */
static const struct env_def *const envs[] = {
    &es_env_cartpole,
    &es_env_pendulum,
    &es_env_humanoid,
};
#define N_ENVS ((int)(sizeof envs / sizeof envs[0]))

/* Contexts are per process and never freed: a worker keeps its model for
 * all the episodes it runs, and the process's exit releases it. */
static void *contexts[N_ENVS];

const struct env_def *es_env_find(const char *name)
{
    for (int i = 0; i < N_ENVS; i++)
        if (strcmp(envs[i]->name, name) == 0)
            return envs[i];
    return NULL;
}

const struct env_def *es_env_get(int id)
{
    return id >= 0 && id < N_ENVS ? envs[id] : NULL;
}

int es_env_id(const struct env_def *e)
{
    for (int i = 0; i < N_ENVS; i++)
        if (envs[i] == e)
            return i;
    return -1;
}

const char *es_env_names(void)
{
    return "cartpole, pendulum, humanoid";
}

void *es_env_context(int id, char *err, size_t errlen)
{
    const struct env_def *e = es_env_get(id);
    if (!e) {
        snprintf(err, errlen, "unknown environment id %d", id);
        return NULL;
    }
    if (!contexts[id] && e->open(&contexts[id], err, errlen) != 0)
        return NULL;
    return contexts[id];
}
