#include "cli/plot_png.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include <cairo.h>

namespace ptrain::cli::plot {
namespace {

// Ten colours that stay apart from one another, for colour-blind readers
// too, and on white (matplotlib's "tab10").
const Rgb kPalette[] = {{0.122, 0.467, 0.706}, {0.839, 0.153, 0.157}, {0.173, 0.627, 0.173}, {1.000, 0.498, 0.055},
                        {0.580, 0.404, 0.741}, {0.549, 0.337, 0.294}, {0.890, 0.467, 0.761}, {0.498, 0.498, 0.498},
                        {0.737, 0.741, 0.133}, {0.090, 0.745, 0.812}};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

}  // namespace

Rgb paletteColour(int i) { return kPalette[((i % kPaletteSize) + kPaletteSize) % kPaletteSize]; }

namespace {

// With several runs the colour says which run and the dash which curve; with
// one run, colours are free to tell its curves apart, which reads faster.
struct Style {
  Rgb colour;
  int dash = 0;  // index into dashPattern
};

void setDash(cairo_t* cr, int dash, double scale) {
  switch (dash % 4) {
    case 0: cairo_set_dash(cr, nullptr, 0, 0); break;
    case 1: { const double d[] = {7 * scale, 4 * scale}; cairo_set_dash(cr, d, 2, 0); break; }
    case 2: { const double d[] = {2 * scale, 3 * scale}; cairo_set_dash(cr, d, 2, 0); break; }
    default: { const double d[] = {8 * scale, 3 * scale, 2 * scale, 3 * scale}; cairo_set_dash(cr, d, 4, 0); break; }
  }
}

}  // namespace

void setColour(cairo_t* cr, const Rgb& c, double alpha) { cairo_set_source_rgba(cr, c.r, c.g, c.b, alpha); }

void setFont(cairo_t* cr, double size, bool bold) {
  cairo_select_font_face(cr, "sans", CAIRO_FONT_SLANT_NORMAL, bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
}

double textWidth(cairo_t* cr, const std::string& text) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, text.c_str(), &e);
  return e.x_advance;
}

// Text placed by its anchor: `ax` 0 left, 0.5 centre, 1 right; `ay` likewise
// 0 top, 0.5 middle, 1 baseline-bottom. Heights come from the font, not the
// string, so that labels of one row share a baseline whatever their letters.
void drawText(cairo_t* cr, const std::string& text, double x, double y, double ax, double ay) {
  cairo_font_extents_t fe;
  cairo_font_extents(cr, &fe);
  const double w = textWidth(cr, text);
  const double h = fe.ascent;  // digits and capitals; descenders would push labels apart
  cairo_move_to(cr, x - ax * w, y + (1 - ay) * h);
  cairo_show_text(cr, text.c_str());
}

namespace {

struct Rect {
  double x, y, w, h;
};

}  // namespace

// Decimals follow the tick spacing, so 0.1, 0.2, 0.3 and not 0.100000.
TickLabels formatTicks(const std::vector<double>& ticks) {
  TickLabels out;
  if (ticks.empty()) return out;
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : std::max(std::fabs(ticks[0]), 1.0);
  double largest = 0;
  for (double t : ticks) largest = std::max(largest, std::fabs(t));
  const int magnitude = largest > 0 ? static_cast<int>(std::floor(std::log10(largest))) : 0;
  double scale = 1;
  if (magnitude >= 6 || magnitude <= -4) {
    scale = std::pow(10.0, magnitude);
    out.multiplier = "\xC3\x97" "1e" + std::to_string(magnitude);  // "×1e-5"
  }
  const double scaledStep = step / scale;
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(scaledStep) + 1e-9)));
  for (double t : ticks) {
    double v = t / scale;
    if (std::fabs(v) < scaledStep * 1e-6) v = 0;  // no "-0" from accumulated rounding
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", std::min(decimals, 12), v);
    out.text.push_back(buf);
  }
  return out;
}

namespace {

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  bool empty() const { return !(lo <= hi); }
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
};

// A range with room for what is drawn at its edges, and never empty: a
// constant series gets a band around its value, so it is a flat line in the
// middle and not a division by zero.
Range padded(Range r, double fraction, bool integer) {
  if (r.hi > r.lo) {
    const double pad = (r.hi - r.lo) * fraction;
    return {r.lo - pad, r.hi + pad};
  }
  if (integer) return {r.lo - 1, r.hi + 1};
  const double band = r.lo != 0 ? std::fabs(r.lo) * 0.05 : 1.0;
  return {r.lo - band, r.hi + band};
}

