// The metrics file of `hp train`: records survive the file bit for bit, runs append,
// bad lines are reported by file and line, and the plot is well-formed SVG.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "hp/base/error.h"
#include "hp/train/metrics.h"

using hp::train::MetricsRecord;
using hp::train::MetricsWriter;

namespace {

// A path under the test temp dir, removed when the test ends.
class TempPath {
 public:
  explicit TempPath(const std::string& name)
      : path_(::testing::TempDir() + "hp_metrics_" + std::to_string(::getpid()) + "_" + name) {
    std::remove(path_.c_str());
  }
  ~TempPath() { std::remove(path_.c_str()); }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

MetricsRecord record(int64_t step, double loss) {
  MetricsRecord r;
  r.step = step;
  r.loss = loss;
  r.grad_norm = 0.5 + 1.0 / static_cast<double>(step + 3);
  r.lr = 3e-4;
  r.ms_per_step = 45.7;
  r.tokens_per_s = 11000 + 10.0 * static_cast<double>(step);
  r.mfu = 0.31;
  r.bubble = 0.125;
  r.rss_mib = 161;
  return r;
}

void expect_same(const MetricsRecord& a, const MetricsRecord& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.grad_norm, b.grad_norm);
  EXPECT_EQ(a.lr, b.lr);
  EXPECT_EQ(a.ms_per_step, b.ms_per_step);
  EXPECT_EQ(a.tokens_per_s, b.tokens_per_s);
  EXPECT_EQ(a.mfu, b.mfu);
  EXPECT_EQ(a.bubble, b.bubble);
  EXPECT_EQ(a.rss_mib, b.rss_mib);
}

std::string read_error(const std::string& text, const std::string& path) {
  std::ofstream(path) << text;
  try {
    hp::train::read_metrics(path);
  } catch (const hp::Error& e) {
    return e.what();
  }
  return "";
}

std::string svg_error(const std::vector<MetricsRecord>& records) {
  try {
    hp::train::plot_metrics_svg(records);
  } catch (const hp::Error& e) {
    return e.what();
  }
  return "";
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Every element is closed, in order: what an XML parser would insist on.
bool tags_balanced(const std::string& svg) {
  std::vector<std::string> open;
  for (size_t lt = svg.find('<'); lt != std::string::npos; lt = svg.find('<', lt + 1)) {
    const size_t gt = svg.find('>', lt);
    if (gt == std::string::npos) return false;
    const std::string tag = svg.substr(lt + 1, gt - lt - 1);
    if (tag.empty() || tag[0] == '?' || tag[0] == '!' || tag.back() == '/') continue;
    const std::string name = tag.substr(tag[0] == '/', tag.find_first_of(" \n") - (tag[0] == '/'));
    if (tag[0] != '/') {
      open.push_back(name);
    } else {
      if (open.empty() || open.back() != name) return false;
      open.pop_back();
    }
  }
  return open.empty();
}

// The polylines' points, each as {x, y}.
std::vector<std::vector<std::pair<double, double>>> polylines(const std::string& svg) {
  std::vector<std::vector<std::pair<double, double>>> lines;
  const std::regex polyline("<polyline[^>]* points=\"([^\"]*)\"");
  const std::regex point("(-?[0-9.]+),(-?[0-9.]+)");
  for (std::sregex_iterator it(svg.begin(), svg.end(), polyline), end; it != end; ++it) {
    const std::string points = (*it)[1];
    lines.emplace_back();
    for (std::sregex_iterator p(points.begin(), points.end(), point); p != end; ++p)
      lines.back().emplace_back(std::stod((*p)[1]), std::stod((*p)[2]));
  }
  return lines;
}

}  // namespace

TEST(Metrics, JsonLineHasEveryFieldAsAKeyAndNoNewline) {
  const std::string line = hp::train::to_json_line(record(10, 2.5));
  for (const char* key : {"step", "loss", "grad_norm", "lr", "ms_per_step", "tokens_per_s", "mfu", "bubble", "rss_mib"})
    EXPECT_NE(line.find("\"" + std::string(key) + "\":"), std::string::npos) << key << " missing from " << line;
  EXPECT_EQ(line.front(), '{');
  EXPECT_EQ(line.back(), '}');
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

TEST(Metrics, RoundTripKeepsDoublesExact) {
  TempPath path("round_trip.jsonl");
  std::vector<MetricsRecord> written;
  for (int64_t step : {1, 10, 20}) written.push_back(record(step, 6.13 / static_cast<double>(step)));
  MetricsRecord extreme = record(std::numeric_limits<int64_t>::max(), 1.0 / 3);
  extreme.lr = std::numeric_limits<double>::denorm_min();
  extreme.tokens_per_s = std::numeric_limits<double>::max();
  extreme.grad_norm = 0.1 + 0.2;  // not the double nearest 0.3
  written.push_back(extreme);
  {
    MetricsWriter w(path.str(), false);
    for (const MetricsRecord& r : written) w.write(r);
  }
  const std::vector<MetricsRecord> read = hp::train::read_metrics(path.str());
  ASSERT_EQ(read.size(), written.size());
  for (size_t i = 0; i < read.size(); ++i) expect_same(read[i], written[i]);
}

TEST(Metrics, ADivergedLossIsWrittenAsNullAndReadAsNaN) {
  TempPath path("nan.jsonl");
  MetricsRecord r = record(5, std::numeric_limits<double>::quiet_NaN());
  r.grad_norm = std::numeric_limits<double>::infinity();
  EXPECT_NE(hp::train::to_json_line(r).find("\"loss\":null"), std::string::npos) << hp::train::to_json_line(r);
  MetricsWriter(path.str(), false).write(r);
  const std::vector<MetricsRecord> read = hp::train::read_metrics(path.str());
  ASSERT_EQ(read.size(), 1u);
  EXPECT_TRUE(std::isnan(read[0].loss));
  EXPECT_TRUE(std::isnan(read[0].grad_norm));
  EXPECT_EQ(read[0].tokens_per_s, r.tokens_per_s);
}

TEST(Metrics, ASecondWriterAppendsAndAFreshOneTruncates) {
  TempPath path("append.jsonl");
  {
    MetricsWriter first(path.str(), false);
    first.write(record(10, 3));
    first.write(record(20, 2));
    // Flushed per line: a reader (or a run killed now) already sees both.
    EXPECT_EQ(hp::train::read_metrics(path.str()).size(), 2u);
  }
  MetricsWriter(path.str(), true).write(record(30, 1));
  std::vector<MetricsRecord> read = hp::train::read_metrics(path.str());
  ASSERT_EQ(read.size(), 3u);
  EXPECT_EQ(read[0].step, 10);
  EXPECT_EQ(read[2].step, 30);
  expect_same(read[2], record(30, 1));

  MetricsWriter(path.str(), false).write(record(40, 0.5));
  read = hp::train::read_metrics(path.str());
  ASSERT_EQ(read.size(), 1u);
  EXPECT_EQ(read[0].step, 40);
}

TEST(Metrics, UnknownKeysAreIgnoredAndMissingKeysKeepDefaults) {
  TempPath path("older.jsonl");
  std::ofstream(path.str()) << "{\"step\": 7, \"loss\": 2.5, \"a_later_key\": [1, {\"x\": 2}]}\n\n"
                            << "{\"loss\": 1.5}\n";
  const std::vector<MetricsRecord> read = hp::train::read_metrics(path.str());
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read[0].step, 7);
  EXPECT_EQ(read[0].loss, 2.5);
  EXPECT_EQ(read[0].mfu, 0);
  EXPECT_EQ(read[0].bubble, 0);
  EXPECT_EQ(read[0].tokens_per_s, 0);
  EXPECT_EQ(read[1].step, 0);
  EXPECT_EQ(read[1].loss, 1.5);
}

TEST(Metrics, AMalformedLineIsAnErrorNamingTheFileAndLine) {
  TempPath path("bad.jsonl");
  const std::string good = hp::train::to_json_line(record(1, 2)) + "\n";
  // Line 3 (after a blank line 2) is cut short.
  std::string e = read_error(good + "\n{\"step\": 3, \"loss\":\n", path.str());
  EXPECT_NE(e.find(path.str() + " line 3:"), std::string::npos) << e;
  e = read_error(good + "{\"step\": \"ten\"}\n", path.str());
  EXPECT_NE(e.find(path.str() + " line 2:"), std::string::npos) << e;
  EXPECT_NE(e.find("\"step\" must be an integer"), std::string::npos) << e;
  e = read_error(good + good + "{\"loss\": \"low\"}\n", path.str());
  EXPECT_NE(e.find(path.str() + " line 3:"), std::string::npos) << e;
  EXPECT_NE(e.find("\"loss\" must be a number"), std::string::npos) << e;
  e = read_error("[1, 2]\n", path.str());
  EXPECT_NE(e.find(path.str() + " line 1: expected a JSON object"), std::string::npos) << e;

  TempPath missing("missing.jsonl");
  try {
    hp::train::read_metrics(missing.str());
    FAIL() << "read a file that does not exist";
  } catch (const hp::Error& err) {
    EXPECT_NE(std::string(err.what()).find(missing.str()), std::string::npos) << err.what();
  }
}

TEST(Metrics, RepeatedStepsKeepTheLastRecord) {
  // A run logged to step 30, was killed, resumed from the checkpoint at step 10 and went on.
  const std::vector<MetricsRecord> log = {record(10, 5), record(20, 4), record(30, 3),
                                          record(20, 4.5), record(30, 3.5), record(40, 2)};
  const std::vector<MetricsRecord> last = hp::train::last_record_per_step(log);
  ASSERT_EQ(last.size(), 4u);
  EXPECT_EQ(last[0].step, 10);
  EXPECT_EQ(last[1].step, 20);
  EXPECT_EQ(last[1].loss, 4.5);
  EXPECT_EQ(last[2].loss, 3.5);
  EXPECT_EQ(last[3].step, 40);

  for (const auto& line : polylines(hp::train::plot_metrics_svg(log))) EXPECT_EQ(line.size(), 4u);
}

TEST(Metrics, SvgHasThreeWellFormedPanelsInsideItsViewBox) {
  std::vector<MetricsRecord> log;
  for (int64_t step = 10; step <= 200; step += 10) log.push_back(record(step, 6.13 * std::exp(-0.006 * step)));
  log[3].loss = std::numeric_limits<double>::quiet_NaN();  // left out, not drawn at the edge
  const std::string svg = hp::train::plot_metrics_svg(log);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u) << svg.substr(0, 80);
  EXPECT_EQ(count(svg, "<polyline"), 3u);
  EXPECT_TRUE(tags_balanced(svg)) << svg;
  for (const char* title : {">loss<", ">tokens/s<", ">grad norm<", ">step<"})
    EXPECT_NE(svg.find(title), std::string::npos) << title;
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.find("url("), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);

  std::smatch box;
  ASSERT_TRUE(std::regex_search(svg, box, std::regex("viewBox=\"0 0 ([0-9.]+) ([0-9.]+)\"")));
  const double width = std::stod(box[1]), height = std::stod(box[2]);
  const auto lines = polylines(svg);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].size(), log.size() - 1);  // the NaN loss
  EXPECT_EQ(lines[1].size(), log.size());
  for (const auto& line : lines) {
    for (const auto& [x, y] : line) {
      EXPECT_GE(x, 0);
      EXPECT_LE(x, width);
      EXPECT_GE(y, 0);
      EXPECT_LE(y, height);
    }
  }
  // Panels stack: each line lies below the one before.
  EXPECT_LT(lines[0].front().second, lines[1].back().second);
  EXPECT_LT(lines[1].front().second, lines[2].back().second);
}

TEST(Metrics, SvgOfOneRecordOrFlatSeriesStillDraws) {
  const std::string one = hp::train::plot_metrics_svg({record(0, 6)});
  EXPECT_TRUE(tags_balanced(one));
  for (const auto& line : polylines(one)) EXPECT_EQ(line.size(), 2u);  // a dot
  std::vector<MetricsRecord> flat = {record(1, 2), record(2, 2), record(3, 2)};
  for (MetricsRecord& r : flat) r.tokens_per_s = r.grad_norm = 0;
  EXPECT_EQ(polylines(hp::train::plot_metrics_svg(flat)).size(), 3u);
}

TEST(Metrics, NothingToPlotIsAnError) {
  EXPECT_NE(svg_error({}).find("no metrics records"), std::string::npos);
}
