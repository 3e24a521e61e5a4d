# Run at build time (POST_BUILD): asks a test program for its case names and
# writes a ctest include file with one test per case.
# Inputs: EXE, OUT, PREFIX, TIMEOUT, LABELS; optional WRAPPER (a script
# run as `WRAPPER EXE CASE` instead of `EXE CASE`) and FIXTURES (fixtures
# every case requires).  Every case gets SKIP_RETURN_CODE 77: a case
# that cannot run exits 77 (TH_SKIP in tests/harness.h) and ctest reports
# it as skipped.
execute_process(COMMAND ${EXE} --list OUTPUT_VARIABLE cases
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} --list failed (${rc}): ${err}")
endif()
string(REPLACE "\n" ";" cases "${cases}")
string(REPLACE "," ";" FIXTURES "${FIXTURES}")
set(text "")
foreach(c IN LISTS cases)
  if(c STREQUAL "")
    continue()
  endif()
  if(WRAPPER)
    string(APPEND text "add_test([=[${PREFIX}.${c}]=] [=[${WRAPPER}]=] [=[${EXE}]=] [=[${c}]=])\n")
  else()
    string(APPEND text "add_test([=[${PREFIX}.${c}]=] [=[${EXE}]=] [=[${c}]=])\n")
  endif()
  string(APPEND text "set_tests_properties([=[${PREFIX}.${c}]=] PROPERTIES TIMEOUT ${TIMEOUT} LABELS [=[${LABELS}]=] SKIP_RETURN_CODE 77)\n")
  if(FIXTURES)
    string(APPEND text "set_tests_properties([=[${PREFIX}.${c}]=] PROPERTIES FIXTURES_REQUIRED [=[${FIXTURES}]=])\n")
  endif()
endforeach()
file(WRITE ${OUT} "${text}")
