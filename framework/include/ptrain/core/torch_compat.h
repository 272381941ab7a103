// The differences between the two libtorch builds ptrain compiles against:
// Debian's libtorch 1.13 and PyTorch 2.x from PyPI (cmake/torch.cmake finds
// either). Every version test in the tree lives here, so the rest of the code
// is written once; when support for 1.13 ends, this file shrinks to nothing.
#pragma once

#include <torch/version.h>

#define PTRAIN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// c10::Allocator::allocate lost its `const` in 2.3, which also added the
// pure virtual copy_data. An allocator declares
//   c10::DataPtr allocate(size_t bytes) PTRAIN_ALLOCATE_CONST override;
// and, on 2.3 and later, copy_data (PTRAIN_ALLOCATOR_HAS_COPY_DATA).
#if PTRAIN_TORCH_AT_LEAST(2, 3)
#define PTRAIN_ALLOCATE_CONST
#define PTRAIN_ALLOCATOR_HAS_COPY_DATA 1
#else
#define PTRAIN_ALLOCATE_CONST const
#define PTRAIN_ALLOCATOR_HAS_COPY_DATA 0
#endif

// c10d::Store gained the pure virtual clone() in 2.6: a store adapter
// defines it where PTRAIN_C10D_STORE_HAS_CLONE.
#define PTRAIN_C10D_STORE_HAS_CLONE PTRAIN_TORCH_AT_LEAST(2, 6)

// c10d: the class a process-group backend (ProcessGroupGloo, ProcessGroupNCCL)
// derives from, whose collectives the comm plugins call. 1.13's Gloo group
// derives from c10d::ProcessGroup; 2.x split per-backend work into c10d::Backend.
namespace c10d {
class Backend;
class ProcessGroup;
}  // namespace c10d

namespace ptrain::compat {
#if PTRAIN_TORCH_AT_LEAST(2, 0)
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif
}  // namespace ptrain::compat
