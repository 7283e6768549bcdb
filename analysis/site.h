#pragma once
// `harness site -o DIR`: the whole db as a static site (no server; opens from the file system or
// any static host). Pages:
//   index.html            every run, filtered and paged in the browser over runs.js (site.js)
//   experiments.html      the experiments, their runs, flips and regressions
//   experiment/NAME/      per experiment: verdict history with flips, regressions (the diff's rule),
//                         each metric over the runs as an SVG plot with its noise band; older runs
//                         on page-2.html, page-3.html ...
//   run/ID.html           what `harness show` prints, the comparison with the run before it, and
//                         the artifacts linked with the tool that opens each (Perfetto, memory_viz)
//   regressions.html      every called regression, newest first
//   envs.html, env/ID.html, envdiff/A-B.html   the envs side by side and the diff of consecutive envs
//   bisects.html, bisect/ID.html               the bisects with their reports
// Every string from the db is escaped (db content is untrusted); file names from db text go
// through site::slug.

#include <cstddef>
#include <string>

#include "db/store.h"

namespace harness::analysis {

//! How a site is built.
struct SiteOptions {
  std::string db_path;            //!< the db's file: artifacts are resolved against its folder
  bool copy_artifacts = false;    //!< copy trace, snapshot and capsule files into DIR/artifacts (for a
                                  //!< static host); else link them where they are, relative to DIR
  size_t runs_per_page = 100;     //!< rows of the index's pages (without JavaScript: its first page)
  size_t history_window = 60;     //!< runs per experiment page (plots, strips, tables)
  size_t listed_regressions = 1000;  //!< rows of regressions.html (newest first; the rest counted)
};

//! What a site holds.
struct SiteStats {
  size_t runs = 0;
  size_t experiments = 0;
  size_t pages = 0;            //!< HTML files
  size_t bytes = 0;            //!< every file written (copied artifacts included)
  size_t artifacts_copied = 0;
  size_t largest_page_bytes = 0;
  std::string largest_page;    //!< its path inside DIR
};

//! Builds the site of every run in `store` into `dir`. The site is built in a folder beside `dir`
//! and renamed into place, so a failure leaves `dir` as it was. Throws UsageError when `dir`
//! exists and is neither an empty folder nor a site written before (it holds `.harness-site`);
//! InfraError when a file cannot be written.
SiteStats write_site(const db::Store& store, const std::string& dir, const SiteOptions& options);

}  // namespace harness::analysis
