#include "hp/plan/rank_correlation.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "hp/base/error.h"

namespace hp::plan {

std::vector<double> ranks_of(const std::vector<double>& values) {
  std::vector<size_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return values[a] < values[b]; });
  std::vector<double> r(values.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && values[order[j + 1]] == values[order[i]]) ++j;
    const double mean_rank = (double(i) + double(j)) / 2 + 1;
    for (size_t k = i; k <= j; ++k) r[order[k]] = mean_rank;
    i = j + 1;
  }
  return r;
}

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  HP_CHECK(a.size() == b.size() && a.size() >= 2)
      << "spearman needs two series of the same length >= 2, got " << a.size() << " and " << b.size();
  const std::vector<double> ra = ranks_of(a), rb = ranks_of(b);
  const double mean = (double(a.size()) + 1) / 2;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (ra[i] - mean) * (rb[i] - mean);
    saa += (ra[i] - mean) * (ra[i] - mean);
    sbb += (rb[i] - mean) * (rb[i] - mean);
  }
  HP_CHECK(saa > 0 && sbb > 0) << "spearman: a series with all values equal has no ranking";
  return sab / std::sqrt(saa * sbb);
}

}  // namespace hp::plan
