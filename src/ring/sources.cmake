# ring/: fiber_ring and its rendezvous.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/ring_rdv.c
     ${CMAKE_CURRENT_LIST_DIR}/ring.c
)
