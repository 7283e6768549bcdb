#pragma once
// A report as a list of blocks (headings, paragraphs, lists, tables, code, figures), rendered
// to Markdown or to a self-contained HTML page. Inline text may use `code` and **bold**, which
// both renderers understand; everything else is plain text and escaped for HTML.

#include <string>
#include <variant>
#include <vector>

namespace harness::analysis {

//! A section title (level 1 to 3).
struct Heading {
  int level = 2;
  std::string text;
};
//! A paragraph of inline text.
struct Paragraph {
  std::string text;
};
//! A bulleted list of inline texts.
struct BulletList {
  std::vector<std::string> items;
};
//! A table of inline texts; `right_align` marks numeric columns.
struct TableBlock {
  std::vector<std::string> headers;
  std::vector<std::vector<std::string>> rows;
  std::vector<bool> right_align;
};
//! Preformatted text (commands, error messages).
struct CodeBlock {
  std::string text;
  std::string language;  //!< "sh", "text", ...
};
//! A plot: its SVG, and the file name it gets beside the report.
struct Figure {
  std::string id;       //!< file-name part: "memory-bwd_peak_bytes"
  std::string caption;
  std::string svg;
};

//! One block of a document.
using Block = std::variant<Heading, Paragraph, BulletList, TableBlock, CodeBlock, Figure>;

//! A report: a title and its blocks.
struct Document {
  std::string title;
  std::vector<Block> blocks;

  void heading(int level, std::string text) { blocks.emplace_back(Heading{level, std::move(text)}); }
  void paragraph(std::string text) { blocks.emplace_back(Paragraph{std::move(text)}); }
  void bullets(std::vector<std::string> items) { blocks.emplace_back(BulletList{std::move(items)}); }
  void table(TableBlock table) { blocks.emplace_back(std::move(table)); }
  void code(std::string text, std::string language = "text") {
    blocks.emplace_back(CodeBlock{std::move(text), std::move(language)});
  }
  void figure(Figure figure) { blocks.emplace_back(std::move(figure)); }
  //! The figures, in order.
  std::vector<const Figure*> figures() const;
};

//! Markdown. Figures become image links to `<figure_prefix><id>.svg` (relative to the report);
//! with an empty prefix no files exist, and each figure is named with where `-o` would write it.
std::string render_markdown(const Document& document, const std::string& figure_prefix);

//! A standalone HTML page with the figures' SVG inline.
std::string render_html(const Document& document);

//! The blocks alone as HTML elements (what render_html puts in the page after the title), for a
//! page that brings its own frame (`harness site`).
std::string render_html_blocks(const Document& document);

//! The stylesheet of render_html's pages.
const char* document_style();

//! Inline text as HTML: escaped, with `code` and **bold** turned into elements.
std::string inline_html(const std::string& text);

}  // namespace harness::analysis
