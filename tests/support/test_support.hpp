// Small helpers shared by the tests: waiting for a condition, and a gate handlers wait at.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

// BUS_TEST_SANITIZED: built with AddressSanitizer or ThreadSanitizer (tests shrink their size).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BUS_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define BUS_TEST_SANITIZED 1
#endif
#endif

namespace bus_test {

/// Waits, within a generous bound, until `done()` holds. A bound missed is a failure, not a timing.
template <class F>
bool eventually(F done, std::chrono::milliseconds bound = std::chrono::seconds(30)) {
  auto limit = std::chrono::steady_clock::now() + bound;
  while (!done()) {
    if (std::chrono::steady_clock::now() > limit) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

/// A door handlers wait at until the test opens it.
class Gate {
 public:
  void wait() {
    while (!open_.load()) open_.wait(false);
  }
  void open() {
    open_.store(true);
    open_.notify_all();
  }

 private:
  std::atomic<bool> open_{false};
};

/// Opens a gate when the test ends, however it ends, so the bus can stop. Declare it after the
/// subscriptions whose handlers wait at the gate: their cancel waits for those handlers.
struct OpenOnExit {
  Gate& gate;
  ~OpenOnExit() { gate.open(); }
};

/// Aborts the test program, naming `what`, if its scope is not left within `bound`: a hang
/// (a deadlock, a wait that never ends) fails the test at once instead of stalling ctest until
/// its timeout. The bound is generous: it catches hangs, it does not time anything.
class Watchdog {
 public:
  Watchdog(std::string what, std::chrono::seconds bound)
      : thread_([this, what = std::move(what), bound] {
          std::unique_lock lock(mu_);
          if (!cv_.wait_for(lock, bound, [this] { return done_; })) {
            std::fprintf(stderr, "watchdog: %s did not finish within %lld s: it hangs\n",
                         what.c_str(), static_cast<long long>(bound.count()));
            std::fflush(stderr);
            std::abort();
          }
        }) {}
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: it starts once the members above exist
};

}  // namespace bus_test
