# runs/: runs from outside: start, list, logs, kill, clean, watch.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/runs.c
     ${CMAKE_CURRENT_LIST_DIR}/launch.c
     ${CMAKE_CURRENT_LIST_DIR}/watch.c
)
