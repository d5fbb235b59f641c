// The C++ side of the interop test: one bus node that the Python peer (interop_peer.py) joins
// through the wire protocol alone (docs/wire-protocol.md). The Python peer starts this program,
// reads its first line ("ready ...") and then talks to it; what this side checks is printed as
// "ok:" / "FAIL:" lines and decides the exit code.
//
// Channels (the Python peer uses the same names and schema ids):
//   interop.cpp.readings  topic     Reading                     this node -> Python
//   interop.py.readings   topic     Reading                     Python -> this node
//   interop.py.stats      endpoint  StatsRequest -> StatsReply  served by Python
//   interop.cpp.stats     endpoint  StatsRequest -> StatsReply  served here
//   interop.cpp.jobs      queue     Reading                     Python -> this node
#include <absl/flags/flag.h>
#include <absl/flags/parse.h>
#include <absl/strings/str_cat.h>
#include <bus/schemas/demo.capnp.h>

#include <atomic>
#include <bus/net/node.hpp>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/test_support.hpp"

ABSL_FLAG(std::string, peer, "", "the Python peer's publisher endpoint");
ABSL_FLAG(std::string, peer_key, "", "the Python peer's CURVE public key (Z85): turns CURVE on");
ABSL_FLAG(uint64_t, readings, 300, "readings to publish on interop.cpp.readings");
ABSL_FLAG(uint64_t, py_readings, 0, "readings expected from Python on interop.py.readings");
ABSL_FLAG(uint64_t, py_gaps, 0, "sequence numbers Python skips on purpose");
ABSL_FLAG(uint64_t, py_rejected, 0, "readings Python sends with a wrong type id");
ABSL_FLAG(uint64_t, calls, 10, "successful calls to interop.py.stats");
ABSL_FLAG(uint64_t, py_calls, 0, "successful calls Python makes to interop.cpp.stats");
ABSL_FLAG(uint64_t, jobs, 0, "queue messages expected from Python on interop.cpp.jobs");

namespace {

using namespace std::chrono_literals;
using Reading = bus::Message<demo::Reading>;
using StatsRequest = bus::Message<demo::StatsRequest>;
using StatsReply = bus::Message<demo::StatsReply>;

inline const bus::Topic<Reading> cpp_readings{"interop.cpp.readings"};
inline const bus::Topic<Reading> py_readings{"interop.py.readings"};
inline const bus::Endpoint<StatsRequest, StatsReply> py_stats{"interop.py.stats"};
inline const bus::Endpoint<StatsRequest, StatsReply> cpp_stats{"interop.cpp.stats"};
inline const bus::Queue<Reading> jobs{"interop.cpp.jobs"};

int passed = 0, failed = 0;

void check(bool ok, const std::string& what) {
  (ok ? passed : failed)++;
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
  std::fflush(stdout);
}

using bus_test::eventually;

/// What arrived from Python, written by handlers on executors.
struct Received {
  std::mutex mu;
  std::vector<uint64_t> reading_seqs;
  bool readings_match = true;
  uint64_t job_count = 0, job_seq_sum = 0;
  bool jobs_match = true;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string peer = absl::GetFlag(FLAGS_peer);
  if (peer.empty()) {
    std::fprintf(stderr, "usage: interop_node --peer=PYTHON_PUBLISH_ADDRESS [...]\n");
    return 2;
  }
  const std::string peer_key = absl::GetFlag(FLAGS_peer_key);

  bus::Bus bus{bus::Options().executors(2)};
  Received got;
  auto sub = bus.subscribe(py_readings, [&](const Reading& r) {
    std::lock_guard lock(got.mu);
    uint64_t seq = r->getSeq();
    got.reading_seqs.push_back(seq);
    // Python sends sensor "py", value 1.5 * seq, unixNanos 1000 * seq.
    if (std::string(r->getSensor().cStr()) != "py" || r->getValue() != 1.5 * seq ||
        r->getUnixNanos() != static_cast<int64_t>(1000 * seq)) {
      got.readings_match = false;
    }
  });
  auto consumer = bus.consume(jobs, [&](Reading&& r) {
    std::lock_guard lock(got.mu);
    ++got.job_count;
    got.job_seq_sum += r->getSeq();
    if (std::string(r->getSensor().cStr()) != "job") got.jobs_match = false;
  });
  std::atomic<uint64_t> served{0};
  auto server = bus.serve(cpp_stats, [&](StatsRequest&& req) {
    served.fetch_add(1);
    return bus::build<demo::StatsReply>([&](demo::StatsReply::Builder r) {
      r.setReadings(7);
      r.setMissed(3);
      auto s = r.initSensors(1);
      s[0].setSensor(req->getSensor());
      s[0].setCount(42);
      s[0].setMean(0.5);
    });
  });

  auto options = bus::net::NodeOptions()
                     .name("cpp-node")
                     .publish_on("tcp://127.0.0.1:*")
                     .requests_on("tcp://127.0.0.1:*")
                     // Python's heartbeat interval times 20: generous for a loaded CI machine.
                     .heartbeat(100ms, 20);
  bus::net::CurveKeys keys;
  if (!peer_key.empty()) {
    keys = bus::net::CurveKeys::generate();
    options.curve(keys, {peer_key}).peer(peer, peer_key);
  } else {
    options.peer(peer);
  }
  bus::net::Node node(bus, options);
  node.export_topic(cpp_readings)
      .import_topic(py_readings)
      .import_endpoint(py_stats)
      .export_endpoint(cpp_stats)
      .export_queue(jobs);
  std::printf("ready pub=%s req=%s id=%llu key=%s\n", node.publish_address().c_str(),
              node.request_address().c_str(), static_cast<unsigned long long>(node.id()),
              keys.public_key.empty() ? "-" : keys.public_key.c_str());
  std::fflush(stdout);

