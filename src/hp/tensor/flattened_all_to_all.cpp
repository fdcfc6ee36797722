#include "hp/tensor/flattened_all_to_all.h"

#include <ATen/ATen.h>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm/collectives.h"
#include "hp/layout/exchange_box.h"

namespace hp {
namespace {

// The view of `x`, the piece at global offset `origin`, that covers box `b` (inside it, or empty).
at::Tensor view_of(const at::Tensor& x, const std::vector<int64_t>& origin, const Box& b) {
  if (b.numel() == 0) return at::empty(b.shape, x.options());  // an empty box may lie outside
  at::Tensor v = x;
  for (size_t d = 0; d < b.shape.size(); ++d) v = v.narrow(d, b.offset[d] - origin[d], b.shape[d]);
  return v;
}

// Which partial term the member at `coord` holds: its coordinates on the step's Partial dims.
int64_t term_of(const RedistributeStep& step, const std::vector<int64_t>& coord) {
  int64_t q = 0;
  for (int m : step.mesh_dims)
    if (step.from.placement(m).is_partial()) q = q * step.from.mesh().dim_size(m) + coord[m];
  return q;
}

}  // namespace

at::Tensor flattened_all_to_all(const at::Tensor& local, const RedistributeStep& step, const DeviceMesh& mesh) {
  std::vector<std::string> names;
  for (int m : step.mesh_dims) names.push_back(mesh.dim_names().at(m));
  const DeviceMesh flat = mesh.submesh(names).flatten();
  const comm::Group& group = flat.group(0);
  const std::vector<int64_t> me = mesh.coordinate();
  const std::vector<int64_t> my_from = step.from.global_offset(me), my_to = step.to.global_offset(me);

  std::vector<at::Tensor> out_pieces;
  std::vector<Box> in_boxes;
  std::vector<int64_t> out_splits, in_splits, in_terms;
  for (int r : group.ranks()) {
    const std::vector<int64_t> peer = mesh.shape().coord_of(r);
    const Box out = exchanged_box(step.from, step.to, me, peer);
    out_pieces.push_back(view_of(local, my_from, out).reshape({-1}));
    out_splits.push_back(out.numel());
    in_boxes.push_back(exchanged_box(step.from, step.to, peer, me));
    in_splits.push_back(in_boxes.back().numel());
    in_terms.push_back(term_of(step, peer));
  }
  // Each partial term's pieces tile this rank's new piece once.
  const std::vector<int64_t> shape = step.to.local_shape(me);
  int64_t terms = 1, arriving = 0;
  for (int m : step.mesh_dims)
    if (step.from.placement(m).is_partial()) terms *= mesh.size(m);
  for (int64_t n : in_splits) arriving += n;
  HP_CHECK(arriving == terms * c10::multiply_integers(shape))
      << step.to_string() << ": " << arriving << " elements arrive for " << terms << " terms of a piece of shape "
      << to_string_list(shape);
  at::Tensor received = at::empty({arriving}, local.options());
  comm::all_to_all_single_async(received, at::cat(out_pieces), group, in_splits, out_splits).wait();

  std::vector<at::Tensor> term(terms);
  for (auto& t : term) t = at::empty(shape, local.options());
  int64_t start = 0;
  for (size_t i = 0; i < in_boxes.size(); ++i) {
    if (in_splits[i] == 0) continue;
    view_of(term[in_terms[i]], my_to, in_boxes[i]).copy_(received.narrow(0, start, in_splits[i]).view(in_boxes[i].shape));
    start += in_splits[i];
  }
  at::Tensor result = term[0];
  for (int64_t q = 1; q < terms; ++q) {
    switch (step.op) {
      case ReduceOp::Max: result = at::maximum(result, term[q]); break;
      case ReduceOp::Min: result = at::minimum(result, term[q]); break;
      default: result.add_(term[q]); break;
    }
  }
  return step.scale == 1 ? result : result * step.scale;
}

}  // namespace hp
