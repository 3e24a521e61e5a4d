# manager/: fiber_manager, its objects (dict, list, value) and their shared-
# memory forms.
fiber_sources(manager.c mobj_srv.c mobj_shm.c mshm.c mobj.c shdict.c)
