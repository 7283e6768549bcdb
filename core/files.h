#pragma once
// Files that readers never see half-written: the one atomic writer every folder uses (autotune
// cache, capsules, result files, writeups), plus reading and removing. Torch-free.

#include <cstddef>
#include <string>

namespace harness {

//! A file written under a temporary name in the destination's folder and published by commit():
//! fsync of the file, rename (or link, when an existing file must win), fsync of the folder. A
//! file never committed is removed when the object dies, so a failed or interrupted writer leaves
//! nothing behind but what a SIGKILL can leave (a ".NAME.tmp.XXXXXX" file beside the target).
class AtomicFile {
 public:
  //! Creates the temporary file next to `path`. Throws InfraError naming the folder on failure.
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  //! Appends bytes. Throws InfraError naming the file (ENOSPC says "no space left on device").
  void write(const void* data, std::size_t bytes);
  void write(const std::string& text) { write(text.data(), text.size()); }

  //! How an existing file at the destination is treated by commit().
  enum class Existing { kReplace, kKeep };
  //! Publishes the file. kReplace: rename over whatever is there. kKeep: link(), so that a file
  //! already at `path` (same content-addressed name written meanwhile by another process) stays;
  //! returns false in that case. Throws InfraError on failure.
  bool commit(Existing existing = Existing::kReplace);

  const std::string& path() const { return path_; }
  const std::string& temporary_path() const { return temporary_; }

 private:
  std::string path_;
  std::string temporary_;
  int fd_ = -1;
  bool committed_ = false;
};

//! The name prefix of AtomicFile's temporary files for `path` (".NAME.tmp."; mkstemp adds six
//! characters), for cleaning up after writers that were killed before their commit.
std::string atomic_temp_prefix(const std::string& path);

//! Writes `content` to `path` atomically (AtomicFile, replacing). Throws InfraError on failure.
void write_file_atomic(const std::string& path, const std::string& content);
//! Whole file as a string; throws InfraError naming the path when it cannot be read.
std::string read_file(const std::string& path);
//! Removes a file tree with nftw (std::filesystem::remove_all is interposed by libtorch.so).
//! Errors are ignored: what cannot be removed stays.
void remove_tree(const std::string& path);
//! fsync of the folder holding `path`, so a rename or link into it is durable. Best effort.
void sync_parent_folder(const std::string& path);

}  // namespace harness
