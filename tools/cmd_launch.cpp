// arbiter launch: start N local ranks with torchrun's environment, stream
// their output line by line prefixed with the rank, and stop them all when
// one fails or the time is up.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/bootstrap.h"
#include "arbiter/common/shm_object.h"
#include "cli.h"
#include "cpu_affinity.h"

extern char** environ;

namespace arbiter::cli {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxRanks = 1024;
constexpr int kExitTimeout = 124;            // as timeout(1)
constexpr std::size_t kMaxLine = 64 * 1024;  // longer lines are cut into pieces
// After the last rank exited, how long output of escaped descendants is read.
constexpr auto kDrainWait = std::chrono::seconds(1);

constexpr const char* kUsage =
    "usage: arbiter launch --nproc N [--timeout S] [--port P] [--bootstrap-port Q]\n"
    "                      [--grace S] [--cpu-affinity none|spread|CPUS] -- PROGRAM ARGS...\n"
    "\n"
    "Starts N ranks of PROGRAM on this host with RANK, WORLD_SIZE, LOCAL_RANK,\n"
    "LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT (a free port unless --port;\n"
    "torch.distributed's store listens there), ARBITER_BOOTSTRAP_PORT (arbiter's own\n"
    "bootstrap: --bootstrap-port, else ARBITER_BOOTSTRAP_PORT when set, else another free\n"
    "port), ARBITER_JOB_TOKEN (fresh and random), and UCX_TLS=tcp,self\n"
    "UCX_NET_DEVICES=lo unless already set. Each line a rank writes is printed as\n"
    "`[rank K] LINE` on the same stream (stdout or stderr); ranks read stdin from\n"
    "/dev/null.\n"
    "\n"
    "--cpu-affinity (or ARBITER_CPU_AFFINITY; the flag wins) pins each rank to one CPU:\n"
    "`spread` puts rank r on the r-th CPU this launcher may use, a list (0,2,4-7) on its\n"
    "r-th CPU, both wrapping around; `none` (the default) leaves placement to the kernel.\n"
    "Pinning helps on a host the job has to itself; on a shared one a pinned rank cannot\n"
    "move off a core another process keeps busy.\n"
    "\n"
    "When a rank exits non-zero or is killed, or --timeout passes, the other ranks get\n"
    "SIGTERM, then SIGKILL after --grace seconds, and one line says which rank failed\n"
    "and how. When a rank exits, whatever it left running in its process group is killed.\n"
    "At the end, arbiter's shared-memory objects that the ranks' processes left in\n"
    "/dev/shm (a rank killed while its peers opened them) are removed, each named.\n"
    "\n"
    "exit 0: every rank exited 0; 1: a rank failed; 124: --timeout passed;\n"
    "128+N: interrupted by signal N; 2: usage error\n\n";

// Self-pipe: the handlers only write the signal number.
int g_signal_pipe[2] = {-1, -1};

void on_signal(int signo) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signo);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // e.g. EPIPE: nobody reads our output any more
    done += static_cast<std::size_t>(n);
  }
}

std::string signal_text(int signo) {
  const char* name = sigabbrev_np(signo);
  return std::string(name ? std::string("SIG") + name : "signal " + std::to_string(signo)) + " (" +
         strsignal(signo) + ")";
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(ranks[i]);
  }
  return text;
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", seconds);
  return text;
}

double seconds_flag(const po::variables_map& vm, const char* flag, bool allow_zero) {
  const std::string text = vm[flag].as<std::string>();
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(value) ||
      value < 0 || (!allow_zero && value == 0) || value > 1e7) {
    throw UsageError{std::string("--") + flag + " '" + text + "' is not a number of seconds" +
                     (allow_zero ? " >= 0" : " > 0")};
  }
  return value;
}

std::string random_token() {
  unsigned char bytes[16];
  std::size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(std::string("getrandom failed: ") + std::strerror(errno));
    got += static_cast<std::size_t>(n);
  }
  static const char* kHex = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  return token;
}

