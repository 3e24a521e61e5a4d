# fiber_tests_may_skip(): gives every test of the calling directory
# SKIP_RETURN_CODE 77, whenever and however it was added (the call is
# deferred to the end of the directory's CMakeLists.txt), so that a case
# that exits 77 ("SKIP: reason"; TH_SKIP in tests/harness.h, skip in
# tests/skip.sh) is reported by ctest as skipped, never as passed.  Cases
# registered from a program's --list (cmake/DiscoverTests.cmake) get the
# property there.
function(fiber_tests_may_skip)
  cmake_language(DEFER CALL fiber_tests_mark_skip_code)
endfunction()

function(fiber_tests_mark_skip_code)
  get_property(tests DIRECTORY PROPERTY TESTS)
  if(tests)
    set_tests_properties(${tests} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endfunction()
