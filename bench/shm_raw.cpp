// The raw references of the same-host shared-memory benchmark: what the kernel and the hardware
// cost with no messaging library in between. `kind=` picks one:
//
//   uds    a Unix-domain stream socket ping-pong: the pong listens on the abstract socket
//          name=N (default bus_shm_uds), the ping connects; blocking write, blocking read of the
//          whole message, the pong echoes it. Every message carries all its `size` bytes.
//   floor  the spinning floor: two 64-bit counters on their own cache lines of a shared page
//          (/dev/shm/N, default bus_shm_floor, created by the pong and unlinked when it stops).
//          The ping stores seq in line A, the pong spins until it sees it and stores it in line B,
//          the ping spins on B: one cache-line transfer each way, the least a round trip through
//          shared memory can cost. `size` is accepted and ignored. mode=block makes the waiting
//          side sleep on a futex on its line instead (the store is followed by a FUTEX_WAKE): the
//          floor of a round trip whose waiter sleeps in the kernel.
//
//   bus_shm_raw pong kind=uds|floor size=S mode=spin|block [name=N]
//   bus_shm_raw ping kind=uds|floor size=S count=N mode=spin|block [warmup=W] [name=N]
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "shm_common.hpp"

namespace {

using namespace bench_bridge;
using namespace bench_shm;

std::string name_of(const Args& a, const char* fallback) {
  auto it = a.kv.find("name");
  return it == a.kv.end() ? fallback : it->second;
}

[[noreturn]] void fail_errno(const std::string& what) { fail(what + ": " + std::strerror(errno)); }

// ---- uds ----------------------------------------------------------------------------------------

// mode=spin is not meaningful for a socket (a non-blocking read in a loop would be one syscall per
// poll and measure that instead): both modes use blocking reads and writes.

sockaddr_un abstract_address(const std::string& name, socklen_t& len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof addr.sun_path) fail("name too long for a socket address");
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // sun_path[0] == 0: abstract
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

void set_receive_timeout(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) fail_errno("SO_RCVTIMEO");
}

/// Reads exactly `n` bytes. False at end of file. A receive timeout is, for the pong, the moment
/// to look at the driver's stop (false when it came) and, for the ping, an error.
bool read_full(int fd, uint8_t* p, std::size_t n, bool pong) {
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r > 0) {
      p += r;
      n -= static_cast<std::size_t>(r);
    } else if (r == 0) {
      return false;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!pong) fail("no pong within 30 s");
      if (stop_requested()) return false;
    } else if (errno != EINTR) {
      if (pong) return false;  // e.g. ECONNRESET: the ping went away
      fail_errno("read");
    }
  }
  return true;
}

bool write_full(int fd, const uint8_t* p, std::size_t n) {
  while (n > 0) {
    ssize_t r = ::write(fd, p, n);
    if (r > 0) {
      p += r;
      n -= static_cast<std::size_t>(r);
    } else if (r < 0 && errno != EINTR) {
      return false;
    }
  }
  return true;
}

