#include "core/byte_size.h"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

namespace harness {
namespace {

struct ByteUnit {
  std::string_view name;
  double scale;
};

constexpr double kKiB = 1024.0;
constexpr std::array<ByteUnit, 12> kByteUnits = {{
    {"B", 1.0},
    {"byte", 1.0},
    {"bytes", 1.0},
    {"KiB", kKiB},
    {"MiB", kKiB * kKiB},
    {"GiB", kKiB * kKiB * kKiB},
    {"TiB", kKiB * kKiB * kKiB * kKiB},
    {"KB", 1e3},
    {"kB", 1e3},
    {"MB", 1e6},
    {"GB", 1e9},
    {"TB", 1e12},
}};

bool same_name(std::string_view a, std::string_view b, UnitCase unit_case) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto x = static_cast<unsigned char>(a[i]);
    const auto y = static_cast<unsigned char>(b[i]);
    if (unit_case == UnitCase::kExact ? x != y : std::tolower(x) != std::tolower(y)) return false;
  }
  return true;
}

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

}  // namespace

std::optional<double> byte_unit_scale(std::string_view unit, UnitCase unit_case) {
  for (const ByteUnit& known : kByteUnits) {
    if (same_name(known.name, unit, unit_case)) return known.scale;
  }
  return std::nullopt;
}

std::string_view byte_unit_list() { return "B, KiB, MiB, GiB, TiB, KB, MB, GB, TB"; }

std::optional<int64_t> parse_byte_size(std::string_view text, UnitCase unit_case) {
  text = trim(text);
  if (text.empty()) return std::nullopt;
  double number = 0.0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (error != std::errc() || !std::isfinite(number) || number < 0) return std::nullopt;
  const std::string_view unit = trim(text.substr(static_cast<size_t>(end - text.data())));
  double scale = 1.0;
  if (!unit.empty()) {
    const auto known = byte_unit_scale(unit, unit_case);
    if (!known) return std::nullopt;
    scale = *known;
  }
  const double bytes = std::round(number * scale);
  // 2^63 is the first double past INT64_MAX: casting it or anything larger is undefined.
  if (!(bytes < 9223372036854775808.0)) return std::nullopt;
  return static_cast<int64_t>(bytes);
}

std::string format_bytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double scaled = bytes;
  while (std::fabs(scaled) >= kKiB && unit < 4) {
    scaled /= kKiB;
    ++unit;
  }
  char text[64];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%.0f B", scaled);
  } else {
    const int decimals = std::fabs(scaled) < 10 ? 2 : (std::fabs(scaled) < 100 ? 1 : 0);
    std::snprintf(text, sizeof text, "%.*f %s", decimals, scaled, kUnits[unit]);
  }
  return text;
}

std::string format_bytes_as_pytorch(int64_t bytes) {
  static constexpr std::pair<double, const char*> kUnits[] = {
      {kKiB * kKiB * kKiB, "GiB"}, {kKiB * kKiB, "MiB"}, {kKiB, "KiB"}};
  char text[48];
  for (const auto& [unit, name] : kUnits) {
    if (static_cast<double>(bytes) < unit) continue;
    std::snprintf(text, sizeof text, "%.2f %s", static_cast<double>(bytes) / unit, name);
    return text;
  }
  return std::to_string(bytes) + " B";
}

}  // namespace harness
