#include "hp/plan/report.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace hp::plan {

namespace {

constexpr double GiB = double(1ull << 30);
constexpr double MiB = double(1ull << 20);

std::string human_bytes(double b) {
  if (b >= GiB) return fmt::format("{:.2f} GiB", b / GiB);
  if (b >= MiB) return fmt::format("{:.1f} MiB", b / MiB);
  return fmt::format("{:.0f} KiB", b / 1024);
}

std::string human_count(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}K", n / 1e3);
  return fmt::format("{:.0f}", n);
}

std::string header(const ModelDesc& m, const ClusterSpec& c, int64_t devices) {
  const ParamCounts pc = count_params(m);
  return fmt::format("model {}: {} params ({} active), {} layers, seq {}\n"
                     "cluster {}: {} of {} devices, {:.0f} GiB and {:.0f} TFLOP/s each\n",
                     m.name, human_count(double(pc.total)), human_count(double(pc.active)), m.layers, m.seq_len, c.name, devices,
                     c.num_devices(), c.device.memory_GiB, c.device.tflops);
}

nlohmann::json memory_json(const MemoryBreakdown& mem) {
  return {{"stage", mem.stage},           {"params", mem.params},
          {"grads", mem.grads},           {"optimizer", mem.optimizer},
          {"activations", mem.activations}, {"logits", mem.logits},
          {"zero_buffers", mem.zero_buffers}, {"ddp_buckets", mem.ddp_buckets},
          {"stage_inputs", mem.stage_inputs}, {"total", mem.total()}};
}

nlohmann::json estimate_json(const Estimate& e) {
  nlohmann::json j;
  const Strategy& s = e.strategy;
  j["strategy"] = to_string(s);
  j["dims"] = {{"dp", s.dp}, {"tp", s.tp}, {"pp", s.pp}, {"cp", s.cp}, {"ep", s.ep}};
  j["zero"] = s.zero;
  j["microbatches"] = s.microbatches;
  j["micro_batch"] = s.micro_batch;
  j["global_batch"] = s.global_batch;
  j["schedule"] = s.schedule;
  j["virtual_stages"] = s.virtual_stages;
  j["recompute"] = to_string(s.recompute);
  j["memory_bytes"] = memory_json(e.memory);
  j["usable_memory_bytes"] = e.usable_memory;
  j["fits"] = e.fits;
  nlohmann::json comm = nlohmann::json::array();
  for (const auto& it : e.comm) {
    nlohmann::json levels;
    for (size_t l = 0; l < e.level_names.size(); ++l) levels[e.level_names[l]] = it.bytes_per_level[l];
    comm.push_back({{"name", it.name},
                    {"collective", to_string(it.kind)},
                    {"group", it.group},
                    {"group_size", it.group_size},
                    {"bytes_per_call", it.bytes},
                    {"calls", it.calls},
                    {"seconds", it.seconds},
                    {"exposed_seconds", it.exposed},
                    {"bytes_per_rank_by_level", levels}});
  }
  j["comm"] = comm;
  nlohmann::json per_level;
  for (size_t l = 0; l < e.level_names.size(); ++l) per_level[e.level_names[l]] = e.comm_bytes_per_level[l];
  j["comm_bytes_per_rank_by_level"] = per_level;
  const TimeBreakdown& t = e.time;
  j["time_seconds"] = {{"compute", t.compute}, {"recompute", t.recompute}, {"tp", t.tp},   {"cp", t.cp},
                       {"ep", t.ep},           {"zero", t.zero},           {"bubble", t.bubble},
                       {"pp", t.pp},           {"dp", t.dp},               {"total", t.total}};
  j["slowest_stage"] = e.slowest_stage;
  j["bubble_fraction"] = e.bubble_fraction;
  j["tokens_per_second"] = e.tokens_per_second;
  j["mfu"] = e.mfu;
  return j;
}

nlohmann::json context_json(const ModelDesc& m, const ClusterSpec& c, int64_t devices) {
  const ParamCounts pc = count_params(m);
  return {{"model", m.name},
          {"params", pc.total},
          {"active_params", pc.active},
          {"cluster", c.name},
          {"devices", devices},
          {"device_memory_GiB", c.device.memory_GiB},
          {"device_tflops", c.device.tflops}};
}

}  // namespace

