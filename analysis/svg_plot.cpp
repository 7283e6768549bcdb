#include "analysis/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "core/printer.h"

namespace harness::analysis {
namespace {

// Layout in SVG pixels. 720×420 reads well embedded in a page of 900 px and on its own.
constexpr double kWidth = 720.0;
constexpr double kHeight = 420.0;
constexpr double kLeft = 84.0;     // room for y tick labels such as "256 MiB"
constexpr double kTop = 44.0;      // title
constexpr double kBottom = 58.0;   // x tick labels and the x label
constexpr double kCharWidth = 6.6; // average width of a 12 px sans-serif character
constexpr int kMaxTicks = 8;
constexpr size_t kMaxCategoryLabels = 8;

// Tableau 10: distinguishable, and still apart for the common colour-vision deficiencies.
const char* const kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

struct Axis {
  bool log = false;
  double low = 0.0, high = 1.0;  // domain (values, not logs)
  std::vector<double> ticks;
  double pixel_low = 0.0, pixel_high = 1.0;

  double to_pixel(double value) const {
    const double t = log ? (std::log10(value) - std::log10(low)) / (std::log10(high) - std::log10(low))
                         : (value - low) / (high - low);
    return pixel_low + t * (pixel_high - pixel_low);
  }
};

std::string num(double value) { return fmt::format("{:.1f}", value); }

double nice_step(double rough) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(rough)));
  for (double factor : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (factor * magnitude >= rough) return factor * magnitude;
  return 10.0 * magnitude;
}

void linear_axis(Axis& axis, double low, double high, bool include_zero) {
  if (include_zero) low = std::min(low, 0.0);
  if (high <= low) {  // a single value: give it room on both sides (or above zero)
    const double pad = high == 0.0 ? 1.0 : std::fabs(high) * 0.5;
    high += pad;
    if (!include_zero) low -= pad;
  }
  const double step = nice_step((high - low) / 5.0);
  axis.low = std::floor(low / step + 1e-9) * step;
  axis.high = std::ceil(high / step - 1e-9) * step;
  for (double v = axis.low; v <= axis.high + step * 1e-6; v += step) axis.ticks.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
}

void log_axis(Axis& axis, double low, double high, bool binary) {
  axis.log = true;
  if (high <= low) {
    low /= 2.0;
    high *= 2.0;
  }
  if (binary) {
    // Powers of two, every `step` doublings: 1 MiB, 4 MiB, 16 MiB ... read better for bytes
    // than powers of ten.
    const double e_low = std::floor(std::log2(low)), e_high = std::ceil(std::log2(high));
    for (int step : {1, 2, 5, 10, 20}) {
      const double first = std::floor(e_low / step) * step, last = std::ceil(e_high / step) * step;
      if ((last - first) / step + 1 <= kMaxTicks || step == 20) {
        axis.low = std::exp2(first);
        axis.high = std::exp2(last);
        for (double e = first; e <= last; e += step) axis.ticks.push_back(std::exp2(e));
        return;
      }
    }
  }
  const double e_low = std::floor(std::log10(low)), e_high = std::ceil(std::log10(high));
  axis.low = std::pow(10.0, e_low);
  axis.high = std::pow(10.0, e_high);
  const int stride = static_cast<int>(std::ceil((e_high - e_low + 1) / kMaxTicks));
  for (double e = e_low; e <= e_high; e += stride) {
    axis.ticks.push_back(std::pow(10.0, e));
    if (e_high - e_low <= 2 && e < e_high)
      for (double factor : {2.0, 5.0}) axis.ticks.push_back(factor * std::pow(10.0, e));
  }
  std::sort(axis.ticks.begin(), axis.ticks.end());
}

bool choose_log(Scale scale, double low, double high) {
  if (scale == Scale::kLog) return low > 0.0;
  if (scale == Scale::kLinear) return false;
  return low > 0.0 && high / low >= 10.0;
}

std::string trim_number(double value, int significant) { return fmt::format("{:.{}g}", value, significant); }

// Cuts at a character boundary, so a label with "·" or "–" stays valid UTF-8 (and the SVG valid XML).
std::string truncate(const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t cut = max_bytes - 1;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) + "…";
}

