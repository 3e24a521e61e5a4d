# backend/: the registry and the run-level ops; each backend is a folder
# below. Each backend's folder adds its own.
fiber_sources(backend.c runops.c)
include(${CMAKE_CURRENT_LIST_DIR}/local/sources.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/http/sources.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/docker/sources.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/slurm/sources.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/kubernetes/sources.cmake)
