// The `ptrain` command line: run, check, plugins, bench-comm, keys.
// Returns the process exit code: 0 success, 2 a user's mistake (one line on
// stderr, no stack trace), 1 a failure at run time.
#pragma once

#include "ptrain/core/error.h"

namespace ptrain::cli {

PTRAIN_API int main(int argc, char** argv);

}  // namespace ptrain::cli
