// hp/tensor.h: the public header of the tensor layer (DTensor, its ops, distributed RNG).
#pragma once

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm.h"
#include "hp/layout/placement.h"
#include "hp/tensor/dtensor.h"
#include "hp/tensor/ops.h"
#include "hp/tensor/random.h"
#include "hp/tensor/redistribute.h"
