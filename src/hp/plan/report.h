// Human and JSON renderings of a dry-run estimate and of a search result.
#pragma once

#include <string>

#include "hp/plan/cluster_spec.h"
#include "hp/plan/estimator.h"
#include "hp/plan/model_desc.h"
#include "hp/plan/search.h"

namespace hp::plan {

std::string format_dryrun(const Estimate& e, const ModelDesc& m, const ClusterSpec& c);
std::string dryrun_json(const Estimate& e, const ModelDesc& m, const ClusterSpec& c);
std::string format_plan(const SearchResult& r, const ModelDesc& m, const ClusterSpec& c, int64_t devices);
std::string plan_json(const SearchResult& r, const ModelDesc& m, const ClusterSpec& c, int64_t devices);

}  // namespace hp::plan
