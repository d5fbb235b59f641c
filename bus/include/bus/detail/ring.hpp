// A bounded single-producer single-consumer ring of 8-byte words holding variable-size records.
#pragma once

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#include "bus/detail/record.hpp"

namespace bus::detail {

class Inbox;

inline constexpr std::size_t kCacheLine = 64;

/// One producing thread -> one inbox. A record is `[header word][payload words...]` (see
/// record.hpp); a header of zero marks the rest of the buffer as skipped so that a record never
/// wraps around. The producer builds records in place (`try_reserve` + `commit`) and makes them
/// visible with `publish`, so a batch of records costs one release store. Between two publishes
/// consecutive sends to one target can share a header (`commit_run`, then `extend_at` and
/// `extended`): the payloads of a batch then lie back to back, as in a plain array queue, and
/// the header gets its count once, when the run closes.
class Ring {
 public:
  Ring(std::size_t capacity_words, Inbox* consumer, Inbox* producer_inbox)
      : buf_(static_cast<uint64_t*>(std::aligned_alloc(kCacheLine, capacity_words * 8))),
        mask_(capacity_words - 1),
        consumer_(consumer),
        producer_inbox_(producer_inbox) {
    assert(capacity_words >= 64 && (capacity_words & mask_) == 0 && "capacity: a power of two");
    if (buf_ == nullptr) throw std::bad_alloc();
  }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring() { std::free(buf_); }

  std::size_t capacity() const { return mask_ + 1; }
  Inbox* consumer() const { return consumer_; }
  /// The inbox of the producing thread when it is an executor or external inbox, else null.
  Inbox* producer_inbox() const { return producer_inbox_; }

  // ---- producer side -------------------------------------------------------------------------

  /// `words` contiguous words, or null when the ring has no room for them.
  [[gnu::always_inline]] uint64_t* try_reserve(uint32_t words) {
    // Fast path: below the limit known free and before the buffer's end.
    if (write_ + words <= write_limit_) [[likely]]
      return at_write();
    return reserve_slow(words);
  }
  uint64_t* reserve_slow(uint32_t words) {
    close_run();  // before a wrap marker moves write_ past the run's end
    uint64_t pos = write_ & mask_;
    uint64_t contiguous = capacity() - pos;
    uint64_t need = words <= contiguous ? words : contiguous + words;
    if (write_ + need - head_cache_ > capacity()) {
      // (1) pairs with (4): the consumer is done with every word below its head.
      head_cache_ = head_.load(std::memory_order_acquire);
      if (write_ + need - head_cache_ > capacity()) return nullptr;
    }
    if (words > contiguous) {
      buf_[pos] = 0;  // wrap marker: the consumer skips to the start
      write_ += contiguous;
      pos = 0;
    }
    // What is known free from here: up to the consumer's head and the buffer's end.
    write_limit_ = std::min(head_cache_ + capacity(), write_ - pos + capacity());
    return buf_ + pos;
  }
  /// Commits the record built at the write position (from try_reserve()).
  void commit(uint32_t words) {
    close_run();
    write_ += words;
  }
  /// The producer's write position (the next word try_reserve() hands out, after a wrap).
  uint64_t write_position() const { return write_; }
  /// commit() of the record that ends at `end`, when no run can be open: a plain thread outside a
  /// Batch never opens one.
  void commit_unrun_to(uint64_t end) {
    assert(run_header_ == 0);
    write_ = end;
  }
  /// Commits the record at `record` as an open run: extend_at() appends payloads to it until
  /// the run closes (the next publish, commit or run). When it closes, its header gets its
  /// count of payloads and `counter`, if any, is raised by that count: the producer counts
  /// a run's messages once, not one by one.
  void commit_run(uint64_t* record, uint32_t words, std::atomic<uint64_t>* counter) {
    close_run();
    write_ += words;
    open_run_ = record;
    run_header_ = record[0];
    run_start_ = write_ - (words - 1);
    run_words_ = words - 1;
    run_counter_ = counter;
    // kMaxRun payloads at most, behind the record and before the buffer's end.
    run_limit_ = std::min(write_limit_, write_ + uint64_t{kMaxRun - 1} * (words - 1));
  }
  /// Closes the open run of `header`'s target when it counts into another counter than
  /// `counter` (or none), so that what joins it from now on is counted once: the fan-out path,
  /// which counts per publish(), closes a run the one-inbox route opened.
  void claim_run(uint64_t header, std::atomic<uint64_t>* counter) {
    if (run_header_ == header && run_counter_ != counter) close_run();
  }
  /// Where one more payload of `payload_words` goes in the open run of `header`'s target, or
  /// null: no open run of that target, or it cannot grow (kMaxRun, the buffer's end, no room
  /// known). Build the payload there, then call extended().
  [[gnu::always_inline]] uint64_t* extend_at(uint64_t header, uint32_t payload_words) {
    if (run_header_ != header || write_ + payload_words > run_limit_) return nullptr;
    return at_write();
  }
  /// Where the next word goes. Never null (the constructor throws instead): telling the compiler
  /// so folds away the callers' checks of try_reserve() and extend_at() on their fast paths
  /// (72 instead of 78 instructions per message published in a Batch).
  [[gnu::always_inline]] uint64_t* at_write() const {
    if (buf_ == nullptr) __builtin_unreachable();
    return buf_ + (write_ & mask_);
  }
  void extended(uint32_t payload_words) { write_ += payload_words; }
  /// How many payloads of `payload_words` the open run of `header`'s target can still take,
  /// back to back from extend_at(); extended_by() counts those built.
  std::size_t extend_room(uint64_t header, uint32_t payload_words) const {
    if (run_header_ != header || write_ >= run_limit_) return 0;
    return static_cast<std::size_t>((run_limit_ - write_) / payload_words);
  }
  void extended_by(std::size_t payloads, uint32_t payload_words) {
    write_ += payloads * payload_words;
  }
  /// Makes committed records visible. Returns false when there was nothing new.
  bool publish() {
    close_run();  // the consumer may read the run's header from now on
    if (write_ == published_) return false;
    published_ = write_;
    // (2) pairs with (3): the records below the tail are fully built.
    tail_.store(write_, std::memory_order_release);
    return true;
  }
  /// publish() right after commit(): there is something new, and no run is open.
  [[gnu::always_inline]] void publish_committed() {
    published_ = write_;
    tail_.store(write_, std::memory_order_release);  // (2), as in publish()
  }
  bool has_unpublished() const { return write_ != published_; }
  bool has_room(uint32_t words) {
    head_cache_ = head_.load(std::memory_order_acquire);  // pairs with (4)
    uint64_t pos = write_ & mask_;
    uint64_t contiguous = capacity() - pos;
    uint64_t need = words <= contiguous ? words : contiguous + words;
    return write_ + need - head_cache_ <= capacity();
  }

