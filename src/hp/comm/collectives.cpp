#include "hp/comm/collectives.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <numeric>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm/engine.h"
#include "hp/comm/hier/hier.h"
#include "hp/comm/symm/collectives.h"
#include "hp/comm/trace.h"
#include "hp/comm/transport.h"
#include "hp/comm/world.h"

namespace hp::comm {
namespace {

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

bool all_equal(const std::vector<int64_t>& v) {
  return std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v.front(); });
}

// Gloo cannot carry int16: move its bits as float16, which data-movement collectives copy
// without arithmetic.
at::Tensor wire(const at::Tensor& t) {
  if (t.scalar_type() == at::kShort) return t.view(at::kHalf);
  if (t.scalar_type() == at::kBool) return t.view(at::kByte);
  return t;
}

std::string what(const char* op, const Group& g) { return std::string(op) + " on " + g.describe(); }

template <typename F>
WorkPtr launch(const char* op, const Group& g, F&& start) {
  try {
    return start();
  } catch (const std::exception& e) {
    HP_FAIL() << what(op, g) << " failed: " << e.what();
  }
  return {};
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return c10d::ReduceOp::SUM;  // divided locally afterwards
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
    case ReduceOp::Product: return c10d::ReduceOp::PRODUCT;
  }
  return c10d::ReduceOp::SUM;
}

void divide_(at::Tensor& t, int64_t n) {
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/true)) t.div_(n, "trunc");
  else t.div_(n);
}

// Reduces `stacked` over dim 0 (one slice per rank, in rank order: deterministic).
at::Tensor reduce_stack(const at::Tensor& stacked, ReduceOp op) {
  const auto dtype = stacked.scalar_type();
  const bool widen = dtype == at::kBFloat16 || dtype == at::kHalf;
  at::Tensor x = widen ? stacked.to(at::kFloat) : stacked;
  at::Tensor r;
  switch (op) {
    case ReduceOp::Sum: r = x.sum(0, false, x.scalar_type()); break;
    case ReduceOp::Avg: r = x.sum(0, false, x.scalar_type()); divide_(r, stacked.size(0)); break;
    case ReduceOp::Max: r = std::get<0>(x.max(0)); break;
    case ReduceOp::Min: r = std::get<0>(x.min(0)); break;
    case ReduceOp::Product: r = x.prod(0, false, x.scalar_type()); break;
  }
  return widen ? r.to(dtype) : r;
}

int64_t wrap_dim(int64_t dim, const at::Tensor& t, const char* op) {
  const int64_t nd = t.dim();
  HP_CHECK(nd > 0) << op << " needs a tensor with at least one dim, got a scalar";
  HP_CHECK(dim >= -nd && dim < nd) << op << ": dim " << dim << " out of range for shape " << t.sizes();
  return dim < 0 ? dim + nd : dim;
}

// c10d wants empty split lists for equal pieces.
std::vector<int64_t> splits_or_empty(const std::vector<int64_t>& s) {
  return all_equal(s) ? std::vector<int64_t>{} : s;
}

// An all-gather's or all-to-all's output: in the group's heap on shared memory, where peers
// write their pieces straight into it; else (Gloo, hierarchical: groups across hosts) pooled.
at::Tensor output_buffer(const Group& g, Transport tr, int64_t numel, const at::TensorOptions& options) {
  if (tr == Transport::SharedMemory)
    if (at::Tensor t = symm::try_output_buffer(numel, c10::typeMetaToScalarType(options.dtype()), g); t.defined())
      return t;
  return g.buffer(numel, options);
}

// A collective's span in the trace: "all_reduce (shared memory)".
std::string span_name(const char* op, Transport tr) { return std::string(op) + " (" + to_string(tr) + ")"; }

