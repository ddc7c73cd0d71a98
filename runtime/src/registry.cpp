#include "arbiter/registry.h"

#include <dlfcn.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string_view>
#include <type_traits>

#include "nccl_library.h"

namespace arbiter {
namespace {

namespace fs = std::filesystem;

// Versions this host knows, newest first, and how far up it looks to name a
// newer one it does not know.
constexpr std::uint32_t kKnownVersions[] = {1};
constexpr std::uint32_t kHighestVersionProbed = 16;

struct Handle {
  void* dl = nullptr;
  ~Handle() {
    if (dl) dlclose(dl);
  }
};

bool is_module_file(const fs::path& p) {
  const std::string name = p.filename().string();
  return name.starts_with("libarbiter-") && p.extension() == ".so";
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const auto at = s.find(sep);
    if (std::string_view item = s.substr(0, at); !item.empty()) out.emplace_back(item);
    if (at == std::string_view::npos) break;
    s.remove_prefix(at + 1);
  }
  return out;
}

std::string module_error(const arbiter_backend_v1_t* b) {
  const char* m = b->last_error ? b->last_error() : nullptr;
  return m && *m ? m : "no reason given";
}

// A module that crashes in its constructor or probe() takes the process
// down with it; while one is opened and probed, a crash of the loading
// thread first names the file on stderr, then goes to whatever handled the
// signal before (the default: the core dump, the exit status a launcher
// reports), with the fault's own details.
constexpr int kCrashSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
constexpr const char* kCrashNames[] = {"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"};
constexpr int kCrashCount = sizeof kCrashSignals / sizeof kCrashSignals[0];
struct sigaction g_before[kCrashCount];
std::atomic<const char*> g_loading{nullptr};
std::atomic<pid_t> g_loading_thread{0};
std::mutex g_loading_lock;  // one module at a time: g_before holds one set

void write_text(const char* s) {
  for (std::size_t n = std::strlen(s); n > 0;) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}

extern "C" void on_module_crash(int sig, siginfo_t* info, void*) {
  // Async-signal-safe only: write(2), gettid, sigaction(2), raise(3).
  int i = 0;
  while (i < kCrashCount && kCrashSignals[i] != sig) ++i;
  const char* path = g_loading.load();
  if (path != nullptr && static_cast<pid_t>(syscall(SYS_gettid)) == g_loading_thread.load()) {
    write_text("arbiter: ");
    write_text(i < kCrashCount ? kCrashNames[i] : "a signal");
    write_text(" while loading the backend module ");
    write_text(path);
    write_text(
        " (in its constructor or probe(): a bug in that module; remove it from the plugin "
        "folder or ARBITER_PLUGIN_PATH)\n");
  }
  if (i < kCrashCount) sigaction(sig, &g_before[i], nullptr);
  // A fault the hardware raised comes again when this returns, now to the
  // handler before, with its own address and context; one sent by raise()
  // or kill() (abort() included) must be sent again.
  if (info == nullptr || info->si_code <= 0) raise(sig);
}

// Names `path` on stderr if the loading thread crashes while this lives.
class CrashNote {
 public:
  explicit CrashNote(const std::string& path) : lock_(g_loading_lock) {
    g_loading.store(path.c_str());
    g_loading_thread.store(static_cast<pid_t>(syscall(SYS_gettid)));
    struct sigaction note {};
    note.sa_sigaction = on_module_crash;
    sigemptyset(&note.sa_mask);
    note.sa_flags = SA_SIGINFO | SA_NODEFER;
    for (int i = 0; i < kCrashCount; ++i) sigaction(kCrashSignals[i], &note, &g_before[i]);
  }
  ~CrashNote() {
    // Only where the note still stands: a handler the module (or a library
    // it pulled in, or another thread) installed meanwhile is theirs to keep.
    for (int i = 0; i < kCrashCount; ++i) {
      struct sigaction now {};
      if (sigaction(kCrashSignals[i], nullptr, &now) == 0 && (now.sa_flags & SA_SIGINFO) &&
          now.sa_sigaction == on_module_crash) {
        sigaction(kCrashSignals[i], &g_before[i], nullptr);
      }
    }
    g_loading.store(nullptr);
    g_loading_thread.store(0);
  }
  CrashNote(const CrashNote&) = delete;
  CrashNote& operator=(const CrashNote&) = delete;

 private:
  std::lock_guard<std::mutex> lock_;
};

}  // namespace

