#include "csrc/storage_pins.hpp"

#include <cstddef>
#include <mutex>
#include <unordered_map>

namespace ucxb {

namespace {

struct Pins {
  std::mutex mu;
  // Ops pinning each storage; every pinner holds the storage, so its address is not reused
  // while it is counted here.
  std::unordered_map<const c10::StorageImpl*, size_t> count;
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
  auto it = p.count.find(impl);
  if (it != p.count.end()) {
    ++it->second;
    return true;
  }
  if (!impl->resizable()) return false;
  impl->set_resizable(false);
  p.count.emplace(impl, 1);
  return true;
}

void unpinStorage(const c10::Storage& storage) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  Pins& p = pins();
  std::lock_guard<std::mutex> lock(p.mu);
  auto it = p.count.find(impl);
  if (it == p.count.end()) return;
  if (--it->second == 0) {
    impl->set_resizable(true);
    p.count.erase(it);
  }
}

}  // namespace ucxb
