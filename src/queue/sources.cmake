# queue/: fiber_queue and its kind on the object server.
fiber_sources(queue.c queue_srv.c)
