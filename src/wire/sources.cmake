# wire/: message encoding and strict decoding; no I/O.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/wire.c
     ${CMAKE_CURRENT_LIST_DIR}/wire_obj.c
     ${CMAKE_CURRENT_LIST_DIR}/wire_stats.c
)
