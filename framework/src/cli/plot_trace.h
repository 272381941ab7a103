// The timeline of `ptrain plot --trace`: ptrain's ranges from the Chrome
// traces that log.profile_steps writes (RUN_DIR/traces/rank<R>.json), one
// band per file, drawn into a PNG with cairo.
//
// A trace comes in either of libtorch's forms: a JSON array of events (the
// legacy profiler) or {"traceEvents": [...]} (Kineto). Only complete events
// ("ph": "X") are read; ptrain's are named "ptrain::<phase>" (data,
// forward_backward, ...), "ptrain::<collective> <group>" and
// "ptrain::wait <group>", and nest by time on the training loop's thread.
#pragma once

#include <string>
#include <vector>

namespace ptrain::cli::plot {

// One range of a trace, times in microseconds on the trace's own clock.
struct TraceRange {
  std::string name;   // as in the trace, e.g. "ptrain::forward_backward", "aten::addmm"
  double start = 0;
  double end = 0;
  int depth = 0;      // how many ranges of its kind (ptrain's, operators) enclose it
};

// What is drawn of one trace file.
struct Trace {
  std::string path;
  std::string label;                  // "rank 0" from rank0.json, else the file's name
  std::vector<TraceRange> ranges;     // ptrain's ranges on the phases' thread, by start
  std::vector<TraceRange> operators;  // the outermost aten:: operators on that thread, by start
  int depth = 0;                      // lanes the ranges need (the deepest depth + 1)
};

// Reads the trace at `path`: the thread that holds the most ptrain phase
// ranges, its ptrain ranges with their nesting, and its outermost operators.
// Throws ConfigError ("ptrain plot: ...") when the file is missing, is not
// JSON, is not a trace, or has no ptrain ranges. Callable from any thread.
Trace readTrace(const std::string& path);

struct Timeline {
  std::vector<Trace> traces;  // one band each, top to bottom
  int width = 1400;
  int height = 0;             // 0: as tall as the lanes need (timelineHeight)
};

// The height that gives every lane of `timeline` its natural size at
// `width`, within the 200..10000 pixels that --size allows.
int timelineHeight(const Timeline& timeline);

// Draws `timeline` (height 0: timelineHeight) and writes it to `path` as a
// PNG. Returns "" on success, else why the file could not be written.
// Callable from any thread; it touches nothing but the file.
std::string writeTimelinePng(const Timeline& timeline, const std::string& path);

}  // namespace ptrain::cli::plot
