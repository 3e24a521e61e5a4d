# net/: sockets, framing, encryption, the gate, the listener.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/settings.c
     ${CMAKE_CURRENT_LIST_DIR}/sock.c
     ${CMAKE_CURRENT_LIST_DIR}/conn.c
     ${CMAKE_CURRENT_LIST_DIR}/secure.c
     ${CMAKE_CURRENT_LIST_DIR}/gate.c
     ${CMAKE_CURRENT_LIST_DIR}/listener.c
)
