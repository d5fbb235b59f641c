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
#include "bus/detail/sync.hpp"

namespace bus::detail {

class Inbox;

inline constexpr std::size_t kCacheLine = 64;

/// The cursor of a ring's open run, held by a route instead of the ring (Ring::lease_run()): a
/// publish() then appends to the run through the route's own fields, with no look at the ring.
/// The ring takes the cursor back when the run closes (whoever closes it), which empties the
/// lease; its holder gives it back to the ring it took it from (Ring::return_lease()) when the
/// holder is set again, moved from or destroyed (Producer::Route). Producer thread only, like
/// the ring's producer side.
struct RunLease {
  /// Whether `words` more fit (false when nothing is leased: both ends are null).
  bool has_room(uint32_t words) const { return static_cast<std::size_t>(end - at) >= words; }
  bool held() const { return at != nullptr; }

  uint64_t* at = nullptr;   // where the run's next payload goes (null: nothing leased)
  uint64_t* end = nullptr;  // where the run must end
};

/// One producing thread -> one inbox. A record is `[header word][payload words...]` (see
/// record.hpp); a wrap marker (kWrapMarker) marks the rest of the buffer as skipped so that a
/// record never wraps around. The producer builds records in place (`try_reserve`, then
/// `commit` with the header) and makes them visible with `publish`, so a batch of records costs
/// one release store. Between two publishes consecutive sends to one target can share a header
/// (`commit_run`, then `extend_at` and `extended`): the payloads of a batch then lie back to
/// back, as in a plain array queue, and the header gets its count once, when the run closes.
///
/// The records signal themselves: the word after the last published record is always kEmpty,
/// and a publish writes the word after its records kEmpty, then the first of its records' header
/// (withheld until then) with a release store. The consumer looks at the word where it reads
/// next: one cache line per message crosses between the cores, where a tail index beside the
/// records would make it two (a request/reply round trip crosses four then, not two). The tail
/// is still stored at each publish, for stats and stop(); no one polls it.
class Ring {
 public:
  Ring(std::size_t capacity_words, Inbox* consumer, Inbox* producer_inbox)
      : buf_(static_cast<uint64_t*>(
            std::aligned_alloc(kCacheLine, (capacity_words + kPrefetchWords) * 8))),
        mask_(capacity_words - 1),
        consumer_(consumer),
        producer_inbox_(producer_inbox) {
    assert(capacity_words >= 64 && (capacity_words & mask_) == 0 && "capacity: a power of two");
    if (buf_ == nullptr) throw std::bad_alloc();
    buf_[0] = kEmpty;  // nothing published yet
  }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring() { std::free(buf_); }

  std::size_t capacity() const { return mask_ + 1; }
  Inbox* consumer() const { return consumer_; }
  /// The inbox of the producing thread when it is an executor or external inbox, else null.
  Inbox* producer_inbox() const { return producer_inbox_; }

  // ---- producer side -------------------------------------------------------------------------

