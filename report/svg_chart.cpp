#include "report/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace lunajit::report {
namespace {

// Plot area inside the SVG: margins for title, axis labels and legend.
constexpr int kLeft = 70, kRight = 20, kTop = 48, kBottom = 48;

std::string tick_label(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e4 || a < 1e-3) return fmt::format("{:.0e}", v);
  return fmt::format("{:.3g}", v);
}

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  bool log2 = false;  // with log: ticks at powers of two
  double map(double v, double p0, double p1) const {
    double t = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
    if (!std::isfinite(t)) t = 0.5;
    return p0 + t * (p1 - p0);
  }
  std::vector<double> ticks() const {
    std::vector<double> t;
    if (log && log2) {
      const double e0 = std::ceil(std::log2(lo) - 1e-9), e1 = std::floor(std::log2(hi) + 1e-9);
      const double step = e1 - e0 + 1 > 12 ? 2 : 1;
      for (double e = e0; e <= e1; e += step) t.push_back(std::exp2(e));
      if (t.empty()) t = {lo, hi};
      return t;
    }
    if (log) {
      for (double e = std::floor(std::log10(lo)); e <= std::ceil(std::log10(hi)); ++e) {
        const double v = std::pow(10.0, e);
        if (v >= lo * 0.999 && v <= hi * 1.001) t.push_back(v);
      }
      if (t.size() < 2) t = {lo, hi};
    } else {
      for (int i = 0; i <= 4; ++i) t.push_back(lo + (hi - lo) * i / 4);
    }
    return t;
  }
};

Axis make_axis(double lo, double hi, bool allow_log, std::optional<double> fixed_max) {
  Axis a;
  if (!(lo <= hi)) lo = 0, hi = 1;
  if (fixed_max) {
    a.lo = 0;
    a.hi = *fixed_max;
    return a;
  }
  if (allow_log && lo > 0 && hi / lo >= 20) {
    a.log = true;
    a.lo = lo / 1.3;
    a.hi = hi * 1.3;
    return a;
  }
  a.lo = 0;
  a.hi = hi > 0 ? hi * 1.15 : 1;
  return a;
}

}  // namespace

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string svg_line_chart(const LineChart& c, int W, int H) {
  double xlo = std::numeric_limits<double>::max(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  for (const auto& s : c.series)
    for (auto [x, y] : s.points) {
      xlo = std::min(xlo, x), xhi = std::max(xhi, x);
      ylo = std::min(ylo, y), yhi = std::max(yhi, y);
    }
  const bool empty = xlo > xhi;
  Axis ax = make_axis(empty ? 1 : xlo, empty ? 2 : xhi, true, std::nullopt);
  if (!empty && xlo == xhi) ax = Axis{xlo * 0.5, xhi * 1.5, false};
  if (c.x_log2 && !empty && xlo > 0) {
    // Half a power of two of margin on each side; a single x still gets the powers of two around it.
    ax = Axis{xlo / std::sqrt(2.0), xhi * std::sqrt(2.0), true, true};
    if (xlo == xhi) ax.lo = xlo / 2, ax.hi = xhi * 2;
  }
  const Axis ay = make_axis(empty ? 0 : ylo, empty ? 1 : yhi, true, c.y_max);
  const double px0 = kLeft, px1 = W - kRight, py0 = H - kBottom, py1 = kTop;

  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\">\n"
      "<rect x=\"0\" y=\"0\" width=\"{0}\" height=\"{1}\" fill=\"#ffffff\" stroke=\"#cccccc\"/>\n"
      "<text x=\"{2}\" y=\"20\" font-size=\"14\" font-weight=\"bold\" text-anchor=\"middle\">{3}</text>\n",
      W, H, W / 2, html_escape(c.title));
  if (!c.note.empty())
    s += fmt::format("<text x=\"{}\" y=\"36\" font-size=\"11\" fill=\"#555555\" text-anchor=\"middle\">{}</text>\n",
                     W / 2, html_escape(c.note));
  // Axes and ticks.
  s += fmt::format("<path d=\"M{} {} V{} H{}\" stroke=\"#888888\" fill=\"none\"/>\n", px0, py1, py0, px1);
  for (double t : ax.ticks()) {
    const double x = ax.map(t, px0, px1);
    s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#eeeeee\"/>"
                     "<text class=\"xtick\" x=\"{0:.1f}\" y=\"{3}\" font-size=\"10\" text-anchor=\"middle\">{4}</text>\n",
                     x, py1, py0, py0 + 14, ax.log2 ? fmt::format("{:.0f}", t) : tick_label(t));
  }
  for (double t : ay.ticks()) {
    const double y = ay.map(t, py0, py1);
    s += fmt::format("<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\" stroke=\"#eeeeee\"/>"
                     "<text x=\"{3}\" y=\"{4:.1f}\" font-size=\"10\" text-anchor=\"end\">{5}</text>\n",
                     y, px0, px1, px0 - 4, y + 3, tick_label(t));
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{}{}</text>\n", (px0 + px1) / 2,
                   H - 10, html_escape(c.x_label), ax.log2 ? " (log2)" : ax.log ? " (log)" : "");
  // Vertical markers, labelled at the top of the plot, one text row each.
  int marker_row = 0;
  for (const ChartMarker& m : c.x_markers) {
    if (!(m.x >= ax.lo && m.x <= ax.hi)) continue;
    const double x = ax.map(m.x, px0, px1);
    s += fmt::format("<line class=\"marker\" x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"{3}\" "
                     "stroke-width=\"1.5\" stroke-dasharray=\"1 3\"/>"
                     "<text x=\"{4:.1f}\" y=\"{5}\" font-size=\"9\" fill=\"{3}\" text-anchor=\"end\">{6}</text>\n",
                     x, py1, py0, m.color, x - 3, py0 - 6 - 11 * marker_row++, html_escape(m.label));
  }
  s += fmt::format("<text x=\"14\" y=\"{0}\" font-size=\"11\" text-anchor=\"middle\" transform=\"rotate(-90 14 {0})\">"
                   "{1}{2}</text>\n",
                   (py0 + py1) / 2, html_escape(c.y_label), ay.log ? " (log)" : "");
  // Series: a polyline and a dot per point.
  int legend_row = 0;
  for (const auto& ser : c.series) {
    auto pts = ser.points;
    std::sort(pts.begin(), pts.end());
    std::string path;
    for (auto [x, y] : pts)
      path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "" : " ", ax.map(x, px0, px1), ay.map(y, py0, py1));
    const std::string dash = !ser.dash.empty() ? " stroke-dasharray=\"" + ser.dash + "\""
                             : ser.dashed       ? std::string(" stroke-dasharray=\"6 4\"")
                                                : std::string();
    if (pts.size() > 1)
      s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2.5\"{}/>\n", path,
                       ser.color, dash);
    for (auto [x, y] : pts)
      s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"{}\"/>\n", ax.map(x, px0, px1),
                       ay.map(y, py0, py1), ser.color);
    // More than 6 series: two legend columns.
    const int rows = c.series.size() > 6 ? int((c.series.size() + 1) / 2) : int(c.series.size());
    const int ly = kTop + 6 + 14 * (legend_row % rows), lx = px0 + 8 + (legend_row / rows) * (W - kLeft - kRight) / 2;
    ++legend_row;
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"3\"{4}/>"
                     "<text x=\"{5}\" y=\"{6}\" font-size=\"11\">{7}</text>\n",
                     lx, ly, lx + 20, ser.color, dash, lx + 24, ly + 4, html_escape(ser.name));
  }
  s += "</svg>\n";
  return s;
}

