# backend/: the registry and the run-level ops; each backend is a folder below.
# Included by the top CMakeLists.txt; adds this folder's sources to the library,
# then each backend's folder adds its own.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/backend.c
     ${CMAKE_CURRENT_LIST_DIR}/runops.c
)
include(${CMAKE_CURRENT_LIST_DIR}/local/sources.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/http/sources.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/docker/sources.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/slurm/sources.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/kubernetes/sources.cmake)
