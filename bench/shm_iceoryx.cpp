// The Eclipse iceoryx (2.0, C++ API) peer of the same-host shared-memory benchmark: what a user
// writes with iceoryx's zero-copy publish/subscribe. RouDi must run with bench/shm_roudi.toml
// (`iox-roudi -c bench/shm_roudi.toml`), whose mempools hold the benchmark's payload sizes.
//
//   bus_shm_iceoryx pong size=S mode=spin|block [name=N]
//   bus_shm_iceoryx ping size=S count=N mode=spin|block [warmup=W] [name=N]
//   bus_shm_iceoryx sub  size=S count=N [subs=K] [mode=block|spin] [queue=Q] [name=N]
//   bus_shm_iceoryx pub  size=S count=N subs=K [name=N]
//
// Untyped publishers and subscribers (the payload size is a run-time argument). Zero-copy: the
// sender loans a chunk, writes the 8-byte sequence number only and publishes it; the receiver
// reads those 8 bytes and the chunk header's payload size, then releases the chunk. Every
// publisher/subscriber pair is lossless: the subscriber asks for BLOCK_PRODUCER and the publisher
// WAIT_FOR_CONSUMER (with no history), so a full subscriber queue makes the publisher wait (it
// spins on std::this_thread::yield() inside publish()) instead of dropping the oldest sample.
//
// Connections are made by RouDi's discovery loop, after the ports exist, and a subscriber's
// SUBSCRIBED state does not say that a publisher is connected. So the senders probe: a sequence-0
// message, sent again every few milliseconds until answered (ping: the pong echoes it; pub: each
// subscriber says hello on a small side topic, "ack", when its first probe arrives). The
// receivers skip sequence 0. The pub then stays until every subscriber has said it is done (or
// they are gone, or stdin closes), so that its process is alive while they drain their queues.
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "iceoryx_hoofs/log/logmanager.hpp"
#include "iceoryx_posh/mepoo/chunk_header.hpp"
#include "iceoryx_posh/popo/publisher.hpp"
#include "iceoryx_posh/popo/subscriber.hpp"
#include "iceoryx_posh/popo/untyped_publisher.hpp"
#include "iceoryx_posh/popo/untyped_subscriber.hpp"
#include "iceoryx_posh/popo/wait_set.hpp"
#include "iceoryx_posh/runtime/posh_runtime.hpp"
#include "shm_common.hpp"

