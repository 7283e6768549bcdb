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

//! "0.313 ms" / "12.4 s": milliseconds with three significant digits.
std::string format_ms(double ms);
//! A metric value formatted by its unit (bytes, ms, or a plain number).
std::string format_value(double value, const std::string& unit);

}  // namespace harness
