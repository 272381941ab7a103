#include "cli/plot_trace.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <regex>

#include <cairo.h>
#include <nlohmann/json.hpp>

#include "cli/plot_png.h"
#include "ptrain/core/error.h"

namespace fs = std::filesystem;

namespace ptrain::cli::plot {
namespace {

using nlohmann::json;

const std::string kPrefix = "ptrain::";

// The phases of a step (core/phase_timer.h), in the legend's order, each with
// its colour from the shared palette. Fixed, so that a phase has the same
// colour in every picture and a reader learns it once.
struct PhaseStyle {
  const char* name;
  int colour;  // index into paletteColour
};
const PhaseStyle kPhases[] = {{"data", 2},      {"forward_backward", 0}, {"grad_reduce", 1},
                              {"pipeline_wait", 4}, {"optimizer", 3},    {"rollout", 5},
                              {"eval", 8},      {"checkpoint", 9},       {"other", 6}};

// What a ptrain range is, which decides how it is drawn.
enum class Kind { kPhase, kCollective, kWait };

// "forward_backward" of "ptrain::forward_backward", "allreduce dp0" of "ptrain::allreduce dp0".
std::string shortName(const std::string& name) {
  return name.rfind(kPrefix, 0) == 0 ? name.substr(kPrefix.size()) : name;
}

Kind kindOf(const std::string& name) {
  const std::string s = shortName(name);
  if (s.rfind("wait ", 0) == 0) return Kind::kWait;
  // A collective names its group after a space; a phase is one word.
  return s.find(' ') != std::string::npos ? Kind::kCollective : Kind::kPhase;
}

// The phase's palette index; a ptrain range of a phase this file does not
// know (a newer writer) is drawn as "other".
int phaseColour(const std::string& name) {
  const std::string s = shortName(name);
  for (const PhaseStyle& p : kPhases) {
    if (s == p.name) return p.colour;
  }
  return 6;
}

bool isPhase(const std::string& name) {
  const std::string s = shortName(name);
  for (const PhaseStyle& p : kPhases) {
    if (s == p.name) return true;
  }
  return false;
}

// Depths by time containment: a range inside another (same thread, so they
// are properly nested) sits one lane below it. Sorted by start, the longer
// first at equal starts so that the enclosing range comes before what it holds.
void nest(std::vector<TraceRange>* ranges) {
  std::sort(ranges->begin(), ranges->end(), [](const TraceRange& a, const TraceRange& b) {
    return a.start != b.start ? a.start < b.start : a.end > b.end;
  });
  std::vector<double> open;  // ends of the ranges enclosing the current one
  for (TraceRange& r : *ranges) {
    // Ranges that touch (one ends where the next begins, to the trace's
    // microsecond rounding) are siblings, not parent and child.
    while (!open.empty() && open.back() <= r.start) open.pop_back();
    r.depth = static_cast<int>(open.size());
    open.push_back(r.end);
  }
}

// "rank 3" for rank3.json (what log.profile_steps writes), else the name.
std::string labelOf(const fs::path& file) {
  static const std::regex kRank(R"(rank(\d+))");
  std::smatch m;
  const std::string stem = file.stem().string();
  if (std::regex_match(stem, m, kRank)) return "rank " + m[1].str();
  return file.filename().string();
}

std::string durationText(double us) {
  const double ms = us / 1000;
  char buf[32];
  if (ms >= 100) std::snprintf(buf, sizeof buf, "%.0f ms", ms);
  else if (ms >= 10) std::snprintf(buf, sizeof buf, "%.1f ms", ms);
  else if (ms >= 1) std::snprintf(buf, sizeof buf, "%.2f ms", ms);
  else std::snprintf(buf, sizeof buf, "%.3f ms", ms);
  return buf;
}

// Every length below is given for a 1400-pixel-wide picture and scaled with
// the width, so a small --size stays legible and a large one is not sparse.
double scaleOf(int width) { return std::clamp(width / 1400.0, 0.7, 3.0); }

// The natural sizes of the layout, before a --size height stretches or
// squeezes the lanes.
struct Metrics {
  double s;
  double margin, legendRow, legendFont;
  double lane, laneGap, opLane, opGap, bandPad;
  double axis;  // ticks, their numbers and the axis label under the bands

  explicit Metrics(double scale)
      : s(scale),
        margin(14 * s),
        legendRow(22 * s),
        legendFont(12 * s),
        lane(22 * s),
        laneGap(3 * s),
        opLane(8 * s),
        opGap(4 * s),
        bandPad(8 * s),
        axis(48 * s) {}