// Runs `body`, a shared-memory or hierarchical collective, after every collective this
// rank issued before it: asynchronous ones on the progress engine (returning at once),
// synchronous ones here once the engine has drained. `result` finishes on the waiter.
// Templates, not std::function: the synchronous path allocates nothing for them.
template <typename Body, typename Result>
Pending run_in_order(const char* op, Transport tr, const Group& g, bool async, Body&& body, Result&& result) {
  // Named only where needed: the group's description costs more than a small collective.
  auto w = [&] { return what(op, g) + " (" + to_string(tr) + ")"; };
  Engine* e = g.engine();
  if (async && e && !Engine::on_progress_thread() && async_engine_enabled()) {
    if (tr == Transport::Hierarchical) {
      hier::detail::count_call();  // counted where it was issued
      // Its host sub-groups are made here, in program order: making a group is a
      // rendezvous under the World's lock, which the progress thread must not take.
      hier::host_levels(g);
    }
    std::string name = w();
    std::function<void()> job(std::forward<Body>(body));
    if (trace::enabled())
      job = [job, span = span_name(op, tr), rank = is_initialized() ? current_world()->rank() : 0] {
        trace::Span s("comm", span, rank, trace::kEngine);
        job();
      };
    return Pending(e->submit(std::move(job), name), std::function<at::Tensor()>(std::forward<Result>(result)), name,
                   g.timeout());
  }
  if (e) e->drain();
  try {
    trace::Span s("comm", trace::enabled() ? span_name(op, tr) : std::string());
    body();
  } catch (const std::exception& ex) {
    HP_FAIL() << w() << " failed: " << ex.what();
  }
  return Pending::done(result());
}

// Issues a Gloo collective here, unless collectives this rank issued before are still on
// the progress engine: then a synchronous one waits for them and an asynchronous one
// queues behind them, so that every backend sees this rank's calls in program order (the
// hierarchical collectives use other groups' backends).
Pending run_gloo(const char* op, const Group& g, bool async, const std::function<WorkPtr()>& issue,
                 std::function<at::Tensor()> finish, std::string w) {
  Engine* e = g.engine();
  if (e && !Engine::on_progress_thread() && e->busy()) {
    if (async) {
      auto timeout = g.timeout();
      auto job = e->submit([issue, timeout] { issue()->wait(timeout); }, w);
      return Pending(std::move(job), std::move(finish), std::move(w), timeout);
    }
    e->drain();
  }
  Pending p(launch(op, g, issue), std::move(finish), std::move(w), g.timeout());
  if (async && !async_engine_enabled()) p.wait();  // on the caller, as every transport then runs
  return p;
}

int64_t bytes_of(const at::Tensor& t, int64_t numel) { return numel * static_cast<int64_t>(t.element_size()); }

// Elements per row (index along dim 0) of `t`.
int64_t row_numel(const at::Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

std::vector<size_t> split_bytes(const std::vector<int64_t>& rows, const at::Tensor& t, int n, const char* which,
                                const Group& g) {
  std::vector<size_t> b(n);
  const int64_t row_bytes = row_numel(t) * static_cast<int64_t>(t.element_size());
  if (rows.empty()) {
    HP_CHECK(t.size(0) % n == 0) << "all_to_all on " << g.describe() << ": " << which << " has " << t.size(0)
                                 << " rows, not divisible into " << n << " equal pieces";
    for (auto& x : b) x = t.size(0) / n * row_bytes;
    return b;
  }
  HP_CHECK(static_cast<int>(rows.size()) == n && sum(rows) == t.size(0))
      << "all_to_all on " << g.describe() << ": " << which << " splits " << to_string_list(rows)
      << " must have one entry per rank and add up to its " << t.size(0) << " rows";
  for (int r = 0; r < n; ++r) b[r] = rows[r] * row_bytes;
  return b;
}

}  // namespace

std::vector<int64_t> chunk_sizes(int64_t n, int parts) {
  HP_CHECK(parts >= 1 && n >= 0) << "cannot chunk " << n << " into " << parts << " parts";
  const int64_t chunk = (n + parts - 1) / parts;
  std::vector<int64_t> s(parts);
  for (int i = 0; i < parts; ++i) s[i] = std::max<int64_t>(0, std::min(chunk, n - i * chunk));
  return s;
}

