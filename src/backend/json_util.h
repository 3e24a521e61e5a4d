/*
 * json_util.h -- small jansson helpers the backends that speak JSON to
 * their engine (docker, kubernetes) share.
 */
#ifndef FB_BACKEND_JSON_UTIL_H
#define FB_BACKEND_JSON_UTIL_H

#include <jansson.h>

/* Sets o[k] = v (taking v), or notes the failure (v NULL: out of memory
 * building it; or out of memory setting it) in *bad, so that a request
 * body is built with one check at the end. */
static inline void fb_json_put(json_t *o, const char *k, json_t *v, int *bad)
{
    if (!v || json_object_set_new(o, k, v) != 0)
        *bad = 1;
}

/* Appends v to the array a (taking v), or notes the failure in *bad. */
static inline void fb_json_push(json_t *a, json_t *v, int *bad)
{
    if (!v || json_array_append_new(a, v) != 0)
        *bad = 1;
}

/* Ends the building of o: o, or NULL (o freed) when anything failed. */
static inline json_t *fb_json_done(json_t *o, int bad)
{
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

#endif /* FB_BACKEND_JSON_UTIL_H */
