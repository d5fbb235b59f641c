// Shared memory between real processes on one host: what a crash, another user, or a small
// /dev/shm does to it. Each case starts bus_fixture_node processes that link by default (the
// transport is chosen per peer) and checks what users of other shared-memory systems hit: files
// left in /dev/shm after kill -9 and restarts that then fail, segments others can open, a process
// killed mid-write or while holding a loaned buffer wedging the others, SIGBUS in a container's
// 64 MB /dev/shm.
#include <absl/strings/str_cat.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "integration/node_process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using integ::cat;
using integ::NodeProcess;

namespace {

// Transport auto, whatever BUS_TEST_TRANSPORT says: these cases are about the link.
std::vector<std::string> node(const std::string& name, std::vector<std::string> flags) {
  flags.insert(flags.begin(), {"--name=" + name, "--transport=auto"});
  return flags;
}

/// The names in /dev/shm (a container's or the host's): what a crash could leave behind.
std::set<std::string> dev_shm() {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    names.insert(e.path().filename().string());
  }
  return names;
}

/// The memfd segments `pid` holds open, by descriptor path, with their modes.
struct Memfd {
  std::string name;
  mode_t mode;
};
std::vector<Memfd> memfds(pid_t pid) {
  std::vector<Memfd> out;
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    char target[256];
    ssize_t n = ::readlink(e.path().c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    std::string t(target, static_cast<std::size_t>(n));
    if (t.rfind("/memfd:bus.", 0) != 0) continue;
    struct stat st {};
    if (::stat(e.path().c_str(), &st) != 0) continue;  // closed meanwhile
    out.push_back({t, st.st_mode & 07777});
  }
  return out;
}

/// Waits until `a` reports `peer` (a node it listens to) reached over `transport`.
bool reaches(NodeProcess& a, const std::string& peer, const std::string& transport) {
  return bus_test::eventually([&] { return a.report().str("transport." + peer) == transport; },
                              60s);
}

/// Waits until `a` has made `n` links in all (a publisher does not list its subscribers among
/// the peers it listens to, but links to them all the same).
bool linked(NodeProcess& a, uint64_t n) {
  return bus_test::eventually([&] { return a.report().num("shm_links") >= n; }, 60s);
}

/// The readings a subscriber took are exactly 1..n, each whole.
void expect_a_whole_prefix(const integ::Answer& r) {
  const uint64_t n = r.num("received");
  EXPECT_EQ(r.num("sum"), n * (n + 1) / 2) << r.line;
  EXPECT_EQ(r.num("torn_readings"), 0u) << r.line;
}

bool root() { return ::geteuid() == 0; }

}  // namespace

