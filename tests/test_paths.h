#pragma once
// Where a test binary finds the checkout's files and the build's binary. The paths are compiled into
// one source per test binary that tests/CMakeLists.txt generates (harness_test_paths), not given to
// every test source as compile definitions: the test sources' compile lines then hold no absolute
// path, and ccache serves their objects to a clone of the checkout at another path. Each binary
// defines the paths it was given; using another one fails at link time.

namespace harness::test_paths {
const char* test_data_dir();    // the checkout's tests/
const char* experiments_dir();  // the checkout's experiments/
const char* fuzz_corpus_dir();  // the checkout's tests/fuzz/
const char* test_binary_dir();  // the build's tests/
const char* binary();           // the harness binary under test
const char* test_python();      // the Python with torch the tests run (HARNESS_TEST_PYTHON of the configure)
}  // namespace harness::test_paths

#define HARNESS_TEST_DATA_DIR (::harness::test_paths::test_data_dir())
#define HARNESS_EXPERIMENTS_DIR (::harness::test_paths::experiments_dir())
#define HARNESS_FUZZ_CORPUS_DIR (::harness::test_paths::fuzz_corpus_dir())
#define HARNESS_TEST_BINARY_DIR (::harness::test_paths::test_binary_dir())
#define HARNESS_BINARY (::harness::test_paths::binary())
#define HARNESS_TEST_PYTHON (::harness::test_paths::test_python())
