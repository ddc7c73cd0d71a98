# cmake -DNVCC=... -DARCH=90a -DSOURCE=spilling_kernel.cu -DOPTIONS="a;b" -P check.cmake
# Passes when nvcc, given the spill guard's options, refuses the spilling
# kernel because of the spill (and not for another reason).
execute_process(
  COMMAND ${NVCC} -c ${SOURCE} -o spilling_kernel.o
          --generate-code=arch=compute_${ARCH},code=sm_${ARCH} ${OPTIONS}
  RESULT_VARIABLE result
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output)
if(result EQUAL 0)
  message(FATAL_ERROR "the spill guard let a spilling kernel build (options: ${OPTIONS})")
endif()
if(NOT output MATCHES "Registers are spilled")
  message(FATAL_ERROR "nvcc failed, but not because of the spill:\n${output}")
endif()
message(STATUS "refused as expected: ${output}")
