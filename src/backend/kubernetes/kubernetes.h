/*
 * kubernetes.h -- test hooks of the kubernetes backend (the ops table is
 * fb_backend_kubernetes in backend.h).
 */
#ifndef FB_KUBERNETES_H
#define FB_KUBERNETES_H

/* Makes the next watch of the run's pods start from resourceVersion 1,
 * which the API server has long forgotten: it answers 410 Gone, and the
 * watcher must list again and resume.  For tests only. */
void fb_k8s_test_expire_next_watch(void);

/* How many times the pod watchers of this process listed the pods (the
 * first list of each backend, and one per 410 Gone).  For tests. */
unsigned fb_k8s_test_lists(void);

#endif /* FB_KUBERNETES_H */
