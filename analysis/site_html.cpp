#include "analysis/site_html.h"

#include <cstdint>
#include <sstream>

#include <fmt/format.h>

#include "analysis/document.h"
#include "analysis/svg_plot.h"
#include "db/store.h"

namespace harness::analysis::site {
namespace {

// The sections of the navigation bar: (key, file, label).
struct NavItem {
  const char* key;
  const char* file;
  const char* label;
};
const NavItem kNav[] = {{"runs", "index.html", "Runs"},
                        {"experiments", "experiments.html", "Experiments"},
                        {"regressions", "regressions.html", "Regressions"},
                        {"envs", "envs.html", "Envs"},
                        {"bisects", "bisects.html", "Bisects"}};

const char* const kSiteCss = R"css(
body { max-width: 1200px; }
nav.site { display: flex; gap: 1.2em; align-items: baseline; border-bottom: 2px solid #1f77b4; padding: .4em 0;
           margin-bottom: 1em; font-size: 15px; }
nav.site .brand { font-weight: bold; color: #1a1a1a; margin-right: 1em; }
nav.site a { color: #1f77b4; text-decoration: none; }
nav.site a.current { color: #1a1a1a; font-weight: bold; }
h1 { border-bottom: none; font-size: 1.6em; margin: .3em 0; }
a { color: #1f5fa0; }
p.meta, span.meta { color: #555; font-size: 13px; }
pre.lines { white-space: pre-wrap; word-break: break-word; }
td.flip, span.flip { color: #b00020; font-weight: bold; }
td.worse, span.worse { color: #b00020; font-weight: bold; }
td.better { color: #2a7d2a; }
tr.regressed td:first-child { border-left: 3px solid #d62728; }
div.strip { display: flex; flex-wrap: wrap; gap: 2px; margin: .4em 0 1em; }
div.strip a { display: inline-block; min-width: 1.6em; padding: 2px 3px; font-size: 11px; color: #fff; text-align: center;
              text-decoration: none; border: 2px solid transparent; border-radius: 3px; }
div.strip a.flip { border-color: #1a1a1a; }
div.strip a.flip::before { content: "\2691"; margin-right: 1px; }
div.filters { display: flex; flex-wrap: wrap; gap: .6em; align-items: center; margin: .6em 0; font-size: 13px; }
div.filters select, div.filters input { font-size: 13px; max-width: 22em; }
div.pager { display: flex; gap: .8em; align-items: center; margin: .6em 0; font-size: 13px; }
details > summary { cursor: pointer; color: #1f5fa0; margin: .4em 0; }
div.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: .5em 1.5em; }
div.plots figure { margin: .3em 0; }
figure svg { width: 100%; height: auto; }
table.matrix td.differs { background: #fff4d6; }
.howto { color: #333; font-size: 13px; }
)css";

const char* const kSiteJs = R"js(
(function () {
  'use strict';
  var data = window.HARNESS_RUNS;
  var body = document.getElementById('runs-body');
  if (!data || !body) return;
  var PAGE = 100;
  var page = 0;
  var root = document.body.getAttribute('data-root') || '';
  var controls = {};

  function el(tag, text, cls) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }
  function anchor(href, text) {
    var a = el('a', text);
    a.setAttribute('href', href);
    return a;
  }
  function fill(id, list, label) {
    var select = document.getElementById(id);
    controls[id] = select;
    list.forEach(function (item, index) {
      var option = el('option', label(item));
      option.value = String(index);
      select.appendChild(option);
    });
    select.addEventListener('change', function () { page = 0; render(); });
  }
  fill('f-experiment', data.experiments, function (e) { return e[0]; });
  fill('f-device', data.devices, function (d) { return d; });
  fill('f-status', data.statuses, function (s) { return s; });
  fill('f-verdict', data.verdicts, function (v) { return v === '' ? '(none)' : v; });
  fill('f-env', data.envs, function (e) { return e[0] + ' ' + e[1]; });
  var text = document.getElementById('f-text');
  var flips = document.getElementById('f-flips');
  var worse = document.getElementById('f-worse');
  [text, flips, worse].forEach(function (input) {
    input.addEventListener('input', function () { page = 0; render(); });
    input.addEventListener('change', function () { page = 0; render(); });
  });
  document.getElementById('p-prev').addEventListener('click', function () { if (page > 0) { page -= 1; render(); } });
  document.getElementById('p-next').addEventListener('click', function () { page += 1; render(); });

  function chosen(id) {
    var value = controls[id].value;
    return value === '' ? -1 : Number(value);
  }
  function matcher() {
    var experiment = chosen('f-experiment'), device = chosen('f-device'), status = chosen('f-status');
    var verdict = chosen('f-verdict'), env = chosen('f-env');
    var needle = text.value.trim().toLowerCase();
    var onlyFlips = flips.checked, onlyWorse = worse.checked;
    return function (r) {
      if (experiment >= 0 && r[1] !== experiment) return false;
      if (device >= 0 && r[2] !== device) return false;
      if (status >= 0 && r[4] !== status) return false;
      if (verdict >= 0 && r[5] !== verdict) return false;
      if (env >= 0 && r[6] !== env) return false;
      if (onlyFlips && !r[8]) return false;
      if (onlyWorse && !r[9]) return false;
      if (needle) {
        var hay = (data.experiments[r[1]][0] + ' ' + data.verdicts[r[5]] + ' ' + data.statuses[r[4]] + ' ' +
                   data.devices[r[2]] + ' ' + r[10] + ' ' + r[0]).toLowerCase();
        if (hay.indexOf(needle) < 0) return false;
      }
      return true;
    };
  }
  function render() {
    var rows = data.rows.filter(matcher());
    var pages = Math.max(1, Math.ceil(rows.length / PAGE));
    if (page >= pages) page = pages - 1;
    while (body.firstChild) body.removeChild(body.firstChild);
    rows.slice(page * PAGE, (page + 1) * PAGE).forEach(function (r) {
      var tr = el('tr');
      if (r[9]) tr.className = 'regressed';
      var cell = el('td', null, 'num');
      cell.appendChild(anchor(root + 'run/' + r[0] + '.html', r[0]));
      tr.appendChild(cell);
      var experiment = data.experiments[r[1]];
      cell = el('td');
      cell.appendChild(anchor(root + 'experiment/' + experiment[1] + '/index.html', experiment[0]));
      tr.appendChild(cell);
      tr.appendChild(el('td', data.devices[r[2]]));
      tr.appendChild(el('td', r[3] || '-'));
      tr.appendChild(el('td', data.statuses[r[4]]));
      tr.appendChild(el('td', (r[8] ? '\u2691 ' : '') + (data.verdicts[r[5]] || '-'), r[8] ? 'flip' : ''));
      tr.appendChild(el('td', r[9] ? String(r[9]) : '', r[9] ? 'num worse' : 'num'));
      var env = data.envs[r[6]];
      cell = el('td', env[2] ? null : '-');
      if (env[2]) cell.appendChild(anchor(root + 'env/' + env[2] + '.html', env[0]));
      tr.appendChild(cell);
      tr.appendChild(el('td', r[7]));
      tr.appendChild(el('td', r[10]));
      body.appendChild(tr);
    });
    document.getElementById('p-info').textContent =
        rows.length + ' of ' + data.rows.length + ' runs \u00b7 page ' + (page + 1) + ' of ' + pages;
    document.getElementById('p-prev').disabled = page === 0;
    document.getElementById('p-next').disabled = page + 1 >= pages;
  }
  render();
})();
)js";

}  // namespace

std::string h(const std::string& text) { return xml_escape(text); }

std::string link(const std::string& href, const std::string& text) {
  return "<a href=\"" + h(href) + "\">" + h(text) + "</a>";
}

std::string table_html_raw(const std::vector<std::string>& headers, const std::vector<std::vector<std::string>>& rows,
                           const std::vector<bool>& right_align, const std::string& css_class) {
  std::ostringstream out;
  out << (css_class.empty() ? "<table>" : "<table class=\"" + h(css_class) + "\">") << "\n<tr>";
  for (const auto& header : headers) out << "<th>" << header << "</th>";
  out << "</tr>\n";
  for (const auto& row : rows) {
    out << "<tr>";
    for (size_t c = 0; c < headers.size(); ++c) {
      const bool right = c < right_align.size() && right_align[c];
      out << (right ? "<td class=\"num\">" : "<td>") << (c < row.size() ? row[c] : "") << "</td>";
    }
    out << "</tr>\n";
  }
  out << "</table>\n";
  return out.str();
}

std::string table_html(const Table& table, const std::string& css_class) {
  std::vector<std::string> headers;
  for (const auto& header : table.headers) headers.push_back(h(header));
  std::vector<std::vector<std::string>> rows;
  rows.reserve(table.rows.size());
  for (const auto& row : table.rows) {
    std::vector<std::string> cells;
    for (const auto& cell : row) cells.push_back(h(cell));
    rows.push_back(std::move(cells));
  }
  return table_html_raw(headers, rows, table.right_align, css_class);
}

std::string pre(const std::string& text, const std::string& css_class) {
  return (css_class.empty() ? "<pre>" : "<pre class=\"" + h(css_class) + "\">") + h(text) + "</pre>\n";
}

std::string script_json(const nlohmann::json& value) {
  const std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '<') out += "\\u003c";
    else if (c == '>') out += "\\u003e";
    else if (c == '&') out += "\\u0026";
    else if (c == '\xe2' && i + 2 < text.size() && text[i + 1] == '\x80' && (text[i + 2] == '\xa8' || text[i + 2] == '\xa9')) {
      out += text[i + 2] == '\xa8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

std::string page(const std::string& title, const std::string& root, const std::string& nav, const std::string& body,
                 const std::string& scripts) {
  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
      << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\n<title>" << h(title)
      << " · harness</title>\n<link rel=\"stylesheet\" href=\"" << root << "site.css\"/>\n</head>\n<body data-root=\""
      << root << "\">\n<nav class=\"site\"><span class=\"brand\">harness</span>";
  for (const auto& item : kNav)
    out << "<a href=\"" << root << item.file << "\"" << (nav == item.key ? " class=\"current\"" : "") << ">" << item.label
        << "</a>";
  out << "</nav>\n" << body << scripts << "</body>\n</html>\n";
  return out.str();
}

const char* site_css() {
  static const std::string css = std::string(document_style()) + kSiteCss;
  return css.c_str();
}

const char* site_js() { return kSiteJs; }

std::string slug(const std::string& text) {
  bool ok = !text.empty() && text.size() <= 64;
  bool only_dashes = true;
  for (char c : text) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) ok = false;
    if (c != '-') only_dashes = false;
  }
  if (ok && !only_dashes) return text;
  return "x-" + db::sha256_hex(text).substr(0, 16);
}

std::string verdict_color(const std::string& verdict) {
  if (verdict.empty()) return "#9e9e9e";
  // A stable hash of the text picks a palette colour (FNV-1a).
  uint32_t hash = 2166136261u;
  for (unsigned char c : verdict) hash = (hash ^ c) * 16777619u;
  return series_color(static_cast<int>(hash % 10));
}

}  // namespace harness::analysis::site
