#include "csrc/storage_pins.hpp"

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

namespace ucxb {

namespace {

struct Pins {
  std::mutex mu;
  // Ops pinning each storage; every pinner holds the storage, so its address is not reused
  // while it is counted here. A flat list: it holds the storages of the ops pending at once
  // (a handful), and a small op must not pay a hash node's allocation and free.
  std::vector<std::pair<const c10::StorageImpl*, size_t>> count;
  std::vector<std::pair<const c10::StorageImpl*, size_t>>::iterator find(
      const c10::StorageImpl* impl) {
    return std::find_if(count.begin(), count.end(),
                        [impl](const auto& entry) { return entry.first == impl; });
  }
};

Pins& pins() {
  static Pins* p = new Pins();  // never destroyed: a Work may be dropped at process exit
  return *p;
}

}  // namespace

bool pinStorage(const c10::Storage& storage) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  Pins& p = pins();
  std::lock_guard<std::mutex> lock(p.mu);
  auto it = p.find(impl);
  if (it != p.count.end()) {
    ++it->second;
    return true;
  }
  if (!impl->resizable()) return false;
  impl->set_resizable(false);
  p.count.emplace_back(impl, 1);
  return true;
}

void unpinStorage(const c10::Storage& storage) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  Pins& p = pins();
  std::lock_guard<std::mutex> lock(p.mu);
  auto it = p.find(impl);
  if (it == p.count.end()) return;
  if (--it->second == 0) {
    impl->set_resizable(true);
    *it = p.count.back();  // order does not matter
    p.count.pop_back();
  }
}

}  // namespace ucxb
