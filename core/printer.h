#pragma once
// One printer for every command: aligned text tables for people, JSON for machines.

#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/byte_size.h"

namespace harness {

//! A text table: headers and rows of cells, printed with aligned columns.
struct Table {
  std::vector<std::string> headers;
  std::vector<std::vector<std::string>> rows;
  //! Columns to right-align (numbers).
  std::vector<bool> right_align;
};

//! Writes the table with two-space column gaps and a rule under the headers.
void print_table(std::ostream& out, const Table& table);
//! Writes the JSON document, indented, followed by a newline.
void print_json(std::ostream& out, const nlohmann::json& value);

//! The formats of `--format`: a table for people, or the export forms (docs/RUNNING.md, "Exports").
enum class Format { kText, kJson, kCsv, kMarkdown };
//! "text", "json", "csv", "md" as --format takes them; UsageError naming the choices otherwise.
Format parse_format(const std::string& name);
//! CSV (RFC 4180): a header row, then one row per line ending in CRLF; a cell holding a comma, a
//! quote, a CR or LF, or leading or trailing spaces is quoted, its quotes doubled.
void print_csv(std::ostream& out, const Table& table);
//! A Markdown (GFM) table: `|` in a cell escaped, a line break in a cell written as a space.
void print_markdown_table(std::ostream& out, const Table& table);
//! One Markdown table cell: what print_markdown_table writes for `text`.
std::string markdown_cell(const std::string& text);
//! The shortest text that reads back as the same double ("0.1", "1e+20", "nan", "inf").
std::string format_exact(double value);

//! "0.313 ms" / "12.4 s": milliseconds with three significant digits.
std::string format_ms(double ms);
//! A metric value formatted by its unit (bytes, ms, or a plain number).
std::string format_value(double value, const std::string& unit);

}  // namespace harness
