#include "core/package_versions.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <limits>
#include <regex>
#include <sstream>

#include "core/errors.h"

namespace harness {
namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

long number_or_zero(const std::string& digits) { return digits.empty() ? 0 : std::stol(digits); }

int compare_release(const std::vector<long>& a, const std::vector<long>& b) {
  const size_t size = std::max(a.size(), b.size());
  for (size_t i = 0; i < size; ++i) {
    const long left = i < a.size() ? a[i] : 0, right = i < b.size() ? b[i] : 0;
    if (left != right) return left < right ? -1 : 1;
  }
  return 0;
}

template <typename T>
int three_way(const T& a, const T& b) {
  return a < b ? -1 : (b < a ? 1 : 0);
}

// A distribution's version from an archive's file name, or "" when the file is not one of `package`'s.
std::string version_of_file(const std::string& file_name, const std::string& package) {
  std::string stem;
  if (file_name.ends_with(".whl")) {
    // {distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl: the distribution has no '-'.
    stem = file_name.substr(0, file_name.size() - 4);
    const auto dash = stem.find('-');
    if (dash == std::string::npos) return "";
    const auto next = stem.find('-', dash + 1);
    if (next == std::string::npos) return "";
    if (normalize_package_name(stem.substr(0, dash)) != package) return "";
    return stem.substr(dash + 1, next - dash - 1);
  }
  for (const char* suffix : {".tar.gz", ".zip"}) {
    if (file_name.ends_with(suffix)) stem = file_name.substr(0, file_name.size() - std::string(suffix).size());
  }
  if (stem.empty()) return "";
  const auto dash = stem.rfind('-');  // {name}-{version}: old sdists keep '-' in the name
  if (dash == std::string::npos || normalize_package_name(stem.substr(0, dash)) != package) return "";
  return stem.substr(dash + 1);
}

}  // namespace

std::optional<PackageVersion> parse_version(const std::string& text) {
  // PEP 440's grammar (appendix B), with its spellings of pre/post/dev separators.
  static const std::regex pattern(
      R"(^\s*v?(?:([0-9]+)!)?([0-9]+(?:\.[0-9]+)*))"
      R"((?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?([0-9]*))?)"
      R"((?:-([0-9]+)|[-_.]?(post|rev|r)[-_.]?([0-9]*))?)"
      R"((?:[-_.]?(dev)[-_.]?([0-9]*))?)"
      R"((?:\+([a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$)",
      std::regex::icase);
  std::smatch match;
  if (!std::regex_match(text, match, pattern)) return std::nullopt;
  PackageVersion version;
  version.text = text;
  version.epoch = static_cast<int>(number_or_zero(match[1].str()));
  std::istringstream parts(match[2].str());
  std::string part;
  while (std::getline(parts, part, '.')) version.release.push_back(std::stol(part));
  if (match[3].matched) {
    const std::string kind = lower(match[3].str());
    version.pre_kind = kind == "a" || kind == "alpha" ? 0 : kind == "b" || kind == "beta" ? 1 : 2;
    version.pre_number = number_or_zero(match[4].str());
  }
  if (match[5].matched) version.post = std::stol(match[5].str());
  if (match[6].matched) version.post = number_or_zero(match[7].str());
  if (match[8].matched) version.dev = number_or_zero(match[9].str());
  if (match[10].matched) version.local = lower(match[10].str());
  return version;
}

int compare_versions(const PackageVersion& a, const PackageVersion& b) {
  if (a.epoch != b.epoch) return three_way(a.epoch, b.epoch);
  if (const int release = compare_release(a.release, b.release)) return release;
  // A dev release without a pre or post part sorts before the pre-releases of its release.
  auto pre_key = [](const PackageVersion& v) {
    if (v.pre_kind == 3 && v.post < 0 && v.dev >= 0) return std::pair<int, long>{-1, 0};
    return std::pair<int, long>{v.pre_kind, v.pre_number};
  };
  if (const int pre = three_way(pre_key(a), pre_key(b))) return pre;
  if (const int post = three_way(a.post, b.post)) return post;
  // Not a dev release sorts after every dev release of the same version.
  auto dev_key = [](const PackageVersion& v) { return v.dev < 0 ? std::numeric_limits<long>::max() : v.dev; };
  return three_way(dev_key(a), dev_key(b));
}

