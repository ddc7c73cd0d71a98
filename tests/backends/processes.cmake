# The GPU modules with one rank per process (processes/gpu_processes_test.cpp),
# included from tests/backends/CMakeLists.txt and, in a GPU-only build, from
# the top-level CMakeLists.txt: Boost-free, sources named through
# CMAKE_CURRENT_LIST_DIR. Each test skips (77) with the reason where the GPU
# or the module cannot run it.
if(NOT ARBITER_CUDA_ENABLED)
  return()
endif()
set(arbiter_process_backends)
foreach(backend trtllm mnnvl nccl)
  if(TARGET arbiter-${backend})
    list(APPEND arbiter_process_backends ${backend})
  endif()
endforeach()
if(NOT arbiter_process_backends)
  return()
endif()

add_executable(backends_gpu_processes_test ${CMAKE_CURRENT_LIST_DIR}/processes/gpu_processes_test.cpp)
target_compile_definitions(backends_gpu_processes_test PRIVATE
  ARBITER_PLUGIN_DIR="${ARBITER_PLUGIN_OUTPUT_DIR}")
target_include_directories(backends_gpu_processes_test PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/support ${CMAKE_CURRENT_LIST_DIR}/../support)
target_link_libraries(backends_gpu_processes_test PRIVATE
  arbiter::backend_common CUDA::cudart_static ${CMAKE_DL_LIBS} Threads::Threads)
# Under `arbiter launch` a rank meets the others through the UCX bootstrap.
if(TARGET arbiter::runtime)
  target_compile_definitions(backends_gpu_processes_test PRIVATE ARBITER_TEST_HAVE_BOOTSTRAP)
  target_link_libraries(backends_gpu_processes_test PRIVATE arbiter::runtime)
endif()

# 2 and 4 forked processes, all on GPU 0 (ARBITER_TEST_SHARED_GPU=1), per
# module; through `arbiter launch` too where the program is built.
foreach(backend IN LISTS arbiter_process_backends)
  add_dependencies(backends_gpu_processes_test arbiter-${backend})
  foreach(ranks 2 4)
    set(name backends_gpu_processes_${backend}_${ranks})
    add_test(NAME ${name}
      COMMAND backends_gpu_processes_test --backend ${backend} --ranks ${ranks})
    set_tests_properties(${name} PROPERTIES
      LABELS "gpu;gpu_processes" TIMEOUT 600 SKIP_RETURN_CODE 77
      ENVIRONMENT "ARBITER_TEST_SHARED_GPU=1")
  endforeach()
  if(NOT backend STREQUAL "nccl")
    set(name backends_gpu_processes_${backend}_lonely)
    add_test(NAME ${name} COMMAND backends_gpu_processes_test --backend ${backend} --lonely)
    set_tests_properties(${name} PROPERTIES
      LABELS "gpu;gpu_processes" TIMEOUT 300 SKIP_RETURN_CODE 77
      ENVIRONMENT "ARBITER_TEST_SHARED_GPU=1")
  endif()
  if(TARGET arbiter AND TARGET arbiter::runtime)
    set(name backends_gpu_processes_${backend}_launch_2)
    add_test(NAME ${name}
      COMMAND arbiter launch --nproc 2 --timeout 500 --
              $<TARGET_FILE:backends_gpu_processes_test> --backend ${backend})
    # The launcher turns a rank's 77 into its own failure: rank 0's line says skip.
    set_tests_properties(${name} PROPERTIES
      LABELS "gpu;gpu_processes" TIMEOUT 600
      SKIP_REGULAR_EXPRESSION "processes, rank 0: skip: "
      ENVIRONMENT "ARBITER_TEST_SHARED_GPU=1")
  endif()
endforeach()
