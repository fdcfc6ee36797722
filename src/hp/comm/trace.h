// A timeline of what each rank computes and communicates, to see whether communication
// hides behind computation: spans recorded while HP_TRACE names a file prefix, written at
// exit as Chrome trace events (chrome://tracing, Perfetto) to <HP_TRACE>.<rank>.json, one
// file per process (ranks run as threads share their process's), and drawn by `hp trace`.
//
// Each span has a rank and a lane: the caller (compute spans, synchronous collectives, and
// "wait" spans where it blocks on an asynchronous one) or the progress engine (the
// asynchronous collectives it runs). Collectives and the trainer's phases record spans;
// anything else can with trace::Span. Off, a Span costs one branch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hp::trace {

enum Lane : int { kCaller = 0, kEngine = 1 };

struct Event {
  std::string name, category;  // category: compute, comm, wait
  int rank = 0;
  int lane = kCaller;
  int64_t begin_us = 0, duration_us = 0;  // steady clock, shared by a host's processes
};

// HP_TRACE is set (read once), or set_enabled(true) was called.
bool enabled();
void set_enabled(bool on);
int64_t now_us();

class Span {
 public:
  // rank < 0: the calling thread's world's rank (0 without one). An empty name records
  // nothing (callers build names only while tracing).
  Span(const char* category, std::string name, int rank = -1, int lane = kCaller);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool on_;
  Event e_;
};

// The events recorded in this process so far (at most 2^20: the oldest are kept).
std::vector<Event> events();
void clear();

// Chrome's trace-event JSON: complete ("X") events, pid = rank, tid = lane, with names
// for both.
std::string to_chrome_json(const std::vector<Event>& events);

}  // namespace hp::trace
