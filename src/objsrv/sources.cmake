# objsrv/: the object servers: one thread hosting objects, its client, the kinds it hosts.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/objsrv.c
     ${CMAKE_CURRENT_LIST_DIR}/objclient.c
)
