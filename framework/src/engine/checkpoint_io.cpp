#include "ptrain/engine/checkpoint_io.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace ptrain {

namespace {

namespace fs = std::filesystem;

// Hidden names, all starting with '.', so that readers skip them:
//   .tmp-step_<N>-<pid>       a save in progress (or one that died)
//   .old-step_<N>-<pid>       a complete step_<N> moved aside while a rerun replaces it
//   .deleting-step_<N>-<pid>  a checkpoint being pruned
constexpr const char* kTmpPrefix = ".tmp-step_";
constexpr const char* kOldPrefix = ".old-step_";
constexpr const char* kDeletingPrefix = ".deleting-step_";
constexpr const char* kStepPrefix = "step_";

std::atomic<bool> gRenameExchange{true};

[[noreturn]] void ioFail(const std::string& path, const std::string& what, int err) {
  throw CheckpointError(detail::concat(path, ": ", what, " (", std::strerror(err), ")"));
}

[[noreturn]] void ioFail(const std::string& path, const std::string& what, const std::error_code& ec) {
  throw CheckpointError(detail::concat(path, ": ", what, " (", ec.message(), ")"));
}

fs::path checkpointsRoot(const std::string& runDir) { return fs::path(runDir) / "checkpoints"; }

// Decimal digits in canonical form (no sign, no leading zero) that fit int64.
bool parseStep(const std::string& digits, int64_t* step) {
  if (digits.empty() || digits.size() > 18) return false;
  if (digits.size() > 1 && digits[0] == '0') return false;
  int64_t value = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  *step = value;
  return true;
}

// "step_<N>" -> N.
bool parseStepName(const std::string& name, int64_t* step) {
  const std::string prefix = kStepPrefix;
  return name.compare(0, prefix.size(), prefix) == 0 && parseStep(name.substr(prefix.size()), step);
}

// "<prefix><N>-<pid>" -> N.
bool parseHiddenName(const std::string& name, const std::string& prefix, int64_t* step) {
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  auto dash = name.find('-', prefix.size());
  if (dash == std::string::npos) return false;
  return parseStep(name.substr(prefix.size(), dash - prefix.size()), step);
}

void fsyncPath(const fs::path& path, bool isDir) {
  int fd = ::open(path.c_str(), (isDir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) ioFail(path.string(), "cannot open to sync it", errno);
  int r = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some filesystems cannot sync a directory and say EINVAL; the data itself
  // was synced through the files, so that is as durable as they allow.
  if (r != 0 && !(isDir && err == EINVAL)) ioFail(path.string(), "fsync failed", err);
}

// Syncs every file below `dir`, then the folders bottom-up, so that a folder's
// entries are durable before the folder that names them is renamed.
void syncTree(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    auto status = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_directory(status)) syncTree(it->path());
    else if (fs::is_regular_file(status)) fsyncPath(it->path(), false);
  }
  if (ec) ioFail(dir.string(), "cannot list folder", ec);
  fsyncPath(dir, true);
}

void renameOrFail(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    ioFail(from.string(), detail::concat("cannot rename to ", to.string()), errno);
  }
}

void removeAllOrFail(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) ioFail(path.string(), "cannot remove", ec);
}

std::string pidSuffix() { return "-" + std::to_string(::getpid()); }

// A crash between the two renames of a fallback replace leaves
// .old-step_<N>-<pid> and no step_<N>: that folder is the last complete copy
// of step N, so it goes back to its name.
void restoreStrandedAside(const fs::path& root) {
  std::error_code ec;
  std::vector<std::pair<int64_t, fs::path>> aside;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    int64_t step = 0;
    if (parseHiddenName(it->path().filename().string(), kOldPrefix, &step)) aside.emplace_back(step, it->path());
  }
  if (ec) ioFail(root.string(), "cannot list folder", ec);
  bool renamed = false;
  for (const auto& [step, path] : aside) {
    fs::path target = root / (kStepPrefix + std::to_string(step));
    if (!fs::exists(fs::symlink_status(target))) {
      renameOrFail(path, target);
      renamed = true;
    }
  }
  if (renamed) fsyncPath(root, true);
}

// Removes what failed or finished saves and prunes left behind. Best effort:
// the save that calls it has already succeeded, and a leftover that cannot be
// removed now is tried again next time.
void removeLeftovers(const fs::path& root) {
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int64_t step = 0;
    if (parseHiddenName(name, kTmpPrefix, &step) || parseHiddenName(name, kDeletingPrefix, &step)) {
      doomed.push_back(it->path());
    } else if (parseHiddenName(name, kOldPrefix, &step) &&
               fs::exists(fs::symlink_status(root / (kStepPrefix + std::to_string(step))))) {
      doomed.push_back(it->path());
    }
  }
  for (const auto& path : doomed) fs::remove_all(path, ec);
}

