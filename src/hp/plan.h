// The plan layer: model, cluster and strategy descriptions, the memory/time estimator,
// reports and the strategy search. Plain C++17, no LibTorch.
#pragma once

#include "hp/plan/cluster_spec.h"
#include "hp/plan/cp_traffic.h"
#include "hp/plan/estimator.h"
#include "hp/plan/flops.h"
#include "hp/plan/memory.h"
#include "hp/plan/model_desc.h"
#include "hp/plan/pipeline_profile.h"
#include "hp/plan/pipeline_stages.h"
#include "hp/plan/rank_correlation.h"
#include "hp/plan/report.h"
#include "hp/plan/search.h"
#include "hp/plan/stage_split.h"
#include "hp/plan/strategy.h"
