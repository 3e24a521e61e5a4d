# runtime/: init and roles, configuration, run identity, the master's service,
# the child and pool-worker loops.
fiber_sources(hooks.c addr.c task.c config.c buildid.c runtime.c runid.c stop.c
              child.c service.c stats_srv.c worker.c)
