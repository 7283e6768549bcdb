#pragma once
// Versions of a Python package as the bisect sees them: PEP 440 ordering (enough of it for real
// release histories: epochs, release numbers, a/b/rc, post and dev releases, local labels), the
// versions a folder of wheels offers (`--find-links DIR`), and those `pip index versions` lists.
// Torch-free; the index is asked through the interpreter's own pip, in a child process.

#include <optional>
#include <string>
#include <vector>

namespace harness {

//! A parsed PEP 440 version. Compare with compare_versions.
struct PackageVersion {
  std::string text;            //!< as written
  int epoch = 0;
  std::vector<long> release;   //!< 2.5.1 -> {2, 5, 1}
  int pre_kind = 3;            //!< 0 a, 1 b, 2 rc, 3 none (a final release sorts after its pre-releases)
  long pre_number = 0;
  long post = -1;              //!< -1 when not a post release
  long dev = -1;               //!< -1 when not a dev release
  std::string local;           //!< "cu124" of 2.5.1+cu124 (ignored by the order, as pip does for ==)

  //! A pre-release or a dev release: not picked from an index unless named.
  bool is_prerelease() const { return pre_kind < 3 || dev >= 0; }
};

//! Parses `text` ("2.5.1", "v1.0rc1", "3.0.0.post1", "2.6.0.dev20241001", "2.5.1+cu124");
//! nullopt when it is no PEP 440 version.
std::optional<PackageVersion> parse_version(const std::string& text);

//! <0, 0, >0 as `a` sorts before, with, after `b` (trailing zeros of the release do not count:
//! 2.5 == 2.5.0; local labels are ignored).
int compare_versions(const PackageVersion& a, const PackageVersion& b);

//! PEP 503 normalized project name: lowercase, runs of '-', '_' and '.' become one '-'.
std::string normalize_package_name(const std::string& name);

//! Versions of `package` offered by the wheels (*.whl) and source archives (*.tar.gz, *.zip) in
//! `folder`, by file name, sorted and without duplicates. Throws UsageError when the folder
//! cannot be read.
std::vector<std::string> versions_in_folder(const std::string& folder, const std::string& package);

//! The versions in the output of `pip index versions P` ("Available versions: 2.11.0, 2.10.0, ...").
//! Empty when the line is missing.
std::vector<std::string> parse_pip_index_versions(const std::string& output);

//! Sorts version strings by PEP 440 (unparsable ones throw UsageError naming `what`) and drops
//! duplicates (2.5 and 2.5.0 count once: the first written wins).
std::vector<std::string> sort_versions(const std::vector<std::string>& versions, const std::string& what);

//! The ordered versions from `good` to `bad`, both included, from `available` (sorted by
//! sort_versions; bad may sort before good: the list then runs downwards). Pre-releases between
//! them are dropped unless `keep_prereleases`. Throws UsageError when good or bad is not among
//! them (naming `source`, where the versions came from) or when they are equal.
std::vector<std::string> versions_between(const std::vector<std::string>& available, const std::string& good,
                                          const std::string& bad, bool keep_prereleases, const std::string& source);

}  // namespace harness
