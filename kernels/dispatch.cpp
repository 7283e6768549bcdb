#include "kernels/dispatch.h"

#include <utility>

namespace harness::kernels {

void DispatchTrace::record(DispatchRecord record) {
  std::lock_guard lock(mutex_);
  records_.push_back(std::move(record));
}

std::vector<DispatchRecord> DispatchTrace::records() const {
  std::lock_guard lock(mutex_);
  return records_;
}

void DispatchTrace::clear() {
  std::lock_guard lock(mutex_);
  records_.clear();
}

}  // namespace harness::kernels