  double bandHeight(const Trace& t, double laneScale) const {
    const double lanes = std::max(1, t.depth) * lane * laneScale + (std::max(1, t.depth) - 1) * laneGap;
    const double ops = t.operators.empty() ? 0 : opGap + opLane * laneScale;
    return bandPad * 2 + lanes + ops;
  }
};

// The legend's entries: the phases present in any trace, then the greys.
struct LegendEntry {
  std::string text;
  Kind kind;
  int colour;  // phases only
  bool operators = false;
};

std::vector<LegendEntry> legendOf(const Timeline& timeline) {
  std::vector<LegendEntry> entries;
  for (const PhaseStyle& p : kPhases) {
    bool used = false;
    for (const Trace& t : timeline.traces) {
      for (const TraceRange& r : t.ranges) used = used || shortName(r.name) == p.name;
    }
    if (used) entries.push_back({p.name, Kind::kPhase, p.colour});
  }
  bool collectives = false, waits = false, operators = false;
  for (const Trace& t : timeline.traces) {
    for (const TraceRange& r : t.ranges) {
      collectives = collectives || kindOf(r.name) == Kind::kCollective;
      waits = waits || kindOf(r.name) == Kind::kWait;
    }
    operators = operators || !t.operators.empty();
  }
  if (collectives) entries.push_back({"collective", Kind::kCollective, 0});
  if (waits) entries.push_back({"wait on a collective", Kind::kWait, 0});
  if (operators) entries.push_back({"aten operators", Kind::kPhase, 0, true});
  return entries;
}

// Rows the legend takes at `width` (it wraps); drawn by drawLegend with the same walk.
template <typename Place>
double layoutLegend(cairo_t* cr, const std::vector<LegendEntry>& entries, const Metrics& m, double width,
                    Place place) {
  setFont(cr, m.legendFont);
  const double swatch = 18 * m.s;
  double x = m.margin, y = m.margin;
  for (const LegendEntry& e : entries) {
    const double entry = swatch + 6 * m.s + textWidth(cr, e.text) + 20 * m.s;
    if (x > m.margin && x + entry > width - m.margin) {
      x = m.margin;
      y += m.legendRow;
    }
    place(e, x, y, swatch);
    x += entry;
  }
  return y + m.legendRow;
}

const Rgb kOperatorColour{0.42, 0.47, 0.55};

Rgb mix(const Rgb& a, const Rgb& b, double t) {
  return {a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t};
}

// One box of a ptrain range: phases in their colour, light with a darker
// edge so that nested boxes and neighbours stay apart; collectives in a
// neutral grey; waits lighter and hatched, since they are time spent idle.
void drawBox(cairo_t* cr, Kind kind, int colour, double x, double y, double w, double h, double s) {
  w = std::max(w, 1.0);  // a range too short for a pixel still shows that it happened
  Rgb fill, edge;
  switch (kind) {
    case Kind::kPhase: {
      const Rgb c = paletteColour(colour);
      fill = mix(c, {1, 1, 1}, 0.45);
      edge = mix(c, {0, 0, 0}, 0.25);
      break;
    }
    case Kind::kCollective:
      fill = {0.62, 0.62, 0.62};
      edge = {0.25, 0.25, 0.25};
      break;
    case Kind::kWait:
      fill = {0.88, 0.88, 0.88};
      edge = {0.35, 0.35, 0.35};
      break;
  }
  setColour(cr, fill);
  cairo_rectangle(cr, x, y, w, h);
  cairo_fill(cr);
  if (kind == Kind::kWait && w > 3) {
    cairo_save(cr);
    cairo_rectangle(cr, x, y, w, h);
    cairo_clip(cr);
    cairo_set_source_rgb(cr, 0.45, 0.45, 0.45);
    cairo_set_line_width(cr, 1 * s);
    const double step = 5 * s;
    for (double hx = x - h; hx < x + w; hx += step) {
      cairo_move_to(cr, hx, y + h);
      cairo_line_to(cr, hx + h, y);
    }
    cairo_stroke(cr);
    cairo_restore(cr);
  }
  if (w > 2) {
    setColour(cr, edge);
    cairo_set_line_width(cr, (kind == Kind::kPhase ? 1 : 1.3) * s);
    cairo_rectangle(cr, x + 0.5, y + 0.5, w - 1, h - 1);
    cairo_stroke(cr);
  } else {
    setColour(cr, edge);
    cairo_rectangle(cr, x, y, w, h);
    cairo_fill(cr);
  }
}

// The most of `name` and its duration that fits `width`: both, the name, its
// first word ("allreduce" of "allreduce dp0"), or nothing.
std::string fittingLabel(cairo_t* cr, const TraceRange& r, double width) {
  const std::string name = shortName(r.name);
  const std::string full = name + "  " + durationText(r.end - r.start);
  if (textWidth(cr, full) <= width) return full;
  if (textWidth(cr, name) <= width) return name;
  const std::string word = name.substr(0, name.find(' '));
  if (word != name && textWidth(cr, word) <= width) return word;
  return "";
}

}  // namespace

Trace readTrace(const std::string& path) {
  const fs::path file = path;
  const std::string hint = " (--trace takes the files log.profile_steps writes: RUN_DIR/traces/rank<R>.json)";
  if (!fs::exists(file)) throw ConfigError("ptrain plot: " + path + " not found" + hint);
  if (fs::is_directory(file)) throw ConfigError("ptrain plot: " + path + " is a folder" + hint);
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError("ptrain plot: " + path + ": cannot be read");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    // nlohmann's message begins "[json.exception.parse_error.101] parse error
    // at line 3, column 5: ..."; where and what are what a reader needs.
    const std::string what = e.what();
    const size_t at = what.find("line");
    throw ConfigError("ptrain plot: " + path + ": not valid JSON (" +
                      (at == std::string::npos ? what : what.substr(at)) + ")");
  }
  // libtorch's legacy profiler writes a bare array of events; Kineto an
  // object whose "traceEvents" holds them (beside metadata).
  const json* events = nullptr;
  if (doc.is_array()) {
    events = &doc;
  } else if (doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array()) {
    events = &doc["traceEvents"];
  }
  if (events == nullptr) {
    throw ConfigError("ptrain plot: " + path +
                      ": not a Chrome trace (expected an array of events or {\"traceEvents\": [...]})");
  }