std::string normalize_package_name(const std::string& name) {
  std::string normalized;
  for (const char c : name) {
    if (c == '-' || c == '_' || c == '.') {
      if (normalized.empty() || normalized.back() != '-') normalized += '-';
    } else {
      normalized += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  return normalized;
}

std::vector<std::string> versions_in_folder(const std::string& folder, const std::string& package) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::directory_iterator entries(folder, error);
  if (error) throw UsageError("--find-links " + folder + ": cannot read the folder (" + error.message() + ")");
  const std::string wanted = normalize_package_name(package);
  std::vector<std::string> versions;
  for (const auto& entry : entries) {
    const std::string version = version_of_file(entry.path().filename().string(), wanted);
    if (!version.empty() && parse_version(version)) versions.push_back(version);
  }
  return sort_versions(versions, "--find-links " + folder);
}

std::vector<std::string> parse_pip_index_versions(const std::string& output) {
  std::istringstream lines(output);
  std::string line;
  const std::string marker = "Available versions:";
  while (std::getline(lines, line)) {
    const auto at = line.find(marker);
    if (at == std::string::npos) continue;
    std::vector<std::string> versions;
    std::istringstream list(line.substr(at + marker.size()));
    std::string item;
    while (std::getline(list, item, ',')) {
      const auto begin = item.find_first_not_of(" \t\r");
      const auto end = item.find_last_not_of(" \t\r");
      if (begin != std::string::npos) versions.push_back(item.substr(begin, end - begin + 1));
    }
    return versions;
  }
  return {};
}

std::vector<std::string> sort_versions(const std::vector<std::string>& versions, const std::string& what) {
  std::vector<PackageVersion> parsed;
  for (const auto& text : versions) {
    auto version = parse_version(text);
    if (!version) throw UsageError(what + ": '" + text + "' is not a version (PEP 440: 2.5.1, 3.0.0rc1, 2.6.0.post1)");
    parsed.push_back(std::move(*version));
  }
  std::stable_sort(parsed.begin(), parsed.end(),
                   [](const PackageVersion& a, const PackageVersion& b) { return compare_versions(a, b) < 0; });
  std::vector<std::string> sorted;
  for (size_t i = 0; i < parsed.size(); ++i) {
    if (i > 0 && compare_versions(parsed[i - 1], parsed[i]) == 0) continue;
    sorted.push_back(parsed[i].text);
  }
  return sorted;
}

std::vector<std::string> versions_between(const std::vector<std::string>& available, const std::string& good,
                                          const std::string& bad, bool keep_prereleases, const std::string& source) {
  const auto good_version = parse_version(good), bad_version = parse_version(bad);
  if (!good_version) throw UsageError("--good '" + good + "' is not a version (PEP 440: 2.5.1, 3.0.0rc1)");
  if (!bad_version) throw UsageError("--bad '" + bad + "' is not a version (PEP 440: 2.5.1, 3.0.0rc1)");
  if (compare_versions(*good_version, *bad_version) == 0)
    throw UsageError("--good " + good + " and --bad " + bad + " are the same version: nothing to bisect");
  const bool upwards = compare_versions(*good_version, *bad_version) < 0;
  const auto& low = upwards ? *good_version : *bad_version;
  const auto& high = upwards ? *bad_version : *good_version;
  std::vector<std::string> between;
  bool has_good = false, has_bad = false;
  for (const auto& text : sort_versions(available, source)) {
    const auto version = *parse_version(text);
    if (compare_versions(version, low) < 0 || compare_versions(version, high) > 0) continue;
    const bool is_good = compare_versions(version, *good_version) == 0;
    const bool is_bad = compare_versions(version, *bad_version) == 0;
    has_good = has_good || is_good;
    has_bad = has_bad || is_bad;
    if (!is_good && !is_bad && version.is_prerelease() && !keep_prereleases) continue;
    between.push_back(is_good ? good : is_bad ? bad : text);
  }
  auto listing = [&] {
    std::string text;
    for (const auto& v : sort_versions(available, source)) text += (text.empty() ? "" : ", ") + v;
    return text.empty() ? std::string("none") : text;
  };
  if (!has_good) throw UsageError("--good " + good + ": not among the versions of " + source + " (" + listing() + ")");
  if (!has_bad) throw UsageError("--bad " + bad + ": not among the versions of " + source + " (" + listing() + ")");
  if (!upwards) std::reverse(between.begin(), between.end());
  return between;
}

}  // namespace harness
