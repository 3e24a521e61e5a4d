# store/: the blob store: fiber_object_put/get and its server.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/object.c
     ${CMAKE_CURRENT_LIST_DIR}/objserve.c
)