  // Complete events, grouped by thread: a thread is its pid and tid together,
  // each a number or a string depending on the writer.
  std::map<std::string, std::vector<TraceRange>> ptrainByThread, operatorsByThread;
  std::map<std::string, int> phasesByThread;
  for (const json& e : *events) {
    if (!e.is_object()) continue;
    const auto ph = e.find("ph");
    const auto name = e.find("name");
    const auto ts = e.find("ts");
    const auto dur = e.find("dur");
    if (ph == e.end() || *ph != "X" || name == e.end() || !name->is_string() || ts == e.end() ||
        !ts->is_number() || dur == e.end() || !dur->is_number()) {
      continue;
    }
    // Kineto repeats user ranges on the GPU's streams, as the kernels they
    // launched span; the host's thread is the one that says when each began.
    const auto cat = e.find("cat");
    if (cat != e.end() && *cat == "gpu_user_annotation") continue;
    const std::string thread =
        (e.contains("pid") ? e["pid"].dump() : std::string("-")) + "/" + (e.contains("tid") ? e["tid"].dump() : "-");
    TraceRange r{name->get<std::string>(), ts->get<double>(), ts->get<double>() + std::max(0.0, dur->get<double>()), 0};
    if (r.name.rfind(kPrefix, 0) == 0) {
      if (isPhase(r.name)) ++phasesByThread[thread];
      ptrainByThread[thread].push_back(std::move(r));
    } else if (r.name.rfind("aten::", 0) == 0) {
      operatorsByThread[thread].push_back(std::move(r));
    }
  }
  if (ptrainByThread.empty()) {
    throw ConfigError("ptrain plot: " + path + " has no ptrain ranges: was it written by log.profile_steps?");
  }
  // The training loop's thread holds the phases; collectives issued from
  // other threads (a pipeline's sends) would overlap its lanes and are left out.
  std::string loop;
  int most = -1;
  size_t mostRanges = 0;
  for (const auto& [thread, ranges] : ptrainByThread) {
    const int phases = phasesByThread.count(thread) ? phasesByThread[thread] : 0;
    if (phases > most || (phases == most && ranges.size() > mostRanges)) {
      loop = thread;
      most = phases;
      mostRanges = ranges.size();
    }
  }

  Trace trace;
  trace.path = path;
  trace.label = labelOf(file);
  trace.ranges = std::move(ptrainByThread[loop]);
  nest(&trace.ranges);
  for (const TraceRange& r : trace.ranges) trace.depth = std::max(trace.depth, r.depth + 1);
  // Operators nest deeply (aten::linear holds aten::addmm holds ...); the
  // outermost say what the thread was doing, in one thin lane.
  std::vector<TraceRange> ops = std::move(operatorsByThread[loop]);
  nest(&ops);
  for (TraceRange& op : ops) {
    if (op.depth == 0) trace.operators.push_back(std::move(op));
  }
  return trace;
}

