// The process seam (util/process.h) on both platforms: ids, existence, watches that see an exit,
// and child processes (arguments passed through intact, exit codes, kills).
#include "util/process.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "support/test_support.h"

namespace expertd {
namespace {

using ::expertd::testing::ReadWholeFile;
using ::expertd::testing::TempDir;

const std::string kChild = EXPERTD_PROCESS_CHILD;

// Polls `done` for up to 10 s.
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

TEST(ProcessTest, ThisProcessExists) {
  EXPECT_GT(CurrentProcessId(), 0);
  EXPECT_TRUE(ProcessExists(CurrentProcessId()));
  EXPECT_FALSE(ProcessExists(0));
  EXPECT_FALSE(ProcessExists(-5));
  EXPECT_FALSE(ProcessWatch::Open(0).valid());
  EXPECT_FALSE(ProcessWatch().Exited());
}

TEST(ProcessTest, ChildGetsItsArgumentsAndReturnsItsExitCode) {
  TempDir dir;
  const std::string out = dir.File("args.txt");
  // Spaces, quotes, backslashes before a quote and at the end, an empty argument.
  const std::vector<std::string> args = {"plain", "two words", "say \"hi\"", "a\\\\\"b",
                                         "ends\\", "", "tab\there"};
  std::vector<std::string> argv = {kChild, out, "0", "7"};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<ChildProcess> child = ChildProcess::Start(argv);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_GT(child->pid(), 0);
  EXPECT_NE(child->pid(), CurrentProcessId());
  absl::StatusOr<int> code = child->Wait();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 7);
  std::string expected;
  for (const std::string& a : args) expected += a + "\n";
  EXPECT_EQ(ReadWholeFile(out), expected);
  EXPECT_FALSE(child->Wait().ok());  // reaped once
}

TEST(ProcessTest, WatchSeesTheExitOfAKilledChild) {
  TempDir dir;
  absl::StatusOr<ChildProcess> child =
      ChildProcess::Start({kChild, dir.File("out.txt"), "60000", "0"});
  ASSERT_TRUE(child.ok()) << child.status();
  const int64_t pid = child->pid();
  ProcessWatch watch = ProcessWatch::Open(pid);
  ASSERT_TRUE(watch.valid());
  EXPECT_TRUE(ProcessExists(pid));
  // Still running a while later (it sleeps for a minute).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(watch.Exited());
  child->Kill();
  EXPECT_TRUE(Eventually([&] { return watch.Exited(); }));
  absl::StatusOr<int> code = child->Wait();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_NE(*code, 0);
  EXPECT_TRUE(watch.Exited());
  ProcessWatch moved = std::move(watch);
  EXPECT_TRUE(moved.Exited());
  EXPECT_FALSE(watch.valid());  // NOLINT(bugprone-use-after-move): moved-from is invalid
}

TEST(ProcessTest, WatchSeesANormalExit) {
  TempDir dir;
  absl::StatusOr<ChildProcess> child = ChildProcess::Start({kChild, dir.File("o"), "300", "0"});
  ASSERT_TRUE(child.ok()) << child.status();
  ProcessWatch watch = ProcessWatch::Open(child->pid());
  ASSERT_TRUE(watch.valid());
  EXPECT_TRUE(Eventually([&] { return watch.Exited(); }));
  EXPECT_EQ(child->Wait().value_or(-1), 0);
}

TEST(ProcessTest, DestroyingARunningChildEndsIt) {
  TempDir dir;
  ProcessWatch watch;
  {
    absl::StatusOr<ChildProcess> child =
        ChildProcess::Start({kChild, dir.File("o"), "60000", "0"});
    ASSERT_TRUE(child.ok()) << child.status();
    watch = ProcessWatch::Open(child->pid());
    ASSERT_TRUE(watch.valid());
  }
  EXPECT_TRUE(watch.Exited());  // killed and reaped by the destructor
}

TEST(ProcessTest, MissingProgramIsAnError) {
  TempDir dir;
  absl::StatusOr<ChildProcess> child = ChildProcess::Start({dir.File("no-such-program")});
  ASSERT_FALSE(child.ok());
  EXPECT_NE(child.status().message().find("no-such-program"), std::string::npos) << child.status();
  EXPECT_FALSE(ChildProcess::Start({}).ok());
}

}  // namespace
}  // namespace expertd
