// A tiny SVG writer for trainplan's HTML report: elements kept as data (so tests can check the
// geometry), linear and log axes with "nice" ticks and unit labels, and four charts: stacked
// bars, grouped horizontal bars, scatter (with lines and labels) and a Gantt chart.
// Formatting only: every value drawn is given by the caller, already in the unit its axis names.
//
// Geometry. A chart of width W and height H (SVG user units; the page scales it with viewBox)
// draws its data in the plot frame of plot_frame(W, H, margins): x in [left, left + width],
// y in [top, top + height] with y growing downwards. Values map linearly (or logarithmically)
// from the axis domain, which is widened to whole ticks (nice_ticks), onto the frame.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trainplan::svg {

// Text and attribute values for XML/HTML: & < > " ' become entities; control characters other
// than tab and newline (not allowed in XML 1.0) become U+FFFD.
std::string escape(std::string_view s);

// A number as an SVG coordinate: at most 2 decimals, no trailing zeros ("12.5", "3", "-0.25").
std::string num(double v);

struct Element {
  std::string tag;                                          // rect, line, circle, text, polyline, path
  std::vector<std::pair<std::string, std::string>> attrs;   // in output order (values unescaped)
  std::string text;                                         // <text> content
  std::string title;                                        // hover text (an SVG <title> child)
  std::string attr(const std::string& name) const;          // "" when absent
  double number(const std::string& name) const;             // attr as a number (0 when absent)
};

class Svg {
 public:
  Svg(double width, double height, std::string aria_label);
  void add(Element e) { elements_.push_back(std::move(e)); }
  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& cls,
            const std::string& title = "");
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, const std::string& cls,
            double width = 1, const std::string& dash = "");
  void circle(double cx, double cy, double r, const std::string& fill, const std::string& cls,
              const std::string& title = "");
  // anchor: start|middle|end. rotate: degrees about (x, y).
  void text(double x, double y, const std::string& s, const std::string& cls, const std::string& anchor = "start",
            double rotate = 0);
  void polyline(const std::vector<std::pair<double, double>>& pts, const std::string& stroke, const std::string& cls,
                double width = 1.5);
  const std::vector<Element>& elements() const { return elements_; }
  // Elements whose class attribute is `cls`.
  std::vector<Element> find(const std::string& cls) const;
  double width() const { return width_; }
  double height() const { return height_; }
  // <svg viewBox=...> with every element; width 100% of its container up to `width`.
  std::string str() const;

 private:
  double width_, height_;
  std::string label_;
  std::vector<Element> elements_;
};

struct Frame {
  double left = 0, top = 0, width = 0, height = 0;
  double right() const { return left + width; }
  double bottom() const { return top + height; }
};
struct Margins {
  double left = 72, right = 24, top = 16, bottom = 52;
};
Frame plot_frame(double width, double height, const Margins& m = {});

// Ticks of a linear axis covering [lo, hi]: a step of 1, 2 or 5 x 10^k giving at most
// `max_ticks` intervals, from floor(lo/step)*step to ceil(hi/step)*step. lo == hi is widened
// (to [0, 1] for 0, else to [0, 2 lo] / [2 lo, 0]).
std::vector<double> nice_ticks(double lo, double hi, int max_ticks = 5);
// Ticks of a log10 axis covering [lo, hi] (lo > 0): 1, 2, 5 x 10^k, from the largest such value
// <= lo to the smallest >= hi; only powers of ten when that gives more than max_ticks + 1 ticks.
std::vector<double> log_ticks(double lo, double hi, int max_ticks = 8);
// A tick label: as many decimals as the tick step needs ("0.25", "100", "2e+06" past 1e6).
std::string tick_label(double v, double step);

// Value -> coordinate: domain [d0, d1] onto range [r0, r1], linearly or in log10 (d0 > 0).
struct Scale {
  double d0 = 0, d1 = 1, r0 = 0, r1 = 1;
  bool log = false;
  double operator()(double v) const;
};

// How an axis writes its tick labels: as plain decimals (tick_label), or compact for people
// (compact_label: "500K", "2.5M", "15T"), after an optional prefix ("$").
struct Axis {
  std::string label;  // e.g. "peak memory per GPU (GB)": name and unit
  bool log = false;
  std::optional<double> min, max;  // domain limits to include (defaults: the data; linear from 0 when set)
  bool compact = false;            // tick labels by compact_label
  std::string prefix{};            // drawn before each tick label (a currency sign)
};

