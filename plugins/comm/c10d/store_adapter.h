// StoreAdapter: a ptrain::Store seen through c10d's Store interface, so that
// c10d's process groups (Gloo, NCCL) rendezvous through the store the core created.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "ptrain/comm/store.h"
#include "ptrain/core/torch_compat.h"

namespace ptrain::c10d_group {

// Every blocking call is bounded by `timeout` (the group's), whatever c10d or
// its backends ask for: Gloo's store wrapper waits with c10d's 300 s default, and a
// group rendezvous must fail within communication.timeout_s instead.
// Thread-safety: as the wrapped store (thread-safe).
class StoreAdapter final : public c10d::Store {
 public:
  StoreAdapter(std::shared_ptr<ptrain::Store> store, std::chrono::milliseconds timeout);
  ~StoreAdapter() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  // ptrain::Store has no deletion or key count; c10d's Gloo and NCCL groups use neither.
  bool deleteKey(const std::string& key) override;
  int64_t getNumKeys() override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
#if PTRAIN_C10D_STORE_HAS_CLONE
  // Another handle on the same (thread-safe) store.
  c10::intrusive_ptr<c10d::Store> clone() override;
#endif

 private:
  std::chrono::milliseconds bounded(std::chrono::milliseconds requested) const;

  std::shared_ptr<ptrain::Store> store_;
};

}  // namespace ptrain::c10d_group