struct Registry::Impl {
  std::vector<ModuleInfo> modules;
  std::vector<std::unique_ptr<Handle>> handles;  // kept open while the registry lives
  const arbiter_backend_v1_t* by_backend[kBackendCount] = {};
  int index_of[kBackendCount] = {-1, -1, -1, -1};
  arbiter_probe_args probed{};
  std::vector<SearchPathError> search_errors;
  std::string search_path_name;

  void load(const fs::path& path, const DiscoverOptions& options);
  void keep_open(void* dl) {
    handles.push_back(std::make_unique<Handle>());
    handles.back()->dl = dl;
  }
};

void Registry::Impl::load(const fs::path& path, const DiscoverOptions& options) {
  ModuleInfo info;
  info.path = path.string();
  constexpr std::string_view kPrefix = "libarbiter-";
  const std::string stem = path.stem().string();
  info.name = stem.rfind(kPrefix, 0) == 0 ? stem.substr(kPrefix.size()) : stem;
  auto record = [&](std::string reason) {
    info.available = reason.empty();
    info.reason = std::move(reason);
    modules.push_back(std::move(info));
  };
  if (!is_module_file(path) || info.name.empty()) {
    return record(
        "not a module file name: modules are named libarbiter-<backend>.so "
        "(libarbiter-shm.so, libarbiter-nccl.so, ...); rename it");
  }
  // Loaded once: the same file reached through two search entries is skipped;
  // another file of the same name in a later folder is shadowed by the first.
  for (const ModuleInfo& m : modules) {
    std::error_code ec;
    if (fs::equivalent(m.path, path, ec)) return;
    if (m.name == info.name) return record("shadowed by " + m.path);
  }
  // nccl needs libnccl.so.2: chosen first (nccl_library.h), so that its
  // DT_NEEDED binds to that file.
  std::optional<nccl_search::NcclChoice> nccl;
  if (info.name == "nccl") {
    nccl = nccl_search::find_nccl({options.nccl_library, options.nccl_wheel_folders});
    if (nccl->found) {
      keep_open(nccl->handle);
    } else if (!options.nccl_library.empty()) {
      return record(nccl->reason);
    }
  }
  auto handle = std::make_unique<Handle>();
  // Until probe() has answered: its constructors and probe() run here.
  std::optional<CrashNote> crash_note(std::in_place, info.path);
  dlerror();
  handle->dl = dlopen(info.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle->dl) {
    const char* e = dlerror();
    const std::string error = e ? e : "dlopen failed";
    if (nccl && !nccl->found) return record(nccl->reason + " (loading the module: " + error + ")");
    if (nccl) {
      return record("cannot load: " + error + " (with " + nccl_search::describe(*nccl) + ")");
    }
    return record("cannot load: " + error);
  }
  if (nccl && !nccl->found) {
    // Its RUNPATH found one (the toolkit's, in a build tree).
    nccl = nccl_search::loaded_by_module();
    if (nccl->found) keep_open(nccl->handle);
  }
  if (nccl && nccl->found) info.dependency = nccl_search::describe(*nccl);
  const arbiter_backend_v1_t* entry = nullptr;
  for (std::uint32_t v : kKnownVersions) {
    const std::string symbol = "arbiter_backend_v" + std::to_string(v);
    if (void* s = dlsym(handle->dl, symbol.c_str())) {
      entry = static_cast<const arbiter_backend_v1_t*>(s);
      info.abi_version = v;
      break;
    }
  }
  if (!entry) {
    for (std::uint32_t v = kHighestVersionProbed; v > kKnownVersions[0]; --v) {
      if (dlsym(handle->dl, ("arbiter_backend_v" + std::to_string(v)).c_str())) {
        info.abi_version = v;
        return record("module speaks backend ABI v" + std::to_string(v) + "; this arbiter knows v" +
                      std::to_string(kKnownVersions[0]) +
                      " (rebuild the module against this arbiter, or upgrade arbiter)");
      }
    }
    return record("missing symbol arbiter_backend_v" + std::to_string(kKnownVersions[0]) +
                  " (not an arbiter backend module?)");
  }
  if (entry->abi_version != info.abi_version) {
    return record("wrong ABI version: symbol arbiter_backend_v" + std::to_string(info.abi_version) +
                  " carries abi_version " + std::to_string(entry->abi_version));
  }
  if (!entry->name || !entry->probe || !entry->workspace_create || !entry->run ||
      !entry->workspace_destroy || !entry->last_error) {
    return record(
        "incomplete module: a required entry (name, probe, workspace_create, run, "
        "workspace_destroy, last_error) is NULL");
  }
  info.name = entry->name;
  Parsed<Backend> which = parse_backend(info.name);
  if (!which) {
    return record("module name '" + info.name + "' is not a backend the policy knows (" +
                  "trtllm, mnnvl, nccl, shm)");
  }
  for (const ModuleInfo& m : modules) {
    if (m.available && m.name == info.name) return record("shadowed by " + m.path);
  }
  info.backend = *which.value;
  if (const void* f = dlsym(handle->dl, ARBITER_BACKEND_FAULTS_SYMBOL_V1)) {
    const auto* faults = static_cast<const arbiter_backend_faults_v1_t*>(f);
    if (faults->faults_version != 1 || faults->module_version == nullptr) {
      return record(std::string("malformed ") + ARBITER_BACKEND_FAULTS_SYMBOL_V1 +
                    ": faults_version " + std::to_string(faults->faults_version) +
                    " (this arbiter knows 1), or a NULL module_version");
    }
    info.faults = faults;
    info.build = faults->module_version;
  }
  if (const void* m = dlsym(handle->dl, ARBITER_BACKEND_MEMORY_SYMBOL_V2)) {
    const auto* memory = static_cast<const arbiter_backend_memory_v2_t*>(m);
    if (memory->memory_version != 2 || memory->alloc == nullptr || memory->free == nullptr ||
        memory->run_registered == nullptr || memory->alignment == 0) {
      return record(std::string("malformed ") + ARBITER_BACKEND_MEMORY_SYMBOL_V2 +
                    ": memory_version " + std::to_string(memory->memory_version) +
                    " (this arbiter knows 2), a NULL entry or alignment 0 (rebuild the module)");
    }
    info.memory = memory;
    info.abi_version = ARBITER_BACKEND_ABI_VERSION_MEMORY;
  }
  if (const void* f = dlsym(handle->dl, ARBITER_BACKEND_FOOTPRINT_SYMBOL_V1)) {
    const auto* footprint = static_cast<const arbiter_backend_footprint_v1_t*>(f);
    if (footprint->footprint_version != 1 || footprint->footprint == nullptr) {
      return record(std::string("malformed ") + ARBITER_BACKEND_FOOTPRINT_SYMBOL_V1 +
                    ": footprint_version " + std::to_string(footprint->footprint_version) +
                    " (this arbiter knows 1), or a NULL entry (rebuild the module)");
    }
    // Kept even when probe() fails below: sizing needs no device.
    info.footprint = footprint;
    info.last_error = entry->last_error;
  }
  arbiter_backend_caps caps{};
  std::int32_t status = ARBITER_OK;
  try {
    status = entry->probe(&options.probe, &caps);
    crash_note.reset();
  } catch (...) {
    // Across a C ABI that is the module's bug; it costs the module, not
    // the rest of discovery.
    return record(
        "probe threw a C++ exception across the C ABI (a bug in the module: catch "
        "it and return a status)");
  }
  if (status != ARBITER_OK) {
    if (info.footprint != nullptr) handles.push_back(std::move(handle));  // still sizes
    return record("probe failed: " + module_error(entry));
  }
  // Read as its bytes: a module may have stored any value in the enum.
  std::underlying_type_t<arbiter_device_kind> kind;
  std::memcpy(&kind, &caps.device_kind, sizeof kind);
  if (kind != ARBITER_DEVICE_CPU && kind != ARBITER_DEVICE_GPU) {
    return record("probe answered caps.device_kind " + std::to_string(kind) +
                  ", which names no device kind (ARBITER_DEVICE_CPU or ARBITER_DEVICE_GPU; a bug "
                  "in the module)");
  }
  if (caps.device_kind != options.probe.device_kind) {
    return record(std::string("probe answered for a ") +
                  (caps.device_kind == ARBITER_DEVICE_CPU ? "CPU" : "GPU") +
                  " when asked about a " +
                  (options.probe.device_kind == ARBITER_DEVICE_CPU ? "CPU" : "GPU") +
                  " rank (caps.device_kind; a module serving only the other kind returns "
                  "ARBITER_UNAVAILABLE)");
  }
  info.caps = caps;
  by_backend[static_cast<int>(*which.value)] = entry;
  index_of[static_cast<int>(*which.value)] = static_cast<int>(modules.size());
  handles.push_back(std::move(handle));
  record({});
}