std::string svg_bar_chart(const BarChart& c, int W, int H) {
  const double px0 = kLeft, px1 = W - kRight, py0 = H - kBottom - 20, py1 = kTop + 16;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\">\n"
      "<rect x=\"0\" y=\"0\" width=\"{0}\" height=\"{1}\" fill=\"#ffffff\" stroke=\"#cccccc\"/>\n"
      "<text x=\"{2}\" y=\"20\" font-size=\"14\" font-weight=\"bold\" text-anchor=\"middle\">{3}</text>\n",
      W, H, W / 2, html_escape(c.title));
  if (!c.note.empty())
    s += fmt::format("<text x=\"{}\" y=\"36\" font-size=\"11\" fill=\"#555555\" text-anchor=\"middle\">{}</text>\n",
                     W / 2, html_escape(c.note));
  s += fmt::format("<path d=\"M{} {} V{} H{}\" stroke=\"#888888\" fill=\"none\"/>\n", px0, py1, py0, px1);
  for (int i = 0; i <= 4; ++i) {
    const double y = py0 + (py1 - py0) * i / 4;
    s += fmt::format("<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\" stroke=\"#eeeeee\"/>"
                     "<text x=\"{3}\" y=\"{4:.1f}\" font-size=\"10\" text-anchor=\"end\">{5}%</text>\n",
                     y, px0, px1, px0 - 4, y + 3, 25 * i);
  }
  // Legend along the top.
  for (size_t m = 0; m < c.metric_names.size(); ++m)
    s += fmt::format("<rect x=\"{0}\" y=\"{1}\" width=\"12\" height=\"10\" fill=\"{2}\"/>"
                     "<text x=\"{3}\" y=\"{4}\" font-size=\"11\">{5}</text>\n",
                     px0 + 8 + 170 * m, kTop - 4, c.metric_colors[m], px0 + 24 + 170 * m, kTop + 5,
                     html_escape(c.metric_names[m]));
  const size_t groups = std::max<size_t>(1, c.groups.size());
  const double gw = (px1 - px0) / groups;
  for (size_t g = 0; g < c.groups.size(); ++g) {
    const auto& grp = c.groups[g];
    const size_t bars = std::max<size_t>(1, grp.fractions.size());
    const double bw = std::min(40.0, gw * 0.8 / bars);
    const double x0 = px0 + g * gw + (gw - bw * bars) / 2;
    for (size_t b = 0; b < grp.fractions.size(); ++b) {
      const double f = std::clamp(grp.fractions[b], 0.0, 1.0);
      const double top = py0 + (py1 - py0) * f;
      s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>", x0 + b * bw,
                       top, bw - 2, py0 - top, c.metric_colors[b % c.metric_colors.size()]);
      if (b < grp.texts.size())
        s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"9\" text-anchor=\"middle\">{}</text>",
                         x0 + b * bw + bw / 2 - 1, top - 3, html_escape(grp.texts[b]));
      s += "\n";
    }
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"middle\">{}</text>\n",
                     px0 + g * gw + gw / 2, py0 + 14 + 12 * (g % 2), html_escape(grp.label));
  }
  s += "</svg>\n";
  return s;
}

}  // namespace lunajit::report
