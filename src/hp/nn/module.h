// A module: named DTensor parameters and buffers, named child modules, and forward hooks
// through which parallelism is injected from outside (a style redistributes inputs and
// outputs).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hp/nn/deferred_init.h"
#include "hp/tensor/dtensor.h"

namespace hp::nn {

class Module {
 public:
  virtual ~Module() = default;

  // Runs the pre-hooks on the input, forward, then the post-hooks on the output.
  DTensor operator()(const DTensor& x);
  virtual DTensor forward(const DTensor& x) = 0;

  // Recursive, in registration order: "layers.0.attn.q_proj.weight".
  std::vector<std::pair<std::string, DTensor*>> named_parameters();
  std::vector<DTensor*> parameters();
  // State the model keeps but does not train (no gradient, no optimizer), named as the
  // parameters are: checkpoints hold it beside them (PyTorch's buffers).
  std::vector<std::pair<std::string, DTensor*>> named_buffers();
  // This module (as "") and every descendant.
  std::vector<std::pair<std::string, Module*>> named_modules();
  // The direct children, in registration order (shared: another module may hold them too).
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  DTensor& param(const std::string& name);  // one of this module's own parameters
  void zero_grad();

  using PreHook = std::function<DTensor(Module&, const DTensor& input)>;
  using PostHook = std::function<DTensor(Module&, const DTensor& input, const DTensor& output)>;
  void register_forward_pre_hook(PreHook hook) { pre_hooks_.push_back(std::move(hook)); }
  void register_forward_hook(PostHook hook) { post_hooks_.push_back(std::move(hook)); }
  // How forward runs, between the pre-hooks and the post-hooks (activation checkpointing
  // replaces it from outside: the hooks, e.g. fully_shard's gathers, stay outside the
  // recomputed region). Unset: forward itself.
  using ForwardWrapper = std::function<DTensor(Module&, const DTensor& input)>;
  void set_forward_wrapper(ForwardWrapper wrapper) { forward_wrapper_ = std::move(wrapper); }
  bool has_forward_wrapper() const { return static_cast<bool>(forward_wrapper_); }

  // This module's own parameters made inside no_init_parameters() and not drawn yet, by
  // name (deferred_init.h); forward refuses to run while any is left.
  std::map<std::string, ParameterInit>& deferred_inits() { return deferred_; }

 protected:
  // The returned reference stays valid; parallelization replaces the DTensor in place.
  DTensor& register_parameter(std::string name, DTensor value);
  // Its owner updates it in place (loading a checkpoint copies into it).
  DTensor& register_buffer(std::string name, DTensor value);
  template <typename M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> m) {
    children_.emplace_back(std::move(name), m);
    return m;
  }

 private:
  std::vector<std::pair<std::string, std::unique_ptr<DTensor>>> params_;
  std::vector<std::pair<std::string, std::unique_ptr<DTensor>>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<PreHook> pre_hooks_;
  std::vector<PostHook> post_hooks_;
  ForwardWrapper forward_wrapper_;
  std::map<std::string, ParameterInit> deferred_;
};

// A trainable leaf: detached from any graph, requiring grad.
DTensor make_parameter(const DTensor& value);

}  // namespace hp::nn
