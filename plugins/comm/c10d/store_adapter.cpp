#include "store_adapter.h"

namespace ptrain::c10d_group {

StoreAdapter::StoreAdapter(std::shared_ptr<ptrain::Store> store, std::chrono::milliseconds timeout)
    : c10d::Store(timeout), store_(std::move(store)) {}

StoreAdapter::~StoreAdapter() = default;

std::chrono::milliseconds StoreAdapter::bounded(std::chrono::milliseconds requested) const {
  if (requested.count() <= 0 || requested > timeout_) return timeout_;
  return requested;
}

void StoreAdapter::set(const std::string& key, const std::vector<uint8_t>& value) { store_->set(key, value); }

std::vector<uint8_t> StoreAdapter::get(const std::string& key) {
  // The wrapped store's own get would block for the store's timeout, which
  // may be longer than the group's.
  store_->wait({key}, timeout_);
  return store_->get(key);
}

int64_t StoreAdapter::add(const std::string& key, int64_t value) { return store_->add(key, value); }

bool StoreAdapter::deleteKey(const std::string& key) {
  TORCH_CHECK(false, "ptrain's rendezvous store cannot delete keys (asked for '", key, "')");
}

int64_t StoreAdapter::getNumKeys() { TORCH_CHECK(false, "ptrain's rendezvous store cannot count its keys"); }

bool StoreAdapter::check(const std::vector<std::string>& keys) { return store_->check(keys); }

void StoreAdapter::wait(const std::vector<std::string>& keys) { store_->wait(keys, timeout_); }

void StoreAdapter::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  store_->wait(keys, bounded(timeout));
}

#if PTRAIN_C10D_STORE_HAS_CLONE
c10::intrusive_ptr<c10d::Store> StoreAdapter::clone() { return c10::make_intrusive<StoreAdapter>(store_, timeout_); }
#endif

}  // namespace ptrain::c10d_group
