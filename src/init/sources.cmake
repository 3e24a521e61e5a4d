# init/: fiber_init, which plugs the concepts into the runtime, and the kinds
# an object server hosts.
fiber_sources(init.c kinds.c)
