#pragma once
// Cached Python environments for `harness bisect`: one venv per package set (base interpreter,
// requirements, where packages come from), under ~/.cache/harness/envs/KEY, made with `uv` when
// it is there, else `venv` + pip, and reused by every later bisect that asks for the same set.
// An env is complete only once its marker file (harness-env.json, written atomically after the
// install) exists; a folder without it is what an interrupted install left, and is rebuilt.
// Torch-free: installers and interpreters run as child processes (argv only, never a shell).

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/errors.h"

namespace harness {

//! What an env holds and where its packages come from.
struct EnvRequest {
  std::string python = "python3";         //!< base interpreter: a path, a name in $PATH, or a version ("3.11")
  std::vector<std::string> requirements;  //!< pip requirement specifiers: "torch==2.5.1", "numpy<2"
  std::vector<std::string> find_links;    //!< folders of wheels (--find-links)
  bool no_index = false;                  //!< never ask a package index (only find_links)
  std::string index_url;                  //!< another index than PyPI ("" for the default)
  std::string installer = "auto";         //!< auto (uv when found, else pip), uv or pip
  double timeout_s = 3600.0;              //!< for creating the venv and for the install, each
};

//! One cached env, as its marker file describes it.
struct CachedEnv {
  std::string key;          //!< the folder's name: a hash of the package set
  std::string path;         //!< the venv's folder
  std::string python;       //!< its interpreter (path/bin/python)
  bool complete = false;    //!< the marker exists (the install finished)
  bool reused = false;      //!< ensure_env found it ready instead of installing
  std::string installer;    //!< "uv 0.5.1" or "pip 23.2.1"
  double install_s = 0.0;   //!< how long creating + installing took
  nlohmann::json request = nlohmann::json::object();   //!< the package set (canonical form of EnvRequest)
  nlohmann::json packages = nlohmann::json::object();  //!< every installed distribution: {name: version}
  std::string created_at;
  std::string last_used_at;
};

//! An install that failed (a version that does not exist, a broken wheel, a resolver conflict):
//! what `harness bisect` skips. The message ends with the installer's last output lines.
class EnvInstallError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

//! $HARNESS_ENV_CACHE, else ~/.cache/harness/envs ($XDG_CACHE_HOME respected).
std::string env_cache_root();

//! The `uv` executable: $HARNESS_UV when set (empty: never use uv), else `uv` in $PATH.
std::optional<std::string> find_uv();

//! The base interpreter `python` names: a path or a program name as find_program resolves it, or
//! for a version such as "3.11" the program python3.11 in $PATH. Throws UsageError when none.
std::string resolve_base_python(const std::string& python);

//! The canonical package set of a request (base interpreter resolved, requirements sorted,
//! folders absolute): what the key hashes and the marker keeps.
nlohmann::json canonical_request(const EnvRequest& request);

//! The cache key (16 hex digits) of a canonical request.
std::string env_key(const nlohmann::json& canonical);

//! The env for `request` under `root`: reused when its marker matches, else (re)built. `log`
//! receives progress lines. Throws UsageError for a request that cannot work (installer asked
//! for and absent, no base interpreter), EnvInstallError when the install fails (the half-made
//! folder is removed), InfraError when the folder cannot be written.
CachedEnv ensure_env(const EnvRequest& request, const std::string& root,
                     const std::function<void(const std::string&)>& log = {});

//! Every env folder under `root` (complete or not), oldest first.
std::vector<CachedEnv> list_envs(const std::string& root);

//! Bytes the files of `path` take (each hard-linked file counted once within the folder).
uint64_t folder_bytes(const std::string& path);

//! Removes an env folder (and its lock file). Throws InfraError when it stays.
void remove_env(const std::string& root, const std::string& key);

}  // namespace harness
