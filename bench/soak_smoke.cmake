# soak_smoke.cmake -- `make test`'s short soak: runs `soak --seconds 8`
# with a worker killed every second, and checks that it succeeded and that
# its JSON line (the last) reports nothing lost and nothing duplicated.
# Usage: cmake -DSOAK=<path to soak> -P soak_smoke.cmake
execute_process(
  COMMAND ${SOAK} --seconds 8 --kill-every-ms 1000 --hostile-every-ms 100
          --report-every-s 4
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err
  RESULT_VARIABLE status)
message("${out}")
if(err)
  message("stderr:\n${err}")
endif()
string(STRIP "${out}" out)
string(REGEX MATCH "[^\n]*$" json "${out}")
foreach(key lost duplicated)
  if(NOT json MATCHES "\"${key}\":0[,}]")
    message(FATAL_ERROR "soak: \"${key}\" is not 0 in: ${json}")
  endif()
endforeach()
if(NOT json MATCHES "\"kills\":[1-9]")
  message(FATAL_ERROR "soak: no worker was killed: ${json}")
endif()
if(NOT status EQUAL 0)
  message(FATAL_ERROR "soak exited with ${status}")
endif()
