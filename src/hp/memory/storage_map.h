// Tensors told apart by their storage, as the checkpoint's observers tell op outputs apart
// (a view shares its base's). A map keeps each storage object it holds from being freed
// while it lives, so no later tensor of the forward takes a freed output's address: a weak
// reference keeps the object, not its data.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <unordered_map>
#include <vector>

namespace hp::memory {

// The storage object's address; null for an undefined tensor or one without storage.
inline const void* storage_of(const at::Tensor& t) {
  return t.defined() && t.has_storage() ? static_cast<const void*>(t.storage().unsafeGetStorageImpl()) : nullptr;
}

template <typename V>
class StorageMap {
 public:
  // Maps t's storage to `v` unless it is mapped already; whether it was added.
  bool insert(const at::Tensor& t, V v) {
    const void* s = storage_of(t);
    if (!s || !map_.emplace(s, std::move(v)).second) return false;
    pins_.push_back(t.storage().getWeakStorageImpl());
    return true;
  }
  // What t's storage maps to; null if nothing.
  const V* find(const at::Tensor& t) const {
    auto it = map_.find(storage_of(t));
    return it == map_.end() ? nullptr : &it->second;
  }

 private:
  std::unordered_map<const void*, V> map_;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> pins_;
};

}  // namespace hp::memory
