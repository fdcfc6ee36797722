// Spearman's rank correlation: how well one ordering (estimated step times) agrees
// with another (measured ones), 1 for the same order, -1 for the reverse.
#pragma once

#include <vector>

namespace hp::plan {

// Ranks 1..n, ties sharing the mean of the ranks they span.
std::vector<double> ranks_of(const std::vector<double>& values);
// Pearson correlation of the ranks of `a` and `b` (same length, at least 2, not all equal).
double spearman(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace hp::plan