// One output stream of a rank (its stdout or its stderr).
struct Stream {
  int fd = -1;     // read end; -1 once closed
  int target = 1;  // where its lines go
  std::string pending;
};

struct Rank {
  int index = 0;
  pid_t pid = -1;
  Stream out, err;
  bool running = false;
  bool signalled_term = false;
  bool signalled_kill = false;
  int wait_status = 0;
};

class Launcher {
 public:
  Launcher(int nproc, std::vector<std::string> program, std::optional<double> timeout, double grace,
           std::uint16_t port, std::uint16_t bootstrap_port, std::vector<int> cpus)
      : program_(std::move(program)),
        timeout_(timeout),
        grace_(grace),
        port_(port),
        bootstrap_port_(bootstrap_port),
        cpus_(std::move(cpus)) {
    ranks_.resize(nproc);
    for (int i = 0; i < nproc; ++i) ranks_[i].index = i;
  }

  int run();

 private:
  std::vector<std::string> environment_for(int rank, const std::string& token) const;
  bool start(Rank& rank, const std::string& token);
  void read_stream(Rank& rank, Stream& stream);
  void emit(const Rank& rank, Stream& stream, bool flush_all);
  void reap();
  void begin_stop(std::string reason, int exit_code);
  void kill_all(int signo);
  int finish();

  std::vector<std::string> program_;
  std::optional<double> timeout_;
  double grace_;
  std::uint16_t port_;            // MASTER_PORT
  std::uint16_t bootstrap_port_;  // ARBITER_BOOTSTRAP_PORT
  std::vector<int> cpus_;         // CPU of each rank; empty: not pinned
  std::vector<Rank> ranks_;
  pid_t self_ = ::getpid();

  bool stopping_ = false;
  std::string reason_;  // the first failure, "rank 2 exited with code 3"
  int exit_code_ = kExitOk;
  Clock::time_point kill_at_{};
};

std::vector<std::string> Launcher::environment_for(int rank, const std::string& token) const {
  const std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(ranks_.size())},
      {"LOCAL_RANK", std::to_string(rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(ranks_.size())},
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", std::to_string(port_)},
      {"ARBITER_BOOTSTRAP_PORT", std::to_string(bootstrap_port_)},
      {"ARBITER_JOB_TOKEN", token},
  };
  // Every rank is on this host: loopback TCP is the one transport sure to work.
  const std::vector<std::pair<std::string, std::string>> defaults = {
      {"UCX_TLS", "tcp,self"},
      {"UCX_NET_DEVICES", "lo"},
  };
  std::vector<std::string> env;
  auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const auto& [name, value] : ours) replaced = replaced || name_of(entry) == name;
    if (!replaced) env.push_back(entry);
  }
  for (const auto& [name, value] : ours) env.push_back(name + "=" + value);
  for (const auto& [name, value] : defaults) {
    if (std::getenv(name.c_str()) == nullptr) env.push_back(name + "=" + value);
  }
  return env;
}

