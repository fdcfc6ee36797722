// HyperParallel's optimizers on DTensor parameters: AdamW, distributed Muon, and chains
// of them (get_hyper_optimizer).
#pragma once

#include "hp/base/error.h"
#include "hp/optim/adamw.h"
#include "hp/optim/chained.h"
#include "hp/optim/muon.h"
#include "hp/optim/newton_schulz.h"
#include "hp/optim/optimizer.h"