std::string format_dryrun(const Estimate& e, const ModelDesc& m, const ClusterSpec& c) {
  const Strategy& s = e.strategy;
  std::string out = header(m, c, s.devices());
  out += fmt::format("strategy {}\n", to_string(s));
  out += fmt::format("global batch {} sequences = {:.2f}M tokens; {} microbatches of {}\n\n", s.global_batch,
                     double(s.global_batch) * m.seq_len / 1e6, s.microbatches, s.micro_batch);

  const MemoryBreakdown& mem = e.memory;
  out += fmt::format("memory per rank (pipeline rank {}, the fullest)\n", mem.stage);
  auto row = [&](const char* what, double b) { out += fmt::format("  {:<16} {:>12}\n", what, human_bytes(b)); };
  row("parameters", mem.params);
  row("gradients", mem.grads);
  row("optimizer", mem.optimizer);
  row("activations", mem.activations);
  row("logits", mem.logits);
  row("gathered/reduce buffers", mem.zero_buffers);
  if (mem.ddp_buckets > 0) row("ddp buckets", mem.ddp_buckets);
  if (mem.stage_inputs > 0) row("stage inputs", mem.stage_inputs);
  out += fmt::format("  {:<16} {:>12} of {} usable: {}\n\n", "total", human_bytes(mem.total()),
                     human_bytes(e.usable_memory), e.fits ? "fits" : "DOES NOT FIT");

  out += fmt::format("communication per step (pipeline rank {}, the slowest)\n", e.slowest_stage);
  out += fmt::format("  {:<32} {:<9} {:>5} {:>8} {:>11} {:>10} {:>10}\n", "collective", "group", "size", "calls",
                     "per call", "time s", "exposed s");
  for (const auto& it : e.comm)
    out += fmt::format("  {:<32} {:<9} {:>5} {:>8.0f} {:>11} {:>10.4f} {:>10.4f}\n", it.name, it.group,
                       it.group_size, it.calls, human_bytes(it.bytes), it.seconds, it.exposed);
  if (e.comm.empty()) out += "  (none)\n";
  out += "  sent per rank per step by link level:";
  for (size_t l = 0; l < e.level_names.size(); ++l)
    out += fmt::format(" {} {}{}", e.level_names[l], human_bytes(e.comm_bytes_per_level[l]),
                       l + 1 < e.level_names.size() ? "," : "");
  out += "\n\n";

  const TimeBreakdown& t = e.time;
  out += "step time\n";
  auto trow = [&](const std::string& what, double sec) {
    out += fmt::format("  {:<28} {:>10.4g} s {:>6.1f}%\n", what, sec, 100 * sec / t.total);
  };
  trow("compute", t.compute - t.recompute);  // recompute is listed on its own
  trow(fmt::format("recompute ({})", to_string(s.recompute)), t.recompute);
  trow("tp exposed", t.tp);
  trow("cp exposed", t.cp);
  trow("ep exposed", t.ep);
  trow("zero exposed", t.zero);
  trow(fmt::format("pipeline bubble ({:.1f}%)", 100 * e.bubble_fraction), t.bubble);
  trow("pp send/recv exposed", t.pp);
  trow("dp exposed", t.dp);
  out += fmt::format("  {:<28} {:>10.4g} s\n", "total", t.total);
  out += fmt::format("throughput {:.4g} tokens/s ({:.4g} per device), MFU {:.1f}%\n", e.tokens_per_second,
                     e.tokens_per_second / double(s.devices()), 100 * e.mfu);
  return out;
}

std::string dryrun_json(const Estimate& e, const ModelDesc& m, const ClusterSpec& c) {
  nlohmann::json j = context_json(m, c, e.strategy.devices());
  j["estimate"] = estimate_json(e);
  return j.dump(2) + "\n";
}

std::string format_plan(const SearchResult& r, const ModelDesc& m, const ClusterSpec& c, int64_t devices) {
  std::string out = header(m, c, devices);
  out += fmt::format("searched {} meshes, {} strategies, {} fit in memory, in {:.2f} s\n", r.meshes, r.candidates,
                     r.fitting, r.seconds);
  if (r.best.empty()) return out + "no strategy fits in memory\n";
  out += fmt::format("\n{:>3}  {:<4} {:<4} {:<4} {:<4} {:<4} {:<4} {:>5} {:>4} {:<16} {:<9} {:>9} {:>9} {:>11} "
                     "{:>6} {:>6}\n",
                     "#", "dp", "tp", "pp", "cp", "ep", "zero", "mb", "mbs", "schedule", "recompute", "step s",
                     "mem GiB", "tokens/s", "bubble", "MFU");
  int i = 1;
  for (const auto& e : r.best) {
    const Strategy& s = e.strategy;
    std::string sched = s.pp == 1 ? "-" : s.virtual_stages > 1 && !uses_v_placement(s.schedule)
                                             ? fmt::format("{} v{}", s.schedule, s.virtual_stages)
                                             : s.schedule;
    out += fmt::format("{:>3}  {:<4} {:<4} {:<4} {:<4} {:<4} {:<4} {:>5} {:>4} {:<16} {:<9} {:>9.4g} {:>9.1f} "
                       "{:>11.4g} {:>5.1f}% {:>5.1f}%\n",
                       i++, s.dp, s.tp, s.pp, s.cp, s.ep, s.zero, s.microbatches, s.micro_batch,
                       sched, to_string(s.recompute), e.time.total, e.memory.total() / GiB, e.tokens_per_second,
                       100 * e.bubble_fraction, 100 * e.mfu);
  }
  out += fmt::format("\nbest: {}\n", to_string(r.best.front().strategy));
  return out;
}

std::string plan_json(const SearchResult& r, const ModelDesc& m, const ClusterSpec& c, int64_t devices) {
  nlohmann::json j = context_json(m, c, devices);
  j["meshes"] = r.meshes;
  j["candidates"] = r.candidates;
  j["fitting"] = r.fitting;
  j["search_seconds"] = r.seconds;
  nlohmann::json best = nlohmann::json::array();
  for (const auto& e : r.best) best.push_back(estimate_json(e));
  j["best"] = best;
  return j.dump(2) + "\n";
}

}  // namespace hp::plan
