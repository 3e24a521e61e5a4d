/*
 * local.h -- what the local backend's job ops (local.c) and run ops
 * (runs.c) share.
 */
#ifndef FB_LOCAL_H
#define FB_LOCAL_H

#include <stddef.h>

/* This process's environment with each of set[] ("NAME=value") added or
 * replacing the variable of the same name; when set names one twice, the
 * last wins.  A calloc'd NULL-terminated array the caller frees (the
 * strings are borrowed), or NULL on ENOMEM. */
char **fb_local_env(const char *const *set, size_t n_set);

#endif /* FB_LOCAL_H */
