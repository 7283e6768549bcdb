// `harness list`: the experiments found in the search directories, with their hypotheses.

#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "db/store.h"
#include "experiments/spec.h"
#include "harness/cli.h"
#include "core/printer.h"

namespace harness {

Action add_list_command(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand("list", "List experiments and their hypotheses");
  add_global_options(*command, options);
  return [&options] {
    namespace fs = std::filesystem;
    std::map<std::string, int> run_counts;
    if (fs::exists(options.db_path)) {
      try {
        db::Store store(options.db_path, db::Access::read);
        db::RunFilter filter;
        filter.limit = 1000000;
        for (const auto& run : store.list_runs(filter)) ++run_counts[run.experiment];
      } catch (const db::DbMissingError&) {
        // Not a harness db (an empty file, a device): the experiments are listed without counts.
      }
    }
    std::set<std::string> seen;
    nlohmann::json json = nlohmann::json::array();
    Table table;
    table.headers = {"experiment", "kind", "runs", "hypothesis", "file"};
    table.right_align = {false, false, true};
    for (const auto& dir : experiment_search_dirs(options)) {
      std::error_code error;
      if (!fs::is_directory(dir, error)) continue;
      std::vector<fs::path> files;
      for (const auto& entry : fs::directory_iterator(dir, error))
        if (entry.path().extension() == ".json") files.push_back(entry.path());
      std::sort(files.begin(), files.end());
      for (const auto& file : files) {
        const std::string name = file.stem().string();
        if (!seen.insert(name).second) continue;
        std::string kind = "?", hypothesis;
        try {
          const auto spec = spec::load_spec_file(file.string());
          kind = spec.kind;
          hypothesis = spec.hypothesis;
        } catch (const spec::SpecError& e) {
          hypothesis = "(invalid spec: " + e.issues().front().to_string() + ")";
        }
        json.push_back({{"name", name}, {"kind", kind}, {"hypothesis", hypothesis}, {"file", file.string()},
                        {"runs", run_counts[name]}});
        table.rows.push_back({name, kind, std::to_string(run_counts[name]), hypothesis, file.string()});
      }
    }
    if (options.json) print_json(std::cout, json);
    else if (table.rows.empty()) std::cout << "no experiments found\n";
    else print_table(std::cout, table);
    return kExitOk;
  };
}

}  // namespace harness