int timelineHeight(const Timeline& timeline) {
  const Metrics m(scaleOf(timeline.width));
  // The legend's height depends on how its entries wrap, which needs a font:
  // a one-pixel surface measures text as well as the real one.
  std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> surface(
      cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1), cairo_surface_destroy);
  std::unique_ptr<cairo_t, decltype(&cairo_destroy)> context(cairo_create(surface.get()), cairo_destroy);
  double h = layoutLegend(context.get(), legendOf(timeline), m, timeline.width, [](auto&&...) {});
  for (const Trace& t : timeline.traces) h += m.bandHeight(t, 1);
  h += m.axis + m.margin / 2;
  return std::clamp(static_cast<int>(std::ceil(h)), 200, 10000);
}

namespace {
// Draws `timeline` on a white `width` x `height` picture.
void drawTimeline(cairo_t* cr, const Timeline& timeline, int width, int height);
}  // namespace

std::string writeTimelinePng(const Timeline& timeline, const std::string& path) {
  const int width = timeline.width;
  const int height = timeline.height > 0 ? timeline.height : timelineHeight(timeline);
  return drawPng(width, height, path, [&](cairo_t* cr) { drawTimeline(cr, timeline, width, height); });
}

namespace {

void drawTimeline(cairo_t* cr, const Timeline& timeline, int width, int height) {
  const Metrics m(scaleOf(width));
  const double s = m.s;

  // Legend at the top: a swatch drawn as its boxes are, then the name.
  const std::vector<LegendEntry> legend = legendOf(timeline);
  const double top = layoutLegend(cr, legend, m, width, [&](const LegendEntry& e, double x, double y, double swatch) {
    const double sh = 12 * s, cy = y + m.legendFont / 2;
    if (e.operators) {
      setColour(cr, kOperatorColour, 0.8);
      cairo_rectangle(cr, x, cy - 3 * s, swatch, 6 * s);
      cairo_fill(cr);
    } else {
      drawBox(cr, e.kind, e.colour, x, cy - sh / 2, swatch, sh, s);
    }
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    setFont(cr, m.legendFont);
    drawText(cr, e.text, x + swatch + 6 * s, cy, 0, 0.5);
  });

  // The bands share the height left; a --size taller than needed makes the
  // lanes taller (up to a point: beyond it they only look empty), a shorter
  // one squeezes them.
  double natural = 0;
  for (const Trace& t : timeline.traces) natural += m.bandHeight(t, 1);
  double fixed = 0;  // the parts of the bands that do not scale (paddings, gaps)
  for (const Trace& t : timeline.traces) fixed += m.bandHeight(t, 0);
  const double room = height - top - m.axis - m.margin / 2;
  const double laneScale =
      natural > fixed ? std::clamp((room - fixed) / (natural - fixed), 0.15, 2.5) : 1.0;

  // The gutter on the left holds the bands' names.
  setFont(cr, 13 * s, true);
  double gutter = 60 * s;
  for (const Trace& t : timeline.traces) gutter = std::max(gutter, textWidth(cr, t.label) + 24 * s);
  const double left = m.margin + gutter, right = width - m.margin;
  const double plotW = std::max(1.0, right - left);

  // One clock for all files, from the first range any of them holds: ranks
  // traced over the same steps line up. Their spans then overlap; when they
  // do not, the files keep different clocks (Kineto's is the epoch, the
  // legacy profiler's starts with the trace: two runs, one of each) and each
  // is drawn from its own first range instead.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> firsts, lasts;
  for (const Trace& t : timeline.traces) {
    double first = inf, last = -inf;
    for (const auto* list : {&t.ranges, &t.operators}) {
      for (const TraceRange& r : *list) {
        first = std::min(first, r.start);
        last = std::max(last, r.end);
      }
    }
    firsts.push_back(first);
    lasts.push_back(last);
  }
  const double latestFirst = *std::max_element(firsts.begin(), firsts.end());
  const double earliestLast = *std::min_element(lasts.begin(), lasts.end());
  const bool sharedClock = latestFirst < earliestLast;
  std::vector<double> origins(firsts.size(), *std::min_element(firsts.begin(), firsts.end()));
  if (!sharedClock) origins = firsts;
  double spanUs = 0;
  for (size_t b = 0; b < lasts.size(); ++b) spanUs = std::max(spanUs, lasts[b] - origins[b]);
  if (!(spanUs > 0)) spanUs = 1;
  const double spanMs = spanUs / 1000;
  // Pixel of `us` microseconds on band b's clock; of `ms` on the axis.
  auto px = [&](size_t b, double us) { return left + (us - origins[b]) / spanUs * plotW; };
  auto axisX = [&](double ms) { return left + ms * 1000 / spanUs * plotW; };

  double bottom = top;
  for (const Trace& t : timeline.traces) bottom += m.bandHeight(t, laneScale);
  const std::vector<double> ticks = niceTicks(0, spanMs, std::max(2, static_cast<int>(plotW / (90 * s))), false);

  // Grid under the boxes, through every band.
  cairo_set_source_rgb(cr, 0.975, 0.975, 0.975);
  cairo_rectangle(cr, left, top, plotW, bottom - top);
  cairo_fill(cr);
  cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
  cairo_set_line_width(cr, 1 * s);
  for (double t : ticks) {
    const double x = std::round(axisX(t)) + 0.5;
    cairo_move_to(cr, x, top);
    cairo_line_to(cr, x, bottom);
  }
  cairo_stroke(cr);

  const double lane = m.lane * laneScale, opLane = m.opLane * laneScale;
  const double labelFont = std::min(11 * s, lane * 0.62);
  double y = top;
  for (size_t b = 0; b < timeline.traces.size(); ++b) {
    const Trace& t = timeline.traces[b];
    const double bandH = m.bandHeight(t, laneScale);
    if (b > 0) {
      cairo_set_source_rgb(cr, 0.7, 0.7, 0.7);
      cairo_set_line_width(cr, 1 * s);
      cairo_move_to(cr, m.margin, std::round(y) + 0.5);
      cairo_line_to(cr, right, std::round(y) + 0.5);
      cairo_stroke(cr);
    }
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    setFont(cr, 13 * s, true);
    drawText(cr, t.label, m.margin, y + bandH / 2, 0, 0.5);

    const double lanesTop = y + m.bandPad;
    cairo_save(cr);
    cairo_rectangle(cr, left, y, plotW, bandH);
    cairo_clip(cr);
    setFont(cr, labelFont);
    for (const TraceRange& r : t.ranges) {
      const double x0 = px(b, r.start), x1 = px(b, r.end);
      const double ly = lanesTop + r.depth * (lane + m.laneGap);
      const Kind kind = kindOf(r.name);
      drawBox(cr, kind, phaseColour(r.name), x0, ly, x1 - x0, lane, s);
      // A label where it fits inside the box, with room to spare.
      if (lane >= labelFont + 2 * s) {
        const std::string label = fittingLabel(cr, r, x1 - x0 - 8 * s);
        if (!label.empty()) {
          cairo_set_source_rgb(cr, 0.08, 0.08, 0.08);
          drawText(cr, label, x0 + 4 * s, ly + lane / 2, 0, 0.5);
        }
      }
    }
    if (!t.operators.empty()) {
      const double oy = lanesTop + std::max(1, t.depth) * (lane + m.laneGap) - m.laneGap + m.opGap;
      // Neighbouring operators often meet within a pixel; as translucent
      // boxes they read as density rather than as a solid bar.
      setColour(cr, kOperatorColour, 0.75);
      for (const TraceRange& op : t.operators) {
        const double x0 = px(b, op.start), x1 = px(b, op.end);
        cairo_rectangle(cr, x0, oy, std::max(x1 - x0, 0.8), opLane);
      }
      cairo_fill(cr);
    }
    cairo_restore(cr);
    y += bandH;
  }

  // Frame, ticks and their numbers, and what the axis measures.
  cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
  cairo_set_line_width(cr, 1 * s);
  cairo_rectangle(cr, std::round(left) + 0.5, std::round(top) + 0.5, std::round(plotW), std::round(bottom - top));
  cairo_stroke(cr);
  const double tickLen = 4 * s;
  for (double t : ticks) {
    const double x = std::round(axisX(t)) + 0.5;
    cairo_move_to(cr, x, bottom);
    cairo_line_to(cr, x, bottom + tickLen);
  }
  cairo_stroke(cr);
  const TickLabels labels = formatTicks(ticks);
  cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
  setFont(cr, 10 * s);
  for (size_t i = 0; i < ticks.size(); ++i) {
    drawText(cr, labels.text[i], axisX(ticks[i]), bottom + tickLen + 4 * s, 0.5, 0);
  }
  setFont(cr, 10.5 * s);
  cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
  const std::string from =
      sharedClock ? "milliseconds from the first range" : "milliseconds from each trace's first range";
  drawText(cr, from + (labels.multiplier.empty() ? "" : " (" + labels.multiplier + ")"),
           left + plotW / 2, bottom + tickLen + 4 * s + 10 * s + 8 * s, 0.5, 0);
}

}  // namespace

}  // namespace ptrain::cli::plot