// A marker centred at (x, y); `radius` is the dot's (a ring is 1.5 times wider, a cross spans 1.5 radii).
std::string marker_svg(Marker marker, double x, double y, const std::string& color, double radius) {
  switch (marker) {
    case Marker::kCircle:
      return fmt::format(R"(<circle cx="{}" cy="{}" r="{}" fill="{}"/>)", num(x), num(y), num(radius), color) + "\n";
    case Marker::kHollowCircle:
      return fmt::format(R"(<circle cx="{}" cy="{}" r="{}" fill="none" stroke="{}" stroke-width="1.5"/>)", num(x), num(y),
                         num(1.5 * radius), color) + "\n";
    case Marker::kCross: {
      const double h = 1.5 * radius;
      return fmt::format(R"(<path d="M{0},{1} L{2},{3} M{0},{3} L{2},{1}" stroke="{4}" stroke-width="2.5"/>)", num(x - h),
                         num(y - h), num(x + h), num(y + h), color) + "\n";
    }
  }
  return "";
}

}  // namespace

std::string series_color(int index) {
  const int count = static_cast<int>(sizeof kPalette / sizeof kPalette[0]);
  return kPalette[((index % count) + count) % count];
}

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string tick_label(double value, const std::string& unit) {
  if (unit == "bytes") {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int index = 0;
    double scaled = value;
    while (std::fabs(scaled) >= 1024.0 && index < 5) {
      scaled /= 1024.0;
      ++index;
    }
    return trim_number(scaled, 3) + " " + units[index];
  }
  if (value != 0.0 && (std::fabs(value) >= 1e5 || std::fabs(value) < 1e-3)) return fmt::format("{:.2g}", value);
  return trim_number(value, 4);
}

