// `harness env`: this machine's toolchain fingerprint, as runs store it.

#include <ATen/ATen.h>

#include <iostream>

#include "db/store.h"
#include "harness/cli/cli.h"
#include "harness/runner/env.h"
#include "core/printer.h"

namespace harness {

Action add_env_command(CLI::App& app, GlobalOptions& options) {
  auto device = std::make_shared<std::string>("auto");
  auto* command = app.add_subcommand("env", "Print this machine's toolchain fingerprint");
  command->add_option("--device", *device, "Device to describe: cpu, cuda:N or auto");
  add_global_options(*command, options);
  return [device, &options] {
    std::string chosen = *device;
    if (chosen == "auto") chosen = at::hasCUDA() && at::detail::getCUDAHooks().getNumGPUs() > 0 ? "cuda:0" : "cpu";
    const nlohmann::json env = full_fingerprint(chosen);
    const std::string id = db::sha256_hex(db::canonical_json(env));
    if (options.json) {
      print_json(std::cout, {{"id", id}, {"device", chosen}, {"env", env}});
      return kExitOk;
    }
    Table table;
    table.headers = {"key", "value"};
    for (const auto& [key, value] : env.items())
      table.rows.push_back({key, value.is_string() ? value.get<std::string>() : value.dump()});
    std::cout << "env " << id.substr(0, 16) << " (device " << chosen << ")\n";
    print_table(std::cout, table);
    return kExitOk;
  };
}

}  // namespace harness
