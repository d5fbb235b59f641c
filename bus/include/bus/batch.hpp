// Batch: a plain thread's publishes made visible together. Part of bus/bus.hpp.
#pragma once

#include "bus/detail/core.hpp"

namespace bus {

class Bus;

/// Defers publication on a plain thread: records are built in the rings as usual but made
/// visible (and their executors woken) once, when the scope ends. Executors batch on their own.
class Batch {
 public:
  explicit Batch(Bus& bus);
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch();
  /// Publishes what was sent so far.
  void flush();
  /// False when the bus was stopping as the batch began: its publishes are then refused.
  bool accepted() const { return accepted_; }

 private:
  detail::Core& core_;
  detail::Producer& producer_;
  bool accepted_;
  detail::Producer::Gate outer_gate_ = detail::Producer::kPerSend;  // restored at the end
};

}  // namespace bus
