#include "hp/parallel/fsdp_offload.h"

#include <atomic>

#include "hp/base/error.h"
#include "hp/memory/host_tier.h"

namespace hp::parallel {

std::shared_ptr<memory::StorageTier> make_offload_tier(const OffloadPolicyVariant& policy, int rank) {
  if (const auto* cpu = std::get_if<CPUOffloadPolicy>(&policy))
    return std::make_shared<memory::HostTier>(cpu->pin_memory);
  if (const auto* file = std::get_if<FileOffloadPolicy>(&policy)) {
    HP_CHECK(!file->dir.empty()) << "fully_shard: FileOffloadPolicy needs a directory (dir is empty)";
    // A directory per unit: ranks that are threads of one process share the counter, not
    // the directory, since the rank is in its name too.
    static std::atomic<int> units{0};
    return std::make_shared<memory::FileTier>(file->dir + "/rank" + std::to_string(rank) + ".unit" +
                                              std::to_string(units++));
  }
  return nullptr;
}

}  // namespace hp::parallel
