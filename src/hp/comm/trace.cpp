#include "hp/comm/trace.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>

#include "hp/comm/world.h"

namespace hp::trace {
namespace {

constexpr size_t kMaxEvents = size_t{1} << 20;

const char* prefix() {
  static const char* p = [] {
    const char* v = std::getenv("HP_TRACE");
    return v && *v ? v : nullptr;
  }();
  return p;
}

std::atomic<bool>& on() {
  static std::atomic<bool> flag{prefix() != nullptr};
  return flag;
}

// The process's events, written to <HP_TRACE>.<lowest rank>.json when it exits.
struct Recorder {
  std::mutex mu;
  std::vector<Event> events;
  ~Recorder() {
    if (!prefix() || events.empty()) return;
    int rank = events.front().rank;
    for (const Event& e : events) rank = std::min(rank, e.rank);
    std::ofstream(std::string(prefix()) + "." + std::to_string(rank) + ".json") << to_chrome_json(events);
  }
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

}  // namespace

bool enabled() { return on().load(std::memory_order_relaxed); }
void set_enabled(bool v) { on() = v; }

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Span::Span(const char* category, std::string name, int rank, int lane) : on_(enabled() && !name.empty()) {
  if (!on_) return;
  e_.name = std::move(name);
  e_.category = category;
  if (rank < 0) rank = comm::is_initialized() ? comm::current_world()->rank() : 0;
  e_.rank = rank;
  e_.lane = lane;
  e_.begin_us = now_us();
}

Span::~Span() {
  if (!on_) return;
  e_.duration_us = now_us() - e_.begin_us;
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.events.size() < kMaxEvents) r.events.push_back(std::move(e_));
}

std::vector<Event> events() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.events;
}

void clear() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events.clear();
}

std::string to_chrome_json(const std::vector<Event>& events) {
  nlohmann::json out = nlohmann::json::array();
  std::set<int> ranks;
  for (const Event& e : events) {
    ranks.insert(e.rank);
    out.push_back({{"name", e.name}, {"cat", e.category}, {"ph", "X"}, {"ts", e.begin_us},
                   {"dur", e.duration_us}, {"pid", e.rank}, {"tid", e.lane}});
  }
  for (int r : ranks) {
    out.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r}, {"args", {{"name", "rank " + std::to_string(r)}}}});
    out.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", kCaller}, {"args", {{"name", "caller"}}}});
    out.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", kEngine}, {"args", {{"name", "engine"}}}});
  }
  return nlohmann::json{{"traceEvents", out}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace hp::trace
