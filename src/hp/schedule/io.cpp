#include "hp/schedule/io.h"

#include <nlohmann/json.hpp>

#include "hp/base/error.h"

namespace hp::schedule {

std::string to_json(const Schedule& s) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& list : s.actions) {
    nlohmann::json l = nlohmann::json::array();
    for (const Action& a : list) l.push_back(to_string(a));
    ranks.push_back(std::move(l));
  }
  nlohmann::json doc = {{"name", s.name},
                        {"num_ranks", s.num_ranks},
                        {"num_stages", s.num_stages},
                        {"num_microbatches", s.num_microbatches},
                        {"stage_to_rank", s.stage_to_rank},
                        {"actions", std::move(ranks)}};
  return doc.dump(1);
}

Schedule schedule_from_json(const std::string& text) {
  try {
    const auto doc = nlohmann::json::parse(text);
    Schedule s;
    s.name = doc.value("name", std::string());
    s.num_ranks = doc.at("num_ranks").get<int>();
    s.num_stages = doc.at("num_stages").get<int>();
    s.num_microbatches = doc.at("num_microbatches").get<int>();
    s.stage_to_rank = doc.at("stage_to_rank").get<std::vector<int>>();
    for (const auto& list : doc.at("actions")) {
      s.actions.emplace_back();
      for (const auto& a : list) s.actions.back().push_back(parse_action(a.get<std::string>()));
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    HP_FAIL() << "bad schedule JSON: " << e.what();
  }
  return {};
}

}  // namespace hp::schedule