  // ---- consumer side -------------------------------------------------------------------------

  /// Runs `f(record)` on up to `max` records; `f` returns the record's size in words (for a bus
  /// record, Target::record_words(header), runs included). The head is not advanced: call
  /// `release()` once the records' effects (their sends) are published.
  template <class F>
  std::size_t consume(std::size_t max, F&& f) {
    std::size_t n = 0;
    for (uint64_t* rec; n < max && (rec = next_record()) != nullptr; ++n) read_ += f(rec);
    return n;
  }
  /// Like consume(), in runs: `f(target, payload, stride, count)` gets `count` payloads of one
  /// target, `stride` words apart from `payload`, and consumes them all. A run is one run record
  /// (its payloads back to back), or consecutive single records of one target (header words in
  /// between). Returns how many payloads it took (a run is taken whole, so it may pass `max`).
  template <class F>
  std::size_t consume_runs(std::size_t max, F&& f) {
    std::size_t n = 0;
    for (uint64_t* rec; n < max && (rec = next_record()) != nullptr;) {
      uint64_t header = *rec;
      Target* target = target_of(header);
      uint32_t payload_words = target->payload_words();
      if (header & ~kTargetBits) {
        std::size_t k = payloads_of(header);
        read_ += 1 + k * payload_words;
        n += k;
        f(target, rec + 1, payload_words, k);
        continue;
      }
      uint32_t words = 1 + payload_words;
      // The run ends at the next other record, at the tail, where the buffer wraps, or at `max`.
      uint64_t end = std::min(tail_cache_, read_ + (capacity() - (read_ & mask_)));
      if (std::size_t room = max - n; room < (end - read_) / words) end = read_ + room * words;
      const uint64_t* stop = rec + (end - read_);
      const uint64_t* at = rec + words;
      while (at < stop && *at == header) at += words;
      auto taken = static_cast<uint64_t>(at - rec);
      std::size_t k = taken / words;
      read_ += taken;
      n += k;
      f(target, rec + 1, words, k);
    }
    return n;
  }
  /// Publishes the head; returns true when it moved.
  bool release() {
    if (read_ == released_) return false;
    released_ = read_;
    // (4) pairs with (1): the words below the head may be reused.
    head_.store(read_, std::memory_order_release);
    return true;
  }
  bool empty_for_consumer() {
    if (read_ != tail_cache_) return false;
    tail_cache_ = tail_.load(std::memory_order_acquire);  // pairs with (2)
    return read_ == tail_cache_;
  }

