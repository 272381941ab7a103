// Line charts of training curves drawn into a PNG with cairo, for
// `ptrain plot` (cmd_plot.cpp). This part knows nothing of metrics.jsonl:
// the command reads the runs and hands over panels of named series; here
// they are laid out in a grid, given axes with round tick values, and
// written out. The drawing helpers at the end (colours, text, tick labels,
// writing a surface) serve the timeline of plot_trace.cpp as well.
#pragma once

#include <functional>
#include <string>
#include <vector>

// cairo's handles, as cairo.h declares them: the callers of writePng need
// not see cairo at all.
typedef struct _cairo cairo_t;
typedef struct _cairo_surface cairo_surface_t;

namespace ptrain::cli::plot {

// One curve of one run. Points need not be finite: NaN and infinities are
// left out of the ranges and of the line (the neighbours are joined).
struct Series {
  std::string name;        // what the curve is, e.g. "train", "eval", "peak_rss_mb"
  int run = 0;             // index into Figure::runs; picks the colour when there are several
  std::vector<double> x;   // steps, ascending
  std::vector<double> y;   // same length as x
  bool markers = false;    // dots at every point (evaluations: few and far apart)
};

struct Panel {
  std::string title;
  std::string yLabel;
  std::string xLabel = "step";
  std::vector<Series> series;
};

struct Figure {
  std::vector<std::string> runs;  // the runs' names, in the legend above the panels
  std::vector<Panel> panels;      // drawn left to right, top to bottom
  int width = 1200;
  int height = 900;
};

// Draws `figure` and writes it to `path` as a PNG. Returns "" on success,
// else why the file could not be written (cairo's words). Callable from any
// thread; it touches nothing but the file.
std::string writePng(const Figure& figure, const std::string& path);

// Round tick values covering [lo, hi]: about `target` of them, spaced by 1, 2
// or 5 times a power of ten, the first at or above lo and the last at or
// below hi. `integer`: never closer than 1 apart (steps are whole numbers).
// lo < hi and both finite.
std::vector<double> niceTicks(double lo, double hi, int target, bool integer);

// --- Drawing helpers shared by the pictures of `ptrain plot` ---
// All take the cairo context to draw on; none keeps it. Not thread-safe on
// one context (cairo's rule), independent across contexts.

struct Rgb {
  double r, g, b;
};

// Colour `i` of a ten-colour palette that stays legible on white and for
// colour-blind readers (matplotlib's "tab10"); any i, wrapped.
Rgb paletteColour(int i);
void setColour(cairo_t* cr, const Rgb& c, double alpha = 1.0);
// The sans face at `size` pixels.
void setFont(cairo_t* cr, double size, bool bold = false);
// How far `text` advances in the current font.
double textWidth(cairo_t* cr, const std::string& text);
// Text placed by its anchor: `ax` 0 left, 0.5 centre, 1 right; `ay` 0 top,
// 0.5 middle, 1 baseline-bottom.
void drawText(cairo_t* cr, const std::string& text, double x, double y, double ax, double ay);

// Labels of round tick values (niceTicks): decimals as the spacing needs, and
// a multiplier ("×1e-5") instead of long numbers when the values are tiny or huge.
struct TickLabels {
  std::vector<std::string> text;  // one per tick
  std::string multiplier;         // "" when the numbers are plain
};
TickLabels formatTicks(const std::vector<double>& ticks);

// Calls `draw` on a white `width` x `height` picture and writes it to `path`
// as a PNG. Returns "" on success, else why not: cairo's words for a picture
// it cannot make, the system's for a file it cannot write (no such folder,
// disk full).
std::string drawPng(int width, int height, const std::string& path, const std::function<void(cairo_t*)>& draw);

}  // namespace ptrain::cli::plot