bool Launcher::start(Rank& rank, const std::string& token) {
  int out[2], err[2], exec_error[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
      ::pipe2(exec_error, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // Everything the child needs is built before fork (no allocation after).
  std::vector<std::string> env = environment_for(rank.index, token);
  std::vector<char*> envp, argv;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  for (const std::string& a : program_) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const bool pinned = !cpus_.empty();
  cpu_set_t cpu{};
  CPU_ZERO(&cpu);
  if (pinned) CPU_SET(cpus_[static_cast<std::size_t>(rank.index)], &cpu);

  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // Own process group: stopping a rank stops what it started too.
    ::setpgid(0, 0);
    // Die with the launcher, even when it is SIGKILLed.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != self_) ::_exit(127);
    ::signal(SIGPIPE, SIG_DFL);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    if (pinned && ::sched_setaffinity(0, sizeof(cpu), &cpu) != 0) {
      const int error = -errno;  // negative: pinning failed, not exec
      [[maybe_unused]] ssize_t n = ::write(exec_error[1], &error, sizeof(error));
      ::_exit(127);
    }
    ::execvpe(argv[0], argv.data(), envp.data());
    const int error = errno;
    [[maybe_unused]] ssize_t n = ::write(exec_error[1], &error, sizeof(error));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so that no signal can miss the group
  ::close(out[1]);
  ::close(err[1]);
  ::close(exec_error[1]);
  if (devnull >= 0) ::close(devnull);
  rank.pid = pid;
  rank.running = true;
  rank.out = Stream{out[0], 1, {}};
  rank.err = Stream{err[0], 2, {}};
  int error = 0;
  ssize_t n;
  do {
    n = ::read(exec_error[0], &error, sizeof(error));
  } while (n < 0 && errno == EINTR);
  ::close(exec_error[0]);
  if (n == sizeof(error)) {
    // The child exits at once: reaped here, it is not among the ranks
    // stopped (it never ran).
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    rank.running = false;
    rank.wait_status = status;
    begin_stop(error < 0 ? "rank " + std::to_string(rank.index) + " could not be pinned to CPU " +
                               std::to_string(cpus_[static_cast<std::size_t>(rank.index)]) + ": " +
                               std::strerror(-error)
                         : "rank " + std::to_string(rank.index) + " could not start '" +
                               program_[0] + "': " + std::strerror(error),
               kExitFailed);
    return false;
  }
  return true;
}

void Launcher::emit(const Rank& rank, Stream& stream, bool flush_all) {
  const std::string prefix = "[rank " + std::to_string(rank.index) + "] ";
  std::string out;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t newline = stream.pending.find('\n', begin);
    if (newline == std::string::npos) break;
    out += prefix;
    out.append(stream.pending, begin, newline + 1 - begin);
    begin = newline + 1;
  }
  stream.pending.erase(0, begin);
  while (stream.pending.size() >= kMaxLine || (flush_all && !stream.pending.empty())) {
    const std::size_t take = std::min(stream.pending.size(), kMaxLine);
    out += prefix;
    out.append(stream.pending, 0, take);
    out += '\n';
    stream.pending.erase(0, take);
  }
  if (!out.empty()) write_all(stream.target, out);
}

void Launcher::read_stream(Rank& rank, Stream& stream) {
  char buffer[65536];
  const ssize_t n = ::read(stream.fd, buffer, sizeof(buffer));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    ::close(stream.fd);
    stream.fd = -1;
    emit(rank, stream, true);
    return;
  }
  stream.pending.append(buffer, static_cast<std::size_t>(n));
  emit(rank, stream, false);
}

void Launcher::reap() {
  for (;;) {
    siginfo_t info{};
    // WNOWAIT: the exited rank stays a zombie, so its pid (= its process
    // group id) cannot be reused while we kill what it left behind.
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    const pid_t pid = info.si_pid;
    ::kill(-pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    for (Rank& rank : ranks_) {
      if (rank.pid != pid) continue;
      rank.running = false;
      rank.wait_status = status;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !stopping_) {
        const std::string how = WIFEXITED(status)
                                    ? "exited with code " + std::to_string(WEXITSTATUS(status))
                                    : "was killed by " + signal_text(WTERMSIG(status));
        begin_stop("rank " + std::to_string(rank.index) + " " + how, kExitFailed);
      }
    }
  }
}

void Launcher::begin_stop(std::string reason, int exit_code) {
  if (stopping_) return;
  stopping_ = true;
  reason_ = std::move(reason);
  exit_code_ = exit_code;
  for (Rank& rank : ranks_) {
    if (rank.running) {
      ::kill(-rank.pid, SIGTERM);
      rank.signalled_term = true;
    }
  }
  kill_at_ = Clock::now() +
             std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_));
}

void Launcher::kill_all(int signo) {
  for (Rank& rank : ranks_) {
    if (!rank.running) continue;
    ::kill(-rank.pid, signo);
    if (signo == SIGKILL) rank.signalled_kill = true;
  }
}

