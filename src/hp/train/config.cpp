#include "hp/train/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <toml.hpp>
#include <variant>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/schedule/generators.h"
#include "hp/train/config_fields.h"

namespace hp::train {

namespace {

// "demo.toml:12" when the value came from a file, so errors point at the line.
std::string where(const std::string& source, const toml::value& v) {
  auto line = v.location().line();
  return line > 0 ? source + ":" + std::to_string(line) : source;
}

std::string shown(const toml::value& v) {
  std::ostringstream os;
  os << v.type() << " " << toml::format(v);
  auto s = os.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Reads one [section]: each get() consumes a key (one per row of config_fields());
// finish() rejects the rest.
class SectionReader {
 public:
  SectionReader(const std::string& source, const std::string& name, const toml::value* table)
      : source_(source), name_(name), table_(table) {}

  void get(const std::string& key, int64_t& out) {
    if (auto* v = find(key)) {
      expect(*v, key, v->is_integer(), "an integer");
      out = v->as_integer();
    }
  }
  void get(const std::string& key, uint64_t& out) {
    if (auto* v = find(key)) {
      expect(*v, key, v->is_integer() && v->as_integer() >= 0, "a non-negative integer");
      out = static_cast<uint64_t>(v->as_integer());
    }
  }
  // Integers are accepted for floats: "rope_theta = 10000" should just work.
  void get(const std::string& key, double& out) {
    if (auto* v = find(key)) {
      expect(*v, key, v->is_floating() || v->is_integer(), "a number");
      out = v->is_floating() ? v->as_floating() : static_cast<double>(v->as_integer());
    }
  }
  void get(const std::string& key, bool& out) {
    if (auto* v = find(key)) {
      expect(*v, key, v->is_boolean(), "a boolean");
      out = v->as_boolean();
    }
  }
  void get(const std::string& key, std::string& out) {
    if (auto* v = find(key)) {
      expect(*v, key, v->is_string(), "a string");
      out = v->as_string().str;
    }
  }
  void get(const std::string& key, std::vector<int64_t>& out) {
    if (auto* v = find(key)) {
      bool ok = v->is_array();
      if (ok)
        for (const auto& e : v->as_array()) ok = ok && e.is_integer();
      expect(*v, key, ok, "an array of integers");
      out.clear();
      for (const auto& e : v->as_array()) out.push_back(e.as_integer());
    }
  }
  void get(const std::string& key, std::vector<std::string>& out) {
    if (auto* v = find(key)) {
      bool ok = v->is_array();
      if (ok)
        for (const auto& e : v->as_array()) ok = ok && e.is_string();
      expect(*v, key, ok, "an array of strings");
      out.clear();
      for (const auto& e : v->as_array()) out.push_back(e.as_string().str);
    }
  }

  void finish() const {
    if (!table_) return;
    for (const auto& [key, v] : table_->as_table()) {
      HP_CHECK(used_.count(key)) << where(source_, v) << ": unknown key " << name_ << "." << key
                                 << " (known: " << to_string_list(used_, "", "") << ")";
    }
  }

 private:
  const toml::value* find(const std::string& key) {
    used_.insert(key);
    if (!table_) return nullptr;
    const auto& t = table_->as_table();
    auto it = t.find(key);
    return it == t.end() ? nullptr : &it->second;
  }
  void expect(const toml::value& v, const std::string& key, bool ok, const char* what) const {
    HP_CHECK(ok) << where(source_, v) << ": " << name_ << "." << key << " must be " << what
                 << ", found " << shown(v);
  }

  const std::string& source_;
  std::string name_;
  const toml::value* table_;
  std::set<std::string> used_;  // every key this section knows (asked for)
};

// TOML text for a double that reads back to the same bits.
std::string toml_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[40];
  for (int prec = 6; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// A value as to_string writes it, by its type.
std::string toml_value(int64_t x) { return std::to_string(x); }
std::string toml_value(uint64_t x) { return std::to_string(x); }
std::string toml_value(double x) { return toml_float(x); }
std::string toml_value(bool x) { return x ? "true" : "false"; }
std::string toml_value(const std::string& s) { return toml_string(s); }
std::string toml_value(const std::vector<int64_t>& xs) { return to_string_list(xs); }
std::string toml_value(const std::vector<std::string>& xs) {
  std::vector<std::string> quoted;
  for (const auto& x : xs) quoted.push_back(toml_string(x));
  return to_string_list(quoted);
}

// "[mesh], [pipeline], ..." for an error that lists the sections.
std::string bracketed(const std::vector<std::string>& sections) {
  std::vector<std::string> parts;
  for (const auto& s : sections) parts.push_back("[" + s + "]");
  return to_string_list(parts, "", "");
}

}  // namespace

ParallelDims TrainConfig::dims() const {
  ParallelDims d = ParallelDims::from_mesh(mesh.shape, mesh.names, source);
  if (mesh.context_parallel == "hybrid" && d.cp > 1) d.cp_ulysses = mesh.cp_ulysses_degree;
  return d;
}

int MeshConfig::zero_stage() const {
  if (data_parallel == "zero1") return 1;
  if (data_parallel == "zero2") return 2;
  if (data_parallel == "fsdp") return 3;
  return 0;
}

int64_t TrainConfig::mesh_size(const std::string& name) const { return dims().size(name); }

int64_t TrainConfig::mesh_coordinate(const std::string& name, int64_t rank) const {
  const ParallelDims d = dims();
  const std::vector<int64_t> shape = d.mesh_shape();
  const std::vector<std::string> names = d.mesh_names();
  int64_t stride = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    if (names[k] == name) return rank / stride % shape[k];
    stride *= shape[k];
  }
  return 0;
}

int64_t TrainConfig::stages_per_rank() const {
  if (pipeline.schedule == "zbv" || pipeline.schedule == "dualpipev") return 2;
  if (pipeline.schedule == "interleaved-1f1b") return pipeline.virtual_stages > 0 ? pipeline.virtual_stages : 2;
  return 1;
}

int64_t TrainConfig::microbatches() const {
  return pipeline.microbatches > 0 ? pipeline.microbatches : 2 * dims().pp;
}

int64_t TrainConfig::world_size() const {
  int64_t n = 1;
  for (auto s : mesh.shape) n *= s;
  return n;
}

std::string TrainConfig::to_string() const {
  std::ostringstream os;
  os << "# resolved from " << source << "\n";
  std::string section;
  for (const auto& f : config_fields()) {
    if (f.section != section) os << (section.empty() ? "" : "\n") << "[" << f.section << "]\n";
    section = f.section;
    std::visit([&](const auto& slot) { os << f.key << " = " << toml_value(slot.read(*this)) << "\n"; }, f.member);
  }
  return os.str();
}

TrainConfig default_config() { return TrainConfig{}; }

TrainConfig parse_config(const std::string& toml_text, const std::string& source) {
  toml::value root;
  try {
    std::istringstream is(toml_text);
    root = toml::parse(is, source);
  } catch (const toml::exception& e) {
    HP_FAIL() << "cannot parse config " << source << ": " << e.what();
  }

  TrainConfig c;
  c.source = source;
  const std::vector<std::string> sections = config_sections();
  for (const auto& [name, v] : root.as_table()) {
    HP_CHECK(std::count(sections.begin(), sections.end(), name))
        << where(source, v) << ": unknown key " << name << " (known sections: " << bracketed(sections) << ")";
    HP_CHECK(v.is_table()) << where(source, v) << ": " << name << " must be a table ([" << name
                           << "]), found " << shown(v);
  }
  auto section = [&](const std::string& name) -> const toml::value* {
    const auto& t = root.as_table();
    auto it = t.find(name);
    return it == t.end() ? nullptr : &it->second;
  };
  for (const auto& name : sections) {
    SectionReader reader(source, name, section(name));
    for (const auto& f : config_fields())
      if (f.section == name) std::visit([&](const auto& slot) { reader.get(f.key, slot.write(c)); }, f.member);
    reader.finish();
  }

  validate(c);
  return c;
}

TrainConfig load_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HP_CHECK(in) << "cannot open config file " << path;
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path);
}

