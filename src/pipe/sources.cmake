# pipe/: fiber_pipe, its direct link and its rendezvous.
fiber_sources(pipe.c pipe_rdv.c)
