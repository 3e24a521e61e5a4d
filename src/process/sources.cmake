# process/: fiber_process.
fiber_sources(process.c)
