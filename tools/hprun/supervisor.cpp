#include "supervisor.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "hp/base/error.h"

namespace hp::run {
namespace {

// The cores this process may run on (a cpuset, taskset, an emulated host's share), not
// every core the machine has.
long usable_cores() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
}

volatile std::sig_atomic_t g_interrupted = 0;

void on_interrupt(int) { g_interrupted = 1; }

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1;  // child's stdout, relayed to ours
  int err_fd = -1;  // child's stderr, relayed to ours
  std::string out_buf, err_buf;
  bool running = false;
};

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Emits every complete line of `buf` with the rank prefix; keeps the tail.
void flush_lines(int rank, std::string& buf, int to_fd, bool final) {
  const std::string prefix = "[rank" + std::to_string(rank) + "]: ";
  size_t start = 0, nl;
  std::string out;
  while ((nl = buf.find('\n', start)) != std::string::npos) {
    out += prefix + buf.substr(start, nl - start + 1);
    start = nl + 1;
  }
  buf.erase(0, start);
  if (final && !buf.empty()) {
    out += prefix + buf + "\n";
    buf.clear();
  }
  write_all(to_fd, out);
}

// Reads what is available; returns false at end of file.
bool pump(int& fd, std::string& buf, int rank, int to_fd) {
  char chunk[65536];
  ssize_t n = ::read(fd, chunk, sizeof chunk);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    flush_lines(rank, buf, to_fd, true);
    ::close(fd);
    fd = -1;
    return false;
  }
  buf.append(chunk, static_cast<size_t>(n));
  flush_lines(rank, buf, to_fd, false);
  return true;
}

std::string describe(const Options& opt, int rank, pid_t pid, int status) {
  std::string who = "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ")";
  if (opt.nnodes > 1) who += " on node " + std::to_string(opt.node_rank);
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return who + " was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return who + " exited with code " + std::to_string(WEXITSTATUS(status));
}

// What every shared-memory segment of one attempt's ranks is named after (hp/comm/symm):
// "/hp-<uid>-<random tag>". Ranks unlink their segments once mapped; a rank killed before
// that leaves one, which remove_segments takes away when the attempt ends.
std::string segment_prefix() {
  std::random_device rd;
  char tag[17];
  std::snprintf(tag, sizeof tag, "%08x%08x", rd(), rd());
  return "/hp-" + std::to_string(::getuid()) + "-" + tag;
}

void remove_segments(const std::string& prefix) {
  const std::string stem = prefix.substr(1) + "-";
  DIR* d = ::opendir("/dev/shm");
  if (!d) return;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d))
    if (std::string(e->d_name).rfind(stem, 0) == 0) names.push_back(e->d_name);
  ::closedir(d);
  for (const auto& n : names) ::shm_unlink(("/" + n).c_str());
}

pid_t spawn(const Options& opt, int rank, int local_rank, int port, int restart_count,
            const std::string& shm_prefix, int out_w, int err_w) {
  const pid_t launcher = ::getpid();
  pid_t pid = ::fork();
  HP_CHECK(pid >= 0) << "fork failed: " << std::strerror(errno);
  if (pid > 0) return pid;
  // Child: its own process group, so that stopping it stops what it started.
  ::setpgid(0, 0);
  // A rank does not outlive hprun, even one killed with SIGKILL (which cannot stop it).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(128 + SIGKILL);  // hprun died before the line above
  ::dup2(out_w, 1);
  ::dup2(err_w, 2);
  const int world = opt.nproc_per_node * opt.nnodes;
  auto set = [](const char* k, const std::string& v) { ::setenv(k, v.c_str(), 1); };
  set("RANK", std::to_string(rank));
  set("LOCAL_RANK", std::to_string(local_rank));
  set("WORLD_SIZE", std::to_string(world));
  set("LOCAL_WORLD_SIZE", std::to_string(opt.nproc_per_node));
  set("GROUP_RANK", std::to_string(opt.node_rank));  // torchrun's name
  set("NODE_RANK", std::to_string(opt.node_rank));
  set("MASTER_ADDR", opt.master_addr);
  set("MASTER_PORT", std::to_string(port));
  set("HP_RESTART_COUNT", std::to_string(restart_count));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count));
  set("HP_SHM_PREFIX", shm_prefix);
  // hprun hosts the store; the ranks join it under their attempt's prefix, as torchrun's do.
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  // Whose descendants may read a rank's memory (hp/comm/symm/cross_memory.h).
  set("HP_LAUNCHER_PID", std::to_string(launcher));
  // Like torchrun: ranks share the cores, so each gets its slice of threads unless told
  // otherwise (oversubscribed OpenMP/OpenBLAS pools spin and starve communication).
  const long cores = std::max(1L, usable_cores() / opt.nproc_per_node);
  // Set but empty counts as unset: OpenMP would take every core for every rank (20x slower
  // steps of the demo at 4 ranks on 2 cores).
  for (const char* k : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"})
    if (const char* v = ::getenv(k); !v || !*v) set(k, std::to_string(cores));
  // Large short-lived tensors: back malloc'd memory with huge pages (512x fewer faults).
  if (!::getenv("GLIBC_TUNABLES")) set("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1");
  std::vector<char*> argv;
  for (const auto& a : opt.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  std::string msg = "hprun: cannot execute '" + opt.command[0] + "': " + std::strerror(errno) + "\n";
  write_all(2, msg);
  ::_exit(127);
}

}  // namespace

