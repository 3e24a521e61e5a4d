# backend/slurm/: the slurm backend: jobs are Slurm jobs.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/runs.c
     ${CMAKE_CURRENT_LIST_DIR}/slurm.c
     ${CMAKE_CURRENT_LIST_DIR}/tool.c
)
