// Differentiable collectives: the backward of each is its adjoint collective.
//   all_gather      <-> reduce_scatter (sum)
//   reduce_scatter  <-> all_gather
//   all_to_all      <-> the inverse all_to_all
//   all_reduce of a partial sum (Partial -> Replicate)  <-> identity
//   identity (Replicate used by sharded work)            <-> all_reduce of the gradient
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "hp/comm/group.h"

namespace hp::comm::autograd {

at::Tensor all_gather(const at::Tensor& t, const Group& g, int64_t dim, std::vector<int64_t> sizes = {});
at::Tensor reduce_scatter(const at::Tensor& t, const Group& g, int64_t dim, std::vector<int64_t> sizes = {});
at::Tensor all_to_all(const at::Tensor& t, const Group& g, int64_t split_dim, int64_t concat_dim,
                      std::vector<int64_t> split_sizes = {}, std::vector<int64_t> concat_sizes = {});
at::Tensor all_reduce_sum(const at::Tensor& t, const Group& g);
at::Tensor all_reduce_sum_backward(const at::Tensor& t, const Group& g);

// Attaches `backward` (grad of output -> grad of input) as the gradient function that
// links `out` to `input`. The tool every differentiable collective is made of.
at::Tensor attach_backward(at::Tensor out, const at::Tensor& input,
                           std::function<at::Tensor(const at::Tensor&)> backward, const char* name);

}  // namespace hp::comm::autograd
