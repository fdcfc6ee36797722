// Errors that say what was expected, what was found, and where.
//   HP_CHECK(a.size() == b.size()) << "shape mismatch: " << a << " vs " << b;
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace hp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

// Collects the message of a failed check; throws hp::Error when it dies at the
// end of the full expression (hence noexcept(false)).
class CheckFailure {
 public:
  CheckFailure(const char* cond, const char* file, int line);
  CheckFailure(const CheckFailure&) = delete;
  ~CheckFailure() noexcept(false);
  template <typename T>
  CheckFailure& operator<<(const T& v) {
    msg_ << v;
    return *this;
  }

 private:
  std::ostringstream msg_;
  std::string where_;
};

}  // namespace detail
}  // namespace hp

#define HP_CHECK(cond) \
  if (cond) {          \
  } else               \
    ::hp::detail::CheckFailure(#cond, __FILE__, __LINE__)

#define HP_FAIL() ::hp::detail::CheckFailure(nullptr, __FILE__, __LINE__)
