// OpCounter: counts the ATen operators libtorch's dispatcher runs, on every
// thread, while one is alive (a RecordFunction callback of scope FUNCTION:
// each op call, including the ones a composite op makes, e.g. linear -> t,
// addmm). `log.count_ops: true` puts the count of every training step in
// metrics.jsonl (`aten_ops`); `make bench` compares fused and unfused steps
// with it. It costs a callback per op, so it is off by default.
#pragma once

#include <cstdint>

#include "ptrain/core/error.h"

namespace ptrain {

class PTRAIN_API OpCounter {
 public:
  OpCounter();
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;

  // Operators since construction or the last reset().
  int64_t count() const;
  void reset();

 private:
  uint64_t handle_;
};

}  // namespace ptrain