// A figure for people: at most three significant digits with a short-scale suffix (K = 1e3,
// M = 1e6, B = 1e9, T = 1e12), trailing zeros dropped: 50000000 -> "50M", 1.5e13 -> "15T",
// 2500 -> "2.5K", 0.25 -> "0.25"; past 1e15 in T ("2000T"), never an exponent.
std::string compact_label(double v);

// --- charts ---

struct Series {
  std::string name;
  std::string color;  // CSS colour
};

// Vertical stacked bars: values[c][s] of category c (e.g. a pipeline stage) and series s (e.g.
// weights), stacked bottom-up in series order, with an optional horizontal reference line
// (e.g. the GPU's memory capacity). Bar c spans the slot [left + c*w/n, left + (c+1)*w/n]
// narrowed by 20% on each side; the y axis starts at 0.
struct StackedBars {
  std::string title;
  std::vector<std::string> categories;
  std::vector<Series> series;
  std::vector<std::vector<double>> values;  // [category][series], >= 0
  Axis y;
  std::optional<double> reference;          // a line at this value
  std::string reference_label;
  std::vector<std::string> tooltips;        // per category: hover text of its bars (may be empty)
};
Svg stacked_bars(const StackedBars& c, double width = 760, double height = 340);

// Horizontal bars: one row per label, one bar per series in each row (grouped), from x = 0.
// value_text[row][series] is drawn right of its bar. Row r's band is height/n; its bars share
// 70% of the band. Missing values (nullopt) draw no bar and "n/a".
struct GroupedBars {
  std::string title;
  std::vector<std::string> rows;
  std::vector<Series> series;
  std::vector<std::vector<std::optional<double>>> values;  // [row][series], >= 0
  std::vector<std::vector<std::string>> value_text;        // [row][series]; empty: the value
  std::vector<std::string> row_note;                       // drawn at the right end of each row (e.g. "+4.1%")
  Axis x;
};
Svg grouped_bars(const GroupedBars& c, double width = 760);
// The row band height grouped_bars uses (its height is rows x this + margins).
inline constexpr double kBarRowHeight = 30;

struct Point {
  double x = 0, y = 0;
  std::string label;  // drawn next to the point when not empty
  std::string title;  // hover text
};
struct ScatterSeries {
  std::string name, color;
  std::vector<Point> points;
  bool line = false;        // join the points in order
  double radius = 3;
  bool legend = true;
};
struct Marker {             // a ring around a point with a caption (e.g. "cheapest within 30 days")
  double x = 0, y = 0;
  std::string caption, color;
};
struct Scatter {
  std::string title;
  std::vector<ScatterSeries> series;  // drawn in order (later on top)
  std::vector<Marker> markers;
  Axis x, y;
};
Svg scatter(const Scatter& c, double width = 760, double height = 420);

// Gantt: rows top to bottom, bars [start, end] on a row in a category's colour.
struct GanttBar {
  int row = 0, category = 0;
  double start = 0, end = 0;
  std::string title;
};
struct Gantt {
  std::string title;
  std::vector<std::string> rows;
  std::vector<Series> categories;
  std::vector<GanttBar> bars;
  Axis x;
};
// Each row is kGanttRowHeight high. Bars of the same row and category closer than half a unit
// of the drawing apart are merged into one (so a step of 10^5 events stays a small page); the
// merged bar's title says how many it stands for.
Svg gantt(const Gantt& c, double width = 760);
inline constexpr double kGanttRowHeight = 18;

// Points to draw of a large scatter: every point no other point beats in both x and y (the
// lower-left front, smaller is better on both) is kept; the others are kept one per cell of a
// grid of cells x cells over the data's bounding box (the first in input order), with the grid
// coarsened (halved) until at most max_points remain or it is one cell. Input order is kept.
// Returns the indices of the kept points.
std::vector<std::size_t> thin_points(const std::vector<std::pair<double, double>>& pts, std::size_t max_points,
                                     int cells = 128);

}  // namespace trainplan::svg
