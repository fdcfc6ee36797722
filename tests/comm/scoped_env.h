// Sets an environment variable for one test, and removes it after.
#pragma once

#include <cstdlib>

class ScopedEnv {
 public:
  ScopedEnv(const char* k, const char* v) : k_(k) { ::setenv(k, v, 1); }
  ~ScopedEnv() { ::unsetenv(k_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* k_;
};