TEST(SharedMemoryProcesses, AKilledProcessLeavesNothingBehindAndItsRestartLinksAgain) {
  const std::set<std::string> before = dev_shm();
  NodeProcess pub(node("pub", {"--export-readings"}));
  ASSERT_TRUE(pub.ready());
  const std::size_t pub_alone = memfds(pub.pid()).size();
  {
    NodeProcess sub(node("sub", {"--import-readings", pub.as_peer()}));
    ASSERT_TRUE(sub.ready());
    ASSERT_TRUE(reaches(sub, "pub", "shm"));
    ASSERT_EQ(pub.ask("wait-subscribers 1").num("n"), 1u);
    ASSERT_TRUE(linked(pub, 1));

    // Its segments: owner only (no shm_group), so no other user can open them through /proc.
    std::vector<Memfd> held = memfds(pub.pid());
    ASSERT_GT(held.size(), pub_alone);
    for (const Memfd& m : held) EXPECT_EQ(m.mode, 0600u) << m.name;

    ASSERT_EQ(pub.ask("publish 1000").num("refused"), 0u);
    ASSERT_TRUE(bus_test::eventually([&] { return sub.report().num("received") >= 1000; }, 60s));
    integ::Answer r = sub.report();
    EXPECT_EQ(r.num("received"), 1000u) << r.line;
    expect_a_whole_prefix(r);
    EXPECT_EQ(r.num("readings.gaps"), 0u) << r.line;
    sub.kill();  // kill -9
  }
  // Nothing named anywhere: the segments were memfds, the socket abstract. The publisher lets go
  // of the link's segment when the socket closes, not after a timeout.
  EXPECT_EQ(dev_shm(), before);
  EXPECT_TRUE(bus_test::eventually([&] { return memfds(pub.pid()).size() == pub_alone; }, 60s))
      << memfds(pub.pid()).size() << " segments, " << pub_alone << " before the link";

  // The same name again, at once: a new link, and every reading of the new burst.
  NodeProcess sub(node("sub", {"--import-readings", pub.as_peer()}));
  ASSERT_TRUE(sub.ready());
  ASSERT_TRUE(reaches(sub, "pub", "shm"));
  ASSERT_TRUE(linked(pub, 2));
  ASSERT_EQ(pub.ask("wait-subscribers 1").num("n"), 1u);
  ASSERT_EQ(pub.ask("publish 1000").num("refused"), 0u);
  ASSERT_TRUE(bus_test::eventually([&] { return sub.report().num("received") >= 1000; }, 60s));
  integ::Answer r = sub.report();
  EXPECT_EQ(r.num("received"), 1000u) << r.line;
  EXPECT_EQ(r.num("torn_readings"), 0u) << r.line;
  EXPECT_GE(pub.report().num("shm_links"), 2u);
  EXPECT_TRUE(sub.quit());
  EXPECT_TRUE(pub.quit());
  EXPECT_EQ(dev_shm(), before);
}

TEST(SharedMemoryProcesses, AWriterKilledMidFrameCostsItsReaderOnlyThatFrameCountedAsLost) {
  // The publisher dies (SIGKILL, from the failpoint) halfway through copying the 300th frame it
  // writes into a link: the reader finds the frame marked as being written by a dead process.
  NodeProcess pub(node("pub", {"--export-readings", "--reading-bytes=2048"}),
                  {"env", "BUS_NET_FAILPOINT=shm-die-mid-frame:300"});
  ASSERT_TRUE(pub.ready());
  NodeProcess sub(node("sub", {"--import-readings", pub.as_peer()}));
  ASSERT_TRUE(sub.ready());
  ASSERT_TRUE(reaches(sub, "pub", "shm"));
  ASSERT_EQ(pub.ask("wait-subscribers 1").num("n"), 1u);
  ASSERT_TRUE(linked(pub, 1));

  integ::Answer died = pub.ask("publish-at 200000 20000");
  EXPECT_EQ(died.word, "") << "the failpoint did not fire: " << died.line;

  integ::Answer r;
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        r = sub.report();
        return r.num("shm_torn_frames") == 1;
      },
      60s))
      << r.line;
  // Everything before the torn frame arrived whole; nothing of it was handed on; what it held
  // (when it held readings, not a heartbeat) is counted as missed, so the books still balance.
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        r = sub.report();
        return r.num("received") == r.num("readings.received");
      },
      60s));
  EXPECT_GT(r.num("received"), 0u) << r.line;
  expect_a_whole_prefix(r);
  EXPECT_EQ(r.num("shm_corrupt"), 0u) << r.line;
  // Nothing is wedged: the publisher restarted on its addresses links again, and is read.
  const uint64_t had = r.num("received");
  NodeProcess again(
      node("pub", cat({"--export-readings", "--reading-bytes=2048"}, pub.same_addresses())));
  ASSERT_TRUE(again.ready());
  ASSERT_EQ(again.ask("wait-subscribers 1").num("n"), 1u);
  ASSERT_TRUE(linked(again, 1));
  ASSERT_EQ(again.ask("publish 500").num("refused"), 0u);
  ASSERT_TRUE(
      bus_test::eventually([&] { return (r = sub.report()).num("received") >= had + 500; }, 60s))
      << r.line;
  EXPECT_EQ(r.num("received"), had + 500) << r.line;
  EXPECT_EQ(r.num("torn_readings"), 0u) << r.line;
  EXPECT_EQ(r.num("shm_torn_frames"), 1u) << r.line;
  EXPECT_TRUE(sub.quit());
  EXPECT_TRUE(again.quit());
}

