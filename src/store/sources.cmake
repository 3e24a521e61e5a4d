# store/: the blob store: fiber_object_put/get and its server.
fiber_sources(arena.c object.c objserve.c)
