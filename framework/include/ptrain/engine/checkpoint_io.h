// Checkpoint folders that are either complete or absent.
//
// A run keeps its checkpoints under RUN_DIR/checkpoints/step_<N>/ (N in plain
// decimal). A save fills a hidden folder RUN_DIR/checkpoints/.tmp-step_<N>-<pid>,
// fsyncs every file and folder in it, and only then renames it to step_<N>.
// Since a rename within one filesystem is atomic, a crash (a kill, a power
// loss after the fsyncs) at any point leaves every previously complete
// checkpoint as it was, and a reader never sees a half-written step_<N>.
// Hidden leftovers (names starting with '.') are ignored by readers and
// removed by the next successful save. docs/checkpoints.md describes the files
// the engine puts inside a checkpoint.
//
// One process writes a run directory at a time (in a multi-rank run, the rank
// the engine chooses; `ptrain run` holds the folder's lock, launch/run_lock.h,
// so that no second run writes it); readers may run at any time.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ptrain/core/error.h"

namespace ptrain {

// RUN_DIR/checkpoints/step_<step>; pure path arithmetic, touches nothing.
PTRAIN_API std::string checkpointDir(const std::string& runDir, int64_t step);

// Writes checkpoint `step` of `runDir` atomically:
//  1. creates RUN_DIR/checkpoints (if needed) and an empty hidden folder
//     RUN_DIR/checkpoints/.tmp-step_<step>-<pid>;
//  2. calls writeFiles(tmpDir), which writes every file of the checkpoint
//     under tmpDir (subfolders allowed);
//  3. fsyncs every file and folder under tmpDir, renames tmpDir to step_<step>
//     and fsyncs RUN_DIR/checkpoints.
// When step_<step> already exists (a rerun of the same step) the new folder
// replaces it: both are swapped with one atomic rename where the filesystem
// supports it (renameat2 RENAME_EXCHANGE), else the old one is first renamed
// aside to a hidden folder; the old copy is deleted after the new one is in
// place. If a crash strands that aside copy without a step_<step>, the next
// save puts it back.
// After a successful save, hidden leftovers of earlier failed saves are
// removed.
// When writeFiles throws, its temporary folder is removed and the exception
// propagates unchanged; no step_<step> appears and nothing else changes.
// Throws CheckpointError (naming the path and the system error) when a
// folder cannot be created, synced or renamed. `step` must be >= 0.
// Calls writeFiles on the calling thread; not safe to call concurrently for
// the same runDir.
PTRAIN_API void writeCheckpointAtomically(const std::string& runDir, int64_t step,
                                          const std::function<void(const std::string& tmpDir)>& writeFiles);

// The same in three calls, for a save that several processes write (each rank
// its own files): one process calls beginCheckpoint, which creates
// RUN_DIR/checkpoints and the empty hidden folder checkpointTmpDir(runDir,
// step, its pid) and returns that path; every writer puts its files there
// (syncFile each); the one process then calls commitCheckpoint (sync, rename
// into place, remove leftovers; on failure the folder is removed and the
// error propagates) or, when a writer failed, abandonCheckpoint (removes the
// folder, best effort). Throws as writeCheckpointAtomically does.
PTRAIN_API std::string checkpointTmpDir(const std::string& runDir, int64_t step, int64_t pid);
PTRAIN_API std::string beginCheckpoint(const std::string& runDir, int64_t step);
PTRAIN_API void commitCheckpoint(const std::string& runDir, int64_t step, const std::string& tmpDir);
PTRAIN_API void abandonCheckpoint(const std::string& tmpDir);
// fsyncs one file; throws CheckpointError naming it.
PTRAIN_API void syncFile(const std::string& path);

// Steps of the complete checkpoints of `runDir` (folders named exactly
// step_<N>), ascending; empty when there are none or the folder is missing.
// Hidden and unrelated entries are ignored. Throws CheckpointError when
// RUN_DIR/checkpoints exists but cannot be listed.
PTRAIN_API std::vector<int64_t> listCheckpoints(const std::string& runDir);

// The highest step listCheckpoints() finds, or nullopt.
PTRAIN_API std::optional<int64_t> latestCheckpoint(const std::string& runDir);

// Deletes complete checkpoints so that only the `keep` highest steps remain,
// and never deletes `justWritten` (the step a resumed run has just saved may be
// lower than checkpoints left by an earlier run). keep <= 0 keeps everything.
// Each doomed folder is first renamed to a hidden name and then deleted, so a
// crash midway never leaves a partial step_<N> that looks complete.
// Throws CheckpointError when a folder cannot be renamed or removed.
PTRAIN_API void pruneCheckpoints(const std::string& runDir, int keep,
                                 std::optional<int64_t> justWritten = std::nullopt);

// For a run resumed from an earlier step than its newest (`ptrain run
// --resume --from-step N`): renames every complete step_M with M > `step` to
// step_M.set-aside (step_M.set-aside-2, ... when taken), which no reader
// takes for a checkpoint and no save or prune touches, so the run continues
// from `step` and the user decides what to do with the rest. Returns the new
// paths. Throws CheckpointError when a folder cannot be renamed.
PTRAIN_API std::vector<std::string> setAsideCheckpointsAfter(const std::string& runDir, int64_t step);

// Where a run takes its starting weights from (checkpoint.load, the GRPO
// actor's actor_rollout_ref.model.path): a step folder (RUN/checkpoints/
// step_N) as it is, a run folder's newest step, or for runs/NAME (one
// timestamped folder per run) the newest run's newest step. Returns the step
// folder and its step in *step. Throws CheckpointError (one line) when the
// path is missing or holds no checkpoint. Reads folder names only.
PTRAIN_API std::string resolveWeightsSource(const std::string& path, int64_t* step);

// Writes `value` as indented JSON (with a final newline) to `path`, through a
// temporary file in the same folder that is fsync'ed and renamed over `path`,
// so readers see the old or the new file, never a partial one. Throws
// CheckpointError with the path on any I/O error.
PTRAIN_API void writeJsonFile(const std::string& path, const nlohmann::json& value);
// The same for any text.
PTRAIN_API void writeFileAtomically(const std::string& path, const std::string& text);

// Writes a new folder `dir` whole or not at all, for outputs a command makes
// (`ptrain checkpoint consolidate`): writeFiles(tmpDir) fills a hidden folder
// beside it (.<name>.tmp-<pid>), which is fsync'ed and renamed to `dir` only
// when writeFiles returns; when it throws the hidden folder is removed and the
// exception propagates, so a failure leaves no partial output. Refuses
// (ConfigError, nothing touched) a `dir` that exists and is not an empty
// folder: outputs are never overwritten. Throws CheckpointError on I/O errors.
PTRAIN_API void writeNewFolder(const std::string& dir, const std::function<void(const std::string& tmpDir)>& writeFiles);

// Reads the JSON file at `path`. Throws CheckpointError "<path>: file not
// found" or "<path>: not valid JSON (...)".
PTRAIN_API nlohmann::json readJsonFile(const std::string& path);

namespace detail {
// For tests: with false, replacing an existing step always takes the
// rename-aside path, as on a filesystem without RENAME_EXCHANGE. Default true.
PTRAIN_API void setCheckpointRenameExchange(bool enabled);
}  // namespace detail

}  // namespace ptrain