namespace {

void validate_pipeline(const TrainConfig& c) {
  const auto& src = c.source;
  const auto& p = c.pipeline;
  HP_CHECK(p.microbatches >= 0) << src << ": pipeline.microbatches = " << p.microbatches << " must be >= 0";
  HP_CHECK(p.virtual_stages >= 0) << src << ": pipeline.virtual_stages = " << p.virtual_stages << " must be >= 0";
  const int64_t pp = c.dims().pp;
  if (pp == 1) return;
  try {  // the generator knows which kinds, stage counts and microbatch counts go together
    schedule::make_schedule(p.schedule, static_cast<int>(pp), static_cast<int>(c.microbatches()),
                            static_cast<int>(p.virtual_stages));
  } catch (const Error& e) {
    HP_FAIL() << src << ": [pipeline] does not make a schedule for pp = " << pp << ": " << e.what();
  }
  const int64_t chunks = pp * c.stages_per_rank(), dp = c.dims().dp, ep = c.dims().ep;
  const auto& md = c.model;
  HP_CHECK(!md.tied_embeddings) << src << ": model.tied_embeddings cannot be split into pipeline stages (the "
                                << "embedding and the head share one weight); set it to false or pp to 1";
  HP_CHECK(md.layers >= chunks) << src << ": model.layers = " << md.layers << " is fewer than the " << chunks
                                << " pipeline chunks (pp = " << pp << " times " << c.stages_per_rank()
                                << " per rank)";
  HP_CHECK(c.train.batch % (c.microbatches() * dp * ep) == 0)
      << src << ": train.batch = " << c.train.batch << " must be divisible by " << c.microbatches()
      << " microbatches times the dp and ep mesh dims (" << dp << " x " << ep << ")";
  if (!p.split.empty()) {
    int64_t sum = 0;
    for (int64_t n : p.split) {
      HP_CHECK(n >= 0) << src << ": pipeline.split " << to_string_list(p.split) << " has a negative count";
      sum += n;
    }
    HP_CHECK(static_cast<int64_t>(p.split.size()) == chunks && sum == md.layers)
        << src << ": pipeline.split " << to_string_list(p.split) << " must give " << chunks
        << " chunks that hold model.layers = " << md.layers << " blocks";
  }
  // fully_shard reduces gradients in the step's last full backward, which a split backward
  // (I then W) does not have; ddp reduces in W as well.
  const bool split_backward = p.schedule == "zb-h1" || p.schedule == "zbv" || p.schedule == "dualpipev";
  HP_CHECK(!split_backward || dp == 1 || c.mesh.zero_stage() == 0)
      << src << ": schedule \"" << p.schedule << "\" splits the backward, which mesh.data_parallel = \"" << c.mesh.data_parallel
      << "\" (fully_shard) cannot reduce in; use gpipe, 1f1b or interleaved-1f1b, or data_parallel = \"ddp\" or \"replicate\"";
  HP_CHECK(!split_backward || c.memory.activation_checkpoint != "full")
      << src << ": schedule \"" << p.schedule << "\" splits the backward, which a fully recomputed region cannot; "
      << "use gpipe, 1f1b or interleaved-1f1b";
}

}  // namespace