// Each collective checks and normalises its shapes, picks its transport, and runs; the
// `*_async` calls return at once, the synchronous ones wait (async = false).
namespace {

Pending all_reduce_impl(at::Tensor t, const Group& g, ReduceOp op, bool async) {
  g.record("all_reduce", t);
  const Transport tr = choose_transport(g, Collective::AllReduce, bytes_of(t, t.numel()), t.scalar_type());
  if (tr == Transport::Local) return Pending::done(t);
  if (tr != Transport::Gloo) {
    at::Tensor x = t.contiguous();
    const Group* gp = &g;
    return run_in_order(
        "all_reduce", tr, g, async,
        [gp, x, op, tr] {
          if (tr == Transport::Hierarchical) hier::all_reduce(*gp, x, op);
          else symm::all_reduce(*symm::group_heap(*gp), x, op);
        },
        [t, x]() mutable {
          if (!x.is_same(t)) t.copy_(x);
          return t;
        });
  }
  // Reduce bfloat16 in float32 on the CPU: more accurate, as the shared-memory paths do.
  const bool widen = t.scalar_type() == at::kBFloat16 && g.device() == "cpu";
  at::Tensor buf = widen ? t.to(at::kFloat) : t.contiguous();
  const int64_t n = g.size();
  return run_gloo(
      "all_reduce", g, async,
      [&g, buf, op] {
        std::vector<at::Tensor> bufs{buf};
        c10d::AllreduceOptions opts;
        opts.reduceOp = to_c10d(op);
        opts.timeout = g.timeout();
        return g.backend().allreduce(bufs, opts);
      },
      [t, buf, op, n]() mutable {
        if (op == ReduceOp::Avg) divide_(buf, n);
        if (!buf.is_same(t)) t.copy_(buf);
        return t;
      },
      what("all_reduce", g));
}

// all_to_all_single without a log entry: the carrier of all_gather, reduce_scatter and
// all_to_all, which record themselves.
Pending all_to_all_single_unlogged(at::Tensor out, const at::Tensor& in, const Group& g,
                                   std::vector<int64_t> out_splits, std::vector<int64_t> in_splits, bool async) {
  HP_CHECK(out.scalar_type() == in.scalar_type())
      << "all_to_all on " << g.describe() << ": output dtype " << out.scalar_type()
      << " differs from input dtype " << in.scalar_type();
  HP_CHECK(out.is_contiguous()) << "all_to_all on " << g.describe() << " needs a contiguous output";
  at::Tensor src = in.contiguous();
  const Transport tr = choose_transport(g, Collective::AllToAll, bytes_of(src, src.numel()), src.scalar_type());
  if (tr == Transport::Local) {
    out.copy_(src.view(out.sizes()));
    return Pending::done(out);
  }
  if (tr == Transport::SharedMemory) {
    HP_CHECK(src.dim() >= 1 && out.dim() >= 1) << "all_to_all on " << g.describe() << " needs tensors with rows";
    const int n = g.size();
    auto send = split_bytes(in_splits, src, n, "input", g), recv = split_bytes(out_splits, out, n, "output", g);
    const Group* gp = &g;
    return run_in_order(
        "all_to_all", tr, g, async,
        [gp, src, out, send, recv] { symm::all_to_all(*symm::group_heap(*gp), src.data_ptr(), send, out.data_ptr(), recv); },
        [out] { return out; });
  }
  at::Tensor out_w = wire(out), in_w = wire(src);
  return run_gloo(
      "all_to_all", g, async,
      [&g, out_w, in_w, out_splits, in_splits]() mutable {
        c10d::AllToAllOptions opts;
        opts.timeout = g.timeout();
        return g.backend().alltoall_base(out_w, in_w, out_splits, in_splits, opts);
      },
      [out, src] { return out; }, what("all_to_all", g));
}

Pending all_gather_impl(const at::Tensor& t, const Group& g, int64_t dim, std::vector<int64_t> sizes, bool async) {
  g.record("all_gather", t);
  dim = wrap_dim(dim, t, "all_gather");
  const int n = g.size();
  if (sizes.empty()) sizes.assign(n, t.size(dim));
  HP_CHECK(static_cast<int>(sizes.size()) == n && sizes[g.rank()] == t.size(dim))
      << "all_gather on " << g.describe() << ": sizes " << to_string_list(sizes)
      << " must have one entry per rank, this rank's equal to its extent " << t.size(dim)
      << " along dim " << dim;
  if (n == 1) return Pending::done(t.clone());
  int64_t per_slice = 1;  // elements per index along `dim`
  for (int64_t d = 0; d < t.dim(); ++d)
    if (d != dim) per_slice *= t.size(d);
  const Transport tr = choose_transport(g, Collective::AllGather, bytes_of(t, per_slice * sum(sizes)), t.scalar_type());
  if (tr != Transport::Gloo) {
    at::Tensor rows = t.movedim(dim, 0).contiguous();
    std::vector<int64_t> out_shape = rows.sizes().vec();
    out_shape[0] = sum(sizes);
    at::Tensor out = output_buffer(g, tr, c10::multiply_integers(out_shape), t.options()).view(out_shape);
    std::vector<size_t> bytes(n);
    for (int r = 0; r < n; ++r) bytes[r] = sizes[r] * row_numel(rows) * t.element_size();
    const Group* gp = &g;
    return run_in_order(
        "all_gather", tr, g, async,
        [gp, rows, bytes, out, tr] {
          if (tr == Transport::Hierarchical) hier::all_gather(*gp, rows.data_ptr(), bytes, out.data_ptr());
          else symm::all_gather(*symm::group_heap(*gp), rows.data_ptr(), bytes, out.data_ptr());
        },
        [out, dim] { return dim == 0 ? out : out.movedim(0, dim).contiguous(); });
  }
  // Every rank sends its rows to every rank: an all-to-all of n copies moves the bytes
  // of a ring all-gather and runs far faster than Gloo's list all-gather.
  at::Tensor rows = t.movedim(dim, 0);
  std::vector<int64_t> rep_shape = rows.sizes().vec();
  rep_shape.insert(rep_shape.begin(), n);
  std::vector<int64_t> flat_shape = rows.sizes().vec();
  flat_shape[0] *= n;
  at::Tensor send = g.buffer(t.numel() * n, t.options()).view(flat_shape);
  send.view(rep_shape).copy_(rows.unsqueeze(0).expand(rep_shape));
  std::vector<int64_t> out_shape = rows.sizes().vec();
  out_shape[0] = sum(sizes);
  at::Tensor out = g.buffer(c10::multiply_integers(out_shape), t.options()).view(out_shape);
  return all_to_all_single_unlogged(out, send, g, splits_or_empty(sizes), std::vector<int64_t>{}, async)
      .then([dim](at::Tensor got) { return dim == 0 ? got : got.movedim(0, dim).contiguous(); },
            what("all_gather", g));
}

Pending reduce_scatter_impl(const at::Tensor& t, const Group& g, int64_t dim, ReduceOp op, std::vector<int64_t> sizes,
                            bool async) {
  g.record("reduce_scatter", t);
  dim = wrap_dim(dim, t, "reduce_scatter");
  const int n = g.size();
  if (sizes.empty()) sizes = chunk_sizes(t.size(dim), n);
  HP_CHECK(static_cast<int>(sizes.size()) == n && sum(sizes) == t.size(dim))
      << "reduce_scatter on " << g.describe() << ": sizes " << to_string_list(sizes)
      << " must have one entry per rank and add up to extent " << t.size(dim) << " along dim " << dim;
  if (n == 1) return Pending::done(reduce_stack(t.unsqueeze(0), op));
  const Transport tr = choose_transport(g, Collective::ReduceScatter, bytes_of(t, t.numel()), t.scalar_type());
  if (tr != Transport::Gloo) {
    at::Tensor rows = t.movedim(dim, 0).contiguous();
    std::vector<int64_t> out_shape = rows.sizes().vec();
    out_shape[0] = sizes[g.rank()];
    at::Tensor out = g.buffer(c10::multiply_integers(out_shape), t.options()).view(out_shape);
    std::vector<int64_t> counts(n);
    for (int r = 0; r < n; ++r) counts[r] = sizes[r] * row_numel(rows);
    const Group* gp = &g;
    return run_in_order(
        "reduce_scatter", tr, g, async,
        [gp, rows, counts, out, op, tr] {
          if (tr == Transport::Hierarchical) hier::reduce_scatter(*gp, rows, counts, out, op);
          else symm::reduce_scatter(*symm::group_heap(*gp), rows, out, counts, op);
        },
        [out, dim] { return dim == 0 ? out : out.movedim(0, dim).contiguous(); });
  }
  // All-to-all hands rank r every rank's r-th piece; a local reduction (in rank order,
  // hence deterministic) finishes it. Same bytes as a ring reduce-scatter.
  at::Tensor rows = t.movedim(dim, 0).contiguous();
  std::vector<int64_t> out_shape = rows.sizes().vec();
  const int64_t mine = sizes[g.rank()];
  out_shape[0] = mine * n;
  at::Tensor out = g.buffer(c10::multiply_integers(out_shape), t.options()).view(out_shape);
  return all_to_all_single_unlogged(out, rows, g, std::vector<int64_t>{}, splits_or_empty(sizes), async)
      .then(
          [n, mine, dim, op](at::Tensor got) {
            std::vector<int64_t> stacked = got.sizes().vec();
            stacked[0] = mine;
            stacked.insert(stacked.begin(), n);
            at::Tensor r = reduce_stack(got.view(stacked), op);
            return dim == 0 ? r : r.movedim(0, dim).contiguous();
          },
          what("reduce_scatter", g));
}

Pending all_to_all_impl(const at::Tensor& t, const Group& g, int64_t split_dim, int64_t concat_dim,
                        std::vector<int64_t> split_sizes, std::vector<int64_t> concat_sizes, bool async) {
  g.record("all_to_all", t);
  split_dim = wrap_dim(split_dim, t, "all_to_all");
  concat_dim = wrap_dim(concat_dim, t, "all_to_all");
  const int n = g.size();
  if (split_sizes.empty()) split_sizes = chunk_sizes(t.size(split_dim), n);
  HP_CHECK(static_cast<int>(split_sizes.size()) == n && sum(split_sizes) == t.size(split_dim))
      << "all_to_all on " << g.describe() << ": split sizes " << to_string_list(split_sizes)
      << " must have one entry per rank and add up to " << t.size(split_dim) << " along dim " << split_dim;
  const int64_t mine = split_sizes[g.rank()];
  if (concat_sizes.empty())
    concat_sizes.assign(n, split_dim == concat_dim ? mine : t.size(concat_dim));
  HP_CHECK(static_cast<int>(concat_sizes.size()) == n)
      << "all_to_all on " << g.describe() << ": concat sizes " << to_string_list(concat_sizes)
      << " must have one entry per rank";

  // Pack the outgoing pieces back to back, each contiguous in its own shape.
  std::vector<int64_t> in_splits(n);
  const int64_t per_index = t.size(split_dim) ? t.numel() / t.size(split_dim) : 0;
  for (int r = 0; r < n; ++r) in_splits[r] = split_sizes[r] * per_index;
  at::Tensor send;
  if (split_dim == 0 && t.is_contiguous()) {
    send = t.view({-1});  // already back to back: no piece views to make
  } else {
    std::vector<at::Tensor> pieces = t.split_with_sizes(split_sizes, split_dim);
    send = g.buffer(t.numel(), t.options());
    int64_t off = 0;
    for (auto& p : pieces) {
      send.narrow(0, off, p.numel()).view(p.sizes()).copy_(p);
      off += p.numel();
    }
  }
  // Rank r's piece arrives with our split extent and its concat extent.
  std::vector<std::vector<int64_t>> in_shapes(n);
  std::vector<int64_t> out_splits(n);
  for (int r = 0; r < n; ++r) {
    in_shapes[r] = t.sizes().vec();
    in_shapes[r][split_dim] = mine;
    in_shapes[r][concat_dim] = concat_sizes[r];
    out_splits[r] = std::accumulate(in_shapes[r].begin(), in_shapes[r].end(), int64_t{1},
                                    std::multiplies<int64_t>());
  }
  const Transport tr = choose_transport(g, Collective::AllToAll, bytes_of(t, t.numel()), t.scalar_type());
  at::Tensor out = output_buffer(g, tr, sum(out_splits), t.options());
  // Gloo's all-to-all with explicit splits is ~2x slower than with equal pieces.
  return all_to_all_single_unlogged(out, send, g, splits_or_empty(out_splits), splits_or_empty(in_splits), async)
      .then(
          [in_shapes, out_splits, concat_dim](at::Tensor flat) {
        if (concat_dim == 0) {  // the pieces arrived back to back: already concatenated
          std::vector<int64_t> shape = in_shapes[0];
          shape[0] = 0;
          for (const auto& s : in_shapes) shape[0] += s[0];
          return flat.view(shape);
        }
        std::vector<at::Tensor> parts;
        int64_t off = 0;
        for (size_t r = 0; r < in_shapes.size(); ++r) {
          parts.push_back(flat.narrow(0, off, out_splits[r]).view(in_shapes[r]));
          off += out_splits[r];
        }
        return at::cat(parts, concat_dim);
      },
          what("all_to_all", g));
}

Pending broadcast_impl(at::Tensor t, const Group& g, int src, bool async) {
  HP_CHECK(src >= 0 && src < g.size()) << "broadcast on " << g.describe() << ": source rank " << src
                                       << " is outside the group";
  g.record("broadcast", t);
  at::Tensor buf = t.contiguous();
  const Transport tr = choose_transport(g, Collective::Broadcast, bytes_of(t, t.numel()), t.scalar_type());
  if (tr == Transport::Local) return Pending::done(t);
  auto finish = [t, buf]() mutable {
    if (!buf.is_same(t)) t.copy_(buf);
    return t;
  };
  if (tr == Transport::SharedMemory) {
    const Group* gp = &g;
    return run_in_order(
        "broadcast", tr, g, async, [gp, buf, src] { symm::broadcast(*symm::group_heap(*gp), buf.data_ptr(), buf.nbytes(), src); },
        finish);
  }
  at::Tensor w = wire(buf);
  return run_gloo(
      "broadcast", g, async,
      [&g, w, src] {
        std::vector<at::Tensor> bufs{w};
        c10d::BroadcastOptions opts;
        opts.rootRank = src;
        opts.timeout = g.timeout();
        return g.backend().broadcast(bufs, opts);
      },
      finish, what("broadcast", g));
}

}  // namespace

