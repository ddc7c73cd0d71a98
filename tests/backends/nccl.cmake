# Suites of the nccl backend (backends/nccl), included from
# tests/backends/CMakeLists.txt. Built only where the module is.
if(TARGET arbiter-nccl)
  # Loads the module on any machine (no driver needed) and checks what it
  # exports and how it says it cannot run; checks its host-side rules
  # (arbiter/nccl/call_rules.h) directly.
  arbiter_add_test(backends_nccl_module_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/nccl/module_test.cpp
    LIBS arbiter::nccl_host ${CMAKE_DL_LIBS} Threads::Threads
    LABELS cpu)
  add_dependencies(backends_nccl_module_test arbiter-nccl)
  target_include_directories(backends_nccl_module_test PRIVATE ${CMAKE_CURRENT_LIST_DIR}/support)

  # Runs the module on a GPU against the common CPU reference; skips, with
  # the reason, where there is no device.
  arbiter_add_test(backends_nccl_gpu_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/nccl/allreduce_gpu_test.cpp
    LIBS arbiter::nccl_host CUDA::cudart_static ${CMAKE_DL_LIBS} Threads::Threads
    LABELS gpu
    TIMEOUT 600)
  add_dependencies(backends_nccl_gpu_test arbiter-nccl)
  target_include_directories(backends_nccl_gpu_test PRIVATE ${CMAKE_CURRENT_LIST_DIR}/support)
endif()
