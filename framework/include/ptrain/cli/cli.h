// The `ptrain` command line: run, check, plugins, bench-comm, keys.
// Returns the process exit code: 0 success, 2 a user's mistake (one line on
// stderr, no stack trace), 1 a failure at run time.
//
// Not part of the plugin SDK: this header belongs to the ptrain_cli library,
// which the `ptrain` binary links and libptrain_core.so does not.
#pragma once

#include "ptrain/core/error.h"

namespace ptrain::cli {

PTRAIN_API int main(int argc, char** argv);

}  // namespace ptrain::cli
