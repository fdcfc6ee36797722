#include "hp/checkpoint/save.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/checkpoint/dtype.h"
#include "hp/comm/world.h"

namespace hp::checkpoint {
namespace fs = std::filesystem;

namespace {

std::string rank_file(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", rank);
  return buf;
}

std::string tmp_dir(const std::string& root, int64_t step) {
  return root + "/.tmp-" + fs::path(step_dir(root, step)).filename().string();
}

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

void job_barrier(const SaveJob& job, const std::string& name) {
  store_barrier(*job.store, job.key + "/" + name, job.world_size, job.timeout,
                "checkpoint step " + std::to_string(job.step) + ": rank " + std::to_string(job.rank) + " at '" + name + "'");
}

// Writes the pieces as one safetensors file; returns this rank's chunks.
Metadata write_rank_file(const SaveJob& job, const std::string& dir) {
  const std::string name = rank_file(job.rank), path = dir + "/" + name;
  std::vector<std::string> keys, dtypes;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> bytes;
  for (const auto& p : job.pieces) {
    const auto& whole = job.part.tensors.at(p.tensor).shape;
    keys.push_back(p.sizes == whole ? p.tensor : p.tensor + "@" + to_string_list(p.offsets, "", ""));
    dtypes.push_back(job.part.tensors.at(p.tensor).dtype);
    shapes.push_back(p.sizes);
    bytes.push_back(p.bytes);
  }
  const std::string header = safetensors_header(keys, dtypes, shapes, bytes);

  Metadata part = job.part;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  HP_CHECK(fd >= 0) << "checkpoint: cannot create " << path << ": " << std::strerror(errno);
  try {
    write_all(fd, header.data(), header.size(), path);
    int64_t at = static_cast<int64_t>(header.size());
    for (const auto& p : job.pieces) {
      Chunk c{p.offsets, p.sizes, name, at, at + p.bytes, {}};
      const auto* data = static_cast<const uint8_t*>(p.data.data_ptr());
      for (int64_t b = 0; b < p.bytes; b += kBlockBytes) {
        const size_t n = static_cast<size_t>(std::min(kBlockBytes, p.bytes - b));
        c.checksums.push_back(checksum(data + b, n));
        write_all(fd, data + b, n, path);
      }
      at += p.bytes;
      part.tensors.at(p.tensor).chunks.push_back(std::move(c));
    }
    HP_CHECK(::fsync(fd) == 0) << "checkpoint: cannot fsync " << path << ": " << std::strerror(errno);
    part.files[name] = FileMeta{at, checksum(header.data(), header.size())};
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return part;
}

// Moves the complete directory `tmp` to `final_dir`. A step saved again swaps the two
// atomically (RENAME_EXCHANGE) and then deletes the old one, so a crash at any point
// leaves one whole checkpoint there; where the file system cannot swap, the old one is
// renamed to .old-step-N first, which list_steps still finds until the new one is in place.
void publish_dir(const std::string& tmp, const std::string& final_dir, const std::string& root) {
  if (!fs::exists(final_dir)) {
    fs::rename(tmp, final_dir);
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_dir(root);
    fs::remove_all(tmp);  // now the old checkpoint
    return;
  }
  const std::string old = root + "/.old-" + fs::path(final_dir).filename().string();
  fs::remove_all(old);
  fs::rename(final_dir, old);
  fs::rename(tmp, final_dir);
}

// Puts back a checkpoint that a re-save interrupted between its renames left at
// .old-step-N (step-N missing), so that retention sees it where it belongs.
void restore_moved_aside(const std::string& root) {
  std::vector<fs::path> moved;  // collected first: renaming while iterating is unspecified
  for (const auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().rfind(".old-step-", 0) == 0) moved.push_back(e.path());
  for (const fs::path& p : moved) {
    const fs::path home = p.parent_path() / p.filename().string().substr(5);
    if (!fs::exists(home)) fs::rename(p, home);
  }
}

// Reads back what a reader checks first: the metadata (its checksum and chunks) and each
// file's size and header checksum.
void verify_written(const std::string& dir) {
  const Metadata m = read_metadata(dir);
  for (const auto& [file, meta] : m.files) verify_file(dir + "/" + file, meta);
}

// HP_CHECKPOINT_PAUSE=STEP:PATH (fault-injection tests): in the save of STEP, between
// writing metadata.json and publishing, rank 0 creates PATH and waits while it exists (up
// to the timeout), so that a test can kill the job there or damage files from outside.
void pause_for_fault_injection(const SaveJob& job) {
  const char* spec = std::getenv("HP_CHECKPOINT_PAUSE");
  if (!spec || !*spec) return;
  const std::string s = spec;
  const auto colon = s.find(':');
  HP_CHECK(colon != std::string::npos && colon > 0) << "HP_CHECKPOINT_PAUSE must be STEP:PATH, got '" << s << "'";
  if (std::stoll(s.substr(0, colon)) != job.step) return;
  const std::string path = s.substr(colon + 1);
  write_file_synced(path, std::to_string(job.step) + "\n");
  const auto deadline = std::chrono::steady_clock::now() + job.timeout;
  while (fs::exists(path) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

// Rank 0: merges every rank's part, writes metadata.json, renames the directory into place
// and drops what is no longer kept.
void publish(const SaveJob& job, const std::string& tmp) {
  Metadata all;
  all.step = job.step;
  all.scalars = job.part.scalars;
  for (int r = 0; r < job.world_size; ++r) {
    const std::string text = string_of(job.store->get(job.key + "/part/" + std::to_string(r)));
    HP_CHECK(text.rfind("error: ", 0) != 0) << "checkpoint step " << job.step << ": rank " << r << " failed to write: "
                                            << text.substr(7);
    merge_into(all, metadata_from_json(text, "rank " + std::to_string(r) + "'s part", /*part=*/true));
  }
  // Files left by an interrupted attempt at the same step are not part of this one.
  for (const auto& e : fs::directory_iterator(tmp))
    if (!all.files.count(e.path().filename().string())) fs::remove_all(e.path());
  write_file_synced(tmp + "/metadata.json", to_json(all));
  fsync_dir(tmp);
  pause_for_fault_injection(job);
  // Nothing is published, and so nothing older retired, unless it reads back whole.
  verify_written(tmp);

  restore_moved_aside(job.root);
  const std::string final_dir = step_dir(job.root, job.step);
  publish_dir(tmp, final_dir, job.root);
  fsync_dir(job.root);

  auto steps = list_steps(job.root);
  if (job.keep > 0 && static_cast<int64_t>(steps.size()) > job.keep)
    for (size_t i = 0; i + job.keep < steps.size(); ++i) fs::remove_all(step_dir(job.root, steps[i]));
  // Only one save is in flight at a time: any other temporary directory is from a crash.
  for (const auto& e : fs::directory_iterator(job.root)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp-", 0) == 0 || n.rfind(".old-", 0) == 0) fs::remove_all(e.path());
  }
}

}  // namespace

void store_barrier(c10d::Store& store, const std::string& key, int world_size, std::chrono::milliseconds timeout,
                   const std::string& who) {
  if (store.add(key, 1) == world_size) store.set(key + "/open", std::vector<uint8_t>{1});
  try {
    store.wait({key + "/open"}, timeout);
  } catch (const std::exception& e) {
    HP_FAIL() << who << " waited " << timeout.count() << " ms for the other ranks (" << e.what() << ")";
  }
}

std::string step_dir(const std::string& root, int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return root + "/" + buf;
}

std::vector<int64_t> list_steps(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string n = e.path().filename().string();
    // A save of a step again that stopped between its two renames left the old one here.
    const bool moved_away = n.rfind(".old-", 0) == 0;
    if (moved_away) n = n.substr(5);
    if (n.rfind("step-", 0) != 0 || n.size() <= 5 || n.find_first_not_of("0123456789", 5) != std::string::npos)
      continue;
    if (moved_away && fs::exists(fs::path(root) / n)) continue;
    if (fs::exists(e.path() / "metadata.json")) steps.push_back(std::stoll(n.substr(5)));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string published_dir(const std::string& root, int64_t step) {
  const std::string dir = step_dir(root, step);
  if (fs::exists(dir + "/metadata.json")) return dir;
  const std::string old = root + "/.old-" + fs::path(dir).filename().string();
  return fs::exists(old + "/metadata.json") ? old : dir;
}

std::optional<int64_t> latest_step(const std::string& root) {
  auto steps = list_steps(root);
  if (steps.empty()) return std::nullopt;
  return steps.back();
}

SaveJob plan_save(const std::string& root, int64_t step, int64_t keep, const State& state) {
  HP_CHECK(!root.empty()) << "checkpoint: no directory given";
  HP_CHECK(step >= 0) << "checkpoint: step must be >= 0, found " << step;
  auto world = comm::current_world();
  SaveJob job;
  job.root = root;
  job.step = step;
  job.keep = keep;
  job.rank = world->rank();
  job.world_size = world->size();
  job.store = world->store();
  job.timeout = world->timeout();
  // Every rank saves in the same order, so its own counter names the same save everywhere.
  const int64_t seq = job.store->add("hp/ckpt/seq/" + std::to_string(job.rank), 1);
  job.key = "hp/ckpt/" + std::to_string(seq);
  job.part.step = step;
  job.part.scalars = state.scalars;

  for (const auto& e : state.tensors) {
    const auto& spec = e.spec;
    job.part.tensors[e.name] = TensorMeta{dtype_name(e.local.scalar_type()), spec.shape(), {}};
    bool owner = true;
    for (int d = 0; d < spec.mesh().ndim(); ++d) {
      const Placement& p = spec.placement(d);
      HP_CHECK(!p.is_partial()) << "checkpoint: tensor " << e.name << " is " << spec.to_string()
                                << ": reduce its Partial placements before saving";
      if (!p.is_shard() && e.coord[d] != 0) owner = false;
    }
    if (!owner || e.local.numel() == 0) continue;
    at::Tensor data = e.local.detach().contiguous();
    job.pieces.push_back({e.name, data, spec.global_offset(e.coord), e.local.sizes().vec(),
                          static_cast<int64_t>(data.numel() * data.element_size())});
  }
  return job;
}

void write_and_commit(const SaveJob& job, const std::function<void()>& prepare,
                      const std::function<void()>& verify) {
  const std::string tmp = tmp_dir(job.root, job.step);
  const std::string part_key = job.key + "/part/" + std::to_string(job.rank);
  std::exception_ptr failed;
  std::string why;
  try {
    if (prepare) prepare();
    fs::create_directories(tmp);
    const std::vector<uint8_t> part = bytes_of(to_json(write_rank_file(job, tmp)));
    if (verify) verify();
    job.store->set(part_key, part);
  } catch (const std::exception& e) {
    failed = std::current_exception();
    why = e.what();
    job.store->set(part_key, bytes_of("error: " + why));
  }
  job_barrier(job, "written");
  const std::string done_key = job.key + "/published";
  if (failed) {
    // The others wait for rank 0 to publish: tell them it will not, and why.
    if (job.rank == 0) job.store->set(done_key, bytes_of("error: rank 0 failed to write its part: " + why));
    std::rethrow_exception(failed);
  }

  if (job.rank == 0) {
    try {
      publish(job, tmp);
      job.store->set(done_key, bytes_of("ok"));
    } catch (const std::exception& e) {
      job.store->set(done_key, bytes_of(std::string("error: ") + e.what()));
      throw;
    }
  } else {
    try {
      job.store->wait({done_key}, job.timeout);
    } catch (const std::exception& e) {
      HP_FAIL() << "checkpoint step " << job.step << ": rank " << job.rank << " waited " << job.timeout.count()
                << " ms for rank 0 to publish it (" << e.what() << ")";
    }
    const std::string status = string_of(job.store->get(done_key));
    HP_CHECK(status == "ok") << "checkpoint step " << job.step << " was not published: " << status.substr(7);
  }
}

}  // namespace hp::checkpoint
