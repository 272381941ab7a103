// comm/gloo: collectives on CPU tensors through libtorch's c10d
// ProcessGroupGloo (compiled in under USE_C10D_GLOO).
//
// One Gloo TCP device per process, shared by every group: each group is one
// c10d::ProcessGroupGloo (its own connections and worker threads) that
// rendezvous through the core's store under "gloo/<group name>/<generation>".
//
// Device selection: PTRAIN_GLOO_IFNAME (or torch's GLOO_SOCKET_IFNAME) names
// an interface; otherwise a loopback or unset MASTER_ADDR binds 127.0.0.1 (a
// single host, no name resolution to go wrong), and anything else binds the
// address this host's name resolves to (c10d's default device).
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "gloo_process_group.h"
#include "ptrain/comm/backend.h"
#include "store_adapter.h"

namespace ptrain::gloo_backend {
namespace {

bool isLoopback(const std::string& addr) {
  return addr.empty() || addr == "localhost" || addr == "ip6-localhost" || addr == "::1" ||
         addr.rfind("127.", 0) == 0;
}

std::string envOr(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : fallback;
}

// "tp0[0,1]"; long rank lists keep their ends: "world[0,1,2,...,63]".
std::string labelOf(const std::string& name, const std::vector<int>& ranks) {
  if (name.find('[') != std::string::npos) return name;
  std::ostringstream os;
  os << name << "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks.size() > 8 && i == 3) {
      os << "...," << ranks.back();
      break;
    }
    if (i) os << ",";
    os << ranks[i];
  }
  os << "]";
  return os.str();
}

class GlooBackend final : public CommBackend {
 public:
  explicit GlooBackend(const PluginContext& ctx) : logger_(ctx.logger) {}

  std::string backendName() const override { return "gloo"; }

  std::shared_ptr<ProcessGroup> createGroup(std::shared_ptr<Store> store, const GroupOptions& opts) override {
    PTRAIN_CHECK(store != nullptr, "gloo createGroup(", opts.name, "): store is null");
    PTRAIN_CHECK_AS(ConfigError, !opts.name.empty(), "gloo: a process group needs a name (used as store prefix)");
    PTRAIN_CHECK_AS(ConfigError, !opts.ranks.empty(), "gloo: group ", opts.name, " has no ranks");
    PTRAIN_CHECK_AS(ConfigError, opts.timeout.count() > 0, "gloo: group ", opts.name,
                    " needs a positive timeout (communication.timeout_s)");
    for (size_t i = 1; i < opts.ranks.size(); ++i) {
      PTRAIN_CHECK_AS(ConfigError, opts.ranks[i - 1] < opts.ranks[i], "gloo: the ranks of group ",
                      labelOf(opts.name, opts.ranks), " must be sorted and distinct");
    }
    auto it = std::find(opts.ranks.begin(), opts.ranks.end(), opts.global_rank);
    PTRAIN_CHECK_AS(ConfigError, it != opts.ranks.end(), "gloo: rank ", opts.global_rank, " is not a member of group ",
                    labelOf(opts.name, opts.ranks), "; only members create a group");

    auto state = std::make_shared<GroupState>();
    state->name = opts.name;
    state->label = labelOf(opts.name, opts.ranks);
    state->global_ranks = opts.ranks;
    state->rank = static_cast<int>(it - opts.ranks.begin());
    state->size = static_cast<int>(opts.ranks.size());
    state->timeout = opts.timeout;

    // A name may be reused (a group torn down and made again); members create
    // groups in the same order, so counting per name keeps their keys apart
    // from the stale ones of the earlier group.
    int generation = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      generation = generations_[opts.name]++;
    }
    auto scoped = prefixStore(store, detail::concat("gloo/", opts.name, "/", generation));
    auto adapter = c10::make_intrusive<StoreAdapter>(scoped, opts.timeout);
    auto options = c10d::ProcessGroupGloo::Options::create(opts.timeout);
    options->devices.push_back(device());

    const std::string where =
        detail::concat("creating group ", state->label, " (rank ", state->rank, " of ", state->size, ")");
    c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
    try {
      pg = c10::make_intrusive<c10d::ProcessGroupGloo>(adapter, state->rank, state->size, options);
    } catch (const TimeoutError&) {
      throw TimeoutError(detail::concat(where, " timed out after ", formatSeconds(opts.timeout),
                                        " (communication.timeout_s)", missingMembers(*scoped, *state)));
    } catch (const Error& e) {
      throw CommError(detail::concat(where, " failed: ", e.what()));
    } catch (const std::exception& e) {
      std::string why = reasonOf(e);
      if (why.find("imeout") != std::string::npos || why.find("imed out") != std::string::npos) {
        throw TimeoutError(detail::concat(where, " timed out after ", formatSeconds(opts.timeout),
                                          " (communication.timeout_s)", missingMembers(*scoped, *state), " (", why,
                                          ")"));
      }
      throw CommError(detail::concat(where, " failed: ", why));
    }
    if (logger_) logger_->debug("gloo: joined group {} as rank {} of {}", state->label, state->rank, state->size);
    return std::make_shared<GlooProcessGroup>(std::move(state), std::move(pg));
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
  static std::string missingMembers(Store& scoped, const GroupState& state) {
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

  std::shared_ptr<spdlog::logger> logger_;
  std::mutex mutex_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::unordered_map<std::string, int> generations_;
};

}  // namespace
}  // namespace ptrain::gloo_backend

PTRAIN_DEFINE_PLUGIN(ptrain::plugin_kind::kComm, "gloo", "1.0.0", ptrain::gloo_backend::GlooBackend)
