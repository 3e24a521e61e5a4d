/*
 * thread.h -- how the library starts a thread of its own.
 *
 * Every thread fiber adds to a program (the master's service thread, a
 * pool's thread, object and blob servers, an object client's flusher, a
 * child's watchdog, the Slurm backend's state thread, the Kubernetes pod
 * watcher and its batch workers) starts here, with every signal blocked:
 * the program's signal handlers (and sigwait, and SIGCHLD for the local
 * backend) then always run on the program's own threads, never on one it
 * does not know about.  The caller's signal mask is left as it was.
 */
#ifndef FB_THREAD_H
#define FB_THREAD_H

#include <pthread.h>

/* Starts *t running fn(arg) with every signal blocked.  Returns 0, or
 * FIBER_ESYS with fiber_last_error() "cannot start WHAT: <reason>" (what
 * names the thread: "the service thread"). */
int fb_thread_start(pthread_t *t, void *(*fn)(void *), void *arg,
                    const char *what);

#endif /* FB_THREAD_H */
