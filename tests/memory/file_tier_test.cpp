// FileTier rewrites a key's file in place: what reads back is always the last write whole,
// never the bytes of an earlier, longer one nor a write that failed part way; a removed
// key's file is renamed for the next new key.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <functional>

#include "hp/base/error.h"
#include "hp/memory/storage_tier.h"

using namespace hp;

namespace {

std::string fresh_dir() {
  char tmpl[] = "/tmp/hp_file_tier_XXXXXX";
  HP_CHECK(::mkdtemp(tmpl) != nullptr) << "mkdtemp failed";
  return tmpl;
}

}  // namespace

TEST(FileTier, AShorterRewriteReadsBackAtItsOwnSize) {
  memory::FileTier tier(fresh_dir());
  tier.write("k", at::arange(64, at::kFloat));
  const at::Tensor shorter = at::arange(16, at::kFloat) * 2;
  tier.write("k", shorter);
  at::Tensor got = at::empty({16}, at::kFloat);
  tier.read("k", got);
  EXPECT_TRUE(at::equal(got, shorter));
  at::Tensor as_before = at::empty({64}, at::kFloat);
  EXPECT_THROW(tier.read("k", as_before), hp::Error);
}

// A file size limit stands for a disk that fills part way through a rewrite.
TEST(FileTier, ARewriteThatFailsPartWayLeavesNothingToReadBack) {
  memory::FileTier tier(fresh_dir());
  tier.write("k", at::zeros({64}, at::kFloat));  // 256 bytes
  rlimit old;
  ::getrlimit(RLIMIT_FSIZE, &old);
  auto previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit tiny = old;
  tiny.rlim_cur = 100;  // the rewrite's first 100 bytes land, the rest do not
  ::setrlimit(RLIMIT_FSIZE, &tiny);
  std::string error;
  try {
    tier.write("k", at::ones({64}, at::kFloat));
  } catch (const hp::Error& e) {
    error = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  EXPECT_NE(error.find("stays in memory"), std::string::npos) << error;
  at::Tensor got = at::empty({64}, at::kFloat);
  EXPECT_THROW(tier.read("k", got), hp::Error) << "read back: " << got;
}

// A removed key's file serves the next new key (activation swap writes new keys every step):
// the same inode, renamed, with the new key's bytes; nothing is left when the tier goes.
TEST(FileTier, ARemovedKeysFileServesTheNextNewKey) {
  const std::string dir = fresh_dir();
  auto inode = [&](const std::string& key) {
    struct stat st;
    HP_CHECK(::stat((dir + "/" + key).c_str(), &st) == 0) << key;
    return st.st_ino;
  };
  {
    memory::FileTier tier(dir);
    tier.write("a", at::arange(1000, at::kFloat));
    const auto a = inode("a");
    tier.remove("a");
    EXPECT_FALSE(std::filesystem::exists(dir + "/a"));
    const at::Tensor b = at::arange(1000, at::kFloat) * 2;
    tier.write("b", b);
    EXPECT_EQ(inode("b"), a);
    at::Tensor back = at::empty({1000}, at::kFloat);
    tier.read("b", back);
    EXPECT_TRUE(at::equal(back, b));
    // Of another size: the kept file is cut to it.
    tier.remove("b");
    const at::Tensor c = at::arange(10, at::kFloat);
    tier.write("c", c);
    EXPECT_EQ(inode("c"), a);
    at::Tensor c_back = at::empty({10}, at::kFloat);
    tier.read("c", c_back);
    EXPECT_TRUE(at::equal(c_back, c));
    tier.write("d", c);  // nothing kept: a new file
    EXPECT_NE(inode("d"), a);
    tier.remove("c");
  }
  EXPECT_FALSE(std::filesystem::exists(dir)) << "the tier left files in " << dir;
}

// Files hold host tensors: a device tensor (here a meta one, as a CUDA one would be) is an
// error naming the key and its device, not a write from a device pointer.
TEST(FileTier, ADeviceTensorIsAnError) {
  memory::FileTier tier(fresh_dir());
  at::Tensor on_device = at::empty({4}, at::TensorOptions().device(at::kMeta));
  for (auto run : {std::function<void()>([&] { tier.write("w", on_device); }),
                   std::function<void()>([&] { tier.read("w", on_device); })}) {
    try {
      run();
      ADD_FAILURE() << "expected an error";
    } catch (const hp::Error& e) {
      for (const char* word : {" w ", "meta", "HostTier"})
        EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  }
}
