// hprun end to end: separate processes, real TCPStore rendezvous.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "shell.h"

namespace {

Result run(const std::string& args, const std::string& env = "") {
  return shell(env + " " HP_BIN_DIR "/hprun " + args);
}

const std::string probe = RANK_PROBE;

// The job's shared-memory prefix the probe printed, and what of it is left in /dev/shm.
std::vector<std::string> segments_left(const std::string& output) {
  const std::string key = "shm prefix /";
  auto at = output.find(key);
  EXPECT_NE(at, std::string::npos) << output;
  if (at == std::string::npos) return {};
  const std::string stem = output.substr(at + key.size(), output.find('\n', at) - at - key.size()) + "-";
  EXPECT_GT(stem.size(), 10u) << output;
  std::vector<std::string> left;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind(stem, 0) == 0) left.push_back(e->d_name);
    ::closedir(d);
  }
  return left;
}

// What `probe listening` printed: the local address of each listening socket.
std::vector<std::string> listening(const std::string& output) {
  std::vector<std::string> found;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (auto at = line.find("listen "); at != std::string::npos && (at == 0 || line.find("]: listen ") == at - 3))
      found.push_back(line.substr(at + 7));
  return found;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// The text after `key` up to the end of its line in `text`, "" if absent.
std::string after(const std::string& text, const std::string& key) {
  const size_t at = text.find(key);
  return at == std::string::npos ? "" : text.substr(at + key.size(), text.find('\n', at) - at - key.size());
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

}  // namespace

TEST(Hprun, FourRanksRendezvousAndAllReduce) {
  Result r = run("--nproc-per-node 4 " + probe + " ok");
  EXPECT_EQ(r.code, 0) << r.output;
  for (int k = 0; k < 4; ++k)
    EXPECT_NE(r.output.find("[rank" + std::to_string(k) + "]: sum 6"), std::string::npos) << r.output;
  EXPECT_TRUE(segments_left(r.output).empty()) << r.output;  // shared-memory collectives left nothing
}

// Each rank gets its slice of the cores as threads unless told otherwise; an empty value
// tells nothing.
TEST(Hprun, AnEmptyThreadCountGetsTheRanksSlice) {
  cpu_set_t usable;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(usable), &usable), 0);
  const long slice = std::max(1, CPU_COUNT(&usable) / 2);
  Result r = run("--nproc-per-node 2 sh -c 'echo threads=$OMP_NUM_THREADS/$OPENBLAS_NUM_THREADS'",
                 "OMP_NUM_THREADS= OPENBLAS_NUM_THREADS=");
  EXPECT_EQ(r.code, 0) << r.output;
  const std::string want = "threads=" + std::to_string(slice) + "/" + std::to_string(slice);
  for (int k = 0; k < 2; ++k)
    EXPECT_NE(r.output.find("[rank" + std::to_string(k) + "]: " + want), std::string::npos) << r.output;
}

// The slice is of the cores hprun may run on: two emulated hosts on one machine each get
// their own cores (scripts/emulate_hosts pins them), and their ranks must not each take
// every core of the machine.
TEST(Hprun, TheSliceIsOfTheCoresItMayRunOn) {
  Result r = shell("OMP_NUM_THREADS= taskset -c 0 " HP_BIN_DIR
                   "/hprun --nproc-per-node 1 sh -c 'echo threads=$OMP_NUM_THREADS'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank0]: threads=1\n"), std::string::npos) << r.output;
}

TEST(Hprun, NoSharedMemoryLeftAfterSigkill) {
  // Rank 1 dies holding a named segment; the others wait until hprun stops them.
  Result r = run("--nproc-per-node 3 " + probe + " shm_signal 1");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank0]: shm sum 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank1]: left /hp-"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << r.output;
  EXPECT_TRUE(segments_left(r.output).empty()) << r.output;
}