  // Topic: this node -> Python (Python checks the content and the sequence numbers).
  const uint64_t n = absl::GetFlag(FLAGS_readings);
  check(node.wait_for_subscribers(cpp_readings.name(), 1, 30s),
        "the Python peer subscribed to interop.cpp.readings");
  uint64_t refused = 0;
  for (uint64_t i = 1; i <= n; ++i) {
    auto r = bus::build<demo::Reading>([&](demo::Reading::Builder b) {
      b.setSensor("cpp");
      b.setSeq(i);
      b.setValue(0.25 * static_cast<double>(i));
      b.setUnixNanos(static_cast<int64_t>(i) * 1000);
    });
    if (!bus.publish(cpp_readings, std::move(r)).ok()) ++refused;
  }
  check(refused == 0, absl::StrCat("published ", n, " readings (", refused, " refused)"));

  // Requests: this node -> Python's ROUTER, through a DEALER found from its heartbeat.
  check(node.wait_for_server(py_stats.name(), 30s),
        "the Python peer's heartbeat announced interop.py.stats");
  bool peer_listed = false;
  for (const auto& p : node.peers()) {
    if (p.name != "py-peer") continue;
    bool serves = false, imports = false;
    for (const auto& s : p.serves) serves |= s == py_stats.name();
    for (const auto& s : p.imports) imports |= s == cpp_readings.name();
    peer_listed = serves && imports && !p.request_address.empty();
  }
  check(peer_listed, "peers() lists py-peer with its endpoint, serves and imports");
  const uint64_t calls = absl::GetFlag(FLAGS_calls);
  uint64_t good = 0;
  for (uint64_t i = 1; i <= calls; ++i) {
    std::string sensor = absl::StrCat("q", i);
    auto rep = bus.call(
        py_stats,
        bus::build<demo::StatsRequest>([&](demo::StatsRequest::Builder b) { b.setSensor(sensor); }),
        5s);
    if (!rep.ok()) {
      check(false, absl::StrCat("call ", i, " to interop.py.stats: ", rep.status().ToString()));
      continue;
    }
    // Python answers readings = 1000 + i, one SensorStats named after the request, mean 2.5.
    auto r = **rep;
    if (r.getReadings() == 1000 + i && r.getSensors().size() == 1 &&
        std::string(r.getSensors()[0].getSensor().cStr()) == sensor &&
        r.getSensors()[0].getMean() == 2.5) {
      ++good;
    }
  }
  check(good == calls, absl::StrCat(good, "/", calls, " calls to interop.py.stats answered right"));
  auto missing = bus.call(
      py_stats,
      bus::build<demo::StatsRequest>([](demo::StatsRequest::Builder b) { b.setSensor("missing"); }),
      5s);
  check(!missing.ok() && missing.status().code() == absl::StatusCode::kNotFound &&
            missing.status().message() == "no sensor 'missing'",
        absl::StrCat("a Python error reply keeps its code and detail (got ",
                     missing.status().ToString(), ")"));

  // Topic: Python -> this node, with one skipped sequence number and one wrong-type frame.
  const uint64_t want = absl::GetFlag(FLAGS_py_readings);
  const uint64_t want_gaps = absl::GetFlag(FLAGS_py_gaps);
  const uint64_t want_rejected = absl::GetFlag(FLAGS_py_rejected);
  bool all = eventually([&] {
    std::lock_guard lock(got.mu);
    return got.reading_seqs.size() >= want;
  });
  {
    std::lock_guard lock(got.mu);
    check(all && got.reading_seqs.size() == want && got.readings_match,
          absl::StrCat("received ", got.reading_seqs.size(), "/", want,
                       " Python readings with the right content"));
  }
  auto t = node.stats().channel(py_readings.name());
  check(t.received == want && t.gaps == want_gaps && t.rejected == want_rejected,
        absl::StrCat("interop.py.readings counters: received ", t.received, " gaps ", t.gaps,
                     " rejected ", t.rejected, " (want ", want, ", ", want_gaps, ", ",
                     want_rejected, ")"));

  // Queue: Python's DEALER -> this node's ROUTER.
  const uint64_t want_jobs = absl::GetFlag(FLAGS_jobs);
  all = eventually([&] {
    std::lock_guard lock(got.mu);
    return got.job_count >= want_jobs;
  });
  {
    std::lock_guard lock(got.mu);
    check(all && got.job_count == want_jobs && got.jobs_match &&
              got.job_seq_sum == want_jobs * (want_jobs + 1) / 2,
          absl::StrCat("consumed ", got.job_count, "/", want_jobs, " Python queue messages"));
  }

  // Requests: Python -> this node.
  const uint64_t want_served = absl::GetFlag(FLAGS_py_calls);
  check(eventually([&] { return served.load() >= want_served; }) && served == want_served,
        absl::StrCat("served ", served.load(), "/", want_served, " Python calls"));

  // The Python peer says goodbye (leaving = true) once its own checks are done.
  check(eventually([&] { return node.peers().empty(); }, 60s),
        "the Python peer's leaving heartbeat removed it from peers()");
  auto s = node.stats();
  check(s.malformed_frames == 0, absl::StrCat("no malformed frames (", s.malformed_frames, ")"));
  node.stop();  // sends this node's leaving heartbeat, which Python checks
  std::printf("interop_node: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
