// hp/memory.h: trading compute and transfers for memory, declared from outside the model.
#pragma once

#include "hp/memory/checkpoint.h"
#include "hp/memory/checkpoint_policy.h"
#include "hp/memory/host_tier.h"
#include "hp/memory/storage_tier.h"
#include "hp/memory/swap_optimizer.h"
