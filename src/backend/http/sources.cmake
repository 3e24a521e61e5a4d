# backend/http/: HTTP over a Unix socket or TCP (libcurl, opened when first needed).
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/curl_dl.c
     ${CMAKE_CURRENT_LIST_DIR}/http.c
)
