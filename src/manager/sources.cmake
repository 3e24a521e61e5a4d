# manager/: fiber_manager, its objects (dict, list, value) and their shared-memory forms.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/manager.c
     ${CMAKE_CURRENT_LIST_DIR}/mobj_srv.c
     ${CMAKE_CURRENT_LIST_DIR}/mobj_shm.c
     ${CMAKE_CURRENT_LIST_DIR}/mshm.c
     ${CMAKE_CURRENT_LIST_DIR}/mobj.c
     ${CMAKE_CURRENT_LIST_DIR}/shdict.c
)
