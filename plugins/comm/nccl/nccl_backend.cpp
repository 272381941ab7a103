// comm/nccl: collectives on CUDA tensors through libtorch's c10d
// ProcessGroupNCCL, behind the same ProcessGroup interface and contract as
// comm/gloo (plugins/comm/c10d holds what the two share).
//
// Each group is one c10d::ProcessGroupNCCL that rendezvous through the core's
// store under "nccl/<group name>/<generation>". Collectives run on NCCL's own
// streams, and waiting on a Work is stream-ordered: the caller's current
// stream waits for the collective's, the host does not, so it goes on queueing
// kernels (a bucket's all-reduce overlaps the rest of backward). The timeout
// (communication.timeout_s, or the operation's) is kept by ptrain's Watchdog
// (comm/watchdog.h): an operation still running at its deadline gets the
// communicator aborted (the stuck kernel ends, the stream goes on) and the
// group raises TimeoutError naming the operation, group and rank at its next
// operation or wait. c10d's own watchdog would instead end the process, so
// its error handling is left to ptrain unless the user set
// TORCH_NCCL_ASYNC_ERROR_HANDLING, and its timeouts come later than ptrain's.
//
// NCCL settings from the recipe (communication.nccl) are in the environment
// before this plugin is created; NCCL reads them when a communicator starts.
#include <cstdlib>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "c10d_group.h"
#include "store_adapter.h"

namespace ptrain::nccl_backend {
namespace {

using namespace c10d_group;

bool ncclReduces(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kChar:
    case at::kByte:
    case at::kInt:
    case at::kLong:
      return true;
    default:
      return false;
  }
}

constexpr BackendTraits kNccl{
    "nccl",
    at::kCUDA,
    "use communication.backend=gloo for host tensors, or move the tensor to the GPU",
    &ncclReduces,
    "Float, Double, Half, BFloat16, Char, Byte, Int and Long",
    /*native_avg=*/true,
    /*native_reduce_scatter=*/true,
    /*skip_empty=*/false,
    /*stream_ordered=*/true,
};

class NcclBackend final : public C10dCommBackend {
 public:
  explicit NcclBackend(const PluginContext& ctx) : C10dCommBackend(kNccl, ctx.logger), device_(ctx.device) {
    PTRAIN_CHECK_AS(ConfigError, device_.is_cuda(), "communication.backend: nccl moves CUDA tensors, but this run's ",
                    "device is ", device_.str(), "; set device: cuda (or auto on a machine with GPUs), or ",
                    "communication.backend: gloo");
    // 0: c10d's watchdog reports but does not end the process; ptrain's
    // watchdog aborts the communicator and the group raises instead.
    setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0", /*overwrite=*/0);
  }

 protected:
  c10::intrusive_ptr<compat::C10dBackend> makeBackend(const c10::intrusive_ptr<StoreAdapter>& store,
                                                      GroupState& state) override {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = state.c10dTimeout(state.timeout);
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, state.rank, state.size, options);
    state.abort = [pg] { pg->abort(); };
    return pg;
  }

 private:
  at::Device device_;
};

}  // namespace
}  // namespace ptrain::nccl_backend

PTRAIN_DEFINE_PLUGIN(ptrain::plugin_kind::kComm, "nccl", "1.0.0", ptrain::nccl_backend::NcclBackend)
