# store/: the blob store: fiber_object_put/get and its server.
fiber_sources(object.c objserve.c)