void install_interrupt_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

bool interrupted() { return g_interrupted != 0; }

Outcome run_attempt(const Options& opt, int master_port, int restart_count, const AttemptLink& link) {
  const std::string shm_prefix = segment_prefix();
  std::vector<Rank> ranks(opt.nproc_per_node);
  for (int l = 0; l < opt.nproc_per_node; ++l) {
    int out[2], err[2];
    HP_CHECK(::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0)
        << "pipe failed: " << std::strerror(errno);
    Rank& r = ranks[l];
    r.rank = opt.node_rank * opt.nproc_per_node + l;
    r.pid = spawn(opt, r.rank, l, master_port, restart_count, shm_prefix, out[1], err[1]);
    ::setpgid(r.pid, r.pid);  // also here: no race with the child's own call
    ::close(out[1]);
    ::close(err[1]);
    r.out_fd = out[0];
    r.err_fd = err[0];
    r.running = true;
  }

  Outcome outcome;
  outcome.ok = true;
  bool stopping = false;
  auto stop_started = std::chrono::steady_clock::now();
  bool killed = false;
  bool remote_failure = false, reported = false;

  auto stop_all = [&](int sig) {
    for (auto& r : ranks)
      if (r.running) ::kill(-r.pid, sig);
  };

  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, bool>> owners;  // (rank, is_stderr)
    for (auto& r : ranks) {
      if (r.out_fd >= 0) fds.push_back({r.out_fd, POLLIN, 0}), owners.push_back({&r, false});
      if (r.err_fd >= 0) fds.push_back({r.err_fd, POLLIN, 0}), owners.push_back({&r, true});
    }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 50);
    else ::usleep(20000);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Rank* r = owners[i].first;
      if (owners[i].second) pump(r->err_fd, r->err_buf, r->rank, 2);
      else pump(r->out_fd, r->out_buf, r->rank, 1);
    }

    bool any_running = false;
    for (auto& r : ranks) {
      if (!r.running) continue;
      int status = 0;
      pid_t got = ::waitpid(r.pid, &status, WNOHANG);
      if (got == r.pid) {
        r.running = false;
        bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && outcome.ok && !stopping) {
          outcome.ok = false;
          outcome.failure = describe(opt, r.rank, r.pid, status);
          outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
      } else {
        any_running = true;
      }
    }

    if (g_interrupted && !outcome.interrupted) {
      outcome.interrupted = true;
      outcome.ok = false;
      outcome.exit_code = 130;
      if (outcome.failure.empty())
        outcome.failure = opt.nnodes > 1 ? "interrupted on node " + std::to_string(opt.node_rank) : "interrupted";
    }
    // A failure on another node stops this one's ranks too; one here is told to the others.
    if (outcome.ok && !stopping && link.remote_failure)
      if (auto remote = link.remote_failure()) outcome = *remote, remote_failure = true;
    if (!outcome.ok && !remote_failure && !reported && link.report) reported = true, link.report(outcome);
    if (!outcome.ok && !stopping && any_running) {
      stopping = true;
      stop_started = std::chrono::steady_clock::now();
      stop_all(SIGTERM);
    }
    if (stopping && !killed && any_running &&
        std::chrono::steady_clock::now() - stop_started > std::chrono::duration<double>(opt.grace_s)) {
      killed = true;
      stop_all(SIGKILL);
    }
    bool pipes_open = false;
    for (auto& r : ranks) pipes_open |= r.out_fd >= 0 || r.err_fd >= 0;
    // A grandchild may hold a pipe open after its rank died: do not wait for it once stopping.
    if (!any_running && (!pipes_open || stopping)) break;
    if (!any_running && !outcome.ok) break;
  }
  // What the ranks wrote before they ended (a failing rank's last words above all) may
  // still sit in the pipes: drain them, but give up on a pipe held open by a grandchild.
  const auto drain_until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (auto& r : ranks) {
    for (auto [fd, buf, to] : {std::make_tuple(&r.out_fd, &r.out_buf, 1), std::make_tuple(&r.err_fd, &r.err_buf, 2)}) {
      while (*fd >= 0 && std::chrono::steady_clock::now() < drain_until) {
        pollfd p{*fd, POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) break;
        pump(*fd, *buf, r.rank, to);
      }
      if (*fd >= 0) flush_lines(r.rank, *buf, to, true), ::close(*fd);
    }
  }
  remove_segments(shm_prefix);
  return outcome;
}

}  // namespace hp::run
