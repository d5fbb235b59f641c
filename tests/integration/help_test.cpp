// Every program we ship says what it is and lists its own flags under --help (Abseil's default
// lists only flags declared in a file named after the program, and said "No flags matched").
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "integration/process.hpp"

namespace {

struct Program {
  const char* path;
  const char* flag;  // one of its own flags, as --help lists it
};

}  // namespace

TEST(Help, EveryShippedProgramListsItsOwnFlags) {
  const std::vector<Program> programs = {
      {GREETING_SERVER, "--io_threads"},
      {GREETING_SERVICE, "--publish"},
      {SHOP_SERVER, "--deadline_ms"},
      {DEMO_PRODUCER, "--rate"},
      {DEMO_AGGREGATOR, "--requests"},
      {DEMO_MONITOR, "--peers"},
      {BUSCTL, "--schema"},
  };
  for (const Program& p : programs) {
    SCOPED_TRACE(p.path);
    std::string out;
    integ::run_command({p.path, "--help"}, &out);
    EXPECT_NE(out.find(p.flag), std::string::npos) << out;
    EXPECT_EQ(out.find("No flags matched"), std::string::npos) << out;
    EXPECT_EQ(out.find("SetProgramUsageMessage() never called"), std::string::npos) << out;
  }
}