class PanelPainter {
 public:
  PanelPainter(cairo_t* cr, const Figure& figure, double scale) : cr_(cr), figure_(figure), s_(scale) {}

  void draw(const Panel& panel, const Rect& cell) {
    // Ranges over the finite points only: one NaN or overflowed value must
    // not flatten every other curve against an axis.
    Range xr, yr;
    for (const Series& series : panel.series) {
      for (size_t i = 0; i < series.x.size() && i < series.y.size(); ++i) {
        if (std::isfinite(series.x[i]) && std::isfinite(series.y[i])) {
          xr.add(series.x[i]);
          yr.add(series.y[i]);
        }
      }
    }
    const double titleSize = 13 * s_, tickSize = 10 * s_, labelSize = 10.5 * s_;
    const double tickLen = 4 * s_, gap = 4 * s_;

    // Title above the plot area.
    cairo_set_source_rgb(cr_, 0.13, 0.13, 0.13);
    setFont(cr_, titleSize, true);
    const double titleBottom = cell.y + 8 * s_ + titleSize;
    drawText(cr_, panel.title, cell.x + cell.w / 2, titleBottom, 0.5, 1);

    if (xr.empty()) {
      Rect area{cell.x + 40 * s_, titleBottom + 10 * s_, cell.w - 60 * s_, cell.h - titleSize - 60 * s_};
      frame(area);
      setFont(cr_, labelSize);
      cairo_set_source_rgb(cr_, 0.5, 0.5, 0.5);
      drawText(cr_, "no finite values", area.x + area.w / 2, area.y + area.h / 2, 0.5, 0.5);
      return;
    }
    xr = padded(xr, 0.02, true);
    yr = padded(yr, 0.06, false);

    // The left margin is as wide as the widest y tick label, so that long
    // numbers (a learning rate, tokens/s) never run into the axis label.
    const double approxRows = std::max(2.0, (cell.h - 90 * s_) / (45 * s_));
    const std::vector<double> yTicks = niceTicks(yr.lo, yr.hi, static_cast<int>(std::min(6.0, approxRows)), false);
    const TickLabels yLabels = formatTicks(yTicks);
    setFont(cr_, tickSize);
    double widest = 0;
    for (const auto& t : yLabels.text) widest = std::max(widest, textWidth(cr_, t));
    const double left = cell.x + 8 * s_ + labelSize + gap * 2 + widest + tickLen;
    const double top = titleBottom + (yLabels.multiplier.empty() ? 8 : 8 + tickSize + 2) * s_;
    const double bottom = cell.y + cell.h - (8 * s_ + labelSize + gap * 2 + tickSize + tickLen);
    const double right = cell.x + cell.w - 14 * s_;
    const Rect area{left, top, std::max(1.0, right - left), std::max(1.0, bottom - top)};

    const std::vector<double> xTicks =
        niceTicks(xr.lo, xr.hi, std::max(2, static_cast<int>(area.w / (75 * s_))), true);
    const TickLabels xLabels = formatTicks(xTicks);
    auto px = [&](double x) { return area.x + (x - xr.lo) / (xr.hi - xr.lo) * area.w; };
    auto py = [&](double y) { return area.y + area.h - (y - yr.lo) / (yr.hi - yr.lo) * area.h; };

    // Background and grid first, the curves over them, the frame last.
    cairo_set_source_rgb(cr_, 0.985, 0.985, 0.985);
    cairo_rectangle(cr_, area.x, area.y, area.w, area.h);
    cairo_fill(cr_);
    cairo_set_line_width(cr_, 1 * s_);
    cairo_set_source_rgb(cr_, 0.88, 0.88, 0.88);
    for (double t : yTicks) {
      cairo_move_to(cr_, area.x, std::round(py(t)) + 0.5);
      cairo_line_to(cr_, area.x + area.w, std::round(py(t)) + 0.5);
    }
    for (double t : xTicks) {
      cairo_move_to(cr_, std::round(px(t)) + 0.5, area.y);
      cairo_line_to(cr_, std::round(px(t)) + 0.5, area.y + area.h);
    }
    cairo_stroke(cr_);

    const std::vector<std::string> names = seriesNames(panel);
    std::vector<std::pair<double, double>> drawn;  // pixel positions, to keep the legend off the data
    cairo_save(cr_);
    cairo_rectangle(cr_, area.x, area.y, area.w, area.h);
    cairo_clip(cr_);
    for (const Series& series : panel.series) {
      const Style style = styleOf(series, names);
      setColour(cr_, style.colour);
      setDash(cr_, style.dash, s_);
      cairo_set_line_width(cr_, 1.7 * s_);
      cairo_set_line_join(cr_, CAIRO_LINE_JOIN_ROUND);
      bool started = false;
      int finite = 0;
      for (size_t i = 0; i < series.x.size() && i < series.y.size(); ++i) {
        if (!std::isfinite(series.x[i]) || !std::isfinite(series.y[i])) continue;
        const double x = px(series.x[i]), y = py(series.y[i]);
        if (started) cairo_line_to(cr_, x, y); else cairo_move_to(cr_, x, y);
        started = true;
        ++finite;
        drawn.emplace_back(x, y);
      }
      cairo_stroke(cr_);
      // A lone point has no line to show it; evaluations are few and each
      // one matters, so both get dots.
      if (series.markers || finite == 1) {
        cairo_set_dash(cr_, nullptr, 0, 0);
        for (size_t i = 0; i < series.x.size() && i < series.y.size(); ++i) {
          if (!std::isfinite(series.x[i]) || !std::isfinite(series.y[i])) continue;
          cairo_arc(cr_, px(series.x[i]), py(series.y[i]), 3 * s_, 0, 2 * M_PI);
          cairo_fill(cr_);
        }
      }
    }
    cairo_restore(cr_);

    // Frame, ticks and their numbers.
    cairo_set_source_rgb(cr_, 0.35, 0.35, 0.35);
    cairo_set_line_width(cr_, 1 * s_);
    cairo_rectangle(cr_, std::round(area.x) + 0.5, std::round(area.y) + 0.5, std::round(area.w), std::round(area.h));
    cairo_stroke(cr_);
    for (double t : yTicks) {
      cairo_move_to(cr_, area.x - tickLen, std::round(py(t)) + 0.5);
      cairo_line_to(cr_, area.x, std::round(py(t)) + 0.5);
    }
    for (double t : xTicks) {
      cairo_move_to(cr_, std::round(px(t)) + 0.5, area.y + area.h);
      cairo_line_to(cr_, std::round(px(t)) + 0.5, area.y + area.h + tickLen);
    }
    cairo_stroke(cr_);
    cairo_set_source_rgb(cr_, 0.2, 0.2, 0.2);
    setFont(cr_, tickSize);
    for (size_t i = 0; i < yTicks.size(); ++i) drawText(cr_, yLabels.text[i], area.x - tickLen - gap, py(yTicks[i]), 1, 0.5);
    for (size_t i = 0; i < xTicks.size(); ++i) {
      drawText(cr_, xLabels.text[i], px(xTicks[i]), area.y + area.h + tickLen + gap, 0.5, 0);
    }
    if (!yLabels.multiplier.empty()) drawText(cr_, yLabels.multiplier, area.x, area.y - 3 * s_, 0, 1);
    if (!xLabels.multiplier.empty()) {
      drawText(cr_, xLabels.multiplier, area.x + area.w, area.y + area.h + tickLen + gap * 2 + tickSize, 1, 0);
    }

    // Axis labels.
    setFont(cr_, labelSize);
    cairo_set_source_rgb(cr_, 0.25, 0.25, 0.25);
    drawText(cr_, panel.xLabel, area.x + area.w / 2, cell.y + cell.h - 6 * s_, 0.5, 1);
    cairo_save(cr_);
    cairo_translate(cr_, cell.x + 8 * s_, area.y + area.h / 2);
    cairo_rotate(cr_, -M_PI / 2);
    drawText(cr_, panel.yLabel, 0, 0, 0.5, 0);
    cairo_restore(cr_);

    // A lone curve named as its axis needs no legend; any other does (which
    // evaluation figure, which memory field).
    if (names.size() > 1 || (names.size() == 1 && names[0] != panel.yLabel)) legend(panel, names, area, drawn);
  }

