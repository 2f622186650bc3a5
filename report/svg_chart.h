// Inline SVG charts for the HTML report: a line chart (log-scaled axes where
// the data spans a wide range, or a log-2 sequence axis) and a grouped bar chart of fractions of a limit.
// Written by hand: the charts must be inline, static SVG (no script, no
// external file) and there is no C++ library in the project's dependencies
// that draws them.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lunajit::report {

struct ChartSeries {
  std::string name;
  std::string color;  // "#1f77b4"
  bool dashed = false;
  std::vector<std::pair<double, double>> points;  // (x, y), any order
  std::string dash;  // an SVG stroke-dasharray ("2 3") instead of dashed's "6 4"
};

// A vertical line at x across the plot, labelled (the summary's crossover).
struct ChartMarker {
  double x = 0;
  std::string label;
  std::string color;
};

struct LineChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<ChartSeries> series;
  std::optional<double> y_max;   // fixed top of the y axis (e.g. 1.2 for a fraction)
  std::string note;              // small text under the title
  // Log-2 x axis with a tick at every power of two in range (every second one
  // past 12 ticks), for sequence lengths; else log-10 where x spans >= 20x.
  bool x_log2 = false;
  std::vector<ChartMarker> x_markers;
};

struct BarGroup {
  std::string label;               // one kernel
  std::vector<double> fractions;   // one bar per metric, height = fraction of its limit (clamped to 1)
  std::vector<std::string> texts;  // the value printed above each bar
};

struct BarChart {
  std::string title;
  std::vector<std::string> metric_names;
  std::vector<std::string> metric_colors;
  std::vector<BarGroup> groups;
  std::string note;
};

// An <svg> element of width x height pixels.
std::string svg_line_chart(const LineChart& chart, int width, int height);
std::string svg_bar_chart(const BarChart& chart, int width, int height);

// Escapes &, <, >, " for HTML text and attributes.
std::string html_escape(std::string_view s);

}  // namespace lunajit::report