std::string render_svg(const Plot& plot) {
  const bool categorical = !plot.categories.empty();
  // Extents of the data (whiskers included).
  double x_min = std::numeric_limits<double>::infinity(), x_max = -x_min, y_min = x_min, y_max = -x_min;
  double y_min_positive = x_min, x_min_positive = x_min;
  bool any = false;
  for (const auto& s : plot.series) {
    for (const auto& p : s.points) {
      if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
      any = true;
      x_min = std::min(x_min, p.x);
      x_max = std::max(x_max, p.x);
      if (p.x > 0) x_min_positive = std::min(x_min_positive, p.x);
      for (const auto& v : {std::optional<double>(p.y), p.low, p.high}) {
        if (!v || !std::isfinite(*v)) continue;
        y_min = std::min(y_min, *v);
        y_max = std::max(y_max, *v);
        if (*v > 0) y_min_positive = std::min(y_min_positive, *v);
      }
    }
  }

  size_t legend_chars = 0;
  for (const auto& s : plot.series) legend_chars = std::max(legend_chars, std::min<size_t>(s.label.size(), 34));
  const double legend_width = plot.series.empty() ? 0.0 : 36.0 + kCharWidth * static_cast<double>(legend_chars);
  const double plot_right = kWidth - 16.0 - legend_width;

  Axis x_axis, y_axis;
  x_axis.pixel_low = kLeft;
  x_axis.pixel_high = plot_right;
  y_axis.pixel_low = kHeight - kBottom;
  y_axis.pixel_high = kTop;
  if (any) {
    const bool y_log = choose_log(plot.y_scale, y_min, y_max) && y_min > 0.0;
    if (y_log) {
      log_axis(y_axis, y_min_positive, y_max, plot.y_unit == "bytes");
    } else {
      linear_axis(y_axis, y_min, y_max, y_min >= 0.0);
    }
    if (categorical) {
      x_axis.low = -0.5;
      x_axis.high = static_cast<double>(plot.categories.size()) - 0.5;
      for (size_t i = 0; i < plot.categories.size(); ++i) x_axis.ticks.push_back(static_cast<double>(i));
    } else {
      const bool x_log = choose_log(plot.x_scale, x_min, x_max) && x_min > 0.0;
      if (x_log) {
        log_axis(x_axis, x_min_positive, x_max, plot.x_unit == "bytes");
      } else {
        linear_axis(x_axis, x_min, x_max, false);
      }
      if (!plot.x_ticks.empty()) {
        // The swept values themselves, with a margin so end points do not sit on the frame.
        x_axis.ticks = plot.x_ticks;
        if (x_axis.log) {
          x_axis.low = x_min_positive / 1.25;
          x_axis.high = x_max * 1.25;
        } else {
          const double pad = x_max > x_min ? 0.06 * (x_max - x_min) : std::max(1.0, std::fabs(x_min) * 0.1);
          x_axis.low = x_min - pad;
          x_axis.high = x_max + pad;
        }
      }
    }
  }

  std::ostringstream svg;
  svg << fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" )"
                     R"(font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">)",
                     kWidth, kHeight)
      << '\n';
  svg << R"(<rect x="0" y="0" width=")" << kWidth << R"(" height=")" << kHeight << R"(" fill="#ffffff"/>)" << '\n';
  svg << fmt::format(R"(<text x="{}" y="24" text-anchor="middle" font-size="14" font-weight="bold">{}</text>)",
                     num((kLeft + plot_right) / 2.0), xml_escape(plot.title))
      << '\n';
  const double bottom = y_axis.pixel_low, top = y_axis.pixel_high;
  if (!any) {
    svg << fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#333333"/>)", num(kLeft),
                       num(top), num(plot_right - kLeft), num(bottom - top))
        << '\n';
    svg << fmt::format(R"(<text x="{}" y="{}" text-anchor="middle" fill="#666666">no data</text>)",
                       num((kLeft + plot_right) / 2.0), num((top + bottom) / 2.0))
        << "\n</svg>\n";
    return svg.str();
  }

  svg << fmt::format(R"(<g class="axis-y" data-low="{}" data-high="{}" data-log="{}" data-pixel-low="{}" data-pixel-high="{}"/>)",
                     format_exact(y_axis.low), format_exact(y_axis.high), y_axis.log ? 1 : 0, format_exact(y_axis.pixel_low),
                     format_exact(y_axis.pixel_high))
      << '\n';
  // Grid and y ticks.
  for (double tick : y_axis.ticks) {
    if (tick < y_axis.low * (1 - 1e-9) - 1e-12 || tick > y_axis.high * (1 + 1e-9) + 1e-12) continue;
    const double y = y_axis.to_pixel(tick);
    svg << fmt::format(R"(<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="#e6e6e6"/>)", num(kLeft), num(y),
                       num(plot_right))
        << '\n';
    svg << fmt::format(R"(<text x="{}" y="{}" text-anchor="end">{}</text>)", num(kLeft - 6), num(y + 4),
                       xml_escape(tick_label(tick, plot.y_unit)))
        << '\n';
  }
  // x ticks; of many categories every `stride`-th is labelled, the last one always.
  const size_t stride = categorical ? (plot.categories.size() + kMaxCategoryLabels - 1) / kMaxCategoryLabels : 1;
  for (size_t i = 0; i < x_axis.ticks.size(); ++i) {
    const double tick = x_axis.ticks[i];
    if (tick < x_axis.low || tick > x_axis.high) continue;
    if (stride > 1 && i % stride != 0 && i + 1 != x_axis.ticks.size()) continue;
    const double x = x_axis.to_pixel(tick);
    const std::string label = categorical ? truncate(plot.categories[i], 22) : tick_label(tick, plot.x_unit);
    svg << fmt::format(R"(<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="#333333"/>)", num(x), num(bottom),
                       num(bottom + 5))
        << '\n';
    svg << fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">{}</text>)", num(x), num(bottom + 19),
                       xml_escape(label))
        << '\n';
  }
  // Frame: the axes.
  svg << fmt::format(R"(<polyline points="{0},{1} {0},{2} {3},{2}" fill="none" stroke="#333333"/>)", num(kLeft),
                     num(top), num(bottom), num(plot_right))
      << '\n';
  svg << fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">{}</text>)", num((kLeft + plot_right) / 2.0),
                     num(kHeight - 12), xml_escape(plot.x_label + (x_axis.log ? " (log scale)" : "")))
      << '\n';
  svg << fmt::format(R"svg(<text x="18" y="{0}" text-anchor="middle" transform="rotate(-90 18 {0})">{1}</text>)svg",
                     num((top + bottom) / 2.0), xml_escape(plot.y_label + (y_axis.log ? " (log scale)" : "")))
      << '\n';

  // Marks: behind the series, above the grid.
  for (const auto& mark : plot.x_marks) {
    if (!std::isfinite(mark.x) || mark.x < x_axis.low || mark.x > x_axis.high || (x_axis.log && mark.x <= 0)) continue;
    const double x = x_axis.to_pixel(mark.x);
    svg << fmt::format(R"(<g class="mark"><title>{0}</title><line x1="{1}" y1="{2}" x2="{1}" y2="{3}" stroke="#888888" )"
                       R"(stroke-width="1.5" stroke-dasharray="4 3"/><text x="{4}" y="{5}" font-size="10" fill="#555555">{6}</text></g>)",
                       xml_escape(mark.tip.empty() ? mark.label : mark.tip), num(x), num(top), num(bottom), num(x + 3),
                       num(top + 10), xml_escape(truncate(mark.label, 16)))
        << '\n';
  }

  // Series. Categorical charts spread the series of one category side by side.
  const double series_count = static_cast<double>(plot.series.size());
  const double dodge = categorical && plot.dodge ? std::min(0.6 / std::max(1.0, series_count), 0.18) : 0.0;
  auto drawable = [&](double x, double y) {
    return std::isfinite(x) && std::isfinite(y) && (!x_axis.log || x > 0) && (!y_axis.log || y > 0);
  };
  for (size_t index = 0; index < plot.series.size(); ++index) {
    const auto& s = plot.series[index];
    const std::string color = series_color(s.color);
    const double offset = (static_cast<double>(index) - (series_count - 1.0) / 2.0) * dodge;
    std::vector<PlotPoint> points;
    for (const auto& p : s.points)
      if (drawable(p.x, p.y)) points.push_back(p);
    std::sort(points.begin(), points.end(), [](const auto& a, const auto& b) { return a.x < b.x; });
    svg << "<g>\n";
    if (s.band) {
      // The band: along the highs left to right, back along the lows.
      std::string forward, backward;
      for (const auto& p : points) {
        if (!p.low || !p.high || !drawable(p.x, *p.low) || !drawable(p.x, *p.high)) continue;
        const double x = x_axis.to_pixel(p.x + offset);
        forward += num(x) + "," + num(y_axis.to_pixel(*p.high)) + " ";
        backward = num(x) + "," + num(y_axis.to_pixel(*p.low)) + " " + backward;
      }
      if (!forward.empty())
        svg << fmt::format(R"(<polygon class="band" points="{}" fill="{}" fill-opacity="0.18" stroke="none"/>)",
                           forward + backward.substr(0, backward.size() - 1), color)
            << '\n';
    }
    if (s.line && (!categorical || s.band) && points.size() > 1) {
      std::string coordinates;
      for (const auto& p : points)
        coordinates += num(x_axis.to_pixel(p.x + offset)) + "," + num(y_axis.to_pixel(p.y)) + " ";
      coordinates.pop_back();
      svg << fmt::format(R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{}/>)", coordinates, color,
                         s.dashed ? R"( stroke-dasharray="6 4")" : "")
          << '\n';
    }
    for (const auto& p : points) {
      const double x = x_axis.to_pixel(p.x + offset), y = y_axis.to_pixel(p.y);
      if (!p.tip.empty())
        svg << fmt::format(R"(<g class="point" data-y="{}" data-key="{}"><title>{}</title>)", format_exact(p.y),
                           xml_escape(p.key), xml_escape(p.tip));
      if (!s.band && p.low && p.high && drawable(p.x, *p.low) && drawable(p.x, *p.high) && *p.high > *p.low) {
        const double y_low = y_axis.to_pixel(*p.low), y_high = y_axis.to_pixel(*p.high);
        svg << fmt::format(R"(<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="{3}" stroke-width="1.5"/>)", num(x),
                           num(y_low), num(y_high), color)
            << '\n';
        for (double cap : {y_low, y_high})
          svg << fmt::format(R"(<line x1="{0}" y1="{2}" x2="{1}" y2="{2}" stroke="{3}" stroke-width="1.5"/>)",
                             num(x - 4), num(x + 4), num(cap), color)
              << '\n';
      }
      svg << marker_svg(s.marker, x, y, color, s.band ? 3.0 : 4.0);
      if (!p.tip.empty()) svg << "</g>\n";
    }
    svg << "</g>\n";
  }

  // Legend, right of the plot.
  double legend_y = top + 8.0;
  const double legend_x = plot_right + 14.0;
  for (const auto& s : plot.series) {
    const std::string color = series_color(s.color);
    if (s.line && (!categorical || s.band)) {
      svg << fmt::format(R"(<line x1="{0}" y1="{2}" x2="{1}" y2="{2}" stroke="{3}" stroke-width="2"{4}/>)",
                         num(legend_x), num(legend_x + 22), num(legend_y), color,
                         s.dashed ? R"( stroke-dasharray="6 4")" : "")
          << '\n';
    }
    svg << marker_svg(s.marker, legend_x + 11.0, legend_y, color, 4.0);
    svg << fmt::format(R"(<text x="{}" y="{}">{}</text>)", num(legend_x + 28), num(legend_y + 4),
                       xml_escape(truncate(s.label, 34)))
        << '\n';
    legend_y += 20.0;
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace harness::analysis
