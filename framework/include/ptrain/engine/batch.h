// Batch: named tensors sharing a leading batch dimension.
#pragma once

#include <map>
#include <string>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain {

struct PTRAIN_API Batch {
  std::map<std::string, at::Tensor> tensors;

  // Rows in the batch (dim 0 of every tensor); 0 when empty.
  int64_t size() const;
  // Rows [begin, end) of every tensor (views, no copy).
  Batch slice(int64_t begin, int64_t end) const;
  // Every tensor on `device` (the same tensors when they are there already).
  Batch to(at::Device device) const;
  // The tensor named `name`; throws InternalError naming it when absent.
  const at::Tensor& at(const std::string& name) const;
};

}  // namespace ptrain