TEST(Hprun, CrashingRankStopsTheOthersAndIsNamed) {
  // The survivors wait forever: the run ends only because hprun stops them.
  Result r = run("--nproc-per-node 3 " + probe + " crash 2");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("rank 2 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with code 3"), std::string::npos) << r.output;
}

TEST(Hprun, KilledRankIsNamedWithItsSignal) {
  Result r = run("--nproc-per-node 2 " + probe + " signal 1");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << r.output;
}

TEST(Hprun, AbsentRankGivesATimeoutNamingIt) {
  Result r = run("--nproc-per-node 3 " + probe + " absent 1", "HP_TIMEOUT_S=2");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("missing ranks [1]"), std::string::npos) << r.output;
}

TEST(Hprun, RestartsTheGroup) {
  // Rank 0 fails every time after a last word that must reach the output; rank 1 waits.
  Result r = run("--max-restarts 2 --nproc-per-node 2 bash -c "
                 "'if [ $RANK = 0 ]; then echo try $HP_RESTART_COUNT; exit 1; fi; sleep 30'");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("[rank0]: try 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("giving up after 2 restart(s)"), std::string::npos) << r.output;
}

TEST(Hprun, BadFlagsAreNamed) {
  Result r = run("--nproc-per-node zero true");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("--nproc-per-node expects an integer"), std::string::npos) << r.output;
  r = run("--nnodes 2 --nproc-per-node 1 true");
  EXPECT_NE(r.output.find("needs --master-addr and --master-port"), std::string::npos) << r.output;
  r = run("--nproc-per-node 1 /nonexistent/program");
  EXPECT_EQ(r.code, 127) << r.output;
  EXPECT_NE(r.output.find("cannot execute"), std::string::npos) << r.output;
}

TEST(Hprun, TrainsTheDemoModelEndToEnd) {
  // A short dp=2 x tp=2 run of `hp train` as 4 processes: the loss must fall.
  const std::string cfg = ::testing::TempDir() + "hp_train_e2e.toml";
  FILE* f = std::fopen(cfg.c_str(), "w");
  std::fputs("[mesh]\nshape = [2, 2]\nnames = [\"dp\", \"tp\"]\n"
             "[model]\ndim = 32\nlayers = 1\nheads = 2\nkv_heads = 2\nffn_dim = 64\nmax_seq = 16\n"
             "[train]\nsteps = 12\nbatch = 4\nseq = 16\nlr = 1e-2\nwarmup = 2\nlog_every = 4\n",
             f);
  std::fclose(f);
  Result r = run("--nproc-per-node 4 " HP_BIN_DIR "/hp train --config " + cfg);
  ASSERT_EQ(r.code, 0) << r.output;
  size_t at = r.output.find("[rank0]: done: loss ");
  ASSERT_NE(at, std::string::npos) << r.output;
  double first = 0, last = 0;
  ASSERT_EQ(std::sscanf(r.output.c_str() + at, "[rank0]: done: loss %lf -> %lf", &first, &last), 2) << r.output;
  EXPECT_LT(last, first) << r.output;
}

TEST(Hprun, TrainRejectsAMeshThatDoesNotFitTheRanks) {
  Result r = run("--nproc-per-node 2 " HP_BIN_DIR "/hp train --config " PROJECT_DIR "/configs/demo.toml");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("needs 4 ranks but 2 were started"), std::string::npos) << r.output;
}

TEST(Hprun, OnOneNodeTheStoreAndGlooListenOnLoopbackOnly) {
  // hprun hosts the store; every listening socket of hprun and the ranks, seen by ss.
  Result r = run("--nproc-per-node 2 " + probe + " listening");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto sockets = listening(r.output);
  EXPECT_GE(sockets.size(), 3u) << r.output;  // the store (hprun) and each rank's Gloo
  for (const auto& s : sockets) EXPECT_EQ(s.rfind("127.0.0.1:", 0), 0u) << s << "\n" << r.output;
}