Pending all_reduce_async(at::Tensor t, const Group& g, ReduceOp op) { return all_reduce_impl(t, g, op, true); }

at::Tensor all_reduce_(at::Tensor t, const Group& g, ReduceOp op) { return all_reduce_impl(t, g, op, false).wait(); }

at::Tensor all_reduce(const at::Tensor& t, const Group& g, ReduceOp op) {
  return all_reduce_impl(t.clone(), g, op, false).wait();
}

Pending all_to_all_single_async(at::Tensor out, const at::Tensor& in, const Group& g,
                                std::vector<int64_t> out_splits, std::vector<int64_t> in_splits) {
  g.record("all_to_all", in);
  return all_to_all_single_unlogged(std::move(out), in, g, std::move(out_splits), std::move(in_splits), true);
}

Pending all_gather_async(const at::Tensor& t, const Group& g, int64_t dim, std::vector<int64_t> sizes) {
  return all_gather_impl(t, g, dim, std::move(sizes), true);
}

at::Tensor all_gather(const at::Tensor& t, const Group& g, int64_t dim, std::vector<int64_t> sizes) {
  return all_gather_impl(t, g, dim, std::move(sizes), false).wait();
}

Pending reduce_scatter_async(const at::Tensor& t, const Group& g, int64_t dim, ReduceOp op,
                             std::vector<int64_t> sizes) {
  return reduce_scatter_impl(t, g, dim, op, std::move(sizes), true);
}

