// Which UCX transport modules the bootstrap's UCX may load (private).
#pragma once

namespace arbiter::bootstrap {

// UCX loads optional transport modules (cma, ib, rdmacm, ...) from the folder
// `ucx` beside libucs and from UCX_MODULE_DIR, whose default is compiled into
// libucs. When that default belongs to another install than the libucs this
// process runs on (the copy the wheel carries, or pip's libucx-cu13, on a
// machine whose system has its own UCX), loading those modules would bring a
// second libucs into the process. Unless the user set UCX_MODULE_DIR, this
// points it at the folder beside the libucs in use. Call before the first
// ucp_init; later calls do nothing.
void confine_ucx_modules();

}  // namespace arbiter::bootstrap
