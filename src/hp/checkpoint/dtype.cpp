#include "hp/checkpoint/dtype.h"

#include "hp/base/error.h"
#include "hp/checkpoint/format.h"

namespace hp::checkpoint {
namespace {

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr DtypeName kNames[] = {{at::kFloat, "F32"}, {at::kDouble, "F64"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"},
                                {at::kLong, "I64"},  {at::kInt, "I32"},    {at::kShort, "I16"}, {at::kChar, "I8"},
                                {at::kByte, "U8"},   {at::kBool, "BOOL"}};

}  // namespace

std::string dtype_name(at::ScalarType t) {
  for (const auto& d : kNames)
    if (d.type == t) return d.name;
  HP_FAIL() << "checkpoint: dtype " << t << " has no safetensors name";
  return {};
}

at::ScalarType dtype_from_name(const std::string& name) {
  dtype_size(name);  // errors on an unknown name, listing the known ones
  for (const auto& d : kNames)
    if (name == d.name) return d.type;
  return at::kFloat;  // unreachable: format.h and this table list the same names
}

}  // namespace hp::checkpoint