at::Tensor reduce_scatter(const at::Tensor& t, const Group& g, int64_t dim, ReduceOp op,
                          std::vector<int64_t> sizes) {
  return reduce_scatter_impl(t, g, dim, op, std::move(sizes), false).wait();
}

Pending all_to_all_async(const at::Tensor& t, const Group& g, int64_t split_dim, int64_t concat_dim,
                         std::vector<int64_t> split_sizes, std::vector<int64_t> concat_sizes) {
  return all_to_all_impl(t, g, split_dim, concat_dim, std::move(split_sizes), std::move(concat_sizes), true);
}

at::Tensor all_to_all(const at::Tensor& t, const Group& g, int64_t split_dim, int64_t concat_dim,
                      std::vector<int64_t> split_sizes, std::vector<int64_t> concat_sizes) {
  return all_to_all_impl(t, g, split_dim, concat_dim, std::move(split_sizes), std::move(concat_sizes), false)
      .wait();
}

Pending broadcast_async(at::Tensor t, const Group& g, int src) { return broadcast_impl(t, g, src, true); }

at::Tensor broadcast_(at::Tensor t, const Group& g, int src) { return broadcast_impl(t, g, src, false).wait(); }

Pending send_async(const at::Tensor& t, const Group& g, int peer, int tag) {
  HP_CHECK(peer >= 0 && peer < g.size() && peer != g.rank())
      << "send on " << g.describe() << ": peer " << peer << " must be another rank of the group";
  g.record("send", t);
  at::Tensor buf = t.contiguous();
  std::vector<at::Tensor> bufs{wire(buf)};
  WorkPtr w = launch("send", g, [&] { return g.backend().send(bufs, peer, tag); });
  return Pending(w, [buf] { return buf; }, what("send", g) + " to " + std::to_string(peer), g.timeout());
}

Pending recv_async(at::Tensor t, const Group& g, int peer, int tag) {
  HP_CHECK(peer >= 0 && peer < g.size() && peer != g.rank())
      << "recv on " << g.describe() << ": peer " << peer << " must be another rank of the group";
  g.record("recv", t);
  at::Tensor buf = t.contiguous();
  std::vector<at::Tensor> bufs{wire(buf)};
  WorkPtr w = launch("recv", g, [&] { return g.backend().recv(bufs, peer, tag); });
  return Pending(
      w,
      [t, buf]() mutable {
        if (!buf.is_same(t)) t.copy_(buf);
        return t;
      },
      what("recv", g) + " from " + std::to_string(peer), g.timeout());
}

void barrier(const Group& g) {
  g.record("barrier", at::Tensor());
  if (g.size() == 1) return;
  if (Engine* e = g.engine()) e->drain();
  c10d::BarrierOptions opts;
  opts.timeout = g.timeout();
  Pending(launch("barrier", g, [&] { return g.backend().barrier(opts); }), nullptr, what("barrier", g),
          g.timeout())
      .wait();
}

}  // namespace hp::comm