int Launcher::run() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  // Every signal whose default would end the launcher at once (and leave
  // the ranks to die by their parent-death signal, with no summary and
  // nothing removed from /dev/shm) stops the job as SIGTERM does: all but
  // the faults of the launcher's own code, the stop and continue signals
  // and those ignored by default. SIGPIPE is ignored (a closed output).
  for (int signo = 1; signo <= SIGRTMAX; ++signo) {
    switch (signo) {
      case SIGKILL:
      case SIGSTOP:
      case SIGTSTP:
      case SIGTTIN:
      case SIGTTOU:
      case SIGCONT:
      case SIGSEGV:
      case SIGBUS:
      case SIGFPE:
      case SIGILL:
      case SIGTRAP:
      case SIGABRT:
      case SIGSYS:
      case SIGPIPE:
      case SIGURG:
      case SIGWINCH:
        continue;
      default:
        break;
    }
    // glibc's own real-time signals (below SIGRTMIN) are not ours to take.
    if (signo >= 32 && signo < SIGRTMIN) continue;
    ::sigaction(signo, &action, nullptr);
  }
  ::signal(SIGPIPE, SIG_IGN);

  const std::string token = random_token();
  const Clock::time_point started = Clock::now();
  for (Rank& rank : ranks_) {
    if (!start(rank, token)) break;
  }
  std::optional<Clock::time_point> deadline;
  if (timeout_) {
    deadline = started + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(*timeout_));
  }
  std::optional<Clock::time_point> drain_until;

  for (;;) {
    reap();
    const Clock::time_point now = Clock::now();
    bool any_running = false;
    for (const Rank& rank : ranks_) any_running = any_running || rank.running;
    if (deadline && now >= *deadline && any_running && !stopping_) {
      std::vector<int> still;
      for (const Rank& rank : ranks_) {
        if (rank.running) still.push_back(rank.index);
      }
      begin_stop("timed out after " + seconds_text(*timeout_) + " with " + rank_list(still) +
                     " still running",
                 kExitTimeout);
    }
    if (stopping_ && any_running && now >= kill_at_) kill_all(SIGKILL);

    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, Stream*>> owners;
    fds.push_back({g_signal_pipe[0], POLLIN, 0});
    owners.emplace_back(nullptr, nullptr);
    for (Rank& rank : ranks_) {
      for (Stream* stream : {&rank.out, &rank.err}) {
        if (stream->fd < 0) continue;
        fds.push_back({stream->fd, POLLIN, 0});
        owners.emplace_back(&rank, stream);
      }
    }
    if (!any_running) {
      if (fds.size() == 1) break;
      // Descendants that escaped their group may hold a pipe open forever.
      if (!drain_until) drain_until = now + kDrainWait;
      if (now >= *drain_until) break;
    }
    Clock::time_point wake = now + std::chrono::seconds(1);
    if (deadline && !stopping_) wake = std::min(wake, *deadline);
    if (stopping_ && any_running) wake = std::min(wake, kill_at_);
    if (drain_until) wake = std::min(wake, *drain_until);
    const auto wait_ms = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
    const int ready =
        ::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(wait_ms, 0)));
    if (ready < 0 && errno != EINTR)
      throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
    if (ready <= 0) continue;
    if (fds[0].revents & POLLIN) {
      unsigned char signals[64];
      const ssize_t n = ::read(g_signal_pipe[0], signals, sizeof(signals));
      for (ssize_t i = 0; i < n; ++i) {
        const int signo = signals[i];
        if (signo == SIGCHLD) continue;  // reap() runs at the top of the loop
        if (stopping_) {
          // A second interrupt from the user: no more grace. Others (SIGXCPU
          // repeats every second) leave the grace period alone.
          if (signo == SIGINT || signo == SIGTERM || signo == SIGHUP || signo == SIGQUIT) {
            kill_all(SIGKILL);
          }
        } else {
          begin_stop("interrupted by " + signal_text(signo), 128 + signo);
        }
      }
    }
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR))
        read_stream(*owners[i].first, *owners[i].second);
    }
  }
  return finish();
}