DiscoverOptions DiscoverOptions::from_environment() {
  DiscoverOptions o;
  if (const char* p = std::getenv("ARBITER_PLUGIN_PATH"); p && *p) o.search_path = split(p, ':');
  o.search_path_name = "ARBITER_PLUGIN_PATH";
  if (const char* l = std::getenv("LOCAL_RANK"); l && *l) o.probe.device = std::atoi(l);
  if (const char* n = std::getenv("ARBITER_NCCL_LIBRARY"); n && *n) o.nccl_library = n;
  // ARBITER_NCCL_WHEEL_DIR: where pip puts nvidia-nccl-cu13, relative to this
  // library's folder; set by the wheel's build (<site-packages>/arbiter/lib).
  if (const std::string wheel = ARBITER_NCCL_WHEEL_DIR; !wheel.empty()) {
    const std::string here = fs::path(Registry::default_plugin_folder()).parent_path().string();
    if (!here.empty()) o.nccl_wheel_folders.push_back((fs::path(here) / wheel).string());
  }
  return o;
}

std::string Registry::default_plugin_folder() {
  // The folder "arbiter" next to this library: <prefix>/lib/arbiter when
  // installed, <build>/lib/arbiter in a build tree.
  Dl_info dl{};
  if (dladdr(reinterpret_cast<void*>(&Registry::default_plugin_folder), &dl) && dl.dli_fname) {
    return (fs::path(dl.dli_fname).parent_path() / "arbiter").string();
  }
  return {};
}

