#include "hp/base/error.h"

#include <exception>

namespace hp::detail {

CheckFailure::CheckFailure(const char* cond, const char* file, int line) {
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  where_ = std::string(" [") + base + ":" + std::to_string(line) +
           (cond ? std::string(", check ") + cond : std::string()) + "]";
}

CheckFailure::~CheckFailure() noexcept(false) {
  // Never throw while another exception unwinds the stack.
  if (std::uncaught_exceptions() > 0) return;
  std::string m = msg_.str();
  if (m.empty()) m = "internal check failed";
  throw Error(m + where_);
}

}  // namespace hp::detail
