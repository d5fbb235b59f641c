// docs/wire-protocol.md, kept true: §6's liveness bound, checked on PeerTable with a clock of the
// test's own (never the machine's), and §13's hexdumps, read from the document at run time and
// compared byte for byte with what the encoders make of the values the document states.
#include <bus/schemas/demo.capnp.h>
#include <bus/schemas/envelope.capnp.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bus/net/options.hpp>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../../bus/net/peers.hpp"
#include "../../bus/net/wire.hpp"

using namespace std::chrono_literals;
using bus::Clock;
using bus::net::NodeOptions;
using bus::net::detail::PeerState;
using bus::net::detail::PeerTable;
using std::chrono::milliseconds;

namespace {

// ---- §6: liveness ------------------------------------------------------------------------------

constexpr uint64_t kPeer = 7;
// Far from the clock's zero, which PeerTable takes for "never checked".
const Clock::time_point kStart{std::chrono::hours(1)};

/// A node's peer table with one peer, run on the test's clock.
class Receiver {
 public:
  Receiver(milliseconds heartbeat, unsigned dead_after, milliseconds peer_interval)
      : table_(heartbeat, dead_after) {
    bool fresh = false;
    PeerState& p = table_.emplace(kPeer, fresh);
    p.id = kPeer;
    p.interval = peer_interval;
  }
  /// A frame of the peer arrived at `t` (what the bridge does with a heartbeat).
  void hear(Clock::time_point t) { table_.find(kPeer)->last_seen = t; }
  /// A check at `t`, as the bridge runs it (nothing waits unread); true when it finds the peer
  /// dead.
  bool check(Clock::time_point t, bool input_waiting = false) {
    return !table_.silent([&](const PeerState&) { return input_waiting; }, t).empty();
  }
  const PeerTable& table() const { return table_; }

 private:
  PeerTable table_;
};

/// When the bridge checks its peers (Bridge::beat_and_check, bus/net/bridge.cpp), with a loop
/// that wakes when it is due: a heartbeat on each multiple of the interval (Bridge::next_beat)
/// or at once (`beat_at`: a new peer, a channel added), and a check in the pass of a heartbeat
/// once the last check is half an interval old, else an interval after the last check.
class BridgeCadence {
 public:
  BridgeCadence(Clock::duration every, Clock::time_point start)
      : every_(every), next_beat_(start), next_check_(start) {}
  /// The bridge sends a heartbeat at once at `t` (no sooner than the last check).
  void beat_at(Clock::time_point t) { extra_beat_ = std::max(t, next_check_ - every_); }
  /// The time of the next check.
  Clock::time_point next() {
    for (;;) {
      Clock::time_point beat_due = std::min(next_beat_, extra_beat_);
      Clock::time_point now = std::min(beat_due, next_check_);
      const bool beat = now >= beat_due;
      if (beat) {
        next_beat_ = Clock::time_point((now.time_since_epoch() / every_ + 1) * every_);
        extra_beat_ = Clock::time_point::max();
      }
      if (now >= next_check_ || (beat && now >= next_check_ - every_ / 2)) {
        next_check_ = now + every_;
        return now;
      }
    }
  }

