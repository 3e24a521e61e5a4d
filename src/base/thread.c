/*
 * thread.c -- starting the library's threads with every signal blocked.
 * See thread.h.
 */
#include <errno.h>
#include <signal.h>

#include "base/common.h"
#include "base/thread.h"

int fb_thread_start(pthread_t *t, void *(*fn)(void *), void *arg,
                    const char *what)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        errno = err;
        return fb_err_errno(FIBER_ESYS, "cannot start %s", what);
    }
    return 0;
}
