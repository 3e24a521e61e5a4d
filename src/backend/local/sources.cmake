# backend/local/: the local backend: jobs are processes on this host.
fiber_sources(runs.c local.c forkserver.c)