namespace {

using namespace bench_bridge;
using namespace bench_shm;
using namespace std::chrono_literals;

/// The mempools of bench/shm_roudi.toml (chunk size with its header, count): keep them in step.
/// A subscriber's default queue leaves room in its payload's pool for the chunks in flight
/// elsewhere (the one the publisher loans, the one it keeps for reuse, the one being read), so
/// that a full queue blocks the publisher before the pool runs dry (loan() would then fail).
struct Pool {
  uint64_t chunk, count;
};
constexpr Pool kPools[] = {{128, 10000}, {1152, 5000}, {66560, 512}, {4198400, 32}};

uint64_t default_queue(uint64_t size) {
  for (const Pool& p : kPools)
    if (size + sizeof(iox::mepoo::ChunkHeader) <= p.chunk)
      return std::min<uint64_t>(iox::MAX_SUBSCRIBER_QUEUE_CAPACITY, p.count - 8);
  fail("size " + std::to_string(size) + " is larger than bench/shm_roudi.toml's largest mempool");
}

uint64_t checked_size(const Args& a) {
  uint64_t size = a.num("size");
  if (size < 8) fail("size must be at least 8 (the sequence number)");
  default_queue(size);
  return size;
}

iox::capro::IdString_t id(const std::string& s) { return {iox::cxx::TruncateToCapacity, s}; }

/// Topic `event` of this run: service "bus_shm", instance name=N (default bus_shm).
iox::capro::ServiceDescription topic(const Args& a, const char* event) {
  auto it = a.kv.find("name");
  return {id("bus_shm"), id(it == a.kv.end() ? "bus_shm" : it->second), id(event)};
}

/// Registers with RouDi. Without RouDi's socket, fails at once (iceoryx itself would wait 60 s
/// for it; it still does when the socket is left over from a RouDi killed with SIGKILL). iceoryx
/// logs to stderr, by default everything down to its verbose messages: warnings only.
void init_runtime(const std::string& role) {
  std::string socket =
      std::string(iox::platform::IOX_UDS_SOCKET_PATH_PREFIX) + iox::roudi::IPC_CHANNEL_ROUDI_NAME;
  if (::access(socket.c_str(), F_OK) != 0)
    fail("RouDi is not running (no " + socket + "): start `iox-roudi -c bench/shm_roudi.toml`");
  iox::log::LogManager::GetLogManager().SetDefaultLogLevel(iox::log::LogLevel::kWarn,
                                                           iox::log::LogLevelOutput::kHideLogLevel);
  std::string name = "bus_shm_" + role + "_" + std::to_string(::getpid());
  iox::runtime::PoshRuntime::initRuntime(iox::RuntimeName_t(iox::cxx::TruncateToCapacity, name));
}

iox::popo::PublisherOptions lossless_publisher() {
  iox::popo::PublisherOptions o;
  o.historyCapacity = 0;
  o.subscriberTooSlowPolicy = iox::popo::ConsumerTooSlowPolicy::WAIT_FOR_CONSUMER;
  return o;
}

iox::popo::SubscriberOptions lossless_subscriber(uint64_t queue) {
  iox::popo::SubscriberOptions o;
  o.queueCapacity = queue;
  o.historyRequest = 0;
  o.queueFullPolicy = iox::popo::QueueFullPolicy::BLOCK_PRODUCER;
  return o;
}

uint32_t payload_size(const void* payload) {
  return iox::mepoo::ChunkHeader::fromUserPayload(payload)->userPayloadSize();
}

/// Loans a chunk of `size` bytes, writes `seq` in its first 8 bytes (the rest is left as it is:
/// zero-copy) and publishes it. An exhausted mempool is waited out (for 10 s at most).
void send(iox::popo::UntypedPublisher& tx, uint64_t size, uint64_t seq) {
  uint64_t deadline = 0;
  for (;;) {
    auto r = tx.loan(static_cast<uint32_t>(size));
    if (!r.has_error()) {
      put_seq(r.value(), seq);
      tx.publish(r.value());
      return;
    }
    if (r.get_error() != iox::popo::AllocationError::RUNNING_OUT_OF_CHUNKS)
      fail("loan of " + std::to_string(size) + " bytes failed (error " +
           std::to_string(static_cast<int>(r.get_error())) +
           "): is RouDi running with bench/shm_roudi.toml?");
    if (deadline == 0) deadline = now_ns() + 10'000'000'000;
    if (now_ns() > deadline) fail("the mempool for " + std::to_string(size) + " bytes stays empty");
    std::this_thread::yield();
  }
}

/// An untyped subscriber with the way to wait for it: spinning on take(), or asleep in a WaitSet
/// on its DATA_RECEIVED event.
class Receiver {
 public:
  Receiver(const iox::capro::ServiceDescription& topic, uint64_t queue, Mode mode)
      : sub_(topic, lossless_subscriber(queue)) {
    if (mode == Mode::spin) return;
    waitset_.emplace();
    waitset_->attachEvent(sub_, iox::popo::SubscriberEvent::DATA_RECEIVED).or_else([](auto) {
      fail("cannot attach the subscriber to a WaitSet");
    });
  }

  /// The next payload (give it back with release()), or nullptr when none came for a while
  /// (100 ms asleep, or 1024 polls spinning): the caller's chance to check for stop or timeout.
  const void* next() {
    for (int polls = 0; polls < 1024; ++polls) {
      auto r = sub_.take();
      if (!r.has_error()) return r.value();
      if (r.get_error() != iox::popo::ChunkReceiveResult::NO_CHUNK_AVAILABLE)
        fail("take: too many chunks held");
      // An event notification can be left over from a sample taken without waiting: then the
      // wait returns at once and the next take() finds nothing; the loop waits again.
      if (waitset_ && waitset_->timedWait(iox::units::Duration::fromMilliseconds(100)).empty())
        return nullptr;
    }
    return nullptr;
  }

  /// next(), failing after `timeout_ns` without a payload.
  const void* next_within(uint64_t timeout_ns, const char* what) {
    uint64_t deadline = 0;
    for (;;) {
      if (const void* p = next()) return p;
      uint64_t t = now_ns();
      if (deadline == 0) deadline = t + timeout_ns;
      if (t > deadline) fail(std::string("nothing received within the timeout: ") + what);
    }
  }

  void release(const void* payload) { sub_.release(payload); }
  bool missed() { return sub_.hasMissedData(); }

