#include "job.h"

#include <cstdlib>
#include <sstream>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm/store.h"

namespace hp::run {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(100);  // how soon a node hears of another's failure

std::chrono::milliseconds store_timeout() {
  const char* v = std::getenv("HP_TIMEOUT_S");
  const double s = v && *v ? std::atof(v) : 300;
  return std::chrono::milliseconds(static_cast<int64_t>((s > 0 ? s : 300) * 1000));
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::string encode(const Outcome& o) {
  return std::to_string(o.exit_code) + " " + (o.interrupted ? "1" : "0") + "\n" + o.failure;
}

Outcome decode(const std::vector<uint8_t>& v) {
  Outcome o;
  const std::string s(v.begin(), v.end());
  std::istringstream in(s);
  int interrupted = 0;
  in >> o.exit_code >> interrupted;
  o.interrupted = interrupted != 0;
  const size_t nl = s.find('\n');
  o.failure = nl == std::string::npos ? s : s.substr(nl + 1);
  return o;
}

// A failure that ends the job on this node at once: the store (node 0's hprun) is gone.
Outcome lost_store(const Options& opt, int port, const std::exception& e) {
  Outcome o;
  o.interrupted = o.store_lost = true;
  o.exit_code = 1;
  o.failure = "lost the job's store at " + opt.master_addr + ":" + std::to_string(port) +
              " (node 0's hprun; did it die?): " + e.what();
  return o;
}

}  // namespace

Job::Job(const Options& opt) : opt_(opt) {
  const auto timeout = store_timeout();
  if (opt.node_rank == 0) {
    // One node: nothing outside this host may reach the store.
    store_ = comm::host_store(opt.nnodes == 1 ? "127.0.0.1" : "", opt.master_port, timeout);
    port_ = static_cast<int>(static_cast<c10d::TCPStore&>(*store_).getPort());
  } else {
    port_ = opt.master_port;
    store_ = comm::join_store(opt.master_addr, port_, timeout, "hprun on node " + std::to_string(opt.node_rank));
  }
  last_poll_ = Clock::now();
}

std::string Job::key(int attempt, const std::string& what) const {
  return "hprun/attempt_" + std::to_string(attempt) + "/" + what;
}

void Job::report(int attempt, const Outcome& failure) {
  try {
    store_->compareSet(key(attempt, "failure"), {}, bytes(encode(failure)));  // the first one stays
  } catch (const std::exception&) {
    // The store is gone: this node stops anyway; end_attempt says why.
  }
}

std::optional<Outcome> Job::reported(int attempt) {
  if (!store_->check({key(attempt, "failure")})) return std::nullopt;
  return decode(store_->get(key(attempt, "failure")));
}

AttemptLink Job::link(int attempt) {
  AttemptLink l;
  l.remote_failure = [this, attempt]() -> std::optional<Outcome> {
    if (opt_.nnodes == 1 || Clock::now() - last_poll_ < kPoll) return std::nullopt;
    last_poll_ = Clock::now();
    try {
      return reported(attempt);
    } catch (const std::exception& e) {
      return lost_store(opt_, port_, e);
    }
  };
  l.report = [this, attempt](const Outcome& o) { report(attempt, o); };
  return l;
}

Outcome Job::end_attempt(int attempt, const Outcome& local) {
  if (local.store_lost) return local;
  try {
    if (!local.ok) report(attempt, local);
    store_->set(key(attempt, "ended/" + std::to_string(opt_.node_rank)), bytes("1"));
    store_->add(key(attempt, "ended"), 1);
    std::optional<Clock::time_point> deadline;
    while (store_->add(key(attempt, "ended"), 0) < opt_.nnodes) {
      // Nodes still running healthy ranks may take as long as they need; once a failure is
      // known every node stops within its grace period, and one that does not is named.
      // Ctrl-C while waiting for slower nodes ends the job on every node.
      if (interrupted() && !store_->check({key(attempt, "failure")})) {
        Outcome o;
        o.interrupted = true;
        o.exit_code = 130;
        o.failure = "interrupted on node " + std::to_string(opt_.node_rank);
        report(attempt, o);
      }
      if (!deadline && store_->check({key(attempt, "failure")}))
        deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(opt_.grace_s + 30));
      if (deadline && Clock::now() > *deadline) {
        std::vector<int> missing;
        for (int n = 0; n < opt_.nnodes; ++n)
          if (!store_->check({key(attempt, "ended/" + std::to_string(n))})) missing.push_back(n);
        Outcome o = *reported(attempt);
        o.interrupted = true;
        o.failure += "; nodes " + to_string_list(missing) + " did not stop their ranks within " +
                     std::to_string(static_cast<int>(opt_.grace_s + 30)) + " s (is their hprun alive?)";
        return o;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (auto f = reported(attempt)) return *f;
    Outcome ok;
    ok.ok = true;
    return ok;
  } catch (const std::exception& e) {
    return lost_store(opt_, port_, e);
  }
}

void Job::leave() {
  try {
    store_->add("hprun/left", 1);
    if (opt_.node_rank != 0) return;
    const auto until = Clock::now() + std::chrono::seconds(30);
    while (store_->add("hprun/left", 0) < opt_.nnodes && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } catch (const std::exception&) {
    // Leaving anyway.
  }
}

}  // namespace hp::run
