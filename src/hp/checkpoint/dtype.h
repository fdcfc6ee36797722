// LibTorch dtypes by their safetensors names ("F32", "BF16", ...).
#pragma once

#include <c10/core/ScalarType.h>

#include <string>

namespace hp::checkpoint {

std::string dtype_name(at::ScalarType t);                 // error if it has none
at::ScalarType dtype_from_name(const std::string& name);  // error if unknown

}  // namespace hp::checkpoint
