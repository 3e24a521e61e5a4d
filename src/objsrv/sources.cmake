# objsrv/: the object servers: one thread hosting objects, its client, the
# kinds it hosts.
fiber_sources(objsrv.c objclient.c)