  /// `words` contiguous words, or null when the ring has no room for them. No run is open
  /// (close_run(): the write position is the run's start until then).
  [[gnu::always_inline]] uint64_t* try_reserve(uint32_t words) {
    assert(run_header_ == 0 && "try_reserve() with a run open: close_run() first");
    // Fast path: below the limit known free and before the buffer's end.
    if (write_ + words <= write_limit_) [[likely]]
      return at_write();
    return reserve_slow(words);
  }
  uint64_t* reserve_slow(uint32_t words) {
    uint64_t pos = write_ & mask_;
    uint64_t contiguous = capacity() - pos;
    uint64_t need = words <= contiguous ? words : contiguous + words;
    // One word more: the kEmpty a publish writes after the records.
    if (write_ + need + 1 - head_cache_ > capacity()) {
      // (1) pairs with (4): the consumer is done with every word below its head.
      head_cache_ = head_.load(std::memory_order_acquire);
      if (write_ + need + 1 - head_cache_ > capacity()) return nullptr;
    }
    if (words > contiguous) {
      put_marker(kWrapMarker, write_ + contiguous);  // the consumer skips to the start
      pos = 0;
    }
    // What is known free from here: up to the consumer's head (less the word kept for the
    // kEmpty after the records) and the buffer's end.
    write_limit_ = std::min(head_cache_ + capacity() - 1, write_ - pos + capacity());
    return buf_ + pos;
  }
  /// try_reserve() of a record of at most a cache line's words that does not cross a line: a
  /// latency-bound record (a request, a reply) then crosses between the cores as one line, not
  /// two. A skip marker fills the rest of the line when it would cross.
  [[gnu::always_inline]] uint64_t* try_reserve_in_line(uint32_t words) {
    constexpr uint64_t kLineWords = kCacheLine / 8;
    assert(words <= kLineWords);
    assert(run_header_ == 0 && "try_reserve_in_line() with a run open: close_run() first");
    uint64_t off = write_ & (kLineWords - 1);  // (buf_ is aligned to a line)
    if (off + words > kLineWords) [[unlikely]] {
      if (try_reserve(kLineWords - off + words) == nullptr) return nullptr;
      off = write_ & (kLineWords - 1);  // 0 after a wrap
      if (off != 0) put_marker(kSkipLine, write_ + (kLineWords - off));
    }
    return try_reserve(words);
  }
  /// After a record from try_reserve_in_line() of `words` was committed: when the rest of its
  /// line cannot take another record that size, a skip marker fills it now, in the same publish
  /// as the record. The consumer, done with the record, then waits on the next line's first
  /// word (the kEmpty), where the next record starts: one line crosses per record. Without it
  /// the next record's skip marker lands on the line the consumer waits on, and the consumer
  /// takes that line, then the next one (and that again once the record is in it).
  void skip_short_line(uint32_t words) {
    constexpr uint64_t kLineWords = kCacheLine / 8;
    uint64_t left = kLineWords - (write_ & (kLineWords - 1));
    if (left == kLineWords || left >= words) return;
    // No room known for it: the next record's try_reserve_in_line() skips the line instead.
    if (try_reserve(static_cast<uint32_t>(left)) == nullptr) return;
    put_marker(kSkipLine, write_ + left);
  }
  /// Commits the record of `header` built at the write position (from try_reserve(); the
  /// caller built its payload and left its header word to this).
  void commit(uint64_t header, uint32_t words) {
    close_run();
    put_word(write_, header);
    write_ += words;
  }
  /// The producer's write position (the next word try_reserve() hands out, after a wrap). No
  /// run is open.
  uint64_t write_position() const {
    assert(run_header_ == 0);
    return write_;
  }
  /// commit() and publish() of the record of `header` at `record`, which ends at `end`, when
  /// nothing else is unpublished (so no run is open): a plain thread outside a Batch, which
  /// publishes each record at once. (A marker before the record was published already.)
  /// publish_to() spelled out with the record's address at hand, so that published_ is not read
  /// again after the payload's stores (which may alias it).
  [[gnu::always_inline]] void commit_publish(uint64_t* record, uint64_t header, uint64_t end) {
    assert(run_header_ == 0 && record == buf_ + (published_ & mask_));
    buf_[end & mask_] = kEmpty;
    std::atomic_ref(*record).store(header, std::memory_order_release);  // (2), as in publish()
    write_ = end;
    published_ = end;
    tail_.store(end, std::memory_order_release);
  }
  /// Commits the record of `header` at the write position as an open run: extend_at() appends
  /// payloads to it until the run closes (the next publish, commit or run). When it closes, its
  /// header gets its count of payloads and `counter`, if any, is raised by that count: the
  /// producer counts a run's messages once, not one by one.
  void commit_run(uint64_t header, uint32_t words, std::atomic<uint64_t>* counter) {
    close_run();
    write_ += words;
    run_header_ = header;
    run_words_ = words - 1;
    run_counter_ = counter;
    // kMaxRun payloads at most, behind the record and before the buffer's end (so the run's
    // words are contiguous: the cursor is a plain pointer).
    const uint64_t limit = std::min(write_limit_, write_ + uint64_t{kMaxRun - 1} * (words - 1));
    run_at_ = buf_ + (write_ & mask_);
    run_end_ = run_at_ + (limit - write_);
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
  ///
  /// An open run grows through its own cursor (run_at_, up to run_end_), not the write position:
  /// three loads per message (the run's header, cursor and end) where the position took five
  /// (the header, position, limit, buffer and mask), and no mask. The write position catches up
  /// when the run closes.
  [[gnu::always_inline]] uint64_t* extend_at(uint64_t header, uint32_t payload_words) {
    if (run_header_ != header || run_at_ + payload_words > run_end_) return nullptr;
    if (run_at_ == nullptr) __builtin_unreachable();  // (an open run has a cursor; see at_write)
    prefetch_for_write<kPrefetchWords * 8>(run_at_);  // past the end: the buffer's padding
    return run_at_;
  }
  /// Where the next word goes. Never null (the constructor throws instead): telling the compiler
  /// so folds away the callers' checks of try_reserve() on their fast paths.
  ///
  /// It also asks for the line kPrefetchWords ahead, to be written (see there).
  [[gnu::always_inline]] uint64_t* at_write() const {
    if (buf_ == nullptr) __builtin_unreachable();
    const uint64_t i = write_ & mask_;
    prefetch_for_write<kPrefetchWords * 8>(buf_, i);  // past the end: the buffer's padding
    return buf_ + i;
  }
  /// How far ahead of the write position the producer asks for lines (1 KiB, 16 lines). The
  /// consumer read them last time round, so the producer's first store to each must take the
  /// line back from the consumer's core. Without the prefetch those stores fill the store
  /// buffer and the producer waits for about one line at a time; with it, many lines are on
  /// their way at once (docs/core.md, "Rings and records"). The address is not wrapped: near the
  /// buffer's end it falls in a padding of kPrefetchWords after it, allocated with the buffer so
  /// that the prefetch takes no line another thread writes.
  static constexpr uint64_t kPrefetchWords = 128;
  void extended(uint32_t payload_words) { run_at_ += payload_words; }
  /// How many payloads of `payload_words` the open run of `header`'s target can still take,
  /// back to back from extend_at(); extended_by() counts those built.
  std::size_t extend_room(uint64_t header, uint32_t payload_words) const {
    if (run_header_ != header) return 0;
    return static_cast<std::size_t>(run_end_ - run_at_) / payload_words;
  }
  void extended_by(std::size_t payloads, uint32_t payload_words) {
    run_at_ += payloads * payload_words;
  }
  /// Hands the open run of `header`'s target to `lease`: its cursor and end move there, and the
  /// ring's own cursor shows no room (extend_at() and extend_room() fail, so every other send
  /// closes the run first) until the run closes or the lease is given back. False when no run of
  /// that target is open or another lease holds it.
  bool lease_run(uint64_t header, RunLease& lease) {
    if (run_header_ != header || lease_ != nullptr) return false;
    assert(!lease.held());
    lease.at = run_at_;
    lease.end = run_end_;
    run_end_ = run_at_;
    lease_ = &lease;
    return true;
  }
  /// The run goes on through the ring's own cursor from where `lease` left it.
  void return_lease(RunLease& lease) {
    assert(lease_ == &lease && run_header_ != 0);
    run_at_ = lease.at;
    run_end_ = lease.end;
    end_lease();
  }
  /// Moves the write position past the open run's payloads, writes their count into its header
  /// (they lie from the run's first payload to write_ then) and counts them.
  [[gnu::always_inline]] void close_run() {
    if (run_header_ != 0) [[unlikely]]
      close_open_run();
  }
  /// Makes committed records visible. Returns false when there was nothing new.
  bool publish() {
    close_run();  // the consumer may read the run's header from now on
    if (write_ == published_) return false;
    publish_to(stash_, write_);
    return true;
  }
  /// (Right with a run open too: its header, at least, is unpublished, and write_ is past it.)
  bool has_unpublished() const { return write_ != published_; }
  bool has_room(uint32_t words) {
    assert(run_header_ == 0);
    head_cache_ = head_.load(std::memory_order_acquire);  // pairs with (4)
    uint64_t pos = write_ & mask_;
    uint64_t contiguous = capacity() - pos;
    uint64_t need = words <= contiguous ? words : contiguous + words;
    return write_ + need + 1 - head_cache_ <= capacity();  // as in reserve_slow()
  }

  // ---- consumer side -------------------------------------------------------------------------

  /// Runs `f(record)` on up to `max` records; `f` returns the record's size in words (for a bus
  /// record, Target::record_words(header), runs included). The head is not advanced: call
  /// `release()` once the records' effects (their sends) are published.
  template <class F>
  std::size_t consume(std::size_t max, F&& f) {
    std::size_t n = 0;
    for (; n < max && next_header() != kEmpty; ++n) read_ += f(buf_ + (read_ & mask_));
    return n;
  }
  /// Like consume(), in runs: `f(target, payload, stride, count)` gets `count` payloads of one
  /// target, `stride` words apart from `payload`, and consumes them all. A run is one run record
  /// (its payloads back to back), or consecutive single records of one target (header words in
  /// between). Returns how many payloads it took (a run is taken whole, so it may pass `max`).
  template <class F>
  std::size_t consume_runs(std::size_t max, F&& f) {
    std::size_t n = 0;
    for (uint64_t header; n < max && (header = next_header()) != kEmpty;) {
      uint64_t* rec = buf_ + (read_ & mask_);
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
      // The run ends at the next other record (or the kEmpty after the last), where the buffer
      // wraps, or at `max`. A header read here may have been published after `header`: the
      // acquire load makes its payload visible too.
      uint64_t end = read_ + (capacity() - (read_ & mask_));
      if (std::size_t room = max - n; room < (end - read_) / words) end = read_ + room * words;
      uint64_t* stop = rec + (end - read_);
      uint64_t* at = rec + words;
      while (at < stop && std::atomic_ref(*at).load(std::memory_order_acquire) == header) {
        at += words;
      }
      auto taken = static_cast<uint64_t>(at - rec);
      std::size_t k = taken / words;
      read_ += taken;
      n += k;
      f(target, rec + 1, words, k);
    }
    return n;
  }
  /// Publishes the head (past the records consumed and the markers skipped); returns true when
  /// it moved.
  bool release() {
    if (read_ == released_) return false;
    released_ = read_;
    // (4) pairs with (1): the words below the head may be reused.
    head_.store(read_, std::memory_order_release);
    return true;
  }
  /// True when nothing is published beyond what the consumer read (a wrap marker is something:
  /// the next look skips it).
  bool empty_for_consumer() const {
    return word_ref(read_).load(std::memory_order_acquire) == kEmpty;  // (3), as below
  }

  /// The header of the next visible record, at read_ (wrap markers skipped), or kEmpty.
  [[gnu::always_inline]] uint64_t next_header() {
    for (;;) {
      // (3) pairs with (2): the record and those published with it are fully built.
      uint64_t h = word_ref(read_).load(std::memory_order_acquire);
      if (h > kSkipLine || h == kEmpty) [[likely]]
        return h;
      if (h == kSkipLine) {
        read_ = (read_ | (kCacheLine / 8 - 1)) + 1;  // the next line
      } else {
        read_ += capacity() - (read_ & mask_);  // a wrap marker: the buffer's start
      }
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
  // The first word written since the last publish, withheld until the next (see the class).
  uint64_t stash_ = 0;
  // The run extend_at() appends to: its header (0: none), where its next payload goes and where
  // it must end (addresses in buf_: a run never wraps), its payloads' size, and the counter of
  // its messages. While it is open, write_ stays past its first payload, where the cursor
  // started: the run starts run_words_ before it (its header one word earlier).
  uint64_t run_header_ = 0;
  uint64_t* run_at_ = nullptr;
  uint64_t* run_end_ = nullptr;
  uint64_t run_words_ = 1;
  std::atomic<uint64_t>* run_counter_ = nullptr;
  RunLease* lease_ = nullptr;  // who holds the open run's cursor, if anyone (lease_run())

  void end_lease() {
    *lease_ = RunLease{};
    lease_ = nullptr;
  }

  /// close_run() when a run is open.
  [[gnu::noinline]] void close_open_run() {
    if (lease_ != nullptr) {  // the cursor is the lease's
      run_at_ = lease_->at;
      end_lease();
    }
    const uint64_t start = write_ - run_words_;  // the first payload (write_ is past it)
    write_ += static_cast<uint64_t>(run_at_ - (buf_ + (write_ & mask_)));  // as in commit_run()
    uint64_t payloads = (write_ - start) / run_words_;
    put_word(start - 1, run_header_ + ((payloads - 1) << kRunShift));
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
  /// Writes `marker` at the write position and moves it to `next`. A marker that would be the
  /// first unpublished word is published at once (the kEmpty goes at `next`): what follows it is
  /// then first, and a plain thread's commit_publish() finds its record first. The tail covers
  /// it, and a consumer that skipped it releases it (stop() waits for heads to meet tails).
  void put_marker(uint64_t marker, uint64_t next) {
    if (write_ == published_) {
      publish_to(marker, next);
    } else {
      buf_[write_ & mask_] = marker;
    }
    write_ = next;
  }
  /// Publishes what lies from published_ to `end`, whose first word is `first` (withheld until
  /// now): the kEmpty after it, then `first` with a release store, then the tail.
  void publish_to(uint64_t first, uint64_t end) {
    buf_[end & mask_] = kEmpty;  // where the consumer stops after these records
    // (2) pairs with (3): the records, and the kEmpty after them, are fully built.
    word_ref(published_).store(first, std::memory_order_release);
    published_ = end;
    tail_.store(end, std::memory_order_release);  // for stats and stop() only
  }
  /// Writes the word at `pos` (unpublished): withheld when it is the first since the publish.
  void put_word(uint64_t pos, uint64_t word) {
    if (pos == published_) {
      stash_ = word;
    } else {
      buf_[pos & mask_] = word;
    }
  }
  std::atomic_ref<uint64_t> word_ref(uint64_t pos) const {
    return std::atomic_ref(buf_[pos & mask_]);
  }

  // Consumer line: the consumer's alone.
  alignas(kCacheLine) uint64_t read_ = 0;
  uint64_t released_ = 0;
};

}  // namespace bus::detail