int uds_pong(const Args& a) {
  std::size_t size = a.num("size");
  if (size < 8) fail("size must be at least 8 (the sequence number)");
  ::signal(SIGPIPE, SIG_IGN);  // a ping gone mid-write: EPIPE, not death
  watch_stdin();
  socklen_t len;
  sockaddr_un addr = abstract_address(name_of(a, "bus_shm_uds"), len);
  int ls = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (ls < 0) fail_errno("socket");
  if (::bind(ls, reinterpret_cast<sockaddr*>(&addr), len) != 0) fail_errno("bind");
  if (::listen(ls, 4) != 0) fail_errno("listen");
  ready();
  std::vector<uint8_t> buf(size);
  // One ping after the other; between them (and while one is idle) look at the stop flag every
  // 100 ms.
  while (!stop_requested()) {
    pollfd p{ls, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    int c = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    set_receive_timeout(c, 100);
    while (read_full(c, buf.data(), size, true) && write_full(c, buf.data(), size)) {
    }
    ::close(c);
  }
  ::close(ls);
  return 0;
}

int uds_ping(const Args& a) {
  uint64_t n = a.num("count"), warm = warmup_of(a, n);
  std::size_t size = a.num("size");
  if (size < 8) fail("size must be at least 8 (the sequence number)");
  socklen_t len;
  sockaddr_un addr = abstract_address(name_of(a, "bus_shm_uds"), len);
  int s = -1;
  for (uint64_t deadline = now_ns() + 10'000'000'000;;) {
    s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) fail_errno("socket");
    if (::connect(s, reinterpret_cast<sockaddr*>(&addr), len) == 0) break;
    if (now_ns() > deadline) fail_errno("connect (is the pong running, same name=?)");
    ::close(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  set_receive_timeout(s, 30'000);
  std::vector<uint8_t> out(size), in(size);
  for (std::size_t j = 8; j < size; ++j) out[j] = pattern(j - 8);
  ready();
  wait_for_go();
  return ping_loop(n, warm, [&](uint64_t seq) {
    put_seq(out.data(), seq);
    if (!write_full(s, out.data(), size)) fail_errno("write");
    if (!read_full(s, in.data(), size, false)) fail("the pong closed the connection");
    return get_seq(in.data()) == seq && in[size - 1] == out[size - 1];
  });
}

// ---- floor --------------------------------------------------------------------------------------

/// A counter alone on its cache line, 128 bytes apart from the other: the adjacent-line
/// prefetcher of some CPUs pulls cache lines in pairs.
struct alignas(128) Line {
  std::atomic<uint64_t> seq{0};
};
struct Floor {
  Line a;  // ping -> pong
  Line b;  // pong -> ping
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the counters are shared by processes");
static_assert(std::endian::native == std::endian::little,
              "the futex word is the counter's low half");
constexpr std::size_t kFloorBytes = 4096;

/// The futex word of a line: the low 32 bits of its counter (a FUTEX_WAIT on it returns as soon
/// as the counter has moved on from the value the waiter saw).
uint32_t* futex_word(Line& l) { return reinterpret_cast<uint32_t*>(&l.seq); }

void futex_wake(Line& l) {
  ::syscall(SYS_futex, futex_word(l), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

/// Sleeps while `l` still holds `seen` (100 ms at most; spurious returns are fine).
void futex_wait(Line& l, uint64_t seen) {
  timespec timeout{0, 100'000'000};
  ::syscall(SYS_futex, futex_word(l), FUTEX_WAIT, static_cast<uint32_t>(seen), &timeout, nullptr,
            0);
}

/// The shared page's name for shm_open (a file under /dev/shm).
std::string shm_name(const Args& a) {
  std::string name = "/";  // (not "/" + ...: GCC 12 warns a false -Wrestrict there)
  return name += name_of(a, "bus_shm_floor");
}

Floor* map_floor(int fd) {
  void* p = ::mmap(nullptr, kFloorBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail_errno("mmap");
  ::close(fd);
  return static_cast<Floor*>(p);
}

int floor_pong(const Args& a) {
  Mode mode = mode_of(a, "spin");
  watch_stdin();
  std::string name = shm_name(a);
  int fd = ::shm_open(name.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) fail_errno("shm_open " + name);
  if (::ftruncate(fd, kFloorBytes) != 0) fail_errno("ftruncate");
  Floor* f = new (map_floor(fd)) Floor{};
  ready();
  uint64_t last = 0;
  if (mode == Mode::spin) {
    for (uint32_t spins = 0;; ++spins) {
      uint64_t v = f->a.seq.load(std::memory_order_acquire);
      if (v != last) {
        f->b.seq.store(v, std::memory_order_release);
        last = v;
      } else if (spins % 1024 == 0 && stop_requested()) {
        break;
      }
    }
  } else {
    while (!stop_requested()) {
      uint64_t v = f->a.seq.load(std::memory_order_acquire);
      if (v == last) {
        futex_wait(f->a, v);
        continue;
      }
      f->b.seq.store(v, std::memory_order_release);
      futex_wake(f->b);
      last = v;
    }
  }
  ::munmap(f, kFloorBytes);
  ::shm_unlink(name.c_str());
  return 0;
}

int floor_ping(const Args& a) {
  uint64_t n = a.num("count"), warm = warmup_of(a, n);
  Mode mode = mode_of(a, "spin");
  std::string name = shm_name(a);
  int fd = -1;
  for (uint64_t deadline = now_ns() + 10'000'000'000; fd < 0;) {
    fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0 && now_ns() > deadline) fail_errno("shm_open " + name + " (is the pong running?)");
    if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Floor* f = map_floor(fd);
  ready();
  wait_for_go();
  int rc = ping_loop(n, warm, [&](uint64_t seq) {
    f->a.seq.store(seq, std::memory_order_release);
    if (mode == Mode::block) futex_wake(f->a);
    uint64_t deadline = 0;
    for (uint32_t polls = 1;; ++polls) {
      uint64_t v = f->b.seq.load(std::memory_order_acquire);
      if (v == seq) return true;
      if (mode == Mode::block) futex_wait(f->b, v);
      if (mode == Mode::block || polls % 1024 == 0) {
        uint64_t t = now_ns();
        if (deadline == 0) deadline = t + 30'000'000'000;
        if (t > deadline) fail("no pong within 30 s");
      }
    }
  });
  ::munmap(f, kFloorBytes);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) fail("usage: bus_shm_raw pong|ping kind=uds|floor key=value...");
  Args a(argc, argv);
  std::string role = argv[1], kind = a.str("kind");
  if (kind != "uds" && kind != "floor") fail("kind must be uds or floor, not " + kind);
  if (role == "pong") return kind == "uds" ? uds_pong(a) : floor_pong(a);
  if (role == "ping") return kind == "uds" ? uds_ping(a) : floor_ping(a);
  fail("unknown role " + role);
}
