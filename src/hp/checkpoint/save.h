// Saving, in two halves so that the second can run on a background thread:
// plan_save (calling thread) picks the chunks this rank owns and fixes the order of the
// store rendezvous; write_and_commit writes them, meets the other ranks through the
// rendezvous store (not a process group: it may run beside training collectives) and,
// on rank 0, publishes the checkpoint.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hp/checkpoint/format.h"
#include "hp/checkpoint/state.h"
#include "hp/comm/backend.h"

namespace hp::checkpoint {

// One chunk this rank writes: its bytes (row-major) and where it lies in the tensor.
struct Piece {
  std::string tensor;
  at::Tensor data;  // contiguous, of shape `sizes`; what is written
  std::vector<int64_t> offsets, sizes;
  int64_t bytes = 0;
};

struct SaveJob {
  std::string root;
  int64_t step = 0;
  int64_t keep = 0;  // checkpoints kept after this one is published; 0 = all
  std::vector<Piece> pieces;
  Metadata part;  // every tensor this rank holds (dtype, shape), no chunks yet; scalars
  int rank = 0, world_size = 1;
  comm::StorePtr store;
  std::chrono::milliseconds timeout{0};
  std::string key;  // rendezvous key prefix, the same on every rank for this save
};

// Rank r owns the chunk of a tensor it holds when its coordinate is 0 on every mesh dim
// that does not shard the tensor: each element is written once. Partial tensors are an
// error. The pieces view the live tensors (contiguous ones are not copied).
SaveJob plan_save(const std::string& root, int64_t step, int64_t keep, const State& state);

// Writes this rank's file, then rank 0 writes metadata.json and renames the directory
// into place once every rank's file is on disk; returns when it is published (or throws,
// on every rank, if any rank failed). `prepare` (e.g. taking the snapshot the pieces
// point to) runs first and `verify` after this rank's file is written; either fails the
// save like a failed write.
void write_and_commit(const SaveJob& job, const std::function<void()>& prepare = {},
                      const std::function<void()>& verify = {});

// Every rank adds itself to `key`; the last to arrive opens the gate for all. `who`
// starts the error a rank that waited past `timeout` gets.
void store_barrier(c10d::Store& store, const std::string& key, int world_size, std::chrono::milliseconds timeout,
                   const std::string& who);

// root/step-00000042
std::string step_dir(const std::string& root, int64_t step);
// Steps of the published checkpoints under root, ascending (none when root is absent).
std::vector<int64_t> list_steps(const std::string& root);
// Where step's checkpoint lies: step_dir, or where a re-save interrupted between its
// renames left it (root/.old-step-N).
std::string published_dir(const std::string& root, int64_t step);
std::optional<int64_t> latest_step(const std::string& root);

}  // namespace hp::checkpoint
