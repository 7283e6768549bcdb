// The fault suite: the harness is killed, hung up on, cut off from its terminal, runs
// out of disk, shares its db with other writers, or finds it read-only or damaged. After each:
// nothing lost (every trial that finished is stored, whole), the run's final status tells the
// truth, SQLite's integrity_check is ok, and no process of the run is left.
// Signals are sent when the run has reached a known state (a trial stored, a child running),
// found by polling the db and /proc, never by sleeping a fixed time.

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sqlite3.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/catch.h"
#include "tests/test_paths.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kFaults = std::string(HARNESS_TEST_DATA_DIR) + "/cli/faults.json";
// How long a condition may take to come true before the test gives up (a loaded CI machine
// starts a LibTorch child in seconds; this is the bound of a hang, not a timing assertion).
constexpr auto kPatience = std::chrono::seconds(180);

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Polls `condition` until it holds; false when kPatience ran out.
bool eventually(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return condition();
}

// Processes (not zombies) whose command line mentions `needle`, with their command lines.
std::vector<std::pair<pid_t, std::string>> processes_mentioning(const std::string& needle) {
  std::vector<std::pair<pid_t, std::string>> found;
  DIR* proc = opendir("/proc");
  if (!proc) return found;
  while (dirent* entry = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
    if (pid <= 0 || pid == getpid()) continue;
    const std::string stat = slurp(fs::path("/proc") / entry->d_name / "stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] == 'Z') continue;
    std::string cmdline = slurp(fs::path("/proc") / entry->d_name / "cmdline");
    for (char& c : cmdline)
      if (c == '\0') c = ' ';
    if (cmdline.find(needle) != std::string::npos) found.emplace_back(pid, cmdline);
  }
  closedir(proc);
  return found;
}

// A db opened with SQLite itself (not through the harness): what is really stored.
class Db {
 public:
  explicit Db(const std::string& path) {
    REQUIRE(sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
    sqlite3_busy_timeout(db_, 10000);
  }
  ~Db() { sqlite3_close(db_); }
  std::vector<std::vector<std::string>> rows(const std::string& sql) const {
    std::vector<std::vector<std::string>> out;
    sqlite3_stmt* statement = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &statement, nullptr) != SQLITE_OK) {
      FAIL("sqlite: " << sqlite3_errmsg(db_) << " in " << sql);
    }
    while (sqlite3_step(statement) == SQLITE_ROW) {
      std::vector<std::string> row;
      for (int column = 0; column < sqlite3_column_count(statement); ++column) {
        const auto* text = sqlite3_column_text(statement, column);
        row.emplace_back(text ? reinterpret_cast<const char*>(text) : "");
      }
      out.push_back(std::move(row));
    }
    sqlite3_finalize(statement);
    return out;
  }
  std::string value(const std::string& sql) const {
    const auto result = rows(sql);
    return result.empty() || result[0].empty() ? "" : result[0][0];
  }

 private:
  sqlite3* db_ = nullptr;
};