Registry Registry::discover(const DiscoverOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->probed = options.probe;
  impl->search_path_name = options.search_path_name;
  std::vector<std::string> places = options.search_path;
  if (options.default_folder) places.push_back(default_plugin_folder());
  for (std::size_t i = 0; i < places.size(); ++i) {
    const bool asked = i < options.search_path.size();  // not the default folder
    auto refuse = [&](std::string reason) {
      if (asked) impl->search_errors.push_back({places[i], std::move(reason)});
    };
    std::error_code ec;
    const fs::path p(places[i]);
    const fs::file_status st = fs::status(p, ec);
    if (st.type() == fs::file_type::regular) {
      impl->load(p, options);
      continue;
    }
    if (st.type() != fs::file_type::directory) {
      // A missing entry sets ec too ("No such file or directory").
      refuse(ec ? ec.message() : "is neither a folder nor a module file");
      continue;
    }
    std::vector<fs::path> files;
    fs::directory_iterator it(p, ec);
    for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
      if (is_module_file(it->path())) files.push_back(it->path());
    }
    if (ec) {
      refuse("cannot list the folder: " + ec.message());
      continue;
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) impl->load(f, options);
  }
  return Registry(std::move(impl));
}

std::vector<AbsentModule> Registry::not_built() {
  // ARBITER_MODULES_NOT_BUILT: "name=reason|name=reason", from the build.
  std::vector<AbsentModule> out;
  for (const std::string& entry : split(ARBITER_MODULES_NOT_BUILT, '|')) {
    const auto at = entry.find('=');
    if (at != std::string::npos) out.push_back({entry.substr(0, at), entry.substr(at + 1)});
  }
  return out;
}

Registry::Registry(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Registry::Registry(Registry&&) noexcept = default;
Registry& Registry::operator=(Registry&&) noexcept = default;
Registry::~Registry() = default;

const std::vector<ModuleInfo>& Registry::modules() const { return impl_->modules; }

const arbiter_backend_v1_t* Registry::backend(Backend backend) const {
  return backend == Backend::kNone ? nullptr : impl_->by_backend[static_cast<int>(backend)];
}

const ModuleInfo* Registry::info(Backend backend) const {
  if (backend == Backend::kNone) return nullptr;
  const int i = impl_->index_of[static_cast<int>(backend)];
  return i < 0 ? nullptr : &impl_->modules[i];
}

const arbiter_backend_faults_v1_t* Registry::faults(Backend backend) const {
  const ModuleInfo* m = info(backend);
  return m != nullptr && m->available ? m->faults : nullptr;
}

const arbiter_backend_memory_v2_t* Registry::memory(Backend backend) const {
  const ModuleInfo* m = info(backend);
  return m != nullptr && m->available ? m->memory : nullptr;
}

const arbiter_probe_args& Registry::probed() const { return impl_->probed; }

const std::vector<SearchPathError>& Registry::search_errors() const { return impl_->search_errors; }

std::string Registry::search_error_message() const {
  std::string out;
  for (const SearchPathError& e : impl_->search_errors) {
    out += (out.empty() ? "" : "; ") +
           (impl_->search_path_name + " entry '" + e.place + "': " + e.reason);
  }
  if (!out.empty()) {
    out +=
        " (fix the entry or remove it: the modules it was meant to supply would be missing, or "
        "others would run in their place)";
  }
  return out;
}

std::uint32_t Registry::available_mask() const {
  std::uint32_t mask = 0;
  for (int b = 0; b < kBackendCount; ++b) {
    if (impl_->by_backend[b]) mask |= 1u << b;
  }
  return mask;
}

}  // namespace arbiter
