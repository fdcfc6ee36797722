// hp/checkpoint.h: the public header of the checkpoint layer (distributed save and load
// from any layout to any layout, asynchronous saves, safetensors files).
#pragma once

#include "hp/base/error.h"
#include "hp/checkpoint/checkpointer.h"
#include "hp/checkpoint/dtype.h"
#include "hp/checkpoint/format.h"
#include "hp/checkpoint/hf.h"
#include "hp/checkpoint/load.h"
#include "hp/checkpoint/save.h"
#include "hp/checkpoint/state.h"
