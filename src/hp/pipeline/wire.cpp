#include "hp/pipeline/wire.h"

#include <limits>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"

namespace hp::pipeline::detail {

at::Tensor encode_header(const at::Tensor& t) {
  HP_CHECK(t.dim() <= kMaxDims) << "pipeline activations have at most " << kMaxDims << " dims, got shape "
                                << t.sizes();
  at::Tensor h = at::zeros({kHeaderLen}, at::kLong);
  auto* p = h.data_ptr<int64_t>();
  p[0] = t.dim();
  p[1] = static_cast<int64_t>(t.scalar_type());
  for (int64_t d = 0; d < t.dim(); ++d) p[2 + d] = t.size(d);
  return h;
}

TensorMeta decode_header(const at::Tensor& h) {
  HP_CHECK(h.numel() == kHeaderLen && h.scalar_type() == at::kLong) << "bad activation header " << h;
  const auto* p = h.data_ptr<int64_t>();
  HP_CHECK(p[0] >= 0 && p[0] <= kMaxDims) << "activation header: ndim " << p[0] << " out of range";
  HP_CHECK(p[1] >= 0 && p[1] < static_cast<int64_t>(at::ScalarType::NumOptions))
      << "activation header: bad dtype code " << p[1];
  TensorMeta m;
  m.dtype = static_cast<at::ScalarType>(p[1]);
  for (int64_t d = 0; d < p[0]; ++d) {
    HP_CHECK(p[2 + d] >= 0) << "activation header: negative size " << p[2 + d] << " in dim " << d;
    m.sizes.push_back(p[2 + d]);
  }
  return m;
}

int message_tag(Message kind, int stage, int microbatch, int num_microbatches) {
  int64_t tag = (static_cast<int64_t>(stage) * num_microbatches + microbatch) * 3 + static_cast<int>(kind);
  HP_CHECK(tag <= std::numeric_limits<int32_t>::max())
      << "pipeline message tag overflows for stage " << stage << ", microbatch " << microbatch;
  return static_cast<int>(tag);
}

ActivationRecv::ActivationRecv(const comm::Group& g, int peer, int tag_header, int tag_data)
    : group_(&g), peer_(peer), tag_data_(tag_data) {
  header_ = comm::recv_async(at::empty({kHeaderLen}, at::kLong), g, peer, tag_header);
}

ActivationRecv::ActivationRecv(const comm::Group& g, int peer, int tag_data, at::Tensor buffer)
    : group_(&g), peer_(peer), tag_data_(tag_data) {
  data_ = comm::recv_async(std::move(buffer), g, peer, tag_data);
  data_posted_ = true;
}

void ActivationRecv::progress(bool wait) {
  if (data_posted_ || (!wait && !header_.ready())) return;
  TensorMeta m = decode_header(header_.wait());
  data_ = comm::recv_async(at::empty(m.sizes, at::TensorOptions().dtype(m.dtype)), *group_, peer_, tag_data_);
  data_posted_ = true;
}

at::Tensor ActivationRecv::wait() {
  progress(/*wait=*/true);
  return data_.wait();
}

std::vector<comm::Pending> send_activation(const at::Tensor& t, const comm::Group& g, int peer,
                                           int tag_header, int tag_data, bool header) {
  std::vector<comm::Pending> out;
  if (header) out.push_back(comm::send_async(encode_header(t), g, peer, tag_header));
  out.push_back(comm::send_async(t.detach(), g, peer, tag_data));
  return out;
}

}  // namespace hp::pipeline::detail
