// `harness list`: the experiments found in the search directories, with their hypotheses.

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <set>

#include "db/store.h"
#include "experiments/models.h"
#include "experiments/spec.h"
#include "harness/cli/cli.h"
#include "core/printer.h"

namespace harness {

namespace {

// `harness list --models`: the model shapes --model takes (experiments/models.h).
int list_models(const GlobalOptions& options) {
  nlohmann::json json = nlohmann::json::array();
  Table table;
  table.headers = {"model", "heads", "kv_heads", "head_dim", "v_head_dim", "hidden", "layers", "note"};
  table.right_align = {false, true, true, true, true, true, true, false};
  for (const spec::ModelShape& model : spec::known_models()) {
    json.push_back({{"name", model.name}, {"heads", model.heads}, {"kv_heads", model.kv_heads},
                    {"head_dim", model.head_dim}, {"v_head_dim", model.v_head_dim}, {"hidden", model.hidden},
                    {"layers", model.layers}, {"note", model.note}});
    table.rows.push_back({model.name, std::to_string(model.heads), std::to_string(model.kv_heads),
                          std::to_string(model.head_dim), std::to_string(model.v_head_dim), std::to_string(model.hidden),
                          std::to_string(model.layers), model.note});
  }
  if (options.json) print_json(std::cout, json);
  else print_table(std::cout, table);
  return kExitOk;
}

}  // namespace

Action add_list_command(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand("list", "List experiments and their hypotheses (--models: the model shapes)");
  auto models = std::make_shared<bool>(false);
  command->add_flag("--models", *models, "List the models --model takes, with their attention shapes");
  add_global_options(*command, options);
  return [&options, models]() -> int {
    if (*models) return list_models(options);
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
