#include "ptrain/engine/op_counter.h"

#include <ATen/record_function.h>

#include <atomic>
#include <memory>

namespace ptrain {
namespace {

std::atomic<int64_t> g_ops{0};

std::unique_ptr<at::ObserverContext> onOp(const at::RecordFunction&) {
  g_ops.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

}  // namespace

OpCounter::OpCounter()
    : handle_(at::addGlobalCallback(at::RecordFunctionCallback(&onOp).needsInputs(false).scopes({at::RecordScope::FUNCTION}))) {
  g_ops.store(0);
}

OpCounter::~OpCounter() { at::removeCallback(handle_); }

int64_t OpCounter::count() const { return g_ops.load(); }

void OpCounter::reset() { g_ops.store(0); }

}  // namespace ptrain