// Creates `dir` and any missing parents, syncing the parent of each folder it
// creates so that the new entries survive a power loss.
void createDirectoriesDurably(const fs::path& dir) {
  std::vector<fs::path> missing;
  std::error_code ec;
  for (fs::path p = dir; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  if (missing.empty() && !fs::is_directory(dir, ec)) {
    throw CheckpointError(detail::concat(dir.string(), ": exists and is not a folder"));
  }
  fs::create_directories(dir, ec);
  if (ec) ioFail(dir.string(), "cannot create folder", ec);
  for (const auto& p : missing) {
    fs::path parent = p.parent_path();
    fsyncPath(parent.empty() ? fs::path(".") : parent, true);
  }
}

}  // namespace

void detail::setCheckpointRenameExchange(bool enabled) { gRenameExchange.store(enabled); }

std::string checkpointDir(const std::string& runDir, int64_t step) {
  return (checkpointsRoot(runDir) / (kStepPrefix + std::to_string(step))).string();
}

std::string checkpointTmpDir(const std::string& runDir, int64_t step, int64_t pid) {
  return (checkpointsRoot(runDir) / (std::string(kTmpPrefix) + std::to_string(step) + "-" + std::to_string(pid)))
      .string();
}

std::string beginCheckpoint(const std::string& runDir, int64_t step) {
  PTRAIN_CHECK(step >= 0, "beginCheckpoint: step must be >= 0, got ", step);
  const fs::path root = checkpointsRoot(runDir);
  createDirectoriesDurably(root);
  restoreStrandedAside(root);
  const fs::path tmp = checkpointTmpDir(runDir, step, ::getpid());
  // A folder of that name is a leftover of an earlier process that had our pid.
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (ec) ioFail(tmp.string(), "cannot remove stale folder", ec);
  if (!fs::create_directory(tmp, ec) || ec) ioFail(tmp.string(), "cannot create folder", ec);
  return tmp.string();
}

void abandonCheckpoint(const std::string& tmpDir) {
  std::error_code ec;
  fs::remove_all(tmpDir, ec);
}

void commitCheckpoint(const std::string& runDir, int64_t step, const std::string& tmpDir) {
  const fs::path root = checkpointsRoot(runDir);
  const fs::path tmp(tmpDir);
  const fs::path target = root / (kStepPrefix + std::to_string(step));
  try {
    syncTree(tmp);
    if (!fs::exists(fs::symlink_status(target))) {
      renameOrFail(tmp, target);
      fsyncPath(root, true);
    } else if (gRenameExchange.load() && ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
      // One atomic swap: step_<N> is the new folder, tmp holds the old one.
      fsyncPath(root, true);
      removeAllOrFail(tmp);
    } else {
      // No RENAME_EXCHANGE here (an older kernel or a filesystem without it):
      // move the old copy aside first. Between the two renames step_<N> is
      // absent; restoreStrandedAside() recovers from a crash in that window.
      const fs::path aside = root / (std::string(kOldPrefix) + std::to_string(step) + pidSuffix());
      renameOrFail(target, aside);
      try {
        renameOrFail(tmp, target);
      } catch (...) {
        std::error_code ec;
        fs::rename(aside, target, ec);
        throw;
      }
      fsyncPath(root, true);
      removeAllOrFail(aside);
    }
  } catch (...) {
    abandonCheckpoint(tmpDir);
    throw;
  }
  removeLeftovers(root);
}

void writeCheckpointAtomically(const std::string& runDir, int64_t step,
                               const std::function<void(const std::string& tmpDir)>& writeFiles) {
  const std::string tmp = beginCheckpoint(runDir, step);
  try {
    writeFiles(tmp);
  } catch (...) {
    abandonCheckpoint(tmp);
    throw;
  }
  commitCheckpoint(runDir, step, tmp);
}

std::vector<int64_t> listCheckpoints(const std::string& runDir) {
  const fs::path root = checkpointsRoot(runDir);
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::exists(root, ec)) return steps;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    int64_t step = 0;
    std::error_code typeEc;
    if (parseStepName(it->path().filename().string(), &step) && it->is_directory(typeEc)) steps.push_back(step);
  }
  if (ec) ioFail(root.string(), "cannot list folder", ec);
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::optional<int64_t> latestCheckpoint(const std::string& runDir) {
  auto steps = listCheckpoints(runDir);
  if (steps.empty()) return std::nullopt;
  return steps.back();
}

void pruneCheckpoints(const std::string& runDir, int keep, std::optional<int64_t> justWritten) {
  if (keep <= 0) return;
  const auto steps = listCheckpoints(runDir);
  if (steps.size() <= static_cast<size_t>(keep)) return;
  const fs::path root = checkpointsRoot(runDir);
  std::vector<fs::path> doomed;
  for (size_t i = 0; i + static_cast<size_t>(keep) < steps.size(); ++i) {
    if (justWritten && steps[i] == *justWritten) continue;
    // Renamed first: a crash during the slow recursive delete must not leave
    // a partial folder under a complete-looking name.
    fs::path hidden = root / (std::string(kDeletingPrefix) + std::to_string(steps[i]) + pidSuffix());
    renameOrFail(root / (kStepPrefix + std::to_string(steps[i])), hidden);
    doomed.push_back(hidden);
  }
  if (doomed.empty()) return;
  fsyncPath(root, true);
  for (const auto& path : doomed) removeAllOrFail(path);
}

