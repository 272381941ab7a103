#include "ptrain/comm/process_group.h"

#include "ptrain/comm/backend.h"
#include "ptrain/comm/store.h"

namespace ptrain {

Work::~Work() = default;
ProcessGroup::~ProcessGroup() = default;
Store::~Store() = default;
CommBackend::~CommBackend() = default;

const char* toString(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kProduct: return "product";
  }
  return "?";
}

void ProcessGroup::unsupported(const char* op) const {
  throw CommError(detail::concat("group ", name(), ": this backend does not support ", op));
}

std::shared_ptr<Work> ProcessGroup::send(const at::Tensor&, int, const PointToPointOptions&) {
  unsupported("send");
}

std::shared_ptr<Work> ProcessGroup::recv(at::Tensor&, int, const PointToPointOptions&) {
  unsupported("recv");
}

}  // namespace ptrain
