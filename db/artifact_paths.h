#pragma once
// Where a db's artifact files (capsules, kept outputs, allocator snapshots, traces) live, and
// which of them the db may delete. Each db owns one folder beside it, named for the db file
// (`harness.db` -> `harness.db.artifacts/`); artifact rows store paths relative to the db's
// folder (`harness.db.artifacts/<sha256>.capsule`), so a db and its artifacts move together.
// Dbs written before that kept their files in `<db folder>/artifacts/`, one folder shared by every
// db there: such rows are still read, but their files are never deleted (another db may name
// them). A row is untrusted input (a db may come from someone else): a path that is absolute,
// has a `..` component, names another folder or leaves the folder through a symbolic link is
// resolved to nothing. Torch-free.

#include <string>

namespace harness::db {

//! What an artifact row's path resolves to.
struct ResolvedArtifact {
  enum class Place {
    own,      //!< in the db's own folder: readable, and deletable by this db
    shared,   //!< in the folder older versions shared between dbs: readable, never deleted
    outside,  //!< anywhere else: neither read nor deleted (`problem` says why)
  };
  Place place = Place::outside;
  std::string file;     //!< absolute path (own, shared); "" when outside
  std::string problem;  //!< why the row is refused (outside), e.g. "an absolute path"
};

//! The artifact folders of one db.
class ArtifactFolder {
 public:
  //! For the db at `db_path` (need not exist yet).
  explicit ArtifactFolder(const std::string& db_path);
  //! The db's own folder, absolute: "<db folder>/<db file name>.artifacts".
  const std::string& own() const { return own_; }
  //! The folder older versions shared between the dbs of a folder: "<db folder>/artifacts".
  const std::string& shared() const { return shared_; }
  //! The path a row stores for `file` (a file under own()): relative to the db's folder.
  std::string row_path(const std::string& file) const;
  //! Resolves a row's path, refusing anything outside own() and shared() (symbolic links
  //! followed: a link inside the folder that points out of it is outside).
  ResolvedArtifact resolve(const std::string& row_path) const;

 private:
  std::string base_;   //!< the db's folder, absolute
  std::string own_;
  std::string shared_;
};

}  // namespace harness::db
