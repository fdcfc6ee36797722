// Building blocks. Their code holds no parallelism: parameters start Replicate on the
// mesh they are built on, and styles applied from outside change their layouts.
#pragma once

#include <functional>

#include "hp/nn/module.h"

namespace hp::nn {

// y = x W^T (+ b). W is [out, in], drawn N(0, 1/in) by the distributed RNG.
class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, const DeviceMesh& mesh, bool bias = false);
  DTensor forward(const DTensor& x) override;
  DTensor& weight() { return *weight_; }
  DTensor* bias() { return bias_; }

  // The product x W^T, replaceable from outside (low precision swaps in its own); the
  // parameters stay the module's. Empty: hp::linear.
  using Product = std::function<DTensor(const DTensor& x, const DTensor& weight)>;
  void set_product(Product product) { product_ = std::move(product); }
  const Product& product() const { return product_; }

 private:
  DTensor* weight_;
  DTensor* bias_ = nullptr;
  Product product_;
};

// Rows of a [vocab, dim] table, looked up by integer ids.
class Embedding : public Module {
 public:
  Embedding(int64_t vocab, int64_t dim, const DeviceMesh& mesh);
  DTensor forward(const DTensor& ids) override;
  DTensor& weight() { return *weight_; }

 private:
  DTensor* weight_;
};

class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, const DeviceMesh& mesh, double eps = 1e-6);
  DTensor forward(const DTensor& x) override;

 private:
  DTensor* weight_;
  double eps_;
};

// A parameter of `shape` drawn N(0, std^2) (std 0: all ones) on `mesh`, replicated; inside
// no_init_parameters() deferred (deferred_init.h).
DTensor init_parameter(const std::vector<int64_t>& shape, const DeviceMesh& mesh, double std);
// The same, all zeros.
DTensor init_zeros(const std::vector<int64_t>& shape, const DeviceMesh& mesh);

}  // namespace hp::nn
