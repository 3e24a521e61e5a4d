# backend/kubernetes/: the kubernetes backend: jobs are pods.
fiber_sources(runs.c kubernetes.c k8s_api.c k8s_master.c)
