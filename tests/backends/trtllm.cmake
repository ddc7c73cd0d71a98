# Suites of the trtllm backend (backends/trtllm), included from
# tests/backends/CMakeLists.txt. Also includable from a GPU-only build that
# has CUDA but no Boost: the Boost.Test suites are then left out and only the
# GPU test is built.

# Host-side pieces: workspace sizing, launch configuration and call guards.
# Needs no GPU and no module.
if(TARGET Boost::unit_test_framework AND COMMAND arbiter_add_test)
  arbiter_add_test(backends_trtllm_host_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/trtllm_host_test.cpp
    LIBS arbiter::trtllm_host
    LABELS cpu)
  target_include_directories(backends_trtllm_host_test PRIVATE ${CMAKE_CURRENT_LIST_DIR}/support)
endif()

if(TARGET arbiter-trtllm)
  # Loads the module on any machine (no driver needed) and checks what it
  # exports and how it says it cannot run.
  if(TARGET Boost::unit_test_framework AND COMMAND arbiter_add_test)
    arbiter_add_test(backends_trtllm_module_test
      SOURCES ${CMAKE_CURRENT_LIST_DIR}/trtllm/module_test.cpp
      LIBS arbiter::backend_common ${CMAKE_DL_LIBS} Threads::Threads
      LABELS cpu)
    add_dependencies(backends_trtllm_module_test arbiter-trtllm)
    target_include_directories(backends_trtllm_module_test PRIVATE
      ${CMAKE_CURRENT_LIST_DIR}/support)
  endif()

  # The kernels on one GPU in loopback mode (virtual ranks) against the CPU
  # reference. No Boost: its own harness (support/gpu_check.h); exits 77,
  # which ctest reports as skipped, where there is no CUDA device.
  add_executable(backends_trtllm_gpu_test ${CMAKE_CURRENT_LIST_DIR}/trtllm/allreduce_gpu_test.cpp)
  target_compile_definitions(backends_trtllm_gpu_test PRIVATE
    ARBITER_PLUGIN_DIR="${ARBITER_PLUGIN_OUTPUT_DIR}")
  target_include_directories(backends_trtllm_gpu_test PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/support
    ${CMAKE_CURRENT_LIST_DIR}/../support)
  target_link_libraries(backends_trtllm_gpu_test PRIVATE
    arbiter::backend_common CUDA::cudart_static ${CMAKE_DL_LIBS} Threads::Threads)
  add_dependencies(backends_trtllm_gpu_test arbiter-trtllm)
  add_test(NAME backends_trtllm_gpu_test COMMAND backends_trtllm_gpu_test)
  set_tests_properties(backends_trtllm_gpu_test PROPERTIES
    LABELS gpu
    TIMEOUT 900
    SKIP_RETURN_CODE 77)
endif()

# abort() on the fused modules in loopback mode (trtllm and, when built,
# mnnvl): a kernel waiting on a rank that never launched returns, memory
# comes back, the context stays usable. No Boost; exits 77 without a GPU.
if(TARGET arbiter-trtllm)
  add_executable(backends_abort_gpu_test ${CMAKE_CURRENT_LIST_DIR}/abort_gpu_test.cpp)
  target_compile_definitions(backends_abort_gpu_test PRIVATE
    ARBITER_PLUGIN_DIR="${ARBITER_PLUGIN_OUTPUT_DIR}")
  target_include_directories(backends_abort_gpu_test PRIVATE ${CMAKE_CURRENT_LIST_DIR}/support)
  target_link_libraries(backends_abort_gpu_test PRIVATE
    arbiter::backend_common CUDA::cudart_static ${CMAKE_DL_LIBS} Threads::Threads)
  add_dependencies(backends_abort_gpu_test arbiter-trtllm)
  if(TARGET arbiter-mnnvl)
    add_dependencies(backends_abort_gpu_test arbiter-mnnvl)
  endif()
  add_test(NAME backends_abort_gpu_test COMMAND backends_abort_gpu_test)
  set_tests_properties(backends_abort_gpu_test PROPERTIES LABELS gpu TIMEOUT 600
    SKIP_RETURN_CODE 77)
endif()
