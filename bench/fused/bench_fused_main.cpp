// arbiter-bench-fused: the fused all-reduce + residual + RMSNorm of the
// trtllm and mnnvl modules (one-shot and two-shot) against the unfused
// baseline (a plain sum kernel, then the nccl backend's residual + RMSNorm
// kernel) and against a device-to-device copy of the same bytes, all in one
// run, in loopback mode on one GPU (bench/FUSED.md).
//
// Loopback mode: `ws` virtual ranks of each module on one GPU
// (LoopbackGroup), each with its own stream and buffers. The numbers say how
// the kernels compare on one device's memory, not what NVLink between GPUs
// gives; mnnvl has no multicast mapping there and stores to each peer in
// turn, so its figures are not multicast figures.
//
// Output: CSV rows on stdout (or --csv FILE), provenance as '#' lines; a
// summary on stderr. Exit 0, 1 when something failed (a module, a workspace,
// a call, or a fused result that differs from the baseline), 2 on bad usage
// or a hung kernel, 77 with "SKIP: ..." when there is no CUDA device.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "bench_fused_options.h"
#include "bench_fused_report.h"
#include "bench_fused_runner.h"
#include "bench_fused_timing.h"
#include "loopback_group.h"

namespace bench = arbiter::bench;

namespace {

// The device as a provenance line, and its description for the rows.
std::string describe_device(int ordinal, bench::Device* d) {
  cudaDeviceProp prop{};
  bench::check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  d->ordinal = ordinal;
  d->name = prop.name;
  d->capability = static_cast<std::uint32_t>(prop.major * 10 + prop.minor);
  d->sm_count = prop.multiProcessorCount;
  int driver = 0;
  int runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  char bus[32] = "?";
  cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal);
  char line[512];
  std::snprintf(line, sizeof line,
                "device %d: %s, capability %d.%d, %d SMs, %.1f GiB, PCI %s; driver %s, runtime %s",
                ordinal, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                static_cast<double>(prop.totalGlobalMem) / (1024.0 * bench::kMiB), bus,
                bench::cuda_version(driver).c_str(), bench::cuda_version(runtime).c_str());
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  arbiter::test::prepare_loopback_environment();
  bench::Options o;
  if (!bench::parse_options(argc, argv, &o)) {
    bench::print_usage(stderr);
    return 2;
  }
  int count = 0;  // a failing cudaGetDeviceCount leaves it unchanged
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    std::printf("SKIP: no CUDA device (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "the device count is 0");
    return 77;
  }
  if (o.device < 0 || o.device >= count) {
    std::fprintf(stderr, "error: --device %d: %d device(s) visible\n", o.device, count);
    return 2;
  }

  std::FILE* csv = stdout;
  if (!o.csv.empty()) {
    csv = std::fopen(o.csv.c_str(), "w");
    if (csv == nullptr) {
      std::fprintf(stderr, "error: cannot write %s\n", o.csv.c_str());
      return 2;
    }
  }
  int rc = 0;
  try {
    bench::check(cudaSetDevice(o.device), "cudaSetDevice");
    bench::Device d;
    const std::string device_line = describe_device(o.device, &d);
    bench::Report report(csv, d);
    report.provenance(o, device_line);
    bench::Bench b(o, d, report);
    b.load_modules();
    report.columns();
    try {
      b.run();
      rc = b.exit_code();
    } catch (const bench::Failure& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      rc = 1;
    }
    // Modules with registered memory have "<name>-reg" rows too.
    std::vector<std::string> columns;
    for (const std::string& name : o.backends) {
      columns.push_back(name);
      for (const bench::Point& p : b.points()) {
        if (p.median(bench::option_key(name + "-reg", "oneshot")) ||
            p.median(bench::option_key(name + "-reg", "twoshot"))) {
          columns.push_back(name + "-reg");
          break;
        }
      }
    }
    bench::print_summary(b.points(), columns, b.stopped(), b.failures());
  } catch (const bench::Failure& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    rc = 1;
  }
  if (csv != stdout) std::fclose(csv);
  return rc;
}
