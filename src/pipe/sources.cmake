# pipe/: fiber_pipe, its direct link and its rendezvous.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/pipe.c
     ${CMAKE_CURRENT_LIST_DIR}/pipe_rdv.c
)
