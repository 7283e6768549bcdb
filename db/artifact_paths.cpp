#include "db/artifact_paths.h"

#include <filesystem>

namespace harness::db {
namespace {

namespace fs = std::filesystem;

fs::path absolute_normal(const std::string& path) {
  std::error_code error;
  const fs::path absolute = fs::absolute(fs::path(path), error);
  return (error ? fs::path(path) : absolute).lexically_normal();
}

// The path with every symbolic link resolved, as far as it exists.
fs::path real(const fs::path& path) {
  std::error_code error;
  const fs::path resolved = fs::weakly_canonical(path, error);
  return error ? path : resolved;
}

// Whether `inner` is `outer` or lies below it (component by component, both normalized).
bool is_within(const fs::path& inner, const fs::path& outer) {
  auto at = inner.begin();
  for (const fs::path& part : outer) {
    if (part.empty()) continue;  // a trailing separator
    if (at == inner.end() || *at != part) return false;
    ++at;
  }
  return true;
}

}  // namespace

ArtifactFolder::ArtifactFolder(const std::string& db_path) {
  const fs::path db = absolute_normal(db_path);
  base_ = db.parent_path().string();
  own_ = (db.parent_path() / (db.filename().string() + ".artifacts")).string();
  shared_ = (db.parent_path() / "artifacts").string();
}

std::string ArtifactFolder::row_path(const std::string& file) const {
  return absolute_normal(file).lexically_proximate(base_).string();
}

ResolvedArtifact ArtifactFolder::resolve(const std::string& row_path) const {
  ResolvedArtifact resolved;
  const fs::path path(row_path);
  const std::string own_name = fs::path(own_).filename().string();
  if (row_path.empty()) {
    resolved.problem = "an empty path";
    return resolved;
  }
  if (path.is_absolute()) {
    resolved.problem = "an absolute path (rows name files relative to the db's folder)";
    return resolved;
  }
  size_t parts = 0;
  for (const fs::path& part : path) {
    if (part == "..") {
      resolved.problem = "a '..' component (rows name files inside " + own_name + "/)";
      return resolved;
    }
    parts += !part.empty() && part != ".";
  }
  const std::string first = path.begin()->string();
  fs::path folder;
  if (first == own_name) {
    resolved.place = ResolvedArtifact::Place::own;
    folder = own_;
  } else if (first == "artifacts") {
    resolved.place = ResolvedArtifact::Place::shared;
    folder = shared_;
  } else {
    resolved.problem = "not inside " + own_name + "/ (nor artifacts/, the folder older versions shared)";
    return resolved;
  }
  if (parts < 2) {
    resolved.place = ResolvedArtifact::Place::outside;
    resolved.problem = "names the artifact folder itself, not a file in it";
    return resolved;
  }
  const fs::path file = (fs::path(base_) / path).lexically_normal();
  if (!is_within(real(file), real(folder))) {
    resolved.place = ResolvedArtifact::Place::outside;
    resolved.problem = "leaves " + folder.filename().string() + "/ through a symbolic link (to " + real(file).string() + ")";
    return resolved;
  }
  resolved.file = file.string();
  return resolved;
}

}  // namespace harness::db
