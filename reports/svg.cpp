#include "reports/svg.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>

namespace trainplan::svg {

std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') out += "\xEF\xBF\xBD";
        else out += c;
    }
  }
  return out;
}

std::string num(double v) {
  if (!std::isfinite(v)) v = 0;
  std::string s = fmt::format("{:.2f}", v);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  if (s == "-0") s = "0";
  return s;
}

std::string Element::attr(const std::string& name) const {
  for (const auto& [k, v] : attrs)
    if (k == name) return v;
  return "";
}

double Element::number(const std::string& name) const {
  const std::string v = attr(name);
  return v.empty() ? 0.0 : std::strtod(v.c_str(), nullptr);
}

Svg::Svg(double width, double height, std::string aria_label)
    : width_(width), height_(height), label_(std::move(aria_label)) {}

void Svg::rect(double x, double y, double w, double h, const std::string& fill, const std::string& cls,
               const std::string& title) {
  add({"rect", {{"class", cls}, {"x", num(x)}, {"y", num(y)}, {"width", num(w)}, {"height", num(h)}, {"fill", fill}},
       "", title});
}

void Svg::line(double x1, double y1, double x2, double y2, const std::string& stroke, const std::string& cls,
               double width, const std::string& dash) {
  Element e{"line",
            {{"class", cls}, {"x1", num(x1)}, {"y1", num(y1)}, {"x2", num(x2)}, {"y2", num(y2)}, {"stroke", stroke},
             {"stroke-width", num(width)}},
            "", ""};
  if (!dash.empty()) e.attrs.emplace_back("stroke-dasharray", dash);
  add(std::move(e));
}

void Svg::circle(double cx, double cy, double r, const std::string& fill, const std::string& cls,
                 const std::string& title) {
  add({"circle", {{"class", cls}, {"cx", num(cx)}, {"cy", num(cy)}, {"r", num(r)}, {"fill", fill}}, "", title});
}

void Svg::text(double x, double y, const std::string& s, const std::string& cls, const std::string& anchor,
               double rotate) {
  Element e{"text", {{"class", cls}, {"x", num(x)}, {"y", num(y)}, {"text-anchor", anchor}}, s, ""};
  if (rotate != 0) e.attrs.emplace_back("transform", fmt::format("rotate({} {} {})", num(rotate), num(x), num(y)));
  add(std::move(e));
}

void Svg::polyline(const std::vector<std::pair<double, double>>& pts, const std::string& stroke, const std::string& cls,
                   double width) {
  std::string p;
  for (const auto& [x, y] : pts) p += (p.empty() ? "" : " ") + num(x) + "," + num(y);
  add({"polyline", {{"class", cls}, {"points", p}, {"fill", "none"}, {"stroke", stroke}, {"stroke-width", num(width)}},
       "", ""});
}

std::vector<Element> Svg::find(const std::string& cls) const {
  std::vector<Element> out;
  for (const Element& e : elements_)
    if (e.attr("class") == cls) out.push_back(e);
  return out;
}

std::string Svg::str() const {
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" width=\"{}\" role=\"img\" aria-label=\"{}\">\n",
      num(width_), num(height_), num(width_), escape(label_));
  for (const Element& e : elements_) {
    out += "<" + e.tag;
    for (const auto& [k, v] : e.attrs) out += " " + k + "=\"" + escape(v) + "\"";
    if (e.text.empty() && e.title.empty()) {
      out += "/>\n";
      continue;
    }
    out += ">";
    if (!e.title.empty()) out += "<title>" + escape(e.title) + "</title>";
    out += escape(e.text) + "</" + e.tag + ">\n";
  }
  return out + "</svg>";
}

Frame plot_frame(double width, double height, const Margins& m) {
  return {m.left, m.top, std::max(1.0, width - m.left - m.right), std::max(1.0, height - m.top - m.bottom)};
}

namespace {

// The tick step: 1, 2 or 5 x 10^k, the smallest giving at most max_ticks intervals over `span`.
double nice_step(double span, int max_ticks) {
  const double raw = span / std::max(1, max_ticks);
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw * (1 - 1e-9)) return m * p;
  return 10 * p;
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int max_ticks) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {0, 1};
  if (lo > hi) std::swap(lo, hi);
  if (lo == hi) {
    if (lo == 0) hi = 1;
    else if (lo > 0) lo = 0, hi = 2 * hi;
    else hi = 0, lo = 2 * lo;
  }
  const double step = nice_step(hi - lo, max_ticks);
  const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  std::vector<double> out;
  for (double i = first; i <= last + 0.5; ++i) out.push_back(i * step);
  return out;
}