// Removes what the ranks' processes, all gone now, left in /dev/shm. A
// rank killed between creating a shared object and the exchange after which
// it unlinks it (its peers opened it) leaves it there: SIGTERM from this
// launcher while it waits in that exchange, for one. arbiter's objects are
// named arbiter-shm-[kind-]GGGGGGGGRRRRRRRR, G the creator's process group
// (arbiter/common/shm_object.h), and each rank leads its own group. A
// rank's pid is free once it was reaped: an object is removed only while
// no process is in that group, so another job's rank that got the pid
// since keeps its objects.
void remove_left_in_dev_shm(const std::vector<Rank>& ranks) {
  namespace fs = std::filesystem;
  constexpr std::string_view kPrefix = "arbiter-shm-";
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kPrefix) || name.size() < kPrefix.size() + 16) continue;
    const std::optional<pid_t> group = common::shm_object_creator_group(name);
    if (!group) continue;
    const pid_t pgid = *group;
    for (const Rank& rank : ranks) {
      if (rank.pid <= 0 || rank.pid != pgid) continue;
      if (::kill(-pgid, 0) == 0 || errno != ESRCH) continue;  // the group lives (again)
      const std::uintmax_t bytes = entry.file_size(ec);
      if (::shm_unlink(("/" + name).c_str()) == 0) {
        std::cerr << "arbiter launch: removed /dev/shm/" << name << " ("
                  << (ec ? std::string("?") : std::to_string(bytes)) << " bytes), left by rank "
                  << rank.index << "'s processes" << std::endl;
      }
    }
  }
}

int Launcher::finish() {
  for (Rank& rank : ranks_) {
    for (Stream* stream : {&rank.out, &rank.err}) {
      if (stream->fd < 0) continue;
      emit(rank, *stream, true);
      ::close(stream->fd);
      stream->fd = -1;
    }
  }
  remove_left_in_dev_shm(ranks_);
  if (!stopping_) return kExitOk;
  std::vector<int> stopped, killed;
  for (const Rank& rank : ranks_) {
    if (rank.signalled_term) stopped.push_back(rank.index);
    if (rank.signalled_kill) killed.push_back(rank.index);
  }
  std::string line = "arbiter launch: " + reason_;
  if (!stopped.empty()) line += "; stopped " + rank_list(stopped);
  if (!killed.empty()) {
    line += " (" + rank_list(killed) + " needed SIGKILL after " + seconds_text(grace_) + ")";
  }
  std::cerr << line << std::endl;
  return exit_code_;
}

}  // namespace