TEST(Hprun, WithoutALauncherStoreRankZeroHostsItOnLoopbackOnOneHost) {
  // As mpirun or torchrun without its agent's store start ranks: rank 0 hosts the store.
  const std::string env = "WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=localhost MASTER_PORT=" +
                          std::to_string(free_port()) + " HP_TIMEOUT_S=60";
  Result r = shell("(" + env + " RANK=0 LOCAL_RANK=0 " + probe + " listening & " + env + " RANK=1 LOCAL_RANK=1 " +
                   probe + " listening; wait)");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto sockets = listening(r.output);
  EXPECT_GE(sockets.size(), 3u) << r.output;  // rank 0's store and each rank's Gloo
  for (const auto& s : sockets) EXPECT_EQ(s.rfind("127.0.0.1:", 0), 0u) << s << "\n" << r.output;
}

TEST(Hprun, RanksGrantMemoryAccessToTheLauncherOnly) {
  // PR_SET_PTRACER names hprun's pid (whose descendants the ranks are), never "any process".
  // strace shows the call even where the kernel has no Yama to honour it.
  if (shell("command -v strace").code != 0) GTEST_SKIP() << "no strace on this machine";
  const std::string trace = ::testing::TempDir() + "hprun_ptracer_" + std::to_string(::getpid()) + ".txt";
  // LeakSanitizer cannot run under ptrace: off for a sanitizer build, no effect otherwise.
  Result r = shell("ASAN_OPTIONS=detect_leaks=0 strace -f -qq -e trace=execve,prctl -o " + trace +
                   " " HP_BIN_DIR "/hprun --nproc-per-node 2 " + probe + " ok");
  const std::string calls = read_file(trace);
  std::remove(trace.c_str());
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string launcher = calls.substr(0, calls.find_first_of(" \t"));  // the first line: hprun's execve
  int granted = 0;
  std::istringstream in(calls);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("PR_SET_PTRACER, ");
    if (at == std::string::npos) continue;
    ++granted;  // "prctl(PR_SET_PTRACER, 123) = ..." or "prctl(PR_SET_PTRACER, 123 <unfinished ...>"
    const std::string tracer = line.substr(at + 16, line.find_first_of(") ", at + 16) - at - 16);
    EXPECT_EQ(tracer, launcher) << line << "\n" << calls;
  }
  EXPECT_EQ(granted, 2) << calls;  // once per rank
}

TEST(Hprun, AKilledLauncherTakesItsRanksAndTheNextRunRemovesTheirSegments) {
  // Rank 1 holds a named segment when hprun is SIGKILLed: hprun cannot remove it then.
  const std::string log = ::testing::TempDir() + "hprun_killed_" + std::to_string(::getpid()) + ".log";
  Result started = shell(HP_BIN_DIR "/hprun --nproc-per-node 2 " + probe + " shm_hold 1 > " + log + " 2>&1 & echo $!");
  const pid_t hprun = std::atoi(started.output.c_str());
  ASSERT_GT(hprun, 0) << started.output;
  std::string out;
  for (int i = 0; i < 600 && after(out, "[rank1]: pid ").empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    out = read_file(log);
  }
  ::kill(hprun, SIGKILL);
  const std::string segment = after(out, "[rank1]: left /");
  const pid_t rank = std::atoi(after(out, "[rank1]: pid ").c_str());
  ASSERT_FALSE(segment.empty()) << out;
  ASSERT_GT(rank, 0) << out;
  for (int i = 0; i < 300 && alive(rank); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(alive(rank)) << "rank 1 (pid " << rank << ") outlived hprun";
  if (alive(rank)) ::kill(rank, SIGKILL);
  // The segment outlives hprun; any process of this user that creates a segment meanwhile
  // (another test running beside this one) may remove it before the next run does.
  const std::string path = "/dev/shm/" + segment;
  Result next = run("--nproc-per-node 1 true");
  EXPECT_EQ(next.code, 0) << next.output;
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << path << " was not removed by the next run";
  ::unlink(path.c_str());
  std::remove(log.c_str());
}
