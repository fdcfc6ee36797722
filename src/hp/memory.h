// hp/memory.h: trading compute and transfers for memory, declared from outside the model.
#pragma once

#include "hp/memory/checkpoint.h"
#include "hp/memory/checkpoint_policy.h"