  /// The next visible record (wrap markers skipped), or null when there is none.
  uint64_t* next_record() {
    for (;;) {
      if (read_ == tail_cache_) {
        // (3) pairs with (2).
        tail_cache_ = tail_.load(std::memory_order_acquire);
        if (read_ == tail_cache_) return nullptr;
      }
      uint64_t pos = read_ & mask_;
      if (buf_[pos] != 0) return buf_ + pos;
      read_ += capacity() - pos;
    }
  }

  // ---- any thread (stats, shutdown) ----------------------------------------------------------
  uint64_t head() const { return head_.load(std::memory_order_seq_cst); }
  uint64_t tail() const { return tail_.load(std::memory_order_seq_cst); }
  std::size_t depth_words() const {
    uint64_t t = tail_.load(std::memory_order_relaxed);
    uint64_t h = head_.load(std::memory_order_relaxed);
    return t > h ? static_cast<std::size_t>(t - h) : 0;
  }

  /// Set by the producer (1) when it waits for room; the consumer wakes it after releasing.
  alignas(kCacheLine) std::atomic<uint32_t> producer_waiting{0};
  /// Set when the producing thread has exited; the consumer frees the ring once it is empty.
  std::atomic<bool> retired{false};

 private:
  // Read by both sides, written once (or, the two flags above, rarely).
  uint64_t* const buf_;
  const uint64_t mask_;
  Inbox* const consumer_;
  Inbox* const producer_inbox_;

  // The tail and the head have a line each: the side that polls one takes only that line, and
  // the other side's own fields (below) never move between the cores.
  alignas(kCacheLine) std::atomic<uint64_t> tail_{0};
  alignas(kCacheLine) std::atomic<uint64_t> head_{0};

  // Producer line: the producer's alone.
  alignas(kCacheLine) uint64_t write_ = 0;  // next word the producer writes (maybe unpublished)
  uint64_t published_ = 0;                  // last value stored to tail_
  uint64_t head_cache_ = 0;   // producer's view of head_: refreshed only when the ring looks full
  uint64_t write_limit_ = 0;  // write_ may grow to it without a check: free and before the end
  // The run extend_at() appends to: its record (unpublished), header (0: none), the end it may
  // grow to, where its payloads start and their size, and the counter of its messages.
  uint64_t* open_run_ = nullptr;
  uint64_t run_header_ = 0;
  uint64_t run_limit_ = 0;
  uint64_t run_start_ = 0;
  uint64_t run_words_ = 1;
  std::atomic<uint64_t>* run_counter_ = nullptr;

  /// Writes the open run's count of payloads into its header (the payloads lie from run_start_
  /// to write_) and counts them.
  [[gnu::always_inline]] void close_run() {
    if (run_header_ != 0) [[unlikely]]
      close_open_run();
  }
  [[gnu::noinline]] void close_open_run() {
    uint64_t payloads = (write_ - run_start_) / run_words_;
    *open_run_ = run_header_ + ((payloads - 1) << kRunShift);
    if (run_counter_ != nullptr) {
      run_counter_->store(run_counter_->load(std::memory_order_relaxed) + payloads,
                          std::memory_order_relaxed);
    }
    run_header_ = 0;
  }

 public:
  // Producer-thread bookkeeping (never read by the consumer), on the producer's line.
  uint32_t held = 0;              // records of this ring in the producer's backlog
  bool queued_for_flush = false;  // in the producer's list of rings to publish

 private:
  // Consumer line: the consumer's alone.
  alignas(kCacheLine) uint64_t read_ = 0;
  uint64_t released_ = 0;
  uint64_t tail_cache_ = 0;  // consumer's view of tail_: refreshed only when it looks empty
};

}  // namespace bus::detail
