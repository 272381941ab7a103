// TensorBoard event files of rank 0, written without TensorFlow or protobuf.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

// PTRAIN_API only: the tests link libptrain_core.so, which exports nothing unmarked.
#include "ptrain/core/error.h"

namespace ptrain {

// Writes TensorBoard event files (TFRecord-framed Event protobufs) in `dir`.
// One thread at a time may call a writer; it is meant for rank 0's training loop.
class PTRAIN_API TensorBoardWriter {
 public:
  // Creates `dir` if needed and opens a new file events.out.tfevents.<unix seconds>.<hostname>.<pid>.ptrain
  // (a new file per writer; TensorBoard reads every file of a folder as one run, so a resumed run that
  // opens another writer continues the same curves). A second writer of the same process in the same
  // second gets ".ptrain.001", ".ptrain.002", ... (up to 999): never an existing file, and names still
  // sort in the order they were opened, which is the order TensorBoard reads them in.
  // Writes the file_version event "brain.Event:2" first.
  // Throws std::runtime_error naming the path when it cannot open it.
  explicit TensorBoardWriter(const std::string& dir);
  // Flushes and closes the file; never throws.
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One scalar point, stored as Summary.Value.simple_value (a float: TensorBoard's own precision).
  // `wallTime`: seconds since the epoch, shown by TensorBoard's "relative" and "wall" axes.
  void scalar(const std::string& tag, int64_t step, double value, double wallTime);
  // One text point for the text plugin: a DT_STRING scalar tensor with plugin_data plugin_name "text".
  // TensorBoard renders it as Markdown.
  void text(const std::string& tag, int64_t step, const std::string& text, double wallTime);
  // Hands what was written to the operating system, so that a running TensorBoard sees it.
  // The caller calls it after each metrics row. Throws std::runtime_error naming the path when a write
  // since the last flush failed (e.g. the disk is full).
  void flush();
  const std::string& path() const;

 private:
  // Frames one serialized Event as a TFRecord and appends it.
  void writeRecord(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

// CRC-32C (Castagnoli) and TFRecord's masked form, exposed for the tests.
PTRAIN_API uint32_t crc32c(const void* data, size_t size);
PTRAIN_API uint32_t maskedCrc32c(const void* data, size_t size);

}  // namespace ptrain