 private:
  // The panel's distinct curve names in first-seen order; a curve's index
  // picks its colour (one run) or its dash (several).
  static std::vector<std::string> seriesNames(const Panel& panel) {
    std::vector<std::string> names;
    for (const Series& series : panel.series) {
      if (std::find(names.begin(), names.end(), series.name) == names.end()) names.push_back(series.name);
    }
    return names;
  }

  Style styleOf(const Series& series, const std::vector<std::string>& names) const {
    const int index = static_cast<int>(std::find(names.begin(), names.end(), series.name) - names.begin());
    if (figure_.runs.size() > 1) return {paletteColour(series.run), index};
    return {paletteColour(index), 0};
  }

  // The curves' names in the corner of the plot area that hides the fewest
  // points (a falling loss leaves the top right empty, a growing memory the
  // top left).
  void legend(const Panel& panel, const std::vector<std::string>& names, const Rect& area,
              const std::vector<std::pair<double, double>>& drawn) {
    const double size = 10 * s_, row = 15 * s_, sample = 22 * s_, pad = 6 * s_;
    setFont(cr_, size);
    double widest = 0;
    for (const auto& n : names) widest = std::max(widest, textWidth(cr_, n));
    const double w = pad * 3 + sample + widest, h = pad * 2 + row * static_cast<double>(names.size()) - 3 * s_;
    const double inset = 6 * s_;
    const Rect corners[] = {{area.x + area.w - w - inset, area.y + inset, w, h},
                            {area.x + inset, area.y + inset, w, h},
                            {area.x + area.w - w - inset, area.y + area.h - h - inset, w, h},
                            {area.x + inset, area.y + area.h - h - inset, w, h}};
    Rect box = corners[0];
    size_t fewest = std::numeric_limits<size_t>::max();
    for (const Rect& c : corners) {
      size_t covered = 0;
      for (const auto& [x, y] : drawn) covered += x >= c.x && x <= c.x + c.w && y >= c.y && y <= c.y + c.h;
      if (covered < fewest) {
        fewest = covered;
        box = c;
      }
    }
    cairo_set_dash(cr_, nullptr, 0, 0);
    cairo_set_source_rgba(cr_, 1, 1, 1, 0.88);
    cairo_rectangle(cr_, box.x, box.y, box.w, box.h);
    cairo_fill_preserve(cr_);
    cairo_set_source_rgb(cr_, 0.8, 0.8, 0.8);
    cairo_set_line_width(cr_, 1 * s_);
    cairo_stroke(cr_);
    const bool severalRuns = figure_.runs.size() > 1;
    for (size_t i = 0; i < names.size(); ++i) {
      const double cy = box.y + pad + row * (static_cast<double>(i) + 0.5) - 1.5 * s_;
      // With several runs a sample is grey: its dash is what it says, the
      // colours are the runs' (the legend above the panels).
      const Rgb colour = severalRuns ? Rgb{0.3, 0.3, 0.3} : paletteColour(static_cast<int>(i));
      setColour(cr_, colour);
      setDash(cr_, severalRuns ? static_cast<int>(i) : 0, s_);
      cairo_set_line_width(cr_, 1.7 * s_);
      cairo_move_to(cr_, box.x + pad, cy);
      cairo_line_to(cr_, box.x + pad + sample, cy);
      cairo_stroke(cr_);
      cairo_set_dash(cr_, nullptr, 0, 0);
      bool markers = false;
      for (const Series& series : panel.series) markers = markers || (series.name == names[i] && series.markers);
      if (markers) {
        cairo_arc(cr_, box.x + pad + sample / 2, cy, 3 * s_, 0, 2 * M_PI);
        cairo_fill(cr_);
      }
      cairo_set_source_rgb(cr_, 0.15, 0.15, 0.15);
      drawText(cr_, names[i], box.x + pad * 2 + sample, cy, 0, 0.5);
    }
  }

