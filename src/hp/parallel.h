// hp/parallel.h: parallelism injected from outside the model.
#pragma once

#include "hp/nn.h"
#include "hp/parallel/async_tp.h"
#include "hp/parallel/context_parallel.h"
#include "hp/parallel/data_parallel.h"
#include "hp/parallel/expert_parallel.h"
#include "hp/parallel/fully_shard.h"
#include "hp/parallel/llama_recipe.h"
#include "hp/parallel/low_precision.h"
#include "hp/parallel/moe_recipe.h"
#include "hp/parallel/tensor_parallel.h"
#include "hp/parallel/token_dispatcher.h"
#include "hp/parallel/zero_stage.h"
