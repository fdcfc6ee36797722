// The pipeline layer: stages of a model on different ranks, driven by a schedule.
#pragma once

#include "hp/pipeline/mesh_stage.h"
#include "hp/pipeline/runtime.h"
#include "hp/pipeline/stage.h"
