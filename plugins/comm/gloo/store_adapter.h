// StoreAdapter: a ptrain::Store seen through c10d's Store interface, so that
// c10d::ProcessGroupGloo can rendezvous through the store the core created.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "ptrain/comm/store.h"

namespace ptrain::gloo_backend {

// Every blocking call is bounded by `timeout` (the group's), whatever c10d or
// Gloo ask for: Gloo's store wrapper waits with c10d's 300 s default, and a
// group rendezvous must fail within communication.timeout_s instead.
// Thread-safety: as the wrapped store (thread-safe).
class StoreAdapter final : public c10d::Store {
 public:
  StoreAdapter(std::shared_ptr<ptrain::Store> store, std::chrono::milliseconds timeout);
  ~StoreAdapter() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  // ptrain::Store has no deletion or key count; c10d's Gloo group uses neither.
  bool deleteKey(const std::string& key) override;
  int64_t getNumKeys() override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::chrono::milliseconds bounded(std::chrono::milliseconds requested) const;

  std::shared_ptr<ptrain::Store> store_;
};

}  // namespace ptrain::gloo_backend