 private:
  const Clock::duration every_;
  Clock::time_point next_beat_, next_check_;
  Clock::time_point extra_beat_ = Clock::time_point::max();  // none
};

std::string millis(Clock::duration d) {
  return std::to_string(std::chrono::duration<double, std::milli>(d).count()) + " ms";
}

// The bound of §6: a peer last heard at t0 is declared dead at the first check after
// t0 + interval x N, so after more than interval x N and within one check interval of it.
TEST(WireDocLiveness, SilentPeerIsDeadAfterIntervalTimesNAndWithinOneCheckOfIt) {
  const NodeOptions defaults;
  const milliseconds h = defaults.heartbeat();
  struct Case {
    milliseconds peer_interval;
    unsigned dead_after;
  };
  // The peer's interval is its own: the same as ours, slower, faster than our checks.
  for (Case c : {Case{h, defaults.dead_after()}, Case{h * 5, defaults.dead_after()},
                 Case{h / 4, defaults.dead_after()}, Case{h, 1}}) {
    const Clock::duration deadline = c.peer_interval * c.dead_after;
    // Every phase of the last frame against our heartbeats, and heartbeats sent at once.
    for (Clock::duration phase = 0ms; phase < h; phase += 1ms) {
      for (int extra = -1; extra < 4; ++extra) {
        SCOPED_TRACE("peer interval " + millis(c.peer_interval) +
                     ", N = " + std::to_string(c.dead_after) + ", our heartbeat " + millis(h) +
                     ", last frame " + millis(phase) + " after one of our heartbeats, extra beat " +
                     std::to_string(extra));
        Receiver r(h, c.dead_after, c.peer_interval);
        BridgeCadence cadence(h, kStart);
        const Clock::time_point t0 = kStart + 3 * h + phase;
        Clock::time_point at = cadence.next();
        for (; at < t0; at = cadence.next()) {
          r.hear(at);  // alive until t0
          ASSERT_FALSE(r.check(at));
        }
        r.hear(t0);
        if (extra >= 0) cadence.beat_at(t0 + extra * h / 4);
        std::optional<Clock::time_point> dead;
        for (; at <= t0 + deadline + 4 * h; at = cadence.next()) {
          if (r.check(at)) {
            dead = at;
            break;
          }
        }
        ASSERT_TRUE(dead.has_value()) << "not declared dead by " << millis(at - t0);
        ASSERT_GT(*dead - t0, deadline) << "declared dead too soon";
        ASSERT_LE(*dead - t0, deadline + r.table().check_every()) << "declared dead too late";
      }
    }
  }
}

// A check late by up to half an interval counts its lateness: the bound stretches to
// interval x N + longest_counted_gap() of counted time, never more.
TEST(WireDocLiveness, LateChecksCountTheirLatenessUpToHalfAHeartbeat) {
  const NodeOptions defaults;
  const milliseconds h = defaults.heartbeat();
  const Clock::duration deadline = defaults.dead_after_time();  // the peer announces h too
  EXPECT_EQ(PeerTable(h, 1).longest_counted_gap(), h + h / 2)
      << "docs/wire-protocol.md §6 says 1.5 H: say what the code does";
  for (Clock::duration phase = 0ms; phase < h + h / 2; phase += 1ms) {
    SCOPED_TRACE("last frame " + millis(phase) + " into a gap");
    Receiver r(h, defaults.dead_after(), h);
    const Clock::duration gap = r.table().longest_counted_gap();  // the latest that counts
    const Clock::time_point t0 = kStart + gap + phase;
    Clock::time_point at = kStart;
    for (; at < t0; at += gap) {
      r.hear(at);
      ASSERT_FALSE(r.check(at));
    }
    r.hear(t0);
    for (; !r.check(at); at += gap) ASSERT_LE(at - t0, deadline + gap) << "not dead yet";
    ASSERT_GT(at - t0, deadline) << "declared dead too soon";
    ASSERT_LE(at - t0, deadline + gap) << "declared dead too late";
  }
}

// A gap between checks longer than longest_counted_gap() is time away (the process was
// stopped, the loop held up): the peer gets all of it past one check interval back, so a pause
// changes nothing in how many checks it takes to declare it dead.
TEST(WireDocLiveness, TimeAwayIsGivenBackToPeers) {
  const NodeOptions defaults;
  const milliseconds h = defaults.heartbeat();
  auto checks_until_dead = [&](Clock::duration pause) {
    Receiver r(h, defaults.dead_after(), h);
    Clock::time_point at = kStart;
    r.hear(at);
    EXPECT_FALSE(r.check(at));
    at += h + pause;  // the first check after the last frame comes late
    int checks = 1;
    for (; !r.check(at); at += h) ++checks;
    return checks;
  };
  const int steady = checks_until_dead(0ms);
  for (Clock::duration pause : {Clock::duration(h / 2 + 1ns), Clock::duration(10s),
                                Clock::duration(std::chrono::hours(2))}) {
    EXPECT_EQ(checks_until_dead(pause), steady) << "after a pause of " << millis(pause);
  }
}

// Silence while the peer's frames may wait unread here is not counted: this node is behind.
TEST(WireDocLiveness, PeerWhoseFramesWaitUnreadIsNotDead) {
  const NodeOptions defaults;
  const milliseconds h = defaults.heartbeat();
  Receiver r(h, defaults.dead_after(), h);
  Clock::time_point at = kStart;
  r.hear(at);
  for (int i = 0; i < 10 * static_cast<int>(defaults.dead_after()); ++i) {
    at += h;
    ASSERT_FALSE(r.check(at, /*input_waiting=*/true));
  }
  EXPECT_TRUE(r.check(at + h, /*input_waiting=*/false));
}

// ---- §13: the hexdumps -------------------------------------------------------------------------

/// A message of a frame, as the document states it: "Envelope (kind = heartbeat, ...)".
struct Stated {
  std::string type;    // the struct named before the values
  std::string values;  // in Cap'n Proto's text format
};

/// A hexdump of a frame, as the document shows it.
struct Dump {
  std::string section;         // "§13.2 A's heartbeat"
  std::string header;          // "frame 2 (96 bytes): Envelope (kind = heartbeat, ...)"
  std::size_t said = 0;        // the size its header says
  std::string text;            // the header after "frame N (B bytes): ", with its next lines
  std::vector<Stated> stated;  // the messages it holds, back to back; none: not stated
  std::vector<uint8_t> bytes;
  std::string where() const { return "docs/wire-protocol.md " + section + ", " + header; }
};

/// The messages `text` states: each a struct name and its values in parentheses.
std::vector<Stated> stated_in(const std::string& text) {
  std::vector<Stated> out;
  for (std::size_t open = text.find('('); open != std::string::npos; open = text.find('(', open)) {
    std::string before = text.substr(0, open);
    before.erase(before.find_last_not_of(' ') + 1);
    std::size_t word = before.find_last_of(' ');
    std::size_t close = open;
    bool quoted = false;
    for (int depth = 0; close < text.size(); ++close) {
      if (text[close] == '"' && text[close - 1] != '\\') quoted = !quoted;
      if (quoted) continue;
      depth += text[close] == '(' ? 1 : text[close] == ')' ? -1 : 0;
      if (depth == 0) break;
    }
    if (close == text.size()) throw std::runtime_error("no ')' closes: " + text.substr(open));
    out.push_back({before.substr(word == std::string::npos ? 0 : word + 1),
                   text.substr(open, close + 1 - open)});
    open = close + 1;
  }
  return out;
}

std::string read_file(const char* path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(std::string("cannot read ") + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// One line of `xxd -g 1`: "00000010: 04 00 ... 00  ascii". Its bytes, or nullopt when it is
/// not such a line; throws when its offset is not `at`.
std::optional<std::vector<uint8_t>> xxd_line(const std::string& line, std::size_t at) {
  if (line.size() < 14 || line[8] != ':' || line[9] != ' ') return std::nullopt;
  for (int i = 0; i < 8; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(line[i]))) return std::nullopt;
  }
  if (std::strtoul(line.substr(0, 8).c_str(), nullptr, 16) != at) {
    throw std::runtime_error("hexdump line at the wrong offset: " + line);
  }
  std::vector<uint8_t> out;
  // Byte i at column 10 + 3i; the ASCII column starts two spaces after the last one.
  for (std::size_t c = 10; c + 1 < line.size() && out.size() < 16; c += 3) {
    if (line[c] == ' ') break;
    out.push_back(static_cast<uint8_t>(std::strtoul(line.substr(c, 2).c_str(), nullptr, 16)));
    if (c + 2 < line.size() && line[c + 2] != ' ') {
      throw std::runtime_error("not a hexdump line: " + line);
    }
  }
  return out;
}

/// Every "frame N (B bytes): ..." block of the document followed by a hexdump.
std::vector<Dump> dumps_of(const std::string& doc) {
  std::vector<Dump> dumps;
  std::istringstream in(doc);
  std::string line, section;
  bool code = false;
  std::optional<Dump> d;
  auto finish = [&] {
    if (d && !d->bytes.empty()) dumps.push_back(std::move(*d));
    d.reset();
  };
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) {
      finish();
      code = !code;
      continue;
    }
    if (!code) {
      if (line.rfind("#", 0) == 0) section = "§" + line.substr(line.find_first_not_of("# "));
      continue;
    }
    std::size_t size = 0;
    int frame = 0, taken = 0;
    if (std::sscanf(line.c_str(), "frame %d (%zu bytes): %n", &frame, &size, &taken) == 2 &&
        taken > 0) {
      finish();
      d = Dump{section, line, size, line.substr(static_cast<std::size_t>(taken)), {}, {}};
      continue;
    }
    if (!d) continue;
    if (auto bytes = xxd_line(line, d->bytes.size())) {
      d->bytes.insert(d->bytes.end(), bytes->begin(), bytes->end());
    } else if (d->bytes.empty()) {
      d->text += " " + line;  // the stated values go on
    }
  }
  finish();
  for (Dump& x : dumps) x.stated = stated_in(x.text);
  return dumps;
}

