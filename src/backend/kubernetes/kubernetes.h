/*
 * kubernetes.h -- test hooks of the kubernetes backend (the ops table is
 * fb_backend_kubernetes in backend.h).
 */
#ifndef FB_KUBERNETES_H
#define FB_KUBERNETES_H

/* Makes the next watch of the run's pods end as a server ends a watch
 * whose resourceVersion it has forgotten: an ERROR event with status 410
 * Gone, handed to the watcher as if read from the stream (the watch
 * itself is real).  The watcher must list again and resume.  Whether a
 * real server answers 410 to an old version depends on its watch cache
 * (a fresh cluster still holds version 1), so the hook does not ask it.
 * For tests only. */
void fb_k8s_test_expire_next_watch(void);

/* How many times the pod watchers of this process listed the pods (the
 * first list of each backend, and one per 410 Gone).  For tests. */
unsigned fb_k8s_test_lists(void);

#endif /* FB_KUBERNETES_H */
