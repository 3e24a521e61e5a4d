# init/: fiber_init, which plugs the concepts into the runtime, and the
# kinds an object server hosts.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/init.c
     ${CMAKE_CURRENT_LIST_DIR}/kinds.c
)
