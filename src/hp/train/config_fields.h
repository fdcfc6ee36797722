// Every TOML key of the trainer's config, once: parse_config reads through this table,
// TrainConfig::to_string prints through it, and the unknown-key and unknown-section
// errors list what it holds. A new key is one new row.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "hp/train/config.h"

namespace hp::train {

// One member of a TrainConfig: read to print it, written when parsing.
template <typename T>
struct Slot {
  const T& (*read)(const TrainConfig&);
  T& (*write)(TrainConfig&);
};

// The value types a key can have; the type picks how it is parsed and printed.
using Member = std::variant<Slot<int64_t>, Slot<uint64_t>, Slot<double>, Slot<bool>, Slot<std::string>,
                            Slot<std::vector<int64_t>>, Slot<std::vector<std::string>>>;

struct Field {
  std::string section;  // the [section] it is written under
  std::string key;
  std::string doc;      // one line for a reader of the TOML
  Member member;
};

// In file order: sections as to_string prints them, keys in order within each.
const std::vector<Field>& config_fields();

// The section names, in the order of config_fields().
std::vector<std::string> config_sections();

}  // namespace hp::train