  void frame(const Rect& area) {
    cairo_set_source_rgb(cr_, 0.35, 0.35, 0.35);
    cairo_set_line_width(cr_, 1 * s_);
    cairo_rectangle(cr_, area.x, area.y, area.w, area.h);
    cairo_stroke(cr_);
  }

  cairo_t* cr_;
  const Figure& figure_;
  double s_;
};

// The runs above the panels: one run's name as the figure's title; several
// as colour swatches beside their names, wrapped onto more rows as needed.
// Returns the height used.
double drawRunLegend(cairo_t* cr, const Figure& figure, double scale, double width) {
  const double margin = 14 * scale, size = 13 * scale, row = 22 * scale, swatch = 22 * scale;
  if (figure.runs.size() <= 1) {
    if (figure.runs.empty()) return margin;
    setFont(cr, size, true);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    drawText(cr, figure.runs[0], margin, margin + size / 2, 0, 0.5);
    return margin + row;
  }
  setFont(cr, size);
  double x = margin, y = margin + size / 2;
  for (size_t i = 0; i < figure.runs.size(); ++i) {
    const double entry = swatch + 6 * scale + textWidth(cr, figure.runs[i]) + 22 * scale;
    if (x > margin && x + entry > width - margin) {
      x = margin;
      y += row;
    }
    setColour(cr, paletteColour(static_cast<int>(i)));
    cairo_set_line_width(cr, 3 * scale);
    cairo_move_to(cr, x, y);
    cairo_line_to(cr, x + swatch, y);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    drawText(cr, figure.runs[i], x + swatch + 6 * scale, y, 0, 0.5);
    x += entry;
  }
  return y + row - size / 2;
}

}  // namespace

