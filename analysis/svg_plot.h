#pragma once
// Small SVG charts for writeups: numeric or categorical x, lines and markers, whiskers for
// spreads and intervals, linear or log axes with readable ticks (bytes in KiB/MiB/GiB), a legend.
// Self-contained SVG 1.1 text, so the same string is embedded in HTML and written as a file.

#include <optional>
#include <string>
#include <vector>

namespace harness::analysis {

//! Axis scale; kAuto is log when every value is positive and they span a decade or more.
enum class Scale { kAuto, kLinear, kLog };

//! Marker drawn at each point. The hollow circle (a ring, wider than the dot) marks predictions: a
//! measured dot inside its ring is a prediction that held.
enum class Marker { kCircle, kHollowCircle, kCross };

//! One point; `low`/`high` draw a whisker (min–max spread or a confidence interval).
struct PlotPoint {
  double x = 0.0;
  double y = 0.0;
  std::optional<double> low;
  std::optional<double> high;
};

//! A named set of points drawn in one colour.
struct PlotSeries {
  std::string label;
  std::vector<PlotPoint> points;
  int color = 0;         //!< index into the palette (series_color)
  bool line = true;      //!< join the points (numeric x only)
  bool dashed = false;   //!< dashed line (predictions)
  Marker marker = Marker::kCircle;
};

//! A chart. With `categories`, x of each point is the index of its category.
struct Plot {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::string x_unit;  //!< "bytes", "ms" or "": how tick labels are written
  std::string y_unit;
  std::vector<std::string> categories;
  std::vector<double> x_ticks;  //!< explicit numeric x ticks (e.g. the swept values); empty: automatic
  Scale x_scale = Scale::kAuto;
  Scale y_scale = Scale::kAuto;
  std::vector<PlotSeries> series;
};

//! The chart as a standalone SVG document.
std::string render_svg(const Plot& plot);

//! Colour `index` of the palette ("#1f77b4", ...), cycling.
std::string series_color(int index);

//! Text with &, <, >, " and ' escaped for XML and HTML.
std::string xml_escape(const std::string& text);

//! A compact axis label for a value: "256 MiB", "1.5 GiB" for bytes, "0.25" otherwise.
std::string tick_label(double value, const std::string& unit);

}  // namespace harness::analysis
