#include "core/files.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "core/errors.h"

namespace harness {
namespace {

std::string errno_text() { return std::strerror(errno); }

std::string folder_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string name_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

void sync_parent_folder(const std::string& path) {
  const int folder = ::open(folder_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (folder < 0) return;
  ::fsync(folder);
  ::close(folder);
}

std::string atomic_temp_prefix(const std::string& path) { return "." + name_of(path) + ".tmp."; }

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  // A dot name, so that folder listings (capsules by hash, the autotune cache) skip it.
  temporary_ = folder_of(path_) + "/" + atomic_temp_prefix(path_) + "XXXXXX";
  fd_ = ::mkstemp(temporary_.data());
  if (fd_ < 0) throw InfraError("cannot create a temporary file in " + folder_of(path_) + ": " + errno_text());
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temporary_.c_str());
}

void AtomicFile::write(const void* data, std::size_t bytes) {
  const auto* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t put = ::write(fd_, cursor, bytes);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) throw InfraError("cannot write " + path_ + ": " + (put < 0 ? errno_text() : "no progress"));
    cursor += put;
    bytes -= static_cast<std::size_t>(put);
  }
}

bool AtomicFile::commit(Existing existing) {
  if (::fsync(fd_) != 0) throw InfraError("cannot flush " + path_ + ": " + errno_text());
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) throw InfraError("cannot close " + path_ + ": " + errno_text());
  bool published = true;
  if (existing == Existing::kReplace) {
    if (::rename(temporary_.c_str(), path_.c_str()) != 0)
      throw InfraError("cannot rename " + temporary_ + " to " + path_ + ": " + errno_text());
    committed_ = true;
  } else {
    // link() fails with EEXIST when another writer published the same name first: theirs stays.
    if (::link(temporary_.c_str(), path_.c_str()) != 0) {
      if (errno != EEXIST) throw InfraError("cannot store " + path_ + ": " + errno_text());
      published = false;
    }
    ::unlink(temporary_.c_str());
    committed_ = true;
  }
  // The new name is durable only once the folder entry is on disk.
  sync_parent_folder(path_);
  return published;
}

void write_file_atomic(const std::string& path, const std::string& content) {
  AtomicFile file(path);
  file.write(content);
  file.commit();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InfraError("cannot read " + path + ": " + errno_text());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void remove_tree(const std::string& path) {
  ::nftw(
      path.c_str(), [](const char* item, const struct stat*, int, struct FTW*) { return ::remove(item); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

}  // namespace harness
