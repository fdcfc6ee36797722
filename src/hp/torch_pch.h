// Precompiled for every LibTorch translation unit: the narrow headers we use, not torch/torch.h.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