std::vector<double> niceTicks(double lo, double hi, int target, bool integer) {
  const double span = hi - lo;
  const double rough = span / std::max(1, target);
  const double magnitude = std::pow(10.0, std::floor(std::log10(rough)));
  const double norm = rough / magnitude;
  double step = (norm < 1.5 ? 1 : norm < 3.5 ? 2 : norm < 7.5 ? 5 : 10) * magnitude;
  if (integer) step = std::max(step, 1.0);
  std::vector<double> ticks;
  const double first = std::ceil(lo / step - 1e-9) * step;
  // Each tick from the first by multiplication: adding the step would
  // accumulate rounding (0.30000000000000004).
  for (int i = 0; i < 1000; ++i) {
    const double t = first + i * step;
    if (t > hi + step * 1e-9) break;
    ticks.push_back(t);
  }
  return ticks;
}

namespace {
void drawFigure(cairo_t* cr, const Figure& figure);
std::string writeSurfacePng(cairo_surface_t* surface, const std::string& path);
}  // namespace

std::string writePng(const Figure& figure, const std::string& path) {
  return drawPng(figure.width, figure.height, path, [&](cairo_t* cr) { drawFigure(cr, figure); });
}

std::string drawPng(int width, int height, const std::string& path, const std::function<void(cairo_t*)>& draw) {
  std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> surface(
      cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height), cairo_surface_destroy);
  if (cairo_surface_status(surface.get()) != CAIRO_STATUS_SUCCESS) {
    return cairo_status_to_string(cairo_surface_status(surface.get()));
  }
  {
    std::unique_ptr<cairo_t, decltype(&cairo_destroy)> context(cairo_create(surface.get()), cairo_destroy);
    cairo_set_source_rgb(context.get(), 1, 1, 1);
    cairo_paint(context.get());
    draw(context.get());
  }
  cairo_surface_flush(surface.get());
  return writeSurfacePng(surface.get(), path);
}

namespace {

void drawFigure(cairo_t* cr, const Figure& figure) {

  // Every length is given for the default 1200x900 and scaled with the
  // picture, so a small --size stays legible and a large one is not sparse.
  const double scale =
      std::clamp(std::min(figure.width / 1200.0, figure.height / 900.0), 0.7, 3.0);
  const double top = drawRunLegend(cr, figure, scale, figure.width);

  // Columns: about as many as rows, more of them on a wide picture.
  const int n = static_cast<int>(figure.panels.size());
  int cols = 1;
  if (n > 0) {
    const double aspect = static_cast<double>(figure.width) / std::max(1, figure.height);
    cols = std::clamp(static_cast<int>(std::ceil(std::sqrt(n * aspect * 0.75))), 1, n);
  }
  const int rows = n > 0 ? (n + cols - 1) / cols : 1;
  const double margin = 6 * scale;
  const double cellW = (figure.width - 2 * margin) / cols;
  const double cellH = (figure.height - top - margin) / rows;
  PanelPainter painter(cr, figure, scale);
  for (int i = 0; i < n; ++i) {
    const Rect cell{margin + (i % cols) * cellW, top + (i / cols) * cellH, cellW, cellH};
    painter.draw(figure.panels[i], cell);
  }
}

std::string writeSurfacePng(cairo_surface_t* surface, const std::string& path) {
  // The file is opened here rather than by cairo, whose only word for any
  // failure is "error while writing to output stream": the system's says
  // which (no such folder, permission denied, disk full).
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return std::strerror(errno);
  errno = 0;
  const cairo_status_t status = cairo_surface_write_to_png_stream(
      surface,
      [](void* closure, const unsigned char* data, unsigned int length) {
        return std::fwrite(data, 1, length, static_cast<std::FILE*>(closure)) == length ? CAIRO_STATUS_SUCCESS
                                                                                          : CAIRO_STATUS_WRITE_ERROR;
      },
      file);
  const int writeErrno = errno;
  const bool closed = std::fclose(file) == 0;
  if (status != CAIRO_STATUS_SUCCESS) {
    return status == CAIRO_STATUS_WRITE_ERROR && writeErrno != 0 ? std::strerror(writeErrno)
                                                                   : cairo_status_to_string(status);
  }
  if (!closed) return std::strerror(errno);
  return "";
}

}  // namespace

}  // namespace ptrain::cli::plot
