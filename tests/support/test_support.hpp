// Small helpers shared by the tests: waiting for a condition, and a gate handlers wait at.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

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

}  // namespace bus_test
