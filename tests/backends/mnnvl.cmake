# Suites of the mnnvl backend (backends/mnnvl), included from
# tests/backends/CMakeLists.txt. Also includable from a GPU-only build that
# has CUDA but no Boost (the top-level CMakeLists.txt in ARBITER_GPU_ONLY
# mode): sources are named through CMAKE_CURRENT_LIST_DIR, the Boost.Test
# suites are then left out and only the GPU test is built.

# Host-side pieces: workspace layout and call guards. Needs no GPU and no module.
if(TARGET Boost::unit_test_framework AND COMMAND arbiter_add_test)
  arbiter_add_test(backends_mnnvl_host_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/mnnvl_host_test.cpp
    LIBS arbiter::mnnvl_host
    LABELS cpu)
  target_include_directories(backends_mnnvl_host_test PRIVATE ${CMAKE_CURRENT_LIST_DIR}/support)
  # The POSIX-descriptor exchange (abstract Unix sockets, SCM_RIGHTS) on pipes.
  arbiter_add_test(backends_mnnvl_fd_exchange_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/mnnvl/fd_exchange_test.cpp
            ${PROJECT_SOURCE_DIR}/backends/mnnvl/src/fd_exchange.cpp
    LIBS arbiter::mnnvl_host Threads::Threads
    LABELS cpu TIMEOUT 60)
  target_include_directories(backends_mnnvl_fd_exchange_test PRIVATE
    ${PROJECT_SOURCE_DIR}/backends/mnnvl/src ${CMAKE_CURRENT_LIST_DIR}/support)
endif()

if(TARGET arbiter-mnnvl)
  # Loads the module on any machine (no driver needed) and checks what it
  # exports and how it says it cannot run.
  if(TARGET Boost::unit_test_framework AND COMMAND arbiter_add_test)
    arbiter_add_test(backends_mnnvl_module_test
      SOURCES ${CMAKE_CURRENT_LIST_DIR}/mnnvl/module_test.cpp
      LIBS arbiter::backend_common ${CMAKE_DL_LIBS} Threads::Threads
      LABELS cpu)
    add_dependencies(backends_mnnvl_module_test arbiter-mnnvl)
    target_include_directories(backends_mnnvl_module_test PRIVATE
      ${CMAKE_CURRENT_LIST_DIR}/support)
  endif()

  # The kernels on one GPU in loopback mode (virtual ranks, unicast stores
  # instead of multicast) against the CPU reference. No Boost: its own
  # harness (support/gpu_check.h); exits 77, which ctest reports as
  # skipped, where there is no CUDA device.
  add_executable(backends_mnnvl_gpu_test ${CMAKE_CURRENT_LIST_DIR}/mnnvl/allreduce_gpu_test.cpp)
  target_compile_definitions(backends_mnnvl_gpu_test PRIVATE
    ARBITER_PLUGIN_DIR="${ARBITER_PLUGIN_OUTPUT_DIR}")
  target_include_directories(backends_mnnvl_gpu_test PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/support
    ${CMAKE_CURRENT_LIST_DIR}/../support)
  target_link_libraries(backends_mnnvl_gpu_test PRIVATE
    arbiter::backend_common CUDA::cudart_static ${CMAKE_DL_LIBS} Threads::Threads)
  add_dependencies(backends_mnnvl_gpu_test arbiter-mnnvl)
  add_test(NAME backends_mnnvl_gpu_test COMMAND backends_mnnvl_gpu_test)
  set_tests_properties(backends_mnnvl_gpu_test PROPERTIES
    LABELS gpu
    TIMEOUT 900
    SKIP_RETURN_CODE 77)
endif()
