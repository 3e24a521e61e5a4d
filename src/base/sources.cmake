# base/: buffers, errors, logging, clocks, threads: used by every layer.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/error.c
     ${CMAKE_CURRENT_LIST_DIR}/buf.c
     ${CMAKE_CURRENT_LIST_DIR}/util.c
     ${CMAKE_CURRENT_LIST_DIR}/thread.c
     ${CMAKE_CURRENT_LIST_DIR}/log.c
)