std::string xxd(const std::vector<uint8_t>& b) {  // as `xxd -g 1` prints it, as the document does
  std::string out;
  char buf[24];
  for (std::size_t at = 0; at < b.size(); at += 16) {
    std::snprintf(buf, sizeof buf, "%08zx:", at);
    out += buf;
    std::string ascii;
    for (std::size_t i = at; i < at + 16; ++i) {
      if (i < b.size()) {
        std::snprintf(buf, sizeof buf, " %02x", b[i]);
        out += buf;
        ascii += b[i] >= 0x20 && b[i] < 0x7f ? static_cast<char>(b[i]) : '.';
      } else {
        out += "   ";
      }
    }
    out += "  " + ascii + "\n";
  }
  return out;
}

/// The schema file that defines each struct whose frames the document dumps.
std::optional<std::string> schema_of(const std::string& type) {
  const std::string dir = BUS_SCHEMA_DIR;
  if (type == "Envelope" || type == "Heartbeat") return dir + "/envelope.capnp";
  if (type == "Reading" || type == "StatsRequest" || type == "StatsReply") {
    return dir + "/demo.capnp";
  }
  return std::nullopt;
}

/// What `capnp encode` makes of a stated message: the tool itself, as §15 runs it (it lays
/// texts and lists out in the order the fields are written), one message in stream framing.
std::vector<uint8_t> capnp_encode(const Stated& m) {
  auto schema = schema_of(m.type);
  if (!schema) throw std::runtime_error("no schema here for " + m.type);
  static int made = 0;
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("bus-wire-doc-" + std::to_string(::getpid()) + "-" + std::to_string(made++) + ".txt"))
          .string();
  std::ofstream(path) << m.values << "\n";
  std::string command = "capnp encode '" + *schema + "' " + m.type + " < " + path;
  std::vector<uint8_t> out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p != nullptr) {
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;)
      out.insert(out.end(), buf, buf + n);
  }
  const int status = p != nullptr ? ::pclose(p) : -1;
  std::filesystem::remove(path);
  if (status != 0) throw std::runtime_error("'" + command + "' failed (is capnp installed?)");
  return out;
}

