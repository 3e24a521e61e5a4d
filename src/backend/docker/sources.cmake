# backend/docker/: the docker backend: jobs are containers (Engine API), and image building.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/runs.c
     ${CMAKE_CURRENT_LIST_DIR}/docker.c
     ${CMAKE_CURRENT_LIST_DIR}/engine.c
     ${CMAKE_CURRENT_LIST_DIR}/elf.c
     ${CMAKE_CURRENT_LIST_DIR}/ldso.c
     ${CMAKE_CURRENT_LIST_DIR}/pathset.c
     ${CMAKE_CURRENT_LIST_DIR}/tar.c
     ${CMAKE_CURRENT_LIST_DIR}/image.c
)
