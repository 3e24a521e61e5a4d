# init/: fiber_init: plugs the concepts into the runtime.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/init.c
     ${CMAKE_CURRENT_LIST_DIR}/kinds.c
)
