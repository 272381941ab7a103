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
  // Process exit code the CLI uses for this error (docs/launching.md, "Exit
  // codes"): 2 for a user's mistake (bad recipe, missing plugin, layout that
  // does not fit, a run folder in use), 1 for failures at run time (a peer
  // died, a collective timed out), 3 out of memory, 4 a non-finite loss or
  // gradient, 5 stopped because another rank failed, 75 stopped by a signal
  // after saving a checkpoint.
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

// This rank stopped because another rank failed or went away: its
// connection closed mid-collective, or it reported an error of its own to the
// others (agreeOnFailure). A consequence, not the cause: exit code 5, so that
// the launcher and exit.json blame the rank whose own error came first.
class PTRAIN_API PeerFailedError : public CommError {
 public:
  using CommError::CommError;
  ~PeerFailedError() override;
  int exitCode() const override { return 5; }
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

// The loss or the gradient norm stopped being finite (train.on_nonfinite:
// stop, or more skipped steps in a row than train.nonfinite_skip_limit), or a
// checkpoint would hold a non-finite value. Nothing of that state is saved.
// Exit code 4.
class PTRAIN_API NonFiniteError : public Error {
 public:
  using Error::Error;
  ~NonFiniteError() override;
  int exitCode() const override { return 4; }
};

// The run was asked to stop (checkpoint.on_signal: SIGTERM, SIGUSR1, ...) and
// saved a checkpoint at a step boundary first; `ptrain run --resume`
// continues it. Exit code 75 (EX_TEMPFAIL: try again later), what a
// scheduler's requeue logic can test for.
class PTRAIN_API StoppedBySignal : public Error {
 public:
  using Error::Error;
  ~StoppedBySignal() override;
  int exitCode() const override { return 75; }
};

// Exit codes of ptrain's processes beyond Error::exitCode()'s.
inline constexpr int kExitNonFinite = 4;
inline constexpr int kExitPeerFailed = 5;
inline constexpr int kExitStoppedAndSaved = 75;

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
