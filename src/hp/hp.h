// Everything HyperParallel offers, one include: each layer's public header.
#pragma once

#include "hp/checkpoint.h"
#include "hp/comm.h"
#include "hp/memory.h"
#include "hp/nn.h"
#include "hp/optim.h"
#include "hp/parallel.h"
#include "hp/pipeline.h"
#include "hp/plan.h"
#include "hp/schedule.h"
#include "hp/tensor.h"
#include "hp/train.h"
