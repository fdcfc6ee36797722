#include "hp/plan/strategy.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/plan/cp_traffic.h"

namespace hp::plan {

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
    case Recompute::FullChunked: return "full_chunked";
  }
  return "?";
}

std::vector<std::string> schedule_names() {
  return {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev"};
}

bool uses_v_placement(const std::string& schedule) { return schedule == "zbv" || schedule == "dualpipev"; }

namespace {

int64_t parse_count(const std::string& key, const std::string& v, int64_t min) {
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HP_CHECK(used == v.size() && !v.empty() && x >= min)
      << "strategy: " << key << "=" << v << ": expected an integer >= " << min;
  return x;
}

bool parse_bool(const std::string& key, const std::string& v) {
  if (v == "1" || v == "on" || v == "true" || v == "yes") return true;
  if (v == "0" || v == "off" || v == "false" || v == "no") return false;
  HP_FAIL() << "strategy: " << key << "=" << v << ": expected 1/0, on/off or true/false";
  return false;
}

const std::vector<std::string>& known_keys() {
  static const std::vector<std::string> keys = {"dp",  "tp",  "pp",       "cp",  "ep",        "zero",  "fsdp",
                                                "mb",  "mbs", "gbs",      "vpp", "recompute", "schedule",
                                                "cp_mode", "cp_ulysses"};
  return keys;
}

}  // namespace

Strategy parse_strategy(const std::string& text) {
  Strategy s;
  std::set<std::string> seen;
  for (const std::string& raw : split(text, ',')) {
    std::string item = trim(raw);
    if (item.empty()) continue;
    auto eq = item.find('=');
    HP_CHECK(eq != std::string::npos) << "strategy: '" << item << "': expected key=value";
    std::string key = trim(item.substr(0, eq));
    std::string val = trim(item.substr(eq + 1));
    if (key == "v") key = "vpp";
    HP_CHECK(!(key == "zero" && seen.count("fsdp")) && !(key == "fsdp" && seen.count("zero")))
        << "strategy: give zero or fsdp, not both (fsdp=1 is zero=3)";
    HP_CHECK(std::find(known_keys().begin(), known_keys().end(), key) != known_keys().end())
        << "strategy: unknown key '" << key << "'; expected one of " << to_string_list(known_keys());
    HP_CHECK(seen.insert(key).second) << "strategy: key '" << key << "' given twice";
    if (key == "dp") s.dp = parse_count(key, val, 0);  // 0: derive
    else if (key == "tp") s.tp = parse_count(key, val, 1);
    else if (key == "pp") s.pp = parse_count(key, val, 1);
    else if (key == "cp") s.cp = parse_count(key, val, 1);
    else if (key == "ep") s.ep = parse_count(key, val, 1);
    else if (key == "mb") s.microbatches = parse_count(key, val, 1);
    else if (key == "mbs") s.micro_batch = parse_count(key, val, 1);
    else if (key == "gbs") s.global_batch = parse_count(key, val, 1);
    else if (key == "vpp") s.virtual_stages = parse_count(key, val, 1);
    else if (key == "cp_ulysses") s.cp_ulysses = parse_count(key, val, 1);
    else if (key == "cp_mode") {
      HP_CHECK(std::find(cp_modes().begin(), cp_modes().end(), val) != cp_modes().end())
          << "strategy: cp_mode=" << val << ": expected one of " << to_string_list(cp_modes());
      s.cp_mode = val;
    }
    else if (key == "zero") {
      HP_CHECK(val.size() == 1 && val[0] >= '0' && val[0] <= '3') << "strategy: zero=" << val << ": expected 0, 1, 2 or 3";
      s.zero = val[0] - '0';
    } else if (key == "fsdp") s.zero = parse_bool(key, val) ? 3 : 0;
    else if (key == "recompute") {
      if (val == "none" || val == "0") s.recompute = Recompute::None;
      else if (val == "selective") s.recompute = Recompute::Selective;
      else if (val == "full" || val == "1") s.recompute = Recompute::Full;
      else if (val == "full_chunked") s.recompute = Recompute::FullChunked;
      else HP_FAIL() << "strategy: recompute=" << val << ": expected none, selective, full or full_chunked";
    } else if (key == "schedule") {
      auto names = schedule_names();
      HP_CHECK(std::find(names.begin(), names.end(), val) != names.end())
          << "strategy: schedule=" << val << ": expected one of " << to_string_list(names);
      s.schedule = val;
    }
  }
  // Interleaving needs at least two chunks; say so only if the user did not choose.
  if (s.schedule == "interleaved-1f1b" && !seen.count("vpp")) s.virtual_stages = 2;
  if (uses_v_placement(s.schedule) && !seen.count("vpp")) s.virtual_stages = 2;
  return s;
}

Strategy resolve_strategy(Strategy s, const ModelDesc& m, int64_t devices) {
  const std::string where = "strategy " + to_string(s) + " for " + m.name + ": ";
  HP_CHECK(devices >= 1) << where << "expected a positive device count, found " << devices;
  const int64_t others = s.tp * s.pp * s.cp * s.ep;
  if (s.dp == 0) {
    HP_CHECK(devices % others == 0) << where << "cannot derive dp: tp*pp*cp*ep = " << others
                                    << " does not divide " << devices << " devices";
    s.dp = devices / others;
  }
  HP_CHECK(s.devices() == devices) << where << "expected dp*tp*pp*cp*ep == " << devices
                                   << " devices, found " << s.devices();
  HP_CHECK(m.heads % s.tp == 0) << where << "expected heads % tp == 0, found heads " << m.heads << ", tp " << s.tp;
  HP_CHECK(m.kv_heads % s.tp == 0 || s.tp % m.kv_heads == 0)
      << where << "expected kv_heads and tp to divide one another, found kv_heads " << m.kv_heads << ", tp "
      << s.tp;
  HP_CHECK(m.ffn % s.tp == 0) << where << "expected ffn % tp == 0, found ffn " << m.ffn << ", tp " << s.tp;
  HP_CHECK(m.seq_len % s.cp == 0) << where << "expected seq_len % cp == 0, found seq_len " << m.seq_len
                                  << ", cp " << s.cp;
  // Sequence parallelism splits each cp shard of the sequence over tp.
  HP_CHECK((m.seq_len / s.cp) % s.tp == 0)
      << where << "expected (seq_len / cp) % tp == 0 for sequence parallelism, found " << m.seq_len / s.cp
      << " tokens per cp rank, tp " << s.tp;
  const bool hybrid = s.cp_mode == "hybrid";
  HP_CHECK(hybrid || s.cp_ulysses == 1)
      << where << "expected cp_ulysses == 1 outside cp_mode=hybrid, found " << s.cp_ulysses;
  if (s.cp > 1 && s.cp_mode == "ulysses") {
    HP_CHECK((m.heads / s.tp) % s.cp == 0) << where << "expected (heads / tp) % cp == 0 for cp_mode=ulysses, found "
                                           << m.heads / s.tp << " heads per tp rank, cp " << s.cp;
  }
  if (s.cp > 1 && hybrid) {
    HP_CHECK(s.cp_ulysses > 1 && s.cp_ulysses < s.cp && s.cp % s.cp_ulysses == 0)
        << where << "expected cp_ulysses to divide cp and lie strictly between 1 and it, found cp_ulysses "
        << s.cp_ulysses << ", cp " << s.cp;
    HP_CHECK((m.heads / s.tp) % s.cp_ulysses == 0)
        << where << "expected (heads / tp) % cp_ulysses == 0, found " << m.heads / s.tp << " heads per tp rank, "
        << "cp_ulysses " << s.cp_ulysses;
  }
  if (m.is_moe()) {
    HP_CHECK(m.experts % s.ep == 0) << where << "expected experts % ep == 0, found experts " << m.experts
                                    << ", ep " << s.ep;
    HP_CHECK(m.moe_ffn % s.tp == 0) << where << "expected moe_ffn % tp == 0, found moe_ffn " << m.moe_ffn
                                    << ", tp " << s.tp;
  } else {
    HP_CHECK(s.ep == 1) << where << "expected ep == 1 for a dense model, found ep " << s.ep;
  }
  HP_CHECK(s.recompute != Recompute::FullChunked || !m.is_moe() || m.dense_layers > 0)
      << where << "recompute=full_chunked chunks the dense layers' MLPs, and every layer of this model is MoE";

  // Pipeline: stages may be uneven, the heaviest one sets the pace.
  HP_CHECK(s.pp * s.virtual_stages <= m.layers)
      << where << "expected pp * vpp <= layers, found " << s.pp << " * " << s.virtual_stages << " > " << m.layers;
  if (s.pp == 1) {
    HP_CHECK(s.virtual_stages == 1) << where << "expected vpp == 1 without pipelining, found " << s.virtual_stages;
  } else if (s.schedule == "interleaved-1f1b") {
    HP_CHECK(s.virtual_stages >= 2) << where << "interleaved-1f1b expects vpp >= 2, found " << s.virtual_stages;
  } else if (uses_v_placement(s.schedule)) {
    HP_CHECK(s.virtual_stages == 2) << where << s.schedule << " expects vpp == 2, found " << s.virtual_stages;
  } else {
    HP_CHECK(s.virtual_stages == 1) << where << s.schedule << " expects vpp == 1, found " << s.virtual_stages;
  }

  // Batch: global = micro_batch * microbatches * dp * ep.
  const int64_t replicas = s.data_replicas();
  if (s.global_batch > 0) {
    HP_CHECK(s.global_batch % replicas == 0) << where << "expected gbs % (dp*ep) == 0, found gbs "
                                             << s.global_batch << ", dp*ep " << replicas;
    const int64_t per = s.global_batch / replicas;
    if (s.microbatches == 0 && s.micro_batch == 0) s.micro_batch = 1;
    if (s.microbatches == 0) {
      HP_CHECK(per % s.micro_batch == 0) << where << "expected mbs to divide gbs/(dp*ep) = " << per
                                         << ", found mbs " << s.micro_batch;
      s.microbatches = per / s.micro_batch;
    }
    if (s.micro_batch == 0) {
      HP_CHECK(per % s.microbatches == 0) << where << "expected mb to divide gbs/(dp*ep) = " << per
                                          << ", found mb " << s.microbatches;
      s.micro_batch = per / s.microbatches;
    }
    HP_CHECK(s.micro_batch * s.microbatches == per)
        << where << "expected mbs * mb == gbs/(dp*ep) = " << per << ", found " << s.micro_batch << " * "
        << s.microbatches;
  } else {
    if (s.micro_batch == 0) s.micro_batch = 1;
    if (s.microbatches == 0) s.microbatches = s.pp * (uses_v_placement(s.schedule) ? 2 : 1);
    s.global_batch = s.micro_batch * s.microbatches * replicas;
  }
  if (s.pp > 1) {
    if (s.schedule == "interleaved-1f1b") {
      HP_CHECK(s.microbatches % s.pp == 0) << where << "interleaved-1f1b expects mb % pp == 0, found mb "
                                           << s.microbatches << ", pp " << s.pp;
    } else if (s.schedule == "zb-h1") {
      HP_CHECK(s.microbatches >= s.pp) << where << "zb-h1 expects mb >= pp, found mb " << s.microbatches
                                       << ", pp " << s.pp;
    } else if (uses_v_placement(s.schedule)) {
      HP_CHECK(s.microbatches >= 2 * s.pp) << where << s.schedule << " expects mb >= 2*pp, found mb "
                                           << s.microbatches << ", pp " << s.pp;
    }
  }
  return s;
}

std::string to_string(const Strategy& s) {
  std::ostringstream os;
  os << "dp=" << s.dp << ",tp=" << s.tp << ",pp=" << s.pp << ",cp=" << s.cp << ",ep=" << s.ep
     << ",zero=" << s.zero;
  if (s.cp > 1 || s.cp_mode != "ring") os << ",cp_mode=" << s.cp_mode;
  if (s.cp_ulysses > 1) os << ",cp_ulysses=" << s.cp_ulysses;
  if (s.microbatches) os << ",mb=" << s.microbatches;
  if (s.micro_batch) os << ",mbs=" << s.micro_batch;
  if (s.global_batch) os << ",gbs=" << s.global_batch;
  os << ",schedule=" << s.schedule << ",vpp=" << s.virtual_stages << ",recompute=" << to_string(s.recompute);
  return os.str();
}

}  // namespace hp::plan
