#include "core/oom_message.h"

#include <cmath>
#include <regex>
#include <stdexcept>

#include "core/byte_size.h"

namespace harness {
namespace {

// A number and an optional unit as PyTorch and the harness print them.
constexpr const char* kSize = R"(([0-9]+(?:\.[0-9]+)?)\s*(TiB|GiB|MiB|KiB|TB|GB|MB|KB|bytes|byte|B)?)";

std::optional<int64_t> quantity(const std::string& number, const std::string& unit) {
  double value = 0.0;
  try {
    value = std::stod(number);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const auto scale = unit.empty() ? std::optional<double>(1.0) : byte_unit_scale(unit);
  if (!scale || !std::isfinite(value) || value < 0) return std::nullopt;
  const double bytes = std::round(value * *scale);
  if (!(bytes < 9223372036854775808.0)) return std::nullopt;
  return static_cast<int64_t>(bytes);
}

std::optional<int64_t> search_quantity(const std::string& text, const std::string& before, const std::string& after) {
  const std::regex pattern(before + kSize + after, std::regex::icase);
  std::smatch match;
  if (!std::regex_search(text, match, pattern)) return std::nullopt;
  return quantity(match[1].str(), match[2].str());
}

}  // namespace

std::optional<int64_t> allocator_requested_bytes(const std::string& text) {
  return search_quantity(text, R"(tried to allocate\s+)", "");
}

std::optional<OomMessage> parse_oom_message(const std::string& text) {
  OomMessage message;
  std::optional<int64_t> requested = allocator_requested_bytes(text);
  if (!requested) requested = search_quantity(text, R"(requested(?:_bytes)?\s*[=:]?\s*)", "");
  if (!requested) {
    // A bare size: "15.09 GiB", "17179869184".
    static const std::regex bare(std::string(R"(^\s*)") + kSize + R"(\s*$)", std::regex::icase);
    std::smatch match;
    if (std::regex_match(text, match, bare)) requested = quantity(match[1].str(), match[2].str());
  }
  if (!requested || *requested <= 0) return std::nullopt;
  message.requested_bytes = *requested;
  message.in_use_bytes = search_quantity(text, "", R"(\s+(?:memory\s+)?in use)");
  if (!message.in_use_bytes) message.in_use_bytes = search_quantity(text, "", R"(\s+already allocated)");
  if (!message.in_use_bytes) message.in_use_bytes = search_quantity(text, R"(with\s+)", R"(\s+in use)");
  message.capacity_bytes = search_quantity(text, "", R"(\s+allowed)");
  if (!message.capacity_bytes) message.capacity_bytes = search_quantity(text, R"(total capacity of\s+)", "");
  if (!message.capacity_bytes) message.capacity_bytes = search_quantity(text, R"(--memory-limit\s+)", "");
  message.allocated_bytes = search_quantity(text, "", R"(\s+is allocated by PyTorch)");
  if (text.find("CUDA") != std::string::npos) message.device_kind = "cuda";
  else if (text.find("CPU") != std::string::npos) message.device_kind = "cpu";
  return message;
}

}  // namespace harness
