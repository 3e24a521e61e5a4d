# runtime/: init and roles, configuration, run identity, the master's service, the child and pool-worker loops.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/hooks.c
     ${CMAKE_CURRENT_LIST_DIR}/addr.c
     ${CMAKE_CURRENT_LIST_DIR}/task.c
     ${CMAKE_CURRENT_LIST_DIR}/config.c
     ${CMAKE_CURRENT_LIST_DIR}/buildid.c
     ${CMAKE_CURRENT_LIST_DIR}/runtime.c
     ${CMAKE_CURRENT_LIST_DIR}/runid.c
     ${CMAKE_CURRENT_LIST_DIR}/stop.c
     ${CMAKE_CURRENT_LIST_DIR}/child.c
     ${CMAKE_CURRENT_LIST_DIR}/service.c
     ${CMAKE_CURRENT_LIST_DIR}/stats_srv.c
     ${CMAKE_CURRENT_LIST_DIR}/worker.c
)
