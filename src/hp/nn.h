// hp/nn.h: modules whose parameters are DTensors, building blocks, the Llama decoder.
#pragma once

#include "hp/nn/deferred_init.h"
#include "hp/nn/layers.h"
#include "hp/nn/moe.h"
#include "hp/nn/moe_llama.h"
#include "hp/nn/module.h"
#include "hp/nn/sequential.h"
#include "hp/nn/transformer.h"
#include "hp/nn/vision.h"
#include "hp/tensor.h"
