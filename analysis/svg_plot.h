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
  PlotPoint() = default;
  PlotPoint(double x_value, double y_value, std::optional<double> low_value = std::nullopt,
            std::optional<double> high_value = std::nullopt)
      : x(x_value), y(y_value), low(low_value), high(high_value) {}

  double x = 0.0;
  double y = 0.0;
  std::optional<double> low;
  std::optional<double> high;
  //! Hover text (an SVG <title>); with it the marker is a `<g class="point" data-y="..." data-key="...">`
  //! whose data-y is y exactly, so a page can be checked against the numbers it plots.
  std::string tip;
  std::string key;  //!< data-key: what the point is (the site writes "run|variant|point")
};

//! A named set of points drawn in one colour.
struct PlotSeries {
  std::string label;
  std::vector<PlotPoint> points;
  int color = 0;         //!< index into the palette (series_color)
  bool line = true;      //!< join the points (numeric x only)
  bool dashed = false;   //!< dashed line (predictions)
  Marker marker = Marker::kCircle;
  //! The points' low..high drawn as a shaded band joining them (numeric x, or categories in
  //! order) instead of a whisker per point: the noise of a metric over a history.
  bool band = false;
};

//! A dashed vertical line across the plot at x (an env change in a history), labelled at its top.
struct PlotMark {
  double x = 0.0;
  std::string label;  //!< a few characters; the line's hover text says more
  std::string tip;
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
  std::vector<PlotMark> x_marks;
  //! Categorical charts set the series of one category side by side; false draws them at the
  //! category itself (a history, where a marker series rings points of another).
  bool dodge = true;
};

//! The chart as a standalone SVG document. With many categories only every n-th is labelled
//! (at most 8 labels). The y axis's mapping is written on an empty `<g class="axis-y">` (data-low,
//! data-high, data-log, data-pixel-low, data-pixel-high) for checks of where points were drawn.
std::string render_svg(const Plot& plot);

//! Colour `index` of the palette ("#1f77b4", ...), cycling.
std::string series_color(int index);

//! Text with &, <, >, " and ' escaped for XML and HTML.
std::string xml_escape(const std::string& text);

//! A compact axis label for a value: "256 MiB", "1.5 GiB" for bytes, "0.25" otherwise.
std::string tick_label(double value, const std::string& unit);

}  // namespace harness::analysis
