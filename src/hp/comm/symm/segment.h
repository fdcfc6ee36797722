// One POSIX shared-memory segment: created by its owner (mode 0600, a name nobody can
// guess) or mapped by a peer from that name. The mapping outlives the name: the owner
// unlinks it as soon as every peer has mapped it; a creator killed before that leaves its
// name behind, which its launcher or the next run removes (reap_orphan_segments).
#pragma once

#include <cstddef>
#include <string>

namespace hp::symm {

class Segment {
 public:
  Segment() = default;
  // A fresh segment of `bytes` named "<prefix>-<random 64-bit hex>-<tag>@<pid>.<pid ns>".
  // The prefix is $HP_SHM_PREFIX (set by hprun, which removes what a killed job leaves)
  // or "/hp-<uid>".
  static Segment create(size_t bytes, const std::string& tag);
  // Maps the segment `name`, which must hold `bytes` and be this user's with mode 0600.
  static Segment open(const std::string& name, size_t bytes);

  Segment(Segment&& o) noexcept;
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  void unlink();  // removes the name; the mapping stays valid
  char* data() const { return static_cast<char*>(base_); }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool named_ = false;  // we own the name and have not unlinked it yet
};

// $HP_SHM_PREFIX, else "/hp-<uid>": what every segment name of this job starts with.
std::string segment_prefix();

// Removes this user's segments whose creator has died: a rank SIGKILLed before it unlinked
// its name leaves one, which its launcher removes unless the launcher was killed too. Names
// end in "@<creator pid>.<pid namespace>"; a segment from another pid namespace is never
// touched, and a pid reused by a live process only delays the removal. Called by hprun at
// start and before each segment is created, so the next run of the same user cleans up.
void reap_orphan_segments();

}  // namespace hp::symm