// A scratch folder per test; every harness process it starts mentions it on its command line (the
// db, and for a trial child its request file: the harness's own scratch folders go here, TMPDIR).
struct Sandbox {
  fs::path dir;
  Sandbox() {
    std::string pattern = (fs::temp_directory_path() / "harness-faults-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    dir = pattern;
  }
  ~Sandbox() {
    for (const auto& [pid, cmdline] : processes_mentioning(dir.string())) kill(pid, SIGKILL);
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
  std::string db() const { return (dir / "test.db").string(); }

  // Starts the harness with `args`; stdout and stderr go to files unless `stderr_fd` is given.
  pid_t start(const std::vector<std::string>& args, int stderr_fd = -1, const std::string& db_path = "") const {
    std::vector<std::string> argv = {HARNESS_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--db", db_path.empty() ? db() : db_path});
    std::vector<char*> raw;
    for (auto& arg : argv) raw.push_back(arg.data());
    raw.push_back(nullptr);
    std::vector<std::string> env_storage = {"HARNESS_ALLOW_FAULTS=1", "TMPDIR=" + dir.string()};
    for (char** entry = environ; *entry; ++entry)
      if (std::string(*entry).rfind("HARNESS_ALLOW_FAULTS=", 0) != 0 && std::string(*entry).rfind("TMPDIR=", 0) != 0)
        env_storage.emplace_back(*entry);
    std::vector<char*> envp;
    for (auto& item : env_storage) envp.push_back(item.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (dir / "stdout").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (stderr_fd >= 0) {
      posix_spawn_file_actions_adddup2(&actions, stderr_fd, STDERR_FILENO);
    } else {
      posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, (dir / "stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
    }
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, raw.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE(rc == 0);
    return pid;
  }

  // Waits for `pid`; its exit code, or 128 + signal.
  static int wait_for(pid_t pid) {
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // Runs the harness to completion; {exit code, stdout, stderr}.
  struct Result {
    int exit_code;
    std::string out, err;
  };
  Result run(const std::vector<std::string>& args, const std::string& db_path = "") const {
    const int code = wait_for(start(args, -1, db_path));
    return {code, slurp(dir / "stdout"), slurp(dir / "stderr")};
  }

  std::string stderr_text() const { return slurp(dir / "stderr"); }
  // The trial child of `variant`, once it runs.
  std::vector<std::pair<pid_t, std::string>> trial_children(const std::string& variant) const {
    std::vector<std::pair<pid_t, std::string>> children;
    for (const auto& process : processes_mentioning(dir.string()))
      if (process.second.find("__trial") != std::string::npos &&
          process.second.find("." + variant + ".request.json ") != std::string::npos)
        children.push_back(process);
    return children;
  }
};

// `run faults.json` with these variants (in this order) and a long timeout.
std::vector<std::string> run_args(const std::string& variants, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"run", kFaults, "--device", "cpu", "--set", "variants=" + variants, "--set",
                                   "timeout_s=600"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

const std::string kOkThenHang = R"({"fused":{"impl":"fused"},"hang":{"impl":"fused","fault":"hang"}})";

// The scratch folder of a running trial child: the folder of its --request file (beside its
// result file and its point's spec).
std::string scratch_of(const std::string& cmdline) {
  const std::string option = "--request ";
  const auto at = cmdline.find(option);
  REQUIRE(at != std::string::npos);
  const auto start = at + option.size();
  const auto end = cmdline.find(' ', start);
  return fs::path(cmdline.substr(start, end - start)).parent_path().string();
}

void check_integrity(const std::string& db_path) {
  Db db(db_path);
  CHECK(db.value("PRAGMA integrity_check") == "ok");
}

// Every stored trial is whole: an ok trial has its metrics.
void check_trials_whole(const std::string& db_path) {
  Db db(db_path);
  CHECK(db.value("SELECT count(*) FROM trials t WHERE t.status = 'ok' AND NOT EXISTS "
                 "(SELECT 1 FROM metrics m WHERE m.trial_id = t.id)") == "0");
}

}  // namespace

TEST_CASE("kill -9 of the parent: the child dies with it and the run is found abandoned", "[faults]") {
  Sandbox box;
  const pid_t parent = box.start(run_args(kOkThenHang));
  REQUIRE(eventually([&] { return !box.trial_children("hang").empty(); }));
  REQUIRE(kill(parent, SIGKILL) == 0);
  CHECK(Sandbox::wait_for(parent) == 128 + SIGKILL);
  // PR_SET_PDEATHSIG: the kernel kills the child when its parent dies.
  CHECK(eventually([&] { return processes_mentioning(box.dir.string()).empty(); }));

  {
    Db db(box.db());
    CHECK(db.value("SELECT status FROM runs") == "running");  // nobody could write anything else
  }
  const auto runs = box.run({"runs", "--json"});
  INFO(runs.err);
  REQUIRE(runs.exit_code == 0);
  const Json listed = Json::parse(runs.out);
  REQUIRE(listed.size() == 1);
  CHECK(listed[0]["status"] == "abandoned");
  CHECK(Db(box.db()).value("SELECT status FROM runs") == "running");  // a reading command writes nothing
  // The next run, a writer, marks it.
  REQUIRE(box.run(run_args(R"({"fused":{"impl":"fused"}})")).exit_code == 0);
  Db db(box.db());
  CHECK(db.value("SELECT status FROM runs WHERE id = 1") == "abandoned");
  CHECK(db.value("SELECT group_concat(variant || ':' || status) FROM trials WHERE run_id = 1") == "fused:ok");
  check_trials_whole(box.db());
  check_integrity(box.db());
}

TEST_CASE("kill -9 of a trial child: recorded as crashed, the other trials still run", "[faults]") {
  Sandbox box;
  const pid_t parent = box.start(
      run_args(R"({"hang":{"impl":"fused","fault":"hang"},"fused":{"impl":"fused"}})"));
  REQUIRE(eventually([&] { return !box.trial_children("hang").empty(); }));
  for (const auto& [pid, cmdline] : box.trial_children("hang")) kill(pid, SIGKILL);
  CHECK(Sandbox::wait_for(parent) == 0);
  Db db(box.db());
  CHECK(db.value("SELECT status FROM runs") == "failed");
  CHECK(db.value("SELECT status || ' ' || signal FROM trials WHERE variant = 'hang'") == "crashed 9");
  CHECK(db.value("SELECT status FROM trials WHERE variant = 'fused'") == "ok");
  CHECK(processes_mentioning(box.dir.string()).empty());
  check_trials_whole(box.db());
  check_integrity(box.db());
}

TEST_CASE("SIGHUP of the parent: run interrupted, child killed, scratch folder removed", "[faults]") {
  Sandbox box;
  const pid_t parent = box.start(run_args(kOkThenHang));
  REQUIRE(eventually([&] { return !box.trial_children("hang").empty(); }));
  const std::string scratch = scratch_of(box.trial_children("hang").front().second);
  REQUIRE(fs::exists(scratch));
  REQUIRE(kill(parent, SIGHUP) == 0);
  CHECK(Sandbox::wait_for(parent) == 3);
  INFO(box.stderr_text());
  CHECK(processes_mentioning(box.dir.string()).empty());
  CHECK_FALSE(fs::exists(scratch));
  Db db(box.db());
  CHECK(db.value("SELECT status FROM runs") == "interrupted");
  CHECK(db.value("SELECT group_concat(variant || ':' || status) FROM trials") == "fused:ok,hang:interrupted");
  check_trials_whole(box.db());
  check_integrity(box.db());
}

TEST_CASE("SIGPIPE (output cut off): run interrupted and stored, not left running", "[faults]") {
  Sandbox box;
  int fds[2];
  REQUIRE(pipe2(fds, O_CLOEXEC) == 0);  // the harness must not inherit the reading end: it would never see EPIPE
  const pid_t parent = box.start(
      run_args(R"({"fused":{"impl":"fused"},"b":{"impl":"fused"},"c":{"impl":"fused"},"d":{"impl":"fused"}})"), fds[1]);
  close(fds[1]);
  // Like `harness run ... 2>&1 | head -1`: read one line, then close the reading end.
  std::string first;
  char c = 0;
  while (read(fds[0], &c, 1) == 1 && c != '\n') first += c;
  CHECK(first.find("run ") == 0);
  close(fds[0]);
  CHECK(Sandbox::wait_for(parent) == 3);
  CHECK(processes_mentioning(box.dir.string()).empty());
  Db db(box.db());
  CHECK(db.value("SELECT status FROM runs") == "interrupted");
  CHECK(std::stoi(db.value("SELECT count(*) FROM trials")) < 4);
  check_trials_whole(box.db());
  check_integrity(box.db());
}

TEST_CASE("the trial child enforces its own deadline when the parent cannot", "[faults]") {
  Sandbox box;
  // The parent is stopped (SIGSTOP) while the child hangs: only the child's watchdog can end it.
  // timeout_s leaves the test ample time to stop the parent before the parent's own deadline.
  const pid_t parent = box.start(run_args(kOkThenHang, {"--set", "timeout_s=20"}));
  REQUIRE(eventually([&] { return !box.trial_children("hang").empty(); }));
  REQUIRE(kill(parent, SIGSTOP) == 0);
  const bool child_ended = eventually([&] { return box.trial_children("hang").empty(); });
  REQUIRE(kill(parent, SIGCONT) == 0);
  CHECK(child_ended);
  CHECK(Sandbox::wait_for(parent) == 0);
  Db db(box.db());
  CHECK(db.value("SELECT status FROM trials WHERE variant = 'hang'") == "timeout");
  // Which text is stored depends on who writes it first once the parent resumes: the child's result
  // ("... its own deadline") or the parent's timeout record (it is past its deadline too). The
  // child having ended while the parent was stopped is what this test is about (child_ended).
  CHECK_FALSE(db.value("SELECT error FROM trials WHERE variant = 'hang'").empty());
  check_integrity(box.db());
}

// A finished run's capsule is content-addressed: a run going now may be about to store a row for
// the very same file. Whatever `db prune` removes while a run of the db is going, it keeps the files.
TEST_CASE("db prune while a run of the db is going deletes no file the run may name", "[faults]") {
  Sandbox box;
  const std::string hang = R"({"hang":{"impl":"fused","fault":"hang"}})";
  // The capsule marker beside a running trial's result file: the capsule is written.
  const auto capsule_written = [&] {
    const auto children = box.trial_children("hang");
    if (children.empty()) return false;
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(scratch_of(children.front().second), error))
      if (entry.path().extension() == ".capsule") return true;
    return false;
  };
  const std::vector<std::string> only_hang = run_args(hang, {"--set", R"(verdict=[{"else":"DONE"}])"});
  const pid_t first = box.start(only_hang);
  REQUIRE(eventually(capsule_written));
  REQUIRE(kill(first, SIGTERM) == 0);
  CHECK(Sandbox::wait_for(first) == 3);
  const std::string capsule = Db(box.db()).value("SELECT path FROM artifacts WHERE kind = 'capsule'");
  REQUIRE_FALSE(capsule.empty());
  const fs::path capsule_file = box.dir / capsule;
  REQUIRE(fs::exists(capsule_file));

  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the first run is older than the cutoff
  const pid_t second = box.start(only_hang);  // the same spec and variant: the same capsule file
  REQUIRE(eventually(capsule_written));
  {
    const auto prune = box.run({"db", "prune", "--older-than", "0s", "--json"});
    INFO(prune.err);
    CHECK(prune.exit_code == 0);
    CHECK(Json::parse(prune.out)["artifacts"] == 1);  // the first run's row goes
    CHECK(Json::parse(prune.out)["removed_files"] == 0);
  }
  CHECK(fs::exists(capsule_file));
  REQUIRE(kill(second, SIGTERM) == 0);
  CHECK(Sandbox::wait_for(second) == 3);
  const auto check = box.run({"db", "check", "--json"});
  INFO(check.err);
  CHECK(Json::parse(check.out)["missing_files"].empty());
}

namespace {

// A small tmpfs at `dir` when this process may mount one (root outside a locked-down container).
bool mount_small_tmpfs(const fs::path& dir, const std::string& size) {
  fs::create_directories(dir);
  return ::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
}

}  // namespace

TEST_CASE("disk full during a run: the run is marked failed with the reason, exit 3, nothing torn", "[faults]") {
  Sandbox box;
  const fs::path full = box.dir / "full";
  // Sixteen points (sweep values must differ), each trial keeping its capsules: ~1.3 MB in all.
  std::vector<std::string> extra = {"--keep-capsules", "--set", "dims.anchors=[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]"};
  const bool mounted = mount_small_tmpfs(full, "600k");
  std::string db_path = (full / "test.db").string();
  if (!mounted) {
    // No mount allowed: SQLite's own page limit gives the same SQLITE_FULL at the store.
    fs::create_directories(full);
    setenv("HARNESS_FAULT_DB_MAX_PAGES", "40", 1);
  }
  struct Unmount {
    fs::path dir;
    bool mounted;
    ~Unmount() {
      unsetenv("HARNESS_FAULT_DB_MAX_PAGES");
      if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
    }
  } unmount{full, mounted};
  const auto run = box.run(run_args(R"({"fused":{"impl":"fused"}})", extra), db_path);
  INFO(run.err);
  CHECK(run.exit_code == 3);
  CHECK(run.err.find("terminate called") == std::string::npos);
  CHECK(run.err.find("full") != std::string::npos);
  CHECK(processes_mentioning(box.dir.string()).empty());
  Db db(db_path);
  const std::string stored_status = db.value("SELECT status FROM runs");
  if (stored_status == "running") {
    // The disk was too full even for the final status (a real tmpfs leaves no room for the
    // journal): the harness says so, and the next reader finds the run abandoned.
    CHECK(run.err.find("it will show as abandoned") != std::string::npos);
    const auto listed = box.run({"runs", "--json"}, db_path);
    INFO(listed.out);
    CHECK(listed.exit_code == 0);
    CHECK(listed.out.find("\"abandoned\"") != std::string::npos);
  } else {
    CHECK(stored_status == "failed");
    CHECK(db.value("SELECT error FROM runs").find("full") != std::string::npos);
  }
  CHECK(std::stoi(db.value("SELECT count(*) FROM trials")) < 16);
  check_trials_whole(db_path);
  check_integrity(db_path);
}

TEST_CASE("concurrent writers: every run of every process stored", "[faults]") {
  Sandbox box;
  // Scaled to CI's two cores: 3 processes x 2 runs each (the issue measured 8 x 12 by hand).
  constexpr int kWriters = 3, kRunsEach = 2;
  std::vector<pid_t> writers;
  const std::string spec = kFaults;
  for (int w = 0; w < kWriters; ++w) {
    writers.push_back(box.start({"run", spec, spec, "--device", "cpu", "--set", R"(variants={"fused":{"impl":"fused"}})"},
                                -1));
  }
  for (pid_t pid : writers) CHECK(Sandbox::wait_for(pid) == 0);
  Db db(box.db());
  CHECK(db.value("SELECT count(*) FROM runs WHERE status = 'ok'") == std::to_string(kWriters * kRunsEach));
  CHECK(db.value("SELECT count(*) FROM trials WHERE status = 'ok'") == std::to_string(kWriters * kRunsEach));
  check_trials_whole(box.db());
  check_integrity(box.db());
}

TEST_CASE("a db in a read-only folder: runs, show, diff and writeup work, run says why it cannot", "[faults]") {
  Sandbox box;
  const fs::path data = box.dir / "data", readonly = box.dir / "readonly";
  fs::create_directories(data);
  const std::string db_path = (data / "test.db").string();
  REQUIRE(box.run(run_args(R"({"fused":{"impl":"fused"}})"), db_path).exit_code == 0);
  REQUIRE(box.run(run_args(R"({"fused":{"impl":"fused"}})"), db_path).exit_code == 0);
  // A read-only bind mount is read-only for root too (chmod is not); without mount rights, chmod.
  fs::create_directories(readonly);
  bool mounted = ::mount(data.c_str(), readonly.c_str(), nullptr, MS_BIND, nullptr) == 0 &&
                 ::mount(nullptr, readonly.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) == 0;
  if (!mounted) {
    ::umount2(readonly.c_str(), MNT_DETACH);
    fs::remove(readonly);
    fs::permissions(data, fs::perms::owner_read | fs::perms::owner_exec);
    fs::create_directory_symlink(data, readonly);
  }
  struct Restore {
    fs::path data, readonly;
    bool mounted;
    ~Restore() {
      if (mounted) ::umount2(readonly.c_str(), MNT_DETACH);
      std::error_code ignored;
      fs::permissions(data, fs::perms::owner_all, ignored);
    }
  } restore{data, readonly, mounted};
  if (!mounted && ::access(data.c_str(), W_OK) == 0) {
    HARNESS_SKIP("cannot make a folder read-only here (root without mount rights)");
  }
  const std::string ro_db = (readonly / "test.db").string();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"runs"}, {"show", "1"}, {"diff", "1", "2"}, {"writeup", "1"}, {"db", "check"}}) {
    const auto result = box.run(args, ro_db);
    INFO(args.front() << ": " << result.err);
    CHECK(result.exit_code == 0);
  }
  const auto run = box.run(run_args(R"({"fused":{"impl":"fused"}})"), ro_db);
  CHECK(run.exit_code == 3);
  CHECK(run.err.find("read-only") != std::string::npos);
  Db db(db_path);
  CHECK(db.value("SELECT count(*) FROM runs") == "2");
  check_integrity(db_path);
}

TEST_CASE("random bytes in a db's pages: run refuses to append, db check says damaged", "[faults]") {
  Sandbox box;
  for (int i = 0; i < 3; ++i) REQUIRE(box.run(run_args(R"({"fused":{"impl":"fused"}})")).exit_code == 0);
  REQUIRE(box.run({"db", "vacuum"}).exit_code == 0);  // every page in the main file
  const auto size = fs::file_size(box.db());
  REQUIRE(size > 3 * 4096);
  // Random-looking bytes over the trials table's root page, b-tree header included.
  const int64_t root_page = std::stoll(Db(box.db()).value("SELECT rootpage FROM sqlite_master WHERE name = 'trials'"));
  {
    std::fstream file(box.db(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp((root_page - 1) * 4096);
    for (int i = 0; i < 3000; ++i) file.put(static_cast<char>((i * 2654435761u) >> 13));
  }
  const auto run = box.run(run_args(R"({"fused":{"impl":"fused"}})"));
  INFO(run.err);
  CHECK(run.exit_code == 3);
  CHECK((run.err.find("damaged") != std::string::npos || run.err.find("malformed") != std::string::npos));
  CHECK(fs::file_size(box.db()) == size);
  const auto check = box.run({"db", "check", "--json"});
  CHECK(check.exit_code == 3);
  CHECK(Json::parse(check.out)["integrity"].is_array());
}
