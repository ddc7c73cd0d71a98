# Host-side suite of the mnnvl backend (backends/mnnvl): workspace layout and
# call guards. Included from tests/backends/CMakeLists.txt; needs no GPU.
if(COMMAND arbiter_add_test)
  arbiter_add_test(backends_mnnvl_host_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/mnnvl_host_test.cpp
    LIBS arbiter::mnnvl_host LABELS cpu)
endif()
