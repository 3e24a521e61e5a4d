# backend/local/: the local backend: jobs are processes on this host.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/runs.c
     ${CMAKE_CURRENT_LIST_DIR}/local.c
)
