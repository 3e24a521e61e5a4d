# backend/kubernetes/: the kubernetes backend: jobs are pods.
# Included by the top CMakeLists.txt; adds this folder's sources to the library.
list(APPEND FIBER_SOURCES
     ${CMAKE_CURRENT_LIST_DIR}/runs.c
     ${CMAKE_CURRENT_LIST_DIR}/kubernetes.c
     ${CMAKE_CURRENT_LIST_DIR}/k8s_api.c
     ${CMAKE_CURRENT_LIST_DIR}/k8s_master.c
)