int cmd_launch(const Args& args) {
  // Everything after the first `--` belongs to the program.
  Args own = args;
  std::vector<std::string> program;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {
      own.assign(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(i));
      program.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    }
  }
  po::options_description desc("arbiter launch options");
  desc.add_options()("nproc", po::value<std::string>(), "ranks to start (required, 1..1024)")(
      "timeout", po::value<std::string>(), "stop every rank after S seconds (default: never)")(
      "port", po::value<std::string>(), "MASTER_PORT (default: a free port of 127.0.0.1)")(
      "bootstrap-port", po::value<std::string>(),
      "ARBITER_BOOTSTRAP_PORT, where arbiter's rank 0 listens (default: ARBITER_BOOTSTRAP_PORT "
      "when set, else a free port other than MASTER_PORT)")(
      "grace", po::value<std::string>()->default_value("5"),
      "seconds between SIGTERM and SIGKILL when stopping ranks")(
      "cpu-affinity", po::value<std::string>(),
      "pin rank r to one CPU: none (default), spread, or a list such as 0,2,4-7 "
      "(default: ARBITER_CPU_AFFINITY)")("program", po::value<std::vector<std::string>>(),
                                         "the program (better after `--`)")("help,h", "this help");
  po::positional_options_description positional;
  positional.add("program", -1);
  po::variables_map vm;
  try {
    vm = parse(own, desc, &positional);
  } catch (const UsageError& e) {
    throw UsageError{e.message + " (hint: put the program and its arguments after `--`)"};
  }
  if (vm.count("help")) {
    std::cout << kUsage << desc;
    return kExitOk;
  }
  if (vm.count("program")) {
    if (!program.empty()) {
      throw UsageError{"give the program once, after `--`"};
    }
    program = vm["program"].as<std::vector<std::string>>();
  }
  if (!vm.count("nproc")) throw UsageError{"--nproc N is required"};
  const std::string nproc_text = vm["nproc"].as<std::string>();
  int nproc = 0;
  {
    bool digits = !nproc_text.empty() && nproc_text.size() <= 5;
    for (char c : nproc_text) digits = digits && c >= '0' && c <= '9';
    nproc = digits ? std::stoi(nproc_text) : 0;
    if (nproc < 1 || nproc > kMaxRanks) {
      throw UsageError{"--nproc '" + nproc_text + "' is not a number of ranks in 1.." +
                       std::to_string(kMaxRanks)};
    }
  }
  std::optional<double> timeout;
  if (vm.count("timeout")) timeout = seconds_flag(vm, "timeout", false);
  const double grace = seconds_flag(vm, "grace", true);
  auto port_flag = [](const std::string& text, const std::string& what) {
    bool digits = !text.empty() && text.size() <= 5;
    for (char c : text) digits = digits && c >= '0' && c <= '9';
    const long value = digits ? std::stol(text) : 0;
    if (value < 1 || value > 65535) {
      throw UsageError{what + " '" + text + "' is not a port number in 1..65535"};
    }
    return static_cast<std::uint16_t>(value);
  };
  std::uint16_t port = 0;
  if (vm.count("port")) port = port_flag(vm["port"].as<std::string>(), "--port");
  std::uint16_t bootstrap_port = 0;
  if (vm.count("bootstrap-port")) {
    bootstrap_port = port_flag(vm["bootstrap-port"].as<std::string>(), "--bootstrap-port");
  } else if (const char* env = std::getenv("ARBITER_BOOTSTRAP_PORT"); env && *env) {
    bootstrap_port = port_flag(env, "ARBITER_BOOTSTRAP_PORT");
  }
  if (program.empty()) {
    throw UsageError{"give the program to run: arbiter launch --nproc N -- PROGRAM ARGS..."};
  }
  std::vector<int> cpus;
  if (vm.count("cpu-affinity")) {
    cpus = cpus_for_ranks(vm["cpu-affinity"].as<std::string>(), "--cpu-affinity", nproc,
                          allowed_cpus());
  } else if (const char* env = std::getenv("ARBITER_CPU_AFFINITY")) {
    cpus = cpus_for_ranks(env, "ARBITER_CPU_AFFINITY", nproc, allowed_cpus());
  }
  if (!cpus.empty()) {
    std::string text;
    for (std::size_t r = 0; r < cpus.size(); ++r) {
      text += (r == 0 ? "" : ", ") + std::to_string(r) + ":" + std::to_string(cpus[r]);
    }
    std::cerr << "arbiter launch: ranks pinned to CPUs (rank:cpu) " << text << "\n";
  }
  // Two ports: a torch.distributed store on MASTER_PORT may listen while
  // arbiter's rank 0 joins its group (torch first, or both at once).
  if (port == 0) {
    do port = free_bootstrap_port();
    while (port == bootstrap_port);
  }
  if (bootstrap_port == 0) {
    do bootstrap_port = free_bootstrap_port();
    while (bootstrap_port == port);
  }
  if (bootstrap_port == port) {
    throw UsageError{
        "arbiter's bootstrap port (" +
        std::string(vm.count("bootstrap-port") ? "--bootstrap-port" : "ARBITER_BOOTSTRAP_PORT") +
        ") and MASTER_PORT (--port) are both " + std::to_string(port) +
        ": torch.distributed's store and arbiter's rank 0 would both listen there; "
        "give them different ports"};
  }
  return Launcher(nproc, std::move(program), timeout, grace, port, bootstrap_port, std::move(cpus))
      .run();
}

}  // namespace arbiter::cli
