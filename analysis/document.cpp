#include "analysis/document.h"

#include <algorithm>
#include <sstream>

#include "analysis/svg_plot.h"
#include "core/printer.h"

namespace harness::analysis {
namespace {

// The longest run of backticks in `text` plus one, so a fence can never be closed by the content.
std::string fence_for(const std::string& text) {
  size_t longest = 0, run = 0;
  for (char c : text) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  return std::string(std::max<size_t>(3, longest + 1), '`');
}

const char* const kStyle = R"css(
body { font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; max-width: 980px; margin: 2em auto; padding: 0 1em;
       color: #1a1a1a; line-height: 1.45; }
h1 { border-bottom: 2px solid #1f77b4; padding-bottom: .2em; }
h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .8em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f4f8; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code { background: #f3f3f3; padding: 0 3px; border-radius: 3px; font-size: 90%; }
pre { background: #f6f8fa; border: 1px solid #e1e4e8; padding: .7em; overflow-x: auto; font-size: 12px; }
figure { margin: 1em 0; }
figcaption { color: #555; font-size: 13px; }
)css";

}  // namespace

std::vector<const Figure*> Document::figures() const {
  std::vector<const Figure*> out;
  for (const auto& block : blocks)
    if (const auto* figure = std::get_if<Figure>(&block)) out.push_back(figure);
  return out;
}

std::string inline_html(const std::string& text) {
  std::string out;
  bool in_code = false, in_bold = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '`') {
      out += in_code ? "</code>" : "<code>";
      in_code = !in_code;
    } else if (!in_code && c == '*' && i + 1 < text.size() && text[i + 1] == '*') {
      out += in_bold ? "</strong>" : "<strong>";
      in_bold = !in_bold;
      ++i;
    } else {
      out += xml_escape(std::string(1, c));
    }
  }
  if (in_code) out += "</code>";
  if (in_bold) out += "</strong>";
  return out;
}

std::string render_markdown(const Document& document, const std::string& figure_prefix) {
  std::ostringstream out;
  out << "# " << document.title << "\n";
  for (const auto& block : document.blocks) {
    out << '\n';
    if (const auto* h = std::get_if<Heading>(&block)) {
      out << std::string(static_cast<size_t>(h->level), '#') << ' ' << h->text << '\n';
    } else if (const auto* p = std::get_if<Paragraph>(&block)) {
      out << p->text << '\n';
    } else if (const auto* list = std::get_if<BulletList>(&block)) {
      for (const auto& item : list->items) out << "- " << item << '\n';
    } else if (const auto* table = std::get_if<TableBlock>(&block)) {
      print_markdown_table(out, Table{table->headers, table->rows, table->right_align});
    } else if (const auto* code = std::get_if<CodeBlock>(&block)) {
      const std::string fence = fence_for(code->text);
      out << fence << code->language << '\n' << code->text;
      if (code->text.empty() || code->text.back() != '\n') out << '\n';
      out << fence << '\n';
    } else if (const auto* figure = std::get_if<Figure>(&block)) {
      if (figure_prefix.empty()) {
        out << "_Plot: " << figure->caption << " (written as `<report>-" << figure->id
            << ".svg` beside the report with `-o report.md`)._\n";
      } else {
        out << "![" << figure->caption << "](" << figure_prefix << figure->id << ".svg)\n";
      }
    }
  }
  return out.str();
}

const char* document_style() { return kStyle; }

std::string render_html(const Document& document) {
  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>" << xml_escape(document.title)
      << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n";
  out << "<h1>" << inline_html(document.title) << "</h1>\n" << render_html_blocks(document);
  out << "</body>\n</html>\n";
  return out.str();
}

std::string render_html_blocks(const Document& document) {
  std::ostringstream out;
  for (const auto& block : document.blocks) {
    if (const auto* h = std::get_if<Heading>(&block)) {
      out << "<h" << h->level << '>' << inline_html(h->text) << "</h" << h->level << ">\n";
    } else if (const auto* p = std::get_if<Paragraph>(&block)) {
      out << "<p>" << inline_html(p->text) << "</p>\n";
    } else if (const auto* list = std::get_if<BulletList>(&block)) {
      out << "<ul>\n";
      for (const auto& item : list->items) out << "<li>" << inline_html(item) << "</li>\n";
      out << "</ul>\n";
    } else if (const auto* table = std::get_if<TableBlock>(&block)) {
      out << "<table>\n<tr>";
      for (const auto& header : table->headers) out << "<th>" << inline_html(header) << "</th>";
      out << "</tr>\n";
      for (const auto& row : table->rows) {
        out << "<tr>";
        for (size_t c = 0; c < table->headers.size(); ++c) {
          const bool right = c < table->right_align.size() && table->right_align[c];
          out << (right ? "<td class=\"num\">" : "<td>") << inline_html(c < row.size() ? row[c] : "") << "</td>";
        }
        out << "</tr>\n";
      }
      out << "</table>\n";
    } else if (const auto* code = std::get_if<CodeBlock>(&block)) {
      out << "<pre><code>" << xml_escape(code->text) << "</code></pre>\n";
    } else if (const auto* figure = std::get_if<Figure>(&block)) {
      out << "<figure id=\"" << xml_escape(figure->id) << "\">\n" << figure->svg << "<figcaption>"
          << inline_html(figure->caption) << "</figcaption>\n</figure>\n";
    }
  }
  return out.str();
}

}  // namespace harness::analysis
