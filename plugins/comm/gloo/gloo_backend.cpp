// comm/gloo: collectives on CPU tensors through libtorch's c10d
// ProcessGroupGloo (compiled in under USE_C10D_GLOO).
//
// One Gloo TCP device per process, shared by every group: each group is one
// c10d::ProcessGroupGloo (its own connections and worker threads) that
// rendezvous through the core's store under "gloo/<group name>/<generation>".
// What every c10d-based plugin shares (Work handles, errors, group creation)
// is in plugins/comm/c10d.
//
// Device selection: PTRAIN_GLOO_IFNAME (or torch's GLOO_SOCKET_IFNAME) names
// an interface; otherwise a loopback or unset MASTER_ADDR binds 127.0.0.1 (a
// single host, no name resolution to go wrong), and anything else binds the
// address this host's name resolves to (c10d's default device).
#include <cstdlib>
#include <mutex>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "c10d_group.h"
#include "store_adapter.h"

namespace ptrain::gloo_backend {
namespace {

using namespace c10d_group;

bool isLoopback(const std::string& addr) {
  return addr.empty() || addr == "localhost" || addr == "ip6-localhost" || addr == "::1" ||
         addr.rfind("127.", 0) == 0;
}

std::string envOr(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : fallback;
}

bool glooReduces(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kChar:
    case at::kByte:
    case at::kInt:
    case at::kLong:
      return true;
    default:
      return false;
  }
}

constexpr BackendTraits kGloo{
    "gloo",
    at::kCPU,
    "use communication.backend=nccl for device tensors, or move the tensor to the CPU",
    &glooReduces,
    "Float, Double, Half, Char, Byte, Int and Long",
    /*native_avg=*/false,
    /*native_reduce_scatter=*/false,
    /*skip_empty=*/true,
    /*stream_ordered=*/false,
};

class GlooBackend final : public C10dCommBackend {
 public:
  explicit GlooBackend(const PluginContext& ctx) : C10dCommBackend(kGloo, ctx.logger) {}

 protected:
  c10::intrusive_ptr<compat::C10dBackend> makeBackend(const c10::intrusive_ptr<StoreAdapter>& store,
                                                      GroupState& state) override {
    auto options = c10d::ProcessGroupGloo::Options::create(state.timeout);
    options->devices.push_back(device());
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, state.rank, state.size, options);
  }

 private:
  std::shared_ptr<::gloo::transport::Device> device() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (device_) return device_;
    std::string ifname = envOr("PTRAIN_GLOO_IFNAME", envOr("GLOO_SOCKET_IFNAME"));
    const std::string masterAddr = envOr("MASTER_ADDR");
    try {
      if (!ifname.empty()) {
        device_ = c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
      } else if (isLoopback(masterAddr)) {
        device_ = c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
      } else {
        device_ = c10d::ProcessGroupGloo::createDefaultDevice();
      }
    } catch (const std::exception& e) {
      if (!ifname.empty()) {
        throw ConfigError(detail::concat("PTRAIN_GLOO_IFNAME=", ifname, ": Gloo cannot use this network interface (",
                                         reasonOf(e), "); name one that `ip addr` lists"));
      }
      throw CommError(detail::concat("gloo: could not create a TCP device (", reasonOf(e),
                                     "); set PTRAIN_GLOO_IFNAME to the network interface to use"));
    }
    if (logger_) {
      logger_->debug("gloo: TCP device {}", ifname.empty() ? (isLoopback(masterAddr) ? "127.0.0.1" : "default")
                                                           : "on interface " + ifname);
    }
    return device_;
  }

  // Gloo's rendezvous publishes one key per rank ("<device>/<rank>"); the
  // ones absent after a timeout are the members that never arrived.
  std::string missingMembers(Store& scoped, const GroupState& state) override {
    std::vector<std::string> missing;
    try {
      for (int r = 0; r < state.size; ++r) {
        if (!scoped.check({detail::concat("0/", r)})) {
          missing.push_back(detail::concat(r, " (global ", state.global_ranks[static_cast<size_t>(r)], ")"));
        }
      }
    } catch (const std::exception&) {
      return ": not every member joined";
    }
    if (missing.empty()) return ": every member arrived but a connection could not be made";
    std::string out = ": ranks that never joined: ";
    for (size_t i = 0; i < missing.size(); ++i) out += (i ? ", " : "") + missing[i];
    return out;
  }

  std::mutex mutex_;
  std::shared_ptr<::gloo::transport::Device> device_;
};

}  // namespace
}  // namespace ptrain::gloo_backend

PTRAIN_DEFINE_PLUGIN(ptrain::plugin_kind::kComm, "gloo", "1.0.0", ptrain::gloo_backend::GlooBackend)
