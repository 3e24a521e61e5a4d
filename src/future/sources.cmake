# future/: fiber_future, one handle over any asynchronous call.
fiber_sources(future.c)
