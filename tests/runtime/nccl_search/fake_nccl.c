/* A stand-in for libnccl.so.2: only ncclGetVersion, returning FAKE_NCCL_VERSION,
 * so that a test can tell which of several copies a process loaded. */
__attribute__((visibility("default"))) int ncclGetVersion(int* version) {
  *version = FAKE_NCCL_VERSION;
  return 0;
}