void writeJsonFile(const std::string& path, const nlohmann::json& value) {
  std::string text;
  try {
    text = value.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(detail::concat(path, ": cannot write JSON (", e.what(), ")"));
  }
  writeFileAtomically(path, text);
}

void writeFileAtomically(const std::string& path, const std::string& text) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const fs::path tmp = dir / ("." + target.filename().string() + ".tmp" + pidSuffix());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) ioFail(path, "cannot create", errno);
  const char* p = text.data();
  size_t left = text.size();
  int err = 0;
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    ioFail(path, "write failed", err);
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    ioFail(path, "cannot replace", err);
  }
  fsyncPath(dir, true);
}

void syncFile(const std::string& path) { fsyncPath(path, false); }

void writeNewFolder(const std::string& dir, const std::function<void(const std::string& tmpDir)>& writeFiles) {
  const fs::path target = fs::path(dir).lexically_normal();
  std::error_code ec;
  if (fs::exists(fs::symlink_status(target, ec))) {
    if (!fs::is_directory(target, ec)) {
      throw ConfigError(detail::concat(dir, ": exists and is not a folder; give a new folder"));
    }
    if (!fs::is_empty(target, ec)) {
      throw ConfigError(detail::concat(dir, ": exists and is not empty; give a new folder (nothing in it is replaced)"));
    }
  }
  const fs::path name = target.filename().empty() ? target.parent_path().filename() : target.filename();
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  createDirectoriesDurably(parent);
  const fs::path tmp = parent / ("." + name.string() + ".tmp" + pidSuffix());
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec) || ec) ioFail(tmp.string(), "cannot create folder", ec);
  try {
    writeFiles(tmp.string());
    syncTree(tmp);
    // An empty folder of that name (one the caller made, or a rerun's) gives way.
    fs::remove(target, ec);
    renameOrFail(tmp, target);
    fsyncPath(parent, true);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

nlohmann::json readJsonFile(const std::string& path) {
  std::error_code ec;
  auto status = fs::status(path, ec);
  if (!fs::exists(status)) throw CheckpointError(detail::concat(path, ": file not found"));
  if (!fs::is_regular_file(status)) throw CheckpointError(detail::concat(path, ": not a regular file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) ioFail(path, "cannot open", errno);
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(detail::concat(path, ": not valid JSON (", e.what(), ")"));
  }
}

std::vector<std::string> setAsideCheckpointsAfter(const std::string& runDir, int64_t step) {
  std::vector<std::string> moved;
  const fs::path root = checkpointsRoot(runDir);
  for (int64_t later : listCheckpoints(runDir)) {
    if (later <= step) continue;
    const std::string name = kStepPrefix + std::to_string(later);
    fs::path target = root / (name + ".set-aside");
    std::error_code ec;
    for (int n = 2; fs::exists(target, ec); ++n) target = root / (name + ".set-aside-" + std::to_string(n));
    renameOrFail(root / name, target);
    moved.push_back(target.string());
  }
  if (!moved.empty()) fsyncPath(root, true);
  return moved;
}

std::string resolveWeightsSource(const std::string& path, int64_t* step) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    throw CheckpointError(path + ": not found: give a run folder (its --run-dir), runs/NAME for the newest run of "
                                 "recipe NAME, a step folder RUN/checkpoints/step_N, a .safetensors state dict or a "
                                 "Hugging Face model folder");
  }
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  int64_t named = 0;
  if (parseStepName(fs::path(trimmed).filename().string(), &named)) {
    *step = named;
    return trimmed;
  }
  // runs/NAME (what `ptrain run` fills with one timestamped folder per run
  // when no --run-dir is given): its newest run that holds a checkpoint.
  std::string runDir = path;
  if (!fs::exists(fs::path(path) / "checkpoints", ec)) {
    std::vector<std::string> runs;
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->is_directory() && latestCheckpoint(it->path().string())) runs.push_back(it->path().string());
    }
    std::sort(runs.begin(), runs.end());
    if (!runs.empty()) runDir = runs.back();
  }
  const auto latest = latestCheckpoint(runDir);
  if (!latest) {
    throw CheckpointError(path + ": holds no checkpoint to start from (no checkpoints/step_N in it or in a run "
                                 "folder inside it); set checkpoint.save_final: true in that run");
  }
  *step = *latest;
  return checkpointDir(runDir, *latest);
}

}  // namespace ptrain