std::vector<double> log_ticks(double lo, double hi, int max_ticks) {
  if (!(lo > 0) || !std::isfinite(hi)) return nice_ticks(0, hi, max_ticks);
  if (hi < lo) std::swap(lo, hi);
  auto all = [&](std::initializer_list<double> mantissas) {
    std::vector<double> v;
    const int k0 = static_cast<int>(std::floor(std::log10(lo) + 1e-9)) - 1;
    const int k1 = static_cast<int>(std::ceil(std::log10(hi) - 1e-9)) + 1;
    for (int k = k0; k <= k1; ++k)
      for (double m : mantissas) v.push_back(m * std::pow(10.0, k));
    std::vector<double> out;
    // The largest tick <= lo, every tick between, the smallest tick >= hi.
    double below = v.front();
    for (double t : v)
      if (t <= lo * (1 + 1e-9)) below = t;
    out.push_back(below);
    for (double t : v) {
      if (t <= below) continue;
      out.push_back(t);
      if (t >= hi * (1 - 1e-9)) break;
    }
    return out;
  };
  std::vector<double> t = all({1.0, 2.0, 5.0});
  if (static_cast<int>(t.size()) > max_ticks + 1) t = all({1.0});
  return t;
}

std::string tick_label(double v, double step) {
  if (std::abs(v) >= 1e6 && std::abs(step) >= 1e5) return fmt::format("{:g}", v);
  const int decimals = step > 0 ? std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9))) : 0;
  std::string s = fmt::format("{:.{}f}", v, std::min(decimals, 9));
  if (s == "-0" || s.find_first_not_of("-0.") == std::string::npos) s = "0";
  return s;
}

