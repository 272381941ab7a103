// Store: the key-value rendezvous every rank reaches before any collective.
//
// Rank 0 hosts a TCP store at MASTER_ADDR:MASTER_PORT; other ranks connect to
// it. Communication backends build their groups on top of it (c10d Gloo and
// NCCL both rendezvous through a store). All methods are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ptrain/core/error.h"

namespace ptrain {

class PTRAIN_API Store {
 public:
  virtual ~Store();
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Blocks until `key` exists or the store's timeout passes (TimeoutError).
  virtual std::vector<uint8_t> get(const std::string& key) = 0;
  // Atomically adds `delta` to the integer at `key` (0 when absent); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // True when every key exists; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Blocks until every key exists, or throws TimeoutError after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  int port = 29500;
  bool is_server = false;  // rank 0 hosts the store
  int world_size = 1;      // the server waits for this many clients
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

// A TCP store (libtorch's c10d TCPStore). Throws TimeoutError when the server
// cannot be reached within the timeout, naming host and port.
PTRAIN_API std::shared_ptr<Store> createTcpStore(const TcpStoreOptions& options);

// Keys written through the returned store are prefixed with `prefix + "/"`.
PTRAIN_API std::shared_ptr<Store> prefixStore(std::shared_ptr<Store> base, const std::string& prefix);

}  // namespace ptrain
