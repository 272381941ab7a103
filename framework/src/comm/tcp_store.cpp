// The rendezvous store: libtorch's c10d TCPStore behind ptrain::Store, and a
// key-prefixing wrapper so that groups and subsystems share one store.
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <thread>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/exception.h>

#include "ptrain/comm/store.h"

namespace ptrain {
namespace {

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  os << static_cast<double>(ms.count()) / 1000.0 << " s";
  return os.str();
}

bool mentionsTimeout(const std::string& what) {
  std::string lower(what);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("timeout") != std::string::npos || lower.find("timed out") != std::string::npos;
}

// c10d reports its failures as c10::Error / std::runtime_error with the first
// line carrying the reason; the rest is a C++ backtrace nobody asked for.
std::string firstLine(const std::string& what) {
  auto end = what.find('\n');
  return end == std::string::npos ? what : what.substr(0, end);
}

std::string joinKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 4; ++i) {
    if (i) out += ", ";
    out += "'" + keys[i] + "'";
  }
  if (keys.size() > 4) out += ", ...";
  return out;
}

// True once something accepts TCP connections at host:port. A plain probe
// rather than c10d's own connect loop: that one retries in whole seconds,
// gives up about a second before its timeout (at once below one second), and
// logs an error line per attempt while rank 0 is still starting.
bool serverListening(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool ok = false;
  for (addrinfo* a = found; a != nullptr && !ok; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    ::close(fd);
  }
  freeaddrinfo(found);
  return ok;
}

class TcpStore final : public Store {
 public:
  explicit TcpStore(const TcpStoreOptions& options) : options_(options) {
    PTRAIN_CHECK_AS(ConfigError, options.port > 0 && options.port < 65536, "rendezvous store port ", options.port,
                    " is out of range: set MASTER_PORT (or --master-port) to a port in 1..65535");
    PTRAIN_CHECK_AS(ConfigError, options.timeout.count() > 0,
                    "rendezvous store timeout must be positive (communication.timeout_s)");
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(options.port);
    opts.isServer = options.is_server;
    opts.numWorkers = static_cast<std::size_t>(std::max(1, options.world_size));
    // Rank 0 does not block here for the others: c10d 1.13 gives up on a
    // missing worker silently, and the first group rendezvous reports it
    // with a timeout that names the group instead.
    opts.waitWorkers = false;
    // c10d fails a connect at once when given less than a second or two;
    // the operations' timeout is set back to ours once connected.
    opts.timeout = std::max<std::chrono::milliseconds>(options.timeout, std::chrono::seconds(2));
    if (!options.is_server) waitForServer();
    try {
      store_ = c10::make_intrusive<c10d::TCPStore>(options.host, opts);
      store_->setTimeout(options.timeout);
    } catch (const std::exception& e) {
      std::string why = firstLine(e.what());
      if (options.is_server) {
        throw CommError(detail::concat("could not host the rendezvous store on port ", options.port, " (", endpoint(),
                                       "): ", why, "; is the port in use? pick another MASTER_PORT (--master-port)"));
      }
      if (dynamic_cast<const c10d::TimeoutError*>(&e) != nullptr || mentionsTimeout(why)) {
        throw TimeoutError(detail::concat("could not reach the rendezvous store at ", endpoint(), " within ",
                                          seconds(options.timeout), ": is rank 0 running, and are MASTER_ADDR/",
                                          "MASTER_PORT the same on every rank? (", why, ")"));
      }
      throw CommError(detail::concat("could not connect to the rendezvous store at ", endpoint(), ": ", why,
                                     "; check MASTER_ADDR/MASTER_PORT"));
    }
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    guard("set", key, [&] { store_->set(key, value); });
  }

  std::vector<uint8_t> get(const std::string& key) override {
    std::vector<uint8_t> value;
    guard("get", key, [&] { value = store_->get(key); });
    return value;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    int64_t value = 0;
    guard("add", key, [&] { value = store_->add(key, delta); });
    return value;
  }

  bool check(const std::vector<std::string>& keys) override {
    bool present = false;
    guard("check", joinKeys(keys), [&] { present = store_->check(keys); });
    return present;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    if (keys.empty()) return;
    guard("wait", joinKeys(keys), [&] { store_->wait(keys, timeout.count() > 0 ? timeout : options_.timeout); },
          timeout.count() > 0 ? timeout : options_.timeout);
  }

  std::chrono::milliseconds timeout() const override { return options_.timeout; }

 private:
  std::string endpoint() const { return detail::concat(options_.host, ":", options_.port); }

  void waitForServer() const {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + options_.timeout;
    auto pause = std::chrono::milliseconds(20);
    while (!serverListening(options_.host, options_.port)) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        throw TimeoutError(detail::concat("could not reach the rendezvous store at ", endpoint(), " within ",
                                          seconds(options_.timeout), ": is rank 0 running, and are MASTER_ADDR/",
                                          "MASTER_PORT the same on every rank?"));
      }
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(500));
    }
  }

  // Turns c10d's failures into ptrain errors that name the store and key.
  template <typename F>
  void guard(const char* op, const std::string& key, F&& body, std::chrono::milliseconds limit = {}) {
    try {
      body();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      std::string why = firstLine(e.what());
      if (limit.count() == 0) limit = options_.timeout;
      if (mentionsTimeout(why)) {
        throw TimeoutError(detail::concat("rendezvous store ", endpoint(), ": ", op, " of key ", key,
                                          " timed out after ", seconds(limit),
                                          " (communication.timeout_s): a peer is missing or stuck"));
      }
      throw CommError(detail::concat("rendezvous store ", endpoint(), ": ", op, " of key ", key, " failed: ", why,
                                     " (did rank 0 exit?)"));
    }
  }

  TcpStoreOptions options_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

// Prefixes keys so that independent users of one store cannot collide.
class PrefixedStore final : public Store {
 public:
  PrefixedStore(std::shared_ptr<Store> base, std::string prefix)
      : base_(std::move(base)), prefix_(std::move(prefix) + "/") {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override { base_->set(prefix_ + key, value); }
  std::vector<uint8_t> get(const std::string& key) override { return base_->get(prefix_ + key); }
  int64_t add(const std::string& key, int64_t delta) override { return base_->add(prefix_ + key, delta); }
  bool check(const std::vector<std::string>& keys) override { return base_->check(join(keys)); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    base_->wait(join(keys), timeout);
  }
  std::chrono::milliseconds timeout() const override { return base_->timeout(); }

 private:
  std::vector<std::string> join(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }

  std::shared_ptr<Store> base_;
  std::string prefix_;
};

}  // namespace

std::shared_ptr<Store> createTcpStore(const TcpStoreOptions& options) { return std::make_shared<TcpStore>(options); }

std::shared_ptr<Store> prefixStore(std::shared_ptr<Store> base, const std::string& prefix) {
  PTRAIN_CHECK(base != nullptr, "prefixStore: base store is null");
  return std::make_shared<PrefixedStore>(std::move(base), prefix);
}

}  // namespace ptrain
