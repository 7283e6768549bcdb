#pragma once
// The HTML pieces of `harness site`: escaping of db text (every string from the db is untrusted),
// tables, the page frame with its navigation, JSON safe inside a script, and the site's static
// stylesheet and script.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/printer.h"

namespace harness::analysis::site {

//! Text for HTML content or a quoted attribute: &, <, >, " and ' escaped.
std::string h(const std::string& text);

//! A link: <a href="href">escaped text</a>; `href` is the site's own relative path (no db text in it).
std::string link(const std::string& href, const std::string& text);

//! A table whose cells are text (escaped here); numeric columns right-aligned as `table.right_align` says.
std::string table_html(const Table& table, const std::string& css_class = "");

//! A table whose cells are already HTML (each built with h() and link()).
std::string table_html_raw(const std::vector<std::string>& headers, const std::vector<std::vector<std::string>>& rows,
                           const std::vector<bool>& right_align = {}, const std::string& css_class = "");

//! Lines of text in a <pre> block, escaped.
std::string pre(const std::string& text, const std::string& css_class = "");

//! JSON text that can stand inside a <script> element or a .js file: <, >, & and the line
//! separators U+2028/U+2029 written as \u escapes (still the same JSON value).
std::string script_json(const nlohmann::json& value);

//! A page: `root` is the relative path from the page to the site's top ("", "../", "../../").
//! `nav` names the section of the navigation bar that is current ("runs", "experiments", ...).
std::string page(const std::string& title, const std::string& root, const std::string& nav, const std::string& body,
                 const std::string& scripts = "");

//! The stylesheet every page links (site.css).
const char* site_css();
//! The index's script (site.js): filters and pages over the runs of runs.js, DOM built with
//! textContent only.
const char* site_js();

//! A file-name part for untrusted text: itself when it is 1-64 of [a-z0-9_-] and not only
//! dashes, else "x-" and 16 hex digits of its sha256 (a stable name that cannot leave the folder).
std::string slug(const std::string& text);

//! Colour of a verdict in the strips: the same verdict always gets the same colour.
std::string verdict_color(const std::string& verdict);

}  // namespace harness::analysis::site
