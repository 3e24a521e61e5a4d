# pool/: fiber_pool: its API, the batch, the scheduler, sets and watch counters.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/pool.c
     ${CMAKE_CURRENT_LIST_DIR}/batch.c
     ${CMAKE_CURRENT_LIST_DIR}/pool_sched.c
     ${CMAKE_CURRENT_LIST_DIR}/pool_sets.c
     ${CMAKE_CURRENT_LIST_DIR}/pool_watch.c
)