std::string compact_label(double v) {
  const double a = std::abs(v);
  const char* suffix = "";
  double scaled = v;
  for (const auto& [unit, name] : {std::pair{1e12, "T"}, std::pair{1e9, "B"}, std::pair{1e6, "M"}, std::pair{1e3, "K"}}) {
    if (a >= unit) {
      scaled = v / unit;
      suffix = name;
      break;
    }
  }
  // Three significant digits (fewer decimals as the mantissa grows), trailing zeros dropped.
  const double m = std::abs(scaled);
  const int decimals = m >= 100 ? 0 : m >= 10 ? 1 : m >= 1 ? 2 : m > 0 ? std::min(9, 2 - static_cast<int>(std::floor(std::log10(m)))) : 0;
  std::string s = fmt::format("{:.{}f}", scaled, decimals);
  if (s.find('.') != std::string::npos) {
    s.erase(s.find_last_not_of('0') + 1);
    if (s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s + suffix;
}

double Scale::operator()(double v) const {
  if (log) {
    const double a = std::log10(d0), b = std::log10(d1);
    const double x = std::log10(std::max(v, std::numeric_limits<double>::min()));
    return b == a ? r0 : r0 + (x - a) / (b - a) * (r1 - r0);
  }
  return d1 == d0 ? r0 : r0 + (v - d0) / (d1 - d0) * (r1 - r0);
}

namespace {

const char* kAxisColor = "#444";
const char* kGridColor = "#ddd";

// The ticks of `axis` over data [lo, hi] (axis.min/max widen it).
std::vector<double> axis_ticks(const Axis& axis, double lo, double hi, int max_ticks) {
  if (axis.min) lo = std::min(lo, *axis.min);
  if (axis.max) hi = std::max(hi, *axis.max);
  if (axis.log) {
    if (!(lo > 0)) lo = hi > 0 ? hi / 10 : 1;
    return log_ticks(lo, hi, max_ticks);
  }
  return nice_ticks(lo, hi, max_ticks);
}

double tick_step(const std::vector<double>& ticks) { return ticks.size() > 1 ? ticks[1] - ticks[0] : 1; }

// Label of a log tick: its own precision.
std::string log_label(double v) { return tick_label(v, v >= 1 ? 1 : std::pow(10.0, std::floor(std::log10(v)))); }

// The label of tick `t` on `axis` (ticks: all of the axis's ticks, for the plain step).
std::string axis_tick_label(const Axis& axis, double t, const std::vector<double>& ticks) {
  const std::string number = axis.compact ? compact_label(t) : axis.log ? log_label(t) : tick_label(t, tick_step(ticks));
  return axis.prefix + number;
}

// Tick labels are 12 px text (the page's svg .tick style): about 7 px per character at most.
constexpr double kTickCharWidth = 7;

void y_axis(Svg& svg, const Frame& f, const Scale& y, const std::vector<double>& ticks, const Axis& axis) {
  std::size_t longest = 0;
  for (double t : ticks) {
    const double py = y(t);
    const std::string label = axis_tick_label(axis, t, ticks);
    longest = std::max(longest, label.size());
    svg.line(f.left, py, f.right(), py, kGridColor, "grid");
    svg.text(f.left - 6, py + 4, label, "tick", "end");
  }
  svg.line(f.left, f.top, f.left, f.bottom(), kAxisColor, "axis");
  // The axis name (13 px, rotated -90 degrees about its baseline at x: glyphs from x - 10 to x + 3)
  // at x = 16, moved left to clear the longest tick label by 5 px where the margin allows (down to
  // x = 10, the page's edge); compact labels (Axis::compact) keep the ticks short enough.
  const double clear = f.left - 6 - kTickCharWidth * static_cast<double>(longest) - 3 - 5;
  svg.text(std::clamp(clear, 10.0, 16.0), f.top + f.height / 2, axis.label, "axis-label", "middle", -90);
}

void x_axis(Svg& svg, const Frame& f, const Scale& x, const std::vector<double>& ticks, const Axis& axis) {
  for (double t : ticks) {
    const double px = x(t);
    svg.line(px, f.top, px, f.bottom(), kGridColor, "grid");
    svg.text(px, f.bottom() + 16, axis_tick_label(axis, t, ticks), "tick", "middle");
  }
  svg.line(f.left, f.bottom(), f.right(), f.bottom(), kAxisColor, "axis");
  svg.text(f.left + f.width / 2, f.bottom() + 38, axis.label, "axis-label", "middle");
}

}  // namespace

Svg stacked_bars(const StackedBars& c, double width, double height) {
  Svg svg(width, height, c.title);
  const Frame f = plot_frame(width, height);
  double top = 0;
  for (const auto& row : c.values) {
    double sum = 0;
    for (double v : row) sum += std::max(0.0, v);
    top = std::max(top, sum);
  }
  if (c.reference) top = std::max(top, *c.reference);
  const std::vector<double> ticks = axis_ticks(Axis{c.y.label, false, 0.0, c.y.max}, 0, top, 5);
  const Scale y{ticks.front(), ticks.back(), f.bottom(), f.top};
  y_axis(svg, f, y, ticks, c.y);
  const std::size_t n = std::max<std::size_t>(1, c.categories.size());
  const double slot = f.width / static_cast<double>(n);
  const std::size_t label_every = (n + 15) / 16;  // at most ~16 category labels
  for (std::size_t i = 0; i < c.categories.size(); ++i) {
    const double x = f.left + slot * static_cast<double>(i) + 0.2 * slot;
    double base = 0;
    for (std::size_t s = 0; s < c.series.size() && i < c.values.size() && s < c.values[i].size(); ++s) {
      const double v = std::max(0.0, c.values[i][s]);
      if (v <= 0) continue;
      const double y0 = y(base), y1 = y(base + v);
      const std::string tip = c.categories[i] + ": " + c.series[s].name +
                              (i < c.tooltips.size() && !c.tooltips[i].empty() ? "\n" + c.tooltips[i] : "");
      svg.rect(x, y1, 0.6 * slot, y0 - y1, c.series[s].color, "bar s" + std::to_string(s), tip);
      base += v;
    }
    if (i % label_every == 0) svg.text(x + 0.3 * slot, f.bottom() + 16, c.categories[i], "tick", "middle");
  }
  svg.line(f.left, f.bottom(), f.right(), f.bottom(), kAxisColor, "axis");
  if (c.reference) {
    const double py = y(*c.reference);
    svg.line(f.left, py, f.right(), py, "#c00", "reference", 1.5, "6 4");
    svg.text(f.right() - 4, py - 5, c.reference_label, "reference-label", "end");
  }
  return svg;
}

Svg grouped_bars(const GroupedBars& c, double width) {
  const Margins m{190, 130, 8, 46};
  const double height = m.top + m.bottom + kBarRowHeight * static_cast<double>(std::max<std::size_t>(1, c.rows.size()));
  Svg svg(width, height, c.title);
  const Frame f = plot_frame(width, height, m);
  double top = 0;
  for (const auto& row : c.values)
    for (const auto& v : row)
      if (v) top = std::max(top, *v);
  const std::vector<double> ticks = axis_ticks(Axis{c.x.label, false, 0.0, c.x.max}, 0, top, 5);
  const Scale x{ticks.front(), ticks.back(), f.left, f.right()};
  x_axis(svg, f, x, ticks, c.x);
  const double ns = static_cast<double>(std::max<std::size_t>(1, c.series.size()));
  const double bar_h = 0.7 * kBarRowHeight / ns;
  for (std::size_t r = 0; r < c.rows.size(); ++r) {
    const double band = f.top + kBarRowHeight * static_cast<double>(r);
    svg.text(f.left - 6, band + kBarRowHeight / 2 + 4, c.rows[r], "row-label", "end");
    for (std::size_t s = 0; s < c.series.size(); ++s) {
      const double by = band + 0.15 * kBarRowHeight + bar_h * static_cast<double>(s);
      const bool has = r < c.values.size() && s < c.values[r].size() && c.values[r][s].has_value();
      std::string label = r < c.value_text.size() && s < c.value_text[r].size() ? c.value_text[r][s] : "";
      if (!has) {
        svg.text(f.left + 4, by + bar_h - 2, "n/a", "value", "start");
        continue;
      }
      const double value = c.values[r][s].value_or(0.0);
      if (label.empty()) label = tick_label(value, tick_step(ticks) / 100);
      const double w = x(std::max(0.0, value)) - f.left;
      svg.rect(f.left, by, w, bar_h, c.series[s].color, "bar s" + std::to_string(s),
               c.rows[r] + " (" + c.series[s].name + "): " + label);
      svg.text(f.left + w + 4, by + bar_h - 2, label, "value", "start");
    }
    if (r < c.row_note.size() && !c.row_note[r].empty()) {
      svg.text(width - 4, band + kBarRowHeight / 2 + 4, c.row_note[r], "note", "end");
    }
  }
  return svg;
}

Svg scatter(const Scatter& c, double width, double height) {
  Svg svg(width, height, c.title);
  const Frame f = plot_frame(width, height, Margins{76, 24, 16, 52});
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  auto include = [&](double x, double y) {
    if (!std::isfinite(x) || !std::isfinite(y) || (c.x.log && x <= 0) || (c.y.log && y <= 0)) return;
    xlo = std::min(xlo, x), xhi = std::max(xhi, x), ylo = std::min(ylo, y), yhi = std::max(yhi, y);
  };
  for (const auto& s : c.series)
    for (const auto& p : s.points) include(p.x, p.y);
  for (const auto& m : c.markers) include(m.x, m.y);
  if (!std::isfinite(xlo)) xlo = xhi = ylo = yhi = 1;
  const std::vector<double> xt = axis_ticks(c.x, xlo, xhi, 6), yt = axis_ticks(c.y, ylo, yhi, 5);
  const Scale x{xt.front(), xt.back(), f.left, f.right(), c.x.log};
  const Scale y{yt.front(), yt.back(), f.bottom(), f.top, c.y.log};
  y_axis(svg, f, y, yt, c.y);
  x_axis(svg, f, x, xt, c.x);
  for (std::size_t si = 0; si < c.series.size(); ++si) {
    const ScatterSeries& s = c.series[si];
    const std::string cls = "point s" + std::to_string(si);
    if (s.line && s.points.size() > 1) {
      std::vector<std::pair<double, double>> pts;
      for (const auto& p : s.points) pts.emplace_back(x(p.x), y(p.y));
      svg.polyline(pts, s.color, "line s" + std::to_string(si));
    }
    for (const auto& p : s.points) svg.circle(x(p.x), y(p.y), s.radius, s.color, cls, p.title);
    for (const auto& p : s.points)
      if (!p.label.empty()) svg.text(x(p.x) + s.radius + 2, y(p.y) - s.radius - 1, p.label, "point-label");
  }
  for (const auto& m : c.markers) {
    svg.add({"circle",
             {{"class", "marker"}, {"cx", num(x(m.x))}, {"cy", num(y(m.y))}, {"r", "9"}, {"fill", "none"},
              {"stroke", m.color}, {"stroke-width", "2.5"}},
             "", m.caption});
    svg.text(x(m.x), y(m.y) + 22, m.caption, "marker-label", "middle");
  }
  return svg;
}

Svg gantt(const Gantt& c, double width) {
  const Margins m{170, 24, 8, 46};
  const double height = m.top + m.bottom + kGanttRowHeight * static_cast<double>(std::max<std::size_t>(1, c.rows.size()));
  Svg svg(width, height, c.title);
  const Frame f = plot_frame(width, height, m);
  double hi = 0;
  for (const auto& b : c.bars) hi = std::max(hi, b.end);
  const std::vector<double> ticks = axis_ticks(Axis{c.x.label, false, 0.0, c.x.max}, 0, hi, 8);
  const Scale x{ticks.front(), ticks.back(), f.left, f.right()};
  x_axis(svg, f, x, ticks, c.x);
  for (std::size_t r = 0; r < c.rows.size(); ++r) {
    svg.text(f.left - 6, f.top + kGanttRowHeight * (static_cast<double>(r) + 0.5) + 4, c.rows[r], "row-label", "end");
  }
  // Merge bars of one row and category closer than half a drawing unit (in value units).
  const double gap = 0.5 * (ticks.back() - ticks.front()) / f.width;
  std::map<std::pair<int, int>, std::vector<const GanttBar*>> groups;
  for (const auto& b : c.bars) groups[{b.row, b.category}].push_back(&b);
  for (auto& [key, bars] : groups) {
    std::stable_sort(bars.begin(), bars.end(), [](const GanttBar* a, const GanttBar* b) { return a->start < b->start; });
    const auto [row, cat] = key;
    if (row < 0 || cat < 0 || static_cast<std::size_t>(cat) >= c.categories.size()) continue;
    for (std::size_t i = 0; i < bars.size();) {
      double start = bars[i]->start, end = bars[i]->end;
      std::size_t j = i + 1;
      while (j < bars.size() && bars[j]->start - end < gap) end = std::max(end, bars[j++]->end);
      const std::string tip = j - i == 1 ? bars[i]->title
                                         : fmt::format("{} x {} ({} .. {})", j - i, c.categories[cat].name,
                                                       tick_label(start, gap / 10), tick_label(end, gap / 10));
      const double y = f.top + kGanttRowHeight * row + 2;
      svg.rect(x(start), y, std::max(0.3, x(end) - x(start)), kGanttRowHeight - 4, c.categories[cat].color,
               "bar s" + std::to_string(cat), tip);
      i = j;
    }
  }
  return svg;
}

std::vector<std::size_t> thin_points(const std::vector<std::pair<double, double>>& pts, std::size_t max_points,
                                     int cells) {
  std::vector<std::size_t> order(pts.size());
  for (std::size_t i = 0; i < pts.size(); ++i) order[i] = i;
  if (pts.size() <= max_points) return order;
  // The lower-left front: sort by x then y; a point is on it when its y is below every earlier y.
  std::vector<std::size_t> by_x = order;
  std::stable_sort(by_x.begin(), by_x.end(), [&](std::size_t a, std::size_t b) { return pts[a] < pts[b]; });
  std::vector<bool> front(pts.size(), false);
  double best_y = std::numeric_limits<double>::infinity();
  for (std::size_t i : by_x) {
    if (pts[i].second < best_y) {
      front[i] = true;
      best_y = pts[i].second;
    }
  }
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  for (const auto& [x, y] : pts) xlo = std::min(xlo, x), xhi = std::max(xhi, x), ylo = std::min(ylo, y), yhi = std::max(yhi, y);
  std::vector<std::size_t> kept;
  for (int n = std::max(1, cells);; n = std::max(1, n / 2)) {
    kept.clear();
    std::set<std::pair<int, int>> used;
    auto cell = [&](double v, double lo, double hi) {
      return hi > lo ? std::min(n - 1, static_cast<int>((v - lo) / (hi - lo) * n)) : 0;
    };
    for (std::size_t i = 0; i < pts.size(); ++i) {
      if (front[i] || used.insert({cell(pts[i].first, xlo, xhi), cell(pts[i].second, ylo, yhi)}).second) kept.push_back(i);
    }
    if (kept.size() <= max_points || n == 1) break;
  }
  return kept;
}

}  // namespace trainplan::svg
