// How tensors travel between pipeline ranks.
//
// Activations change shape from one microbatch to the next (sequence length), so
// every forward activation is preceded by a fixed-size int64 header
// [ndim, dtype, d0, ..., d7]: the receiver posts the header receive early and the
// data receive once the header has landed. Gradients need no header: the grad of
// a stage output has the output's shape and dtype, which the receiving rank
// produced itself in F, so its receive is posted right after that F.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hp/comm/group.h"
#include "hp/comm/pending.h"

namespace hp::pipeline::detail {

constexpr int kMaxDims = 8;
constexpr int kHeaderLen = 2 + kMaxDims;

struct TensorMeta {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes;
};

at::Tensor encode_header(const at::Tensor& t);   // int64 [kHeaderLen]; throws past kMaxDims dims
TensorMeta decode_header(const at::Tensor& h);   // throws on a malformed header

// Distinct Gloo tags per message in one step, so no two in-flight messages between
// the same pair of ranks can be confused: activation header, activation, grad.
enum class Message { kActHeader = 0, kAct = 1, kGrad = 2 };
int message_tag(Message kind, int stage, int microbatch, int num_microbatches);

// A forward activation on its way in: header first, then the data.
class ActivationRecv {
 public:
  ActivationRecv() = default;
  ActivationRecv(const comm::Group& g, int peer, int tag_header, int tag_data);
  // Static shapes: no header; the data receive into `buffer` is posted at once.
  ActivationRecv(const comm::Group& g, int peer, int tag_data, at::Tensor buffer);
  // Posts the data receive if the header is there (wait: block for it).
  void progress(bool wait);
  at::Tensor wait();  // the activation
  std::string what;   // for errors: "RECV_F 3.1 from rank 2"

 private:
  const comm::Group* group_ = nullptr;
  int peer_ = -1, tag_data_ = 0;
  comm::Pending header_, data_;
  bool data_posted_ = false;
};

// Sends header + data (non-blocking; data alone with static shapes); returns the handles
// to wait on.
std::vector<comm::Pending> send_activation(const at::Tensor& t, const comm::Group& g, int peer,
                                           int tag_header, int tag_data, bool header = true);

}  // namespace hp::pipeline::detail