TEST(SharedMemoryProcesses, AReaderKilledWhileHoldingLargeMessagesReleasesThemInTheWriter) {
  // 64 KiB readings go as heap blocks read in place: the subscriber keeps every one, so the
  // publisher holds (pins) them for it. Dropping them, or dying, gives them back.
  const std::vector<std::string> large = {"--reading-bytes=65536", "--max-message-bytes=1048576"};
  NodeProcess pub(node("pub", cat({"--export-readings"}, large)));
  ASSERT_TRUE(pub.ready());
  NodeProcess sub(node("sub", cat({"--import-readings", "--keep-readings", pub.as_peer()}, large)));
  ASSERT_TRUE(sub.ready());
  ASSERT_TRUE(reaches(sub, "pub", "shm"));
  ASSERT_EQ(pub.ask("wait-subscribers 1").num("n"), 1u);
  ASSERT_TRUE(linked(pub, 1));

  ASSERT_EQ(pub.ask("publish 50").num("refused"), 0u);
  integ::Answer r;
  ASSERT_TRUE(bus_test::eventually([&] { return (r = sub.report()).num("kept") == 50; }, 60s))
      << r.line;
  EXPECT_EQ(r.num("shm_in_place"), 50u) << r.line;
  expect_a_whole_prefix(r);
  integ::Answer p;
  ASSERT_TRUE(bus_test::eventually(
      [&] { return (p = pub.report()).num("shm_pinned_bytes") >= 50u * 65536; }, 60s))
      << p.line;

  ASSERT_EQ(sub.ask("drop").word, "dropped");
  EXPECT_TRUE(
      bus_test::eventually([&] { return (p = pub.report()).num("shm_pinned_bytes") == 0; }, 60s))
      << p.line;

  ASSERT_EQ(pub.ask("publish 50").num("refused"), 0u);
  ASSERT_TRUE(bus_test::eventually([&] { return (r = sub.report()).num("kept") == 50; }, 60s))
      << r.line;
  ASSERT_TRUE(bus_test::eventually(
      [&] { return (p = pub.report()).num("shm_pinned_bytes") >= 50u * 65536; }, 60s))
      << p.line;
  sub.kill();
  EXPECT_TRUE(
      bus_test::eventually([&] { return (p = pub.report()).num("shm_pinned_bytes") == 0; }, 60s))
      << p.line;
  // And the heap is the publisher's to use again.
  NodeProcess sub2(node("sub2", cat({"--import-readings", pub.as_peer()}, large)));
  ASSERT_TRUE(sub2.ready());
  ASSERT_EQ(pub.ask("wait-subscribers 1").num("n"), 1u);
  ASSERT_TRUE(linked(pub, 2));
  ASSERT_EQ(pub.ask("publish 200").num("refused"), 0u);
  ASSERT_TRUE(bus_test::eventually([&] { return (r = sub2.report()).num("received") == 200; }, 60s))
      << r.line;
  EXPECT_EQ(r.num("torn_readings"), 0u) << r.line;
  EXPECT_EQ(pub.report().num("shm_heap_full"), 0u);
  EXPECT_TRUE(sub2.quit());
  EXPECT_TRUE(pub.quit());
}