/// ...and of every message a dump states, back to back (a frame 3 of several payloads).
std::vector<uint8_t> capnp_encode(const Dump& d) {
  std::vector<uint8_t> out;
  for (const Stated& m : d.stated) {
    std::vector<uint8_t> one = capnp_encode(m);
    out.insert(out.end(), one.begin(), one.end());
  }
  return out;
}

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

std::string differs(const Dump& d, const char* encoder, const std::vector<uint8_t>& made) {
  return d.where() + "\nThe document's dump is not what " + encoder +
         " makes of the values it states.\nthe document (" + std::to_string(d.bytes.size()) +
         " bytes):\n" + xxd(d.bytes) + encoder + " (" + std::to_string(made.size()) + " bytes):\n" +
         xxd(made);
}

class WireDocBytes : public ::testing::Test {
 protected:
  void SetUp() override {
    dumps_ = dumps_of(read_file(BUS_WIRE_DOC));
    ASSERT_FALSE(dumps_.empty()) << "no hexdumps found in " << BUS_WIRE_DOC;
  }
  /// The dumps of one message of `type`.
  std::vector<const Dump*> of(const std::string& type) const {
    std::vector<const Dump*> out;
    for (const Dump& d : dumps_) {
      if (d.stated.size() == 1 && d.stated[0].type == type) out.push_back(&d);
    }
    return out;
  }
  std::vector<Dump> dumps_;
};

TEST_F(WireDocBytes, EveryDumpIsAsLongAsItsHeaderSaysAndStatesItsValues) {
  for (const Dump& d : dumps_) {
    EXPECT_EQ(d.bytes.size(), d.said) << d.where();
    EXPECT_FALSE(d.stated.empty()) << d.where() << ": no values stated, nothing to check";
    for (const Stated& m : d.stated) {
      EXPECT_TRUE(schema_of(m.type).has_value()) << d.where() << ": no schema for " << m.type;
    }
  }
}

// Every envelope dump (frame 2) is byte for byte what a C++ node writes for the values stated
// above it: encode_envelope() of the fields those values decode to.
TEST_F(WireDocBytes, EnvelopeDumpsAreWhatTheCppEncoderWrites) {
  std::vector<const Dump*> envelopes = of("Envelope");
  ASSERT_FALSE(envelopes.empty());
  for (const Dump* d : envelopes) {
    try {
      std::vector<uint8_t> stated = capnp_encode(*d);
      auto fields = bus::net::detail::decode_envelope(stated.data(), stated.size());
      ASSERT_TRUE(fields.ok()) << d->where() << ": " << fields.status();
      std::vector<uint8_t> made = bytes_of(bus::net::detail::encode_envelope(*fields));
      EXPECT_TRUE(d->bytes == made) << differs(*d, "encode_envelope()", made);
    } catch (const std::exception& e) {
      ADD_FAILURE() << d->where() << ": " << e.what();
    } catch (const kj::Exception& e) {
      ADD_FAILURE() << d->where() << ": " << e.getDescription().cStr();
    }
  }
}

// Every dump (envelopes, the heartbeat, payloads) is what `capnp encode` makes of the values
// it states (§15): what a peer in another language sends, byte for byte.
TEST_F(WireDocBytes, EveryDumpIsWhatCapnpEncodeMakesOfItsStatedValues) {
  ASSERT_FALSE(of("Heartbeat").empty());
  for (const Dump& d : dumps_) {
    try {
      std::vector<uint8_t> made = capnp_encode(d);
      EXPECT_TRUE(d.bytes == made) << differs(d, "capnp encode", made);
    } catch (const std::exception& e) {
      ADD_FAILURE() << d.where() << ": " << e.what();
    } catch (const kj::Exception& e) {
      ADD_FAILURE() << d.where() << ": " << e.getDescription().cStr();
    }
  }
}

}  // namespace
