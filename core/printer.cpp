#include "core/printer.h"

#include <algorithm>
#include <cmath>
#include <ostream>

#include <fmt/format.h>

#include "core/errors.h"

namespace harness {

void print_table(std::ostream& out, const Table& table) {
  const size_t columns = table.headers.size();
  std::vector<size_t> width(columns, 0);
  for (size_t c = 0; c < columns; ++c) width[c] = table.headers[c].size();
  for (const auto& row : table.rows)
    for (size_t c = 0; c < std::min(columns, row.size()); ++c) width[c] = std::max(width[c], row[c].size());

  auto emit = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < columns; ++c) {
      const std::string cell = c < cells.size() ? cells[c] : "";
      const bool right = c < table.right_align.size() && table.right_align[c];
      const std::string pad(width[c] - std::min(width[c], cell.size()), ' ');
      line += right ? pad + cell : cell + (c + 1 < columns ? pad : "");
      if (c + 1 < columns) line += "  ";
    }
    out << line << '\n';
  };
  emit(table.headers);
  std::vector<std::string> rule;
  for (size_t c = 0; c < columns; ++c) rule.emplace_back(width[c], '-');
  emit(rule);
  for (const auto& row : table.rows) emit(row);
}

void print_json(std::ostream& out, const nlohmann::json& value) { out << value.dump(2) << '\n'; }

Format parse_format(const std::string& name) {
  if (name == "text") return Format::kText;
  if (name == "json") return Format::kJson;
  if (name == "csv") return Format::kCsv;
  if (name == "md") return Format::kMarkdown;
  throw UsageError("--format " + name + ": expected text, json, csv or md");
}

namespace {

std::string csv_cell(const std::string& text) {
  const bool quote = text.find_first_of(",\"\r\n") != std::string::npos ||
                     (!text.empty() && (text.front() == ' ' || text.back() == ' '));
  if (!quote) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

void print_csv(std::ostream& out, const Table& table) {
  auto emit = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < table.headers.size(); ++c) {
      if (c) out << ',';
      out << csv_cell(c < cells.size() ? cells[c] : "");
    }
    out << "\r\n";
  };
  emit(table.headers);
  for (const auto& row : table.rows) emit(row);
}

std::string markdown_cell(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '|') out += "\\|";
    else if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') continue;
    else if (c == '\n' || c == '\r') out += ' ';
    else out += c;
  }
  return out.empty() ? " " : out;
}

void print_markdown_table(std::ostream& out, const Table& table) {
  out << '|';
  for (const auto& header : table.headers) out << ' ' << markdown_cell(header) << " |";
  out << "\n|";
  for (size_t c = 0; c < table.headers.size(); ++c)
    out << (c < table.right_align.size() && table.right_align[c] ? " ---: |" : " --- |");
  out << '\n';
  for (const auto& row : table.rows) {
    out << '|';
    for (size_t c = 0; c < table.headers.size(); ++c) out << ' ' << markdown_cell(c < row.size() ? row[c] : "") << " |";
    out << '\n';
  }
}

std::string format_exact(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return fmt::format("{}", value);
}

std::string format_ms(double ms) {
  if (ms >= 10000.0) return fmt::format("{:.1f} s", ms / 1000.0);
  if (ms >= 100.0) return fmt::format("{:.0f} ms", ms);
  if (ms >= 10.0) return fmt::format("{:.1f} ms", ms);
  return fmt::format("{:.3f} ms", ms);
}

std::string format_value(double value, const std::string& unit) {
  if (unit == "bytes") return format_bytes(value);
  if (unit == "ms") return format_ms(value);
  if (std::isnan(value)) return "nan";
  if (value == std::floor(value) && std::fabs(value) < 1e15) return fmt::format("{:.0f}", value);
  return fmt::format("{:.4g}", value);
}

}  // namespace harness
