# queue/: fiber_queue and its kind on the object server.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/queue.c
     ${CMAKE_CURRENT_LIST_DIR}/queue_srv.c
)
