# tool/: the `fiber` command.  Included by the top CMakeLists.txt.
# Built only on the public API, like curl's tool on libcurl: it links the
# shared library and sees include/ alone, so an internal symbol cannot slip
# in (they are hidden in libfiber.so).
file(GLOB FIBER_TOOL_SOURCES CONFIGURE_DEPENDS
     ${CMAKE_CURRENT_LIST_DIR}/*.c)
add_executable(fiber_tool ${FIBER_TOOL_SOURCES})
target_link_libraries(fiber_tool PRIVATE fiber)
set_target_properties(fiber_tool PROPERTIES
  OUTPUT_NAME fiber
  INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
install(TARGETS fiber_tool RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
