// Error types shared by the core, plugins and the CLI.
//
// Every error a user can cause derives from ptrain::Error and carries a
// one-line message that says where (file:line:col or key path), what was
// expected, and how to fix it. The CLI prints what() on one line and exits
// with exitCode(); nothing else is printed for a user's mistake.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#define PTRAIN_API __attribute__((visibility("default")))

namespace ptrain {

class PTRAIN_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
  ~Error() override;
  // Process exit code the CLI uses for this error: 2 for a user's mistake
  // (bad recipe, missing plugin, layout that does not fit), 1 for failures
  // at run time (a peer died, a collective timed out).
  virtual int exitCode() const { return 2; }
};

// A recipe or command-line value is wrong: syntax, type, range, unknown key,
// a layout that does not split the world.
class PTRAIN_API ConfigError : public Error {
 public:
  using Error::Error;
  ~ConfigError() override;
};

// A plugin library could not be used; the message names the file and why.
class PTRAIN_API PluginLoadError : public Error {
 public:
  using Error::Error;
  ~PluginLoadError() override;
};

// A collective or point-to-point operation failed; names op, group and rank.
class PTRAIN_API CommError : public Error {
 public:
  using Error::Error;
  ~CommError() override;
  int exitCode() const override { return 1; }
};

// A collective or rendezvous ran past its deadline.
class PTRAIN_API TimeoutError : public CommError {
 public:
  using CommError::CommError;
  ~TimeoutError() override;
};

// A checkpoint is missing, corrupt, or belongs to another model.
class PTRAIN_API CheckpointError : public Error {
 public:
  using Error::Error;
  ~CheckpointError() override;
};

// A worker went over its memory: `train.max_memory_mb`, or an allocation the
// system refused. Exit code 3, which `ptrain doctor` reads as out of memory.
class PTRAIN_API OutOfMemoryError : public Error {
 public:
  using Error::Error;
  ~OutOfMemoryError() override;
  int exitCode() const override { return 3; }
};

// Internal invariant broken: a bug in ptrain or a plugin, not the user's fault.
class PTRAIN_API InternalError : public Error {
 public:
  using Error::Error;
  ~InternalError() override;
  int exitCode() const override { return 1; }
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

}  // namespace ptrain

// PTRAIN_CHECK(cond, parts...): throws ptrain::InternalError with the parts
// streamed together when cond is false. PTRAIN_CHECK_AS(Type, cond, parts...)
// throws the given ptrain error type instead (e.g. ConfigError for user input).
#define PTRAIN_CHECK_AS(ErrorType, cond, ...)                     \
  do {                                                            \
    if (!(cond)) {                                                \
      throw ErrorType(::ptrain::detail::concat(__VA_ARGS__));     \
    }                                                             \
  } while (0)

#define PTRAIN_CHECK(cond, ...) \
  PTRAIN_CHECK_AS(::ptrain::InternalError, cond, __VA_ARGS__)
