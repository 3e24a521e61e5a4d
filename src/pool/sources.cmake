# pool/: fiber_pool: its API, the batch, the scheduler, sets and watch
# counters.
fiber_sources(pool.c batch.c pool_sched.c pool_sets.c pool_watch.c)