TEST(SharedMemoryProcesses, AProcessOfAnotherUserIsRefusedAndReachedOverZeroMq) {
  if (!root()) GTEST_SKIP() << "needs root to start a process as another user";
  const std::vector<std::string> as_nobody = {"setpriv", "--reuid=65534", "--regid=65534",
                                              "--clear-groups"};
  std::string probe = absl::StrCat("setpriv --reuid=65534 --regid=65534 --clear-groups test -x '",
                                   BUS_FIXTURE_NODE, "'");
  if (std::system(probe.c_str()) != 0) {
    GTEST_SKIP() << "user 65534 cannot run " << BUS_FIXTURE_NODE << " from this folder";
  }
  NodeProcess pub(node("pub", {"--export-readings"}));
  ASSERT_TRUE(pub.ready());
  NodeProcess sub(node("sub", {"--import-readings", pub.as_peer()}), as_nobody);
  ASSERT_TRUE(sub.ready());
  ASSERT_EQ(pub.ask("wait-subscribers 1").num("n"), 1u);
  ASSERT_EQ(pub.ask("publish 500").num("refused"), 0u);
  integ::Answer r;
  ASSERT_TRUE(bus_test::eventually([&] { return (r = sub.report()).num("received") >= 500; }, 60s))
      << r.line;
  EXPECT_EQ(r.num("received"), 500u) << r.line;
  EXPECT_EQ(r.str("transport.pub"), "zmq") << r.line;
  // Whichever end was asked denied it (an authentication denial) and the end that asked counted
  // a refused link (when it read the answer: maybe after the readings arrived over ZeroMQ).
  integ::Answer p;
  EXPECT_TRUE(bus_test::eventually(
      [&] {
        p = pub.report();
        r = sub.report();
        return p.num("auth_denied") + r.num("auth_denied") >= 1 &&
               p.num("shm_refused") + r.num("shm_refused") >= 1;
      },
      60s))
      << p.line << "\n"
      << r.line;
  EXPECT_EQ(p.num("shm_links") + r.num("shm_links"), 0u) << p.line << "\n" << r.line;
  EXPECT_TRUE(sub.quit());
  EXPECT_TRUE(pub.quit());
}

TEST(SharedMemoryProcesses, FourMegabyteMessagesCrossWhereDevShmHoldsOneMegabyte) {
  if (!root()) GTEST_SKIP() << "needs root to mount a tmpfs in a mount namespace";
  // Each process sees a 1 MiB /dev/shm of its own (Docker's is 64 MB): the segments are memfds,
  // which do not live there, so nothing fills it and nothing ends in SIGBUS.
  const std::vector<std::string> small_dev_shm = {
      "unshare",
      "-m",
      "--propagation",
      "private",
      "sh",
      "-c",
      "mount -t tmpfs -o size=1m tmpfs /dev/shm && exec \"$0\" \"$@\""};
  if (std::system("unshare -m --propagation private sh -c 'mount -t tmpfs -o size=1m tmpfs "
                  "/dev/shm'") != 0) {
    GTEST_SKIP() << "this machine does not allow mount namespaces here";
  }
  const std::vector<std::string> large = {"--reading-bytes=4194304",
                                          "--max-message-bytes=16777216"};
  NodeProcess pub(node("pub", cat({"--export-readings"}, large)), small_dev_shm);
  ASSERT_TRUE(pub.ready());
  NodeProcess sub(node("sub", cat({"--import-readings", pub.as_peer()}, large)), small_dev_shm);
  ASSERT_TRUE(sub.ready());
  ASSERT_TRUE(reaches(sub, "pub", "shm"));
  ASSERT_EQ(pub.ask("wait-subscribers 1").num("n"), 1u);
  ASSERT_TRUE(linked(pub, 1));
  ASSERT_EQ(pub.ask("publish 40").num("refused"), 0u);  // 160 MiB through a 1 MiB /dev/shm
  integ::Answer r;
  ASSERT_TRUE(bus_test::eventually([&] { return (r = sub.report()).num("received") >= 40; }, 60s))
      << r.line;
  EXPECT_EQ(r.num("received"), 40u) << r.line;
  expect_a_whole_prefix(r);
  EXPECT_EQ(r.num("shm_in_place"), 40u) << r.line;
  EXPECT_TRUE(sub.quit());
  EXPECT_TRUE(pub.quit());
}
