# Host-side suites of the trtllm backend (backends/trtllm): workspace sizing,
# launch configuration and call guards. Included from
# tests/backends/CMakeLists.txt; needs no GPU.
arbiter_add_test(backends_trtllm_host_test SOURCES trtllm_host_test.cpp LIBS arbiter::trtllm_host LABELS cpu)