 private:
  iox::popo::UntypedSubscriber sub_;
  std::optional<iox::popo::WaitSet<1>> waitset_;  // destroyed first: detaches sub_
};

int role_pong(const Args& a) {
  Mode mode = mode_of(a, "spin");
  checked_size(a);
  watch_stdin();
  init_runtime("pong");
  Receiver rx(topic(a, "ping"), 16, mode);
  iox::popo::UntypedPublisher tx(topic(a, "pong"), lossless_publisher());
  ready();
  while (!stop_requested()) {
    const void* p = rx.next();
    if (p == nullptr) continue;
    uint64_t seq = get_seq(p), size = payload_size(p);  // the pong has the ping's size
    rx.release(p);
    send(tx, size, seq);
  }
  return 0;
}

int role_ping(const Args& a) {
  uint64_t n = a.num("count"), warm = warmup_of(a, n), size = checked_size(a);
  Mode mode = mode_of(a, "spin");
  init_runtime("ping");
  iox::popo::UntypedPublisher tx(topic(a, "ping"), lossless_publisher());
  Receiver rx(topic(a, "pong"), 16, mode);

  // Connected both ways once a probe comes back. Then let the answers to earlier probes arrive,
  // and drop them.
  uint64_t deadline = now_ns() + 30'000'000'000;
  for (bool connected = false; !connected;) {
    if (now_ns() > deadline) fail("no pong answered within 30 s (is it running, same name=?)");
    if (tx.hasSubscribers()) send(tx, 8, 0);
    for (uint64_t until = now_ns() + 10'000'000; !connected && now_ns() < until;) {
      if (const void* p = rx.next()) {
        rx.release(p);
        connected = true;
      }
    }
  }
  std::this_thread::sleep_for(20ms);
  while (const void* p = rx.next()) rx.release(p);

  ready();
  wait_for_go();
  return ping_loop(n, warm, [&](uint64_t seq) {
    send(tx, size, seq);
    const void* p = rx.next_within(30'000'000'000, "pong");
    bool good = get_seq(p) == seq && payload_size(p) == size;
    rx.release(p);
    return good;
  });
}

/// The side topic "ack": each subscriber's hello (its first probe arrived) and done (it has all).
struct Ack {
  uint64_t pid;
  uint64_t done;
};

int role_sub(const Args& a) {
  uint64_t n = a.num("count"), size = checked_size(a);
  Mode mode = mode_of(a, "block");
  watch_stdin();
  init_runtime("sub");
  Receiver rx(topic(a, "data"), a.num("queue", default_queue(size)), mode);
  iox::popo::PublisherOptions ack_options;
  ack_options.historyCapacity = 2;  // a pub's ack subscriber may connect after we said hello
  iox::popo::Publisher<Ack> acks(topic(a, "ack"), ack_options);
  auto ack = [&](uint64_t done) {
    acks.publishCopyOf(Ack{static_cast<uint64_t>(::getpid()), done}).or_else([](auto) {
      fail("cannot publish on the ack topic");
    });
  };
  ready();

  uint64_t count = 0, t_last = 0, c0 = cpu_ns();
  bool ok = true, hello = false;
  while (count < n && !stop_requested()) {
    const void* p = rx.next();
    if (p == nullptr) continue;
    uint64_t seq = get_seq(p);
    bool right_size = payload_size(p) == size;
    rx.release(p);
    if (seq == 0) {  // a probe: the publisher is connected
      if (!hello) {
        ack(0);
        hello = true;
        c0 = cpu_ns();
      }
      continue;
    }
    t_last = now_ns();
    ok = ok && seq == count + 1 && right_size;
    ++count;
  }
  ok = ok && count == n && !rx.missed();
  print_receiver(t_last, count, ok, cpu_ns() - c0);
  ack(1);
  return 0;
}

int role_pub(const Args& a) {
  uint64_t n = a.num("count"), size = checked_size(a), subs = a.num("subs", 1);
  init_runtime("pub");
  iox::popo::UntypedPublisher tx(topic(a, "data"), lossless_publisher());
  iox::popo::SubscriberOptions ack_options;
  ack_options.historyRequest = 2;
  iox::popo::Subscriber<Ack> acks(topic(a, "ack"), ack_options);
  std::set<uint64_t> hello, done;
  auto take_acks = [&] {
    for (auto r = acks.take(); !r.has_error(); r = acks.take()) {
      hello.insert(r.value()->pid);
      if (r.value()->done) done.insert(r.value()->pid);
    }
  };
  ready();
  wait_for_go();
  watch_stdin();

  uint64_t deadline = now_ns() + 60'000'000'000;
  while (hello.size() < subs) {
    if (stop_requested()) return 0;
    if (now_ns() > deadline)
      fail(std::to_string(hello.size()) + " of " + std::to_string(subs) +
           " subscribers connected within 60 s");
    if (tx.hasSubscribers()) send(tx, 8, 0);
    std::this_thread::sleep_for(5ms);
    take_acks();
  }

  uint64_t c0 = cpu_ns(), t0 = now_ns();
  for (uint64_t i = 1; i <= n; ++i) send(tx, size, i);
  uint64_t t_sent = now_ns();
  print_sender(t0, t_sent, cpu_ns() - c0);

  while (done.size() < subs && tx.hasSubscribers() && !stop_requested()) {
    std::this_thread::sleep_for(1ms);
    take_acks();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) fail("usage: bus_shm_iceoryx pong|ping|sub|pub key=value...");
  Args a(argc, argv);
  std::string role = argv[1];
  if (role == "pong") return role_pong(a);
  if (role == "ping") return role_ping(a);
  if (role == "sub") return role_sub(a);
  if (role == "pub") return role_pub(a);
  fail("unknown role " + role);
}