void validate(const TrainConfig& c) {
  const auto& src = c.source;
  const auto& m = c.mesh;
  const ParallelDims dims = c.dims();  // names, sizes

  auto positive = [&](const char* key, int64_t v) {
    HP_CHECK(v >= 1) << src << ": " << key << " = " << v << " must be >= 1";
  };
  auto non_negative = [&](const char* key, double v) {
    HP_CHECK(v >= 0 && std::isfinite(v)) << src << ": " << key << " = " << v << " must be >= 0";
  };
  const auto& md = c.model;
  positive("model.vocab", md.vocab);
  positive("model.dim", md.dim);
  positive("model.layers", md.layers);
  positive("model.heads", md.heads);
  positive("model.kv_heads", md.kv_heads);
  positive("model.ffn_dim", md.ffn_dim);
  positive("model.max_seq", md.max_seq);
  HP_CHECK(md.norm_eps > 0 && std::isfinite(md.norm_eps)) << src << ": model.norm_eps = " << md.norm_eps
                                                         << " must be > 0";
  HP_CHECK(md.vocab >= 256) << src << ": model.vocab = " << md.vocab
                            << " must be >= 256 (the tokenizer is byte-level)";
  HP_CHECK(md.dim % md.heads == 0) << src << ": model.dim = " << md.dim
                                   << " must be divisible by model.heads = " << md.heads;
  HP_CHECK((md.dim / md.heads) % 2 == 0)
      << src << ": head dim model.dim / model.heads = " << md.dim / md.heads
      << " must be even (rotary embeddings rotate pairs)";
  HP_CHECK(md.heads % md.kv_heads == 0) << src << ": model.heads = " << md.heads
                                        << " must be divisible by model.kv_heads = "
                                        << md.kv_heads;
  HP_CHECK(md.rope_theta > 0 && std::isfinite(md.rope_theta))
      << src << ": model.rope_theta = " << md.rope_theta << " must be > 0";

  const auto& t = c.train;
  positive("train.steps", t.steps);
  positive("train.batch", t.batch);
  positive("train.seq", t.seq);
  positive("train.log_every", t.log_every);
  HP_CHECK(t.lr > 0 && std::isfinite(t.lr)) << src << ": train.lr = " << t.lr << " must be > 0";
  HP_CHECK(t.warmup >= 0) << src << ": train.warmup = " << t.warmup << " must be >= 0";
  non_negative("train.weight_decay", t.weight_decay);
  non_negative("train.grad_clip", t.grad_clip);
  non_negative("train.peak_tflops", t.peak_tflops);
  HP_CHECK(m.data_parallel == "ddp" || m.data_parallel == "replicate" || m.zero_stage() > 0)
      << src << ": mesh.data_parallel = \"" << m.data_parallel
      << "\" must be \"ddp\", \"replicate\", \"zero1\", \"zero2\" or \"fsdp\"";
  HP_CHECK(t.optimizer == "adamw" || t.optimizer == "muon")
      << src << ": train.optimizer = \"" << t.optimizer << "\" must be \"adamw\" or \"muon\"";
  HP_CHECK(t.muon_lr > 0 && std::isfinite(t.muon_lr)) << src << ": train.muon_lr = " << t.muon_lr << " must be > 0";
  HP_CHECK(c.checkpoint.every >= 0) << src << ": checkpoint.every = " << c.checkpoint.every << " must be >= 0";
  HP_CHECK(c.checkpoint.keep >= 0) << src << ": checkpoint.keep = " << c.checkpoint.keep << " must be >= 0";
  auto dtype = [&](const char* key, const std::string& value) {
    HP_CHECK(value == "float32" || value == "bfloat16")
        << src << ": " << key << " = \"" << value << "\" must be \"float32\" or \"bfloat16\"";
  };
  dtype("train.mixed_precision_param", t.mixed_precision_param);
  dtype("train.mixed_precision_reduce", t.mixed_precision_reduce);
  dtype("train.muon_ns_dtype", t.muon_ns_dtype);
  if (t.mixed_precision()) {
    // Only fully_shard casts parameters for compute while keeping float32 masters.
    const char* keys = "train.mixed_precision_param / mixed_precision_reduce";
    HP_CHECK(m.zero_stage() > 0)
        << src << ": " << keys << " need mesh.data_parallel = \"fsdp\", \"zero1\" or \"zero2\""
        << " (it casts through fully_shard, at dp = 1 too), not \"" << m.data_parallel
        << "\"; set it, or both keys to \"float32\"";
    HP_CHECK(dims.pp == 1) << src << ": " << keys << " with pipeline stages (pp = " << dims.pp
                           << ") are not supported yet (stages exchange float32 activations); set both to \"float32\"";
    HP_CHECK(std::count(dims.order.begin(), dims.order.end(), "dp"))
        << src << ": " << keys << " need a dp mesh dim for fully_shard; add \"dp\" to mesh.names (size 1 is fine)";
  }
  const auto& lp = c.low_precision;
  HP_CHECK(lp.scaling.empty() || lp.scaling == "tensorwise" || lp.scaling == "rowwise" || lp.scaling == "mx_block")
      << src << ": low_precision.scaling = \"" << lp.scaling
      << "\" must be \"\" (off), \"tensorwise\", \"rowwise\" or \"mx_block\"";
  HP_CHECK(!lp.delayed || lp.scaling == "tensorwise")
      << src << ": low_precision.delayed needs low_precision.scaling = \"tensorwise\", not \"" << lp.scaling << "\"";
  positive("low_precision.history_len", lp.history_len);
  HP_CHECK(!lp.fsdp_float8_all_gather || lp.scaling == "tensorwise")
      << src << ": low_precision.fsdp_float8_all_gather needs low_precision.scaling = \"tensorwise\", not \""
      << lp.scaling << "\" (one gathered FP8 weight must serve both of its products)";
  const auto& mem = c.memory;
  HP_CHECK(mem.activation_checkpoint.empty() || mem.activation_checkpoint == "full" ||
           mem.activation_checkpoint == "selective" || mem.activation_checkpoint == "swap")
      << src << ": memory.activation_checkpoint = \"" << mem.activation_checkpoint
      << "\" must be \"\" (off), \"full\", \"selective\" or \"swap\"";
  HP_CHECK(mem.activation_checkpoint != "swap" || !mem.activation_swap_dir.empty())
      << src << ": memory.activation_checkpoint = \"swap\" needs memory.activation_swap_dir, where the files go";
  HP_CHECK(mem.memory_budget >= 0 && mem.memory_budget <= 1)
      << src << ": memory.memory_budget = " << mem.memory_budget << " must be from 0 to 1";
  HP_CHECK(mem.memory_budget == 0 || mem.activation_checkpoint == "selective" || mem.activation_checkpoint == "swap")
      << src << ": memory.memory_budget needs memory.activation_checkpoint = \"selective\" or \"swap\", not \""
      << mem.activation_checkpoint << "\"";
  HP_CHECK(!mem.release_at_next_region || mem.activation_checkpoint == "selective" ||
           mem.activation_checkpoint == "swap")
      << src << ": memory.release_at_next_region needs memory.activation_checkpoint = \"selective\" or \"swap\", not \""
      << mem.activation_checkpoint << "\"";
  HP_CHECK(mem.activation_checkpoint.empty() || !mem.checkpoint_modules.empty())
      << src << ": memory.checkpoint_modules is empty";
  HP_CHECK(mem.chunked_modules.empty() || !mem.activation_checkpoint.empty())
      << src << ": memory.chunked_modules are regions inside the checkpointed modules and need "
      << "memory.activation_checkpoint";
  positive("memory.token_chunks", mem.token_chunks);
  positive("memory.optimizer_offload_batch_mib", mem.optimizer_offload_batch_mib);

  const auto& mon = c.monitor;
  HP_CHECK(mon.every >= 0) << src << ": monitor.every = " << mon.every << " must be >= 0";
  HP_CHECK(mon.replica_check_every >= 0)
      << src << ": monitor.replica_check_every = " << mon.replica_check_every << " must be >= 0";
  // A factor of 1 or less flags about half of all steps.
  HP_CHECK(mon.spike_factor == 0 || (mon.spike_factor > 1 && std::isfinite(mon.spike_factor)))
      << src << ": monitor.spike_factor = " << mon.spike_factor << " must be 0 (off) or above 1";
  HP_CHECK(t.seq <= md.max_seq) << src << ": train.seq = " << t.seq
                                << " exceeds model.max_seq = " << md.max_seq;

  if (c.moe.enabled()) {
    try {
      c.moe.model(md).validate();
    } catch (const Error& e) {
      HP_FAIL() << src << ": [moe]: " << e.what();
    }
    HP_CHECK(dims.cp == 1) << src << ": [moe] models do not run with a cp mesh dim (" << dims.cp << ") yet";
    HP_CHECK(c.moe.num_experts >= dims.ep) << src << ": moe.num_experts = " << c.moe.num_experts
                                           << " is fewer than the ep mesh dim (" << dims.ep << ")";
  } else {
    HP_CHECK(dims.ep == 1) << src << ": the ep mesh dim (" << dims.ep << ") needs a MoE model ([moe] num_experts > 0)";
  }

  // Shapes the parallel layers will split; failing here beats failing mid-setup.
  const int64_t dp = dims.dp, tp = dims.tp;
  HP_CHECK(t.batch % (dp * dims.ep) == 0) << src << ": train.batch = " << t.batch
                              << " must be divisible by the dp and ep mesh dims (" << dp << " x " << dims.ep << ")";
  HP_CHECK(md.heads % tp == 0 && md.kv_heads % tp == 0 && md.ffn_dim % tp == 0)
      << src << ": model.heads = " << md.heads << ", model.kv_heads = " << md.kv_heads
      << " and model.ffn_dim = " << md.ffn_dim << " must be divisible by the tp mesh dim ("
      << tp << ")";
  HP_CHECK(!m.sequence_parallel || t.seq % tp == 0)
      << src << ": with mesh.sequence_parallel, train.seq = " << t.seq
      << " must be divisible by the tp mesh dim (" << tp << ")";
  HP_CHECK(!m.async_tp || (m.sequence_parallel && tp > 1))
      << src << ": mesh.async_tp decomposes the sequence-parallel collectives of a tp mesh dim; set "
      << "mesh.sequence_parallel = true with tp > 1, or async_tp = false";
  const int64_t cp = dims.cp;
  const bool hybrid = m.context_parallel == "hybrid";
  HP_CHECK(hybrid || m.context_parallel == "ulysses" || m.context_parallel == "ring" ||
           m.context_parallel == "allgather_kv")
      << src << ": mesh.context_parallel = \"" << m.context_parallel
      << "\" must be \"ulysses\", \"ring\", \"allgather_kv\" or \"hybrid\"";
  const int64_t uly = m.cp_ulysses_degree;
  // Without a cp dim neither setting does anything.
  HP_CHECK(cp == 1 || hybrid || uly == 1) << src << ": mesh.cp_ulysses_degree = " << uly
                               << " splits cp for mesh.context_parallel = \"hybrid\" only, not \""
                               << m.context_parallel << "\"";
  HP_CHECK(!hybrid || cp == 1 || (uly > 1 && uly < cp && cp % uly == 0))
      << src << ": mesh.cp_ulysses_degree = " << uly << " must divide the cp mesh dim (" << cp
      << ") and lie strictly between 1 and it: hybrid runs Ulysses over cp_ulysses_degree ranks and the ring "
      << "over cp / cp_ulysses_degree";
  HP_CHECK(!hybrid || cp == 1 || (md.heads / tp) % uly == 0)
      << src << ": mesh.context_parallel = \"hybrid\" splits the " << md.heads / tp << " heads of each tp rank"
      << " (model.heads = " << md.heads << " over tp = " << tp << ") over mesh.cp_ulysses_degree = " << uly
      << ", which does not divide them";
  HP_CHECK(cp == 1 || !m.sequence_parallel)
      << src << ": mesh.sequence_parallel with a cp mesh dim (" << cp
      << ") would shard the sequence twice; the cp dim already shards it";
  HP_CHECK(cp == 1 || m.context_parallel != "ulysses" || (md.heads / tp) % cp == 0)
      << src << ": mesh.context_parallel = \"ulysses\" splits the " << md.heads / tp << " heads of each tp rank"
      << " (model.heads = " << md.heads << " over tp = " << tp << ") over the cp mesh dim (" << cp
      << "), which does not divide them; use \"ring\" or \"allgather_kv\", or another cp";
  HP_CHECK(t.seq >= cp) << src << ": train.seq = " << t.seq << " gives some of the " << cp
                        << " cp ranks no token; use a longer sequence or a smaller cp";
  validate_pipeline(c);
}

}  // namespace hp::train
