// bus::detail::Ring on its own: FIFO of variable-size records, bounded, never split at the end.
#include "bus/detail/ring.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

using bus::detail::Ring;

// A test record: a header word `seq << 8 | 0x80 | words` (never one of the markers, which are
// 0, 1 and 2) and payload words derived from the sequence number, so a torn or misplaced record
// shows.
uint32_t size_of(uint64_t seq) { return 1 + static_cast<uint32_t>((seq * 7) % 13); }  // 1..13
uint64_t payload(uint64_t seq, uint32_t k) { return seq * 0x9E3779B97F4A7C15ull + k; }
uint64_t header_of(uint64_t seq, uint32_t words) { return seq << 8 | 0x80 | words; }

/// Builds the payload of record `seq` at `at` and commits the record.
void write_record(Ring& ring, uint64_t* at, uint64_t seq, uint32_t words) {
  for (uint32_t k = 1; k < words; ++k) at[k] = payload(seq, k);
  ring.commit(header_of(seq, words), words);
}

/// Consumes records, checking they come in sequence and intact.
struct Reader {
  uint64_t next = 0;
  uint64_t bad = 0;
  uint32_t operator()(uint64_t* rec) {
    uint32_t words = static_cast<uint32_t>(rec[0] & 0x7f);
    uint64_t seq = rec[0] >> 8;
    if (seq != next || words == 0) ++bad;
    for (uint32_t k = 1; k < words; ++k) {
      if (rec[k] != payload(seq, k)) ++bad;
    }
    ++next;
    return words;
  }
};

/// Builds record `seq` of `words` words in the ring and commits it; returns where, or null if full.
uint64_t* put(Ring& ring, uint64_t seq, uint32_t words) {
  uint64_t* at = ring.try_reserve(words);
  if (at == nullptr) return nullptr;
  write_record(ring, at, seq, words);
  return at;
}

TEST(Ring, KeepsFifoOrderOfVariableSizeRecordsAcrossWrapArounds) {
  Ring ring(64, nullptr, nullptr);
  constexpr uint64_t kRecords = 200000;
  uint64_t* base = nullptr;  // the buffer's start: the first record of an empty ring goes there
  uint64_t split = 0;        // records that would cross the buffer's end
  uint64_t written = 0;
  Reader reader;
  while (reader.next < kRecords) {
    while (written < kRecords) {
      uint32_t words = size_of(written);
      uint64_t* at = put(ring, written, words);
      if (at == nullptr) break;
      if (base == nullptr) base = at;
      if (at < base || at + words > base + ring.capacity()) ++split;
      ++written;
    }
    ring.publish();
    // Take a varying number, so the producer meets the consumer at every offset.
    ASSERT_GT(ring.consume(1 + reader.next % 5, reader), 0u);
    ring.release();
  }
  EXPECT_EQ(reader.bad, 0u);
  EXPECT_EQ(split, 0u);
  EXPECT_EQ(ring.consume(SIZE_MAX, reader), 0u);
  EXPECT_EQ(ring.head(), ring.tail());
  EXPECT_GT(ring.tail(), 10000 * ring.capacity());  // it went round many times
}

TEST(Ring, KeepsFifoOrderBetweenAProducerAndAConsumerThread) {
  Ring ring(256, nullptr, nullptr);
  constexpr uint64_t kWords = 10'000'000;
  constexpr uint64_t kUnknown = UINT64_MAX;
  std::atomic<uint64_t> total{kUnknown};  // records sent, once the producer is done
  std::thread producer([&] {
    uint64_t seq = 0;
    uint64_t words_sent = 0;
    while (words_sent < kWords) {
      uint32_t words = size_of(seq);
      uint64_t* at = ring.try_reserve(words);
      if (at == nullptr) {
        ring.publish();  // what is built but unpublished is room the consumer cannot free
        std::this_thread::yield();
        continue;
      }
      write_record(ring, at, seq, words);
      ++seq;
      words_sent += words;
      if (seq % 8 == 0) ring.publish();  // a batch of records, one release store
    }
    ring.publish();
    total.store(seq);
  });
  Reader reader;
  while (true) {
    std::size_t n = ring.consume(64, reader);
    if (n > 0) {
      ring.release();
      continue;
    }
    uint64_t t = total.load();
    if (t != kUnknown && reader.next == t) break;
    std::this_thread::yield();
  }
  producer.join();
  EXPECT_EQ(reader.bad, 0u);
  EXPECT_GE(ring.tail(), kWords);
  EXPECT_EQ(ring.head(), ring.tail());
}

// Records that signal themselves mixed with markers: single records published at once
// (commit_publish, a plain thread's path), batches (commit + publish), and records kept within
// a cache line (try_reserve_in_line, requests and replies), whose skip markers and wrap markers
// are published at once when nothing precedes them.
TEST(Ring, KeepsFifoOrderWithSinglePublishesBatchesAndLineSkips) {
  Ring ring(256, nullptr, nullptr);
  constexpr uint64_t kRecords = 2'000'000;
  std::atomic<bool> done{false};
  std::thread producer([&] {
    uint64_t seq = 0;
    while (seq < kRecords) {
      uint32_t words = size_of(seq);
      bool in_line = words <= 8 && seq % 2 == 0;
      bool single = seq % 3 == 0 && !ring.has_unpublished();
      uint64_t* at = in_line ? ring.try_reserve_in_line(words) : ring.try_reserve(words);
      if (at == nullptr) {
        ring.publish();  // what is built but unpublished is room the consumer cannot free
        std::this_thread::yield();
        continue;
      }
      if (in_line) EXPECT_LE((reinterpret_cast<uintptr_t>(at) % 64) / 8 + words, 8u) << seq;
      for (uint32_t k = 1; k < words; ++k) at[k] = payload(seq, k);
      if (single) {
        ring.commit_publish(at, header_of(seq, words), ring.write_position() + words);
      } else {
        ring.commit(header_of(seq, words), words);
        if (seq % 5 == 0) ring.publish();
      }
      ++seq;
    }
    ring.publish();
    done.store(true);
  });
  Reader reader;
  while (reader.next < kRecords) {
    std::size_t n = ring.consume(64, reader);
    ring.release();  // as Inbox::run_once(): past records and skipped markers
    if (n == 0) std::this_thread::yield();
  }
  producer.join();
  EXPECT_EQ(reader.bad, 0u);
  EXPECT_EQ(ring.consume(SIZE_MAX, reader), 0u);
  EXPECT_TRUE(done.load());
  // The head meets the tail (stop() waits for that), markers included.
  EXPECT_EQ(ring.head(), ring.tail());
}

TEST(Ring, ARecordKeptInALineSkipsTheRestOfTheLine) {
  Ring ring(64, nullptr, nullptr);
  Reader reader;
  uint64_t* base = put(ring, 0, 3);  // words 0-2
  ASSERT_NE(base, nullptr);
  // Seven words from word 3 would cross into the next line: a skip marker fills words 3-7.
  uint64_t* at = ring.try_reserve_in_line(7);
  ASSERT_EQ(at, base + 8);
  write_record(ring, at, 1, 7);
  // Five words from word 15 would cross too; they fit in the line from word 16.
  EXPECT_EQ(ring.try_reserve_in_line(5), base + 16);
  write_record(ring, base + 16, 2, 5);
  // Three from word 21 fit in their line: no skip.
  EXPECT_EQ(ring.try_reserve_in_line(3), base + 21);
  write_record(ring, base + 21, 3, 3);
  ring.publish();
  EXPECT_EQ(ring.consume(SIZE_MAX, reader), 4u);
  EXPECT_EQ(reader.bad, 0u);
  ring.release();
  EXPECT_EQ(ring.head(), ring.tail());
  EXPECT_EQ(ring.depth_words(), 0u);
}

TEST(Ring, AShortRestOfALineIsSkippedInTheRecordsOwnPublish) {
  Ring ring(64, nullptr, nullptr);
  Reader reader;
  // Five words at word 0 leave three: too few for another five, so the marker goes in now.
  uint64_t* base = ring.try_reserve_in_line(5);
  ASSERT_NE(base, nullptr);
  write_record(ring, base, 0, 5);
  ring.skip_short_line(5);
  EXPECT_EQ(ring.write_position(), 8u);
  ring.publish();
  EXPECT_EQ(ring.tail(), 8u);  // the record and the marker, published together
  EXPECT_EQ(ring.consume(SIZE_MAX, reader), 1u);
  EXPECT_TRUE(ring.release());
  EXPECT_EQ(ring.head(), 8u);  // the consumer went on to the next line, where it waits
  EXPECT_TRUE(ring.empty_for_consumer());
  // The next record of that size starts the line the consumer waits on: no marker before it.
  uint64_t* at = ring.try_reserve_in_line(5);
  EXPECT_EQ(at, base + 8);
  write_record(ring, at, 1, 5);
  // Three words after it are enough for three: no marker.
  ring.skip_short_line(3);
  EXPECT_EQ(ring.write_position(), 13u);
  at = ring.try_reserve_in_line(3);
  EXPECT_EQ(at, base + 13);
  write_record(ring, at, 2, 3);
  // A record that ends its line leaves nothing to skip.
  ring.skip_short_line(3);
  EXPECT_EQ(ring.write_position(), 16u);
  ring.publish();
  EXPECT_EQ(ring.consume(SIZE_MAX, reader), 2u);
  EXPECT_EQ(reader.bad, 0u);
  EXPECT_TRUE(ring.release());
  EXPECT_EQ(ring.head(), ring.tail());
}

TEST(Ring, AMarkerWithNothingBeforeItIsPublishedAtOnce) {
  Ring ring(64, nullptr, nullptr);
  Reader reader;
  uint64_t* base = ring.try_reserve(3);
  ASSERT_NE(base, nullptr);
  for (uint32_t k = 1; k < 3; ++k) base[k] = payload(0, k);
  ring.commit_publish(base, header_of(0, 3), ring.write_position() + 3);
  ASSERT_EQ(ring.consume(SIZE_MAX, reader), 1u);
  ring.release();
  // Nothing unpublished: the skip marker is published as it is written, so the record after
  // it is the first unpublished word, which commit_publish() expects.
  uint64_t* at = ring.try_reserve_in_line(7);
  ASSERT_EQ(at, base + 8);
  EXPECT_FALSE(ring.has_unpublished());
  EXPECT_FALSE(ring.empty_for_consumer());        // the marker is there to skip
  EXPECT_EQ(ring.consume(SIZE_MAX, reader), 0u);  // it is not a record
  EXPECT_TRUE(ring.empty_for_consumer());
  // The tail covers the marker, and releasing moves the head past it: stop() sees them meet
  // even when no record follows (its payload's copy threw, say).
  EXPECT_NE(ring.head(), ring.tail());
  EXPECT_TRUE(ring.release());
  EXPECT_EQ(ring.head(), ring.tail());
  for (uint32_t k = 1; k < 7; ++k) at[k] = payload(1, k);
  ring.commit_publish(at, header_of(1, 7), ring.write_position() + 7);
  EXPECT_EQ(ring.consume(SIZE_MAX, reader), 1u);
  EXPECT_EQ(reader.bad, 0u);
  EXPECT_TRUE(ring.release());
  EXPECT_EQ(ring.head(), ring.tail());
}

TEST(Ring, TryReserveFailsWhenFullAndSucceedsAfterRelease) {
  Ring ring(64, nullptr, nullptr);
  // 63 words: one stays free for the kEmpty a publish writes after the records.
  for (uint64_t seq = 0; seq < 7; ++seq) ASSERT_NE(put(ring, seq, 8), nullptr) << seq;
  ASSERT_NE(put(ring, 7, 7), nullptr);
  EXPECT_EQ(ring.try_reserve(1), nullptr);
  EXPECT_FALSE(ring.has_room(1));
  ring.publish();
  EXPECT_EQ(ring.depth_words(), 63u);

  // Consumed is not yet free: the words are the consumer's until it releases them.
  Reader reader;
  ASSERT_EQ(ring.consume(1, reader), 1u);
  EXPECT_EQ(ring.try_reserve(1), nullptr);
  EXPECT_TRUE(ring.release());
  EXPECT_FALSE(ring.release());  // nothing more consumed
  // 8 words free at the start, and the last word: a record that does not fit there wraps, and
  // the word it skips counts.
  EXPECT_TRUE(ring.has_room(7));
  EXPECT_FALSE(ring.has_room(8));
  EXPECT_NE(ring.try_reserve(7), nullptr);
}

TEST(Ring, RecordsAreInvisibleUntilPublished) {
  Ring ring(64, nullptr, nullptr);
  Reader reader;
  for (uint64_t seq = 0; seq < 3; ++seq) ASSERT_NE(put(ring, seq, size_of(seq)), nullptr);
  EXPECT_TRUE(ring.has_unpublished());
  EXPECT_EQ(ring.consume(SIZE_MAX, reader), 0u);
  EXPECT_TRUE(ring.empty_for_consumer());
  EXPECT_TRUE(ring.publish());
  EXPECT_FALSE(ring.publish());  // nothing new
  EXPECT_FALSE(ring.has_unpublished());
  EXPECT_FALSE(ring.empty_for_consumer());
  EXPECT_EQ(ring.consume(SIZE_MAX, reader), 3u);
  EXPECT_EQ(reader.bad, 0u);
}

TEST(Ring, RecordNeverSplitsAcrossTheEnd) {
  Ring ring(64, nullptr, nullptr);
  Reader reader;
  uint64_t* base = put(ring, 0, 60);  // the first record of an empty ring starts the buffer
  ASSERT_NE(base, nullptr);
  ring.publish();

  // 4 words are left at the end.
  EXPECT_EQ(ring.try_reserve(8), nullptr);  // 4 skipped + 8 would not fit before the head moves
  // Nor do 4 words: the kEmpty after them would go on the word at the head.
  EXPECT_EQ(ring.try_reserve(4), nullptr);
  ASSERT_EQ(ring.consume(SIZE_MAX, reader), 1u);
  ring.release();
  // Now a 4-word record fits there exactly, without a wrap.
  uint64_t* end_record = put(ring, 1, 4);
  ASSERT_EQ(end_record, base + 60);
  ring.publish();
  ASSERT_EQ(ring.consume(SIZE_MAX, reader), 1u);
  ring.release();

  // Now at the end again (position 0 after a full turn): take 62 words, leaving 2 at the end.
  ASSERT_EQ(put(ring, 2, 62), base);
  ring.publish();
  ASSERT_EQ(ring.consume(SIZE_MAX, reader), 1u);
  ring.release();

  // A 5-word record does not fit in the last 2 words: it starts the buffer, and the consumer
  // skips the 2 words (the wrap marker) without seeing a record there.
  uint64_t* wrapped = put(ring, 3, 5);
  EXPECT_EQ(wrapped, base);
  ring.publish();
  EXPECT_EQ(ring.depth_words(), 2u + 5u);
  uint64_t* seen = nullptr;
  EXPECT_EQ(ring.consume(SIZE_MAX,
                         [&](uint64_t* rec) {
                           seen = rec;
                           return reader(rec);
                         }),
            1u);
  EXPECT_EQ(seen, base);
  EXPECT_EQ(reader.bad, 0u);
  EXPECT_EQ(reader.next, 4u);
  ring.release();
  EXPECT_EQ(ring.depth_words(), 0u);
}

TEST(Ring, ARecordOfAllButOneWordFillsTheRing) {
  Ring ring(64, nullptr, nullptr);
  EXPECT_EQ(ring.try_reserve(64), nullptr);  // the kEmpty after it would have no word
  uint64_t* base = ring.try_reserve(63);
  ASSERT_NE(base, nullptr);
  write_record(ring, base, 0, 63);
  EXPECT_EQ(ring.try_reserve(1), nullptr);
  ring.publish();
  Reader reader;
  uint32_t words = 0;
  EXPECT_EQ(ring.consume(SIZE_MAX,
                         [&](uint64_t* rec) {
                           words = reader(rec);
                           return words;
                         }),
            1u);
  EXPECT_EQ(words, 63u);
  EXPECT_EQ(reader.bad, 0u);
  ring.release();
  // The next one starts over at the buffer's start, the word at the end skipped.
  EXPECT_EQ(ring.try_reserve(63), nullptr);
  EXPECT_EQ(ring.try_reserve(62), base);
}

// consume_runs: consecutive records of one target come as one run, which ends at another
// target, at the tail, at the buffer's end and at `max`.
bus::detail::PayloadOps two_words{2, nullptr, nullptr};
bus::detail::PayloadOps three_words{3, nullptr, nullptr};
bus::detail::Target target_a{nullptr, &two_words};
bus::detail::Target target_b{nullptr, &three_words};

struct RecordRun {
  const bus::detail::Target* target;
  uint64_t* first;
  uint32_t words;
  std::size_t count;
  bool operator==(const RecordRun&) const = default;
};

/// Commits a record of `t` whose payload words all hold `value`.
uint64_t* put_for(Ring& ring, const bus::detail::Target& t, uint64_t value) {
  uint32_t words = t.ops->words;
  ring.close_run();  // a new record goes after an open run's payloads (as Core::append_record)
  uint64_t* at = ring.try_reserve(words);
  if (at == nullptr) return nullptr;
  for (uint32_t k = 1; k < words; ++k) at[k] = value;
  ring.commit(reinterpret_cast<uint64_t>(&t), words);
  return at;
}

std::vector<RecordRun> runs(Ring& ring, std::size_t max) {
  std::vector<RecordRun> out;
  ring.consume_runs(
      max, [&](bus::detail::Target* t, uint64_t* payload, uint32_t stride, std::size_t count) {
        out.push_back({t, payload - 1, stride, count});  // `first`: the first record's header
      });
  return out;
}

TEST(Ring, ConsumeRunsGroupsRecordsOfOneTarget) {
  Ring ring(64, nullptr, nullptr);
  uint64_t* a0 = put_for(ring, target_a, 1);
  put_for(ring, target_a, 2);
  put_for(ring, target_a, 3);
  uint64_t* b0 = put_for(ring, target_b, 4);
  put_for(ring, target_b, 5);
  uint64_t* a3 = put_for(ring, target_a, 6);
  ring.publish();
  put_for(ring, target_a, 7);  // not published: not part of the run
  EXPECT_EQ(runs(ring, SIZE_MAX),
            (std::vector<RecordRun>{
                {&target_a, a0, 2, 3}, {&target_b, b0, 3, 2}, {&target_a, a3, 2, 1}}));
  EXPECT_EQ(a0[2 * 2 + 1], 3u);  // the third record of the run, `words` apart
  ring.publish();
  EXPECT_EQ(runs(ring, SIZE_MAX).size(), 1u);
  ring.release();
  EXPECT_EQ(ring.depth_words(), 0u);
}

TEST(Ring, ConsumeRunsStopsAtMaxAndAtTheBuffersEnd) {
  Ring ring(64, nullptr, nullptr);
  // 31 two-word records fill the ring (a word stays free for the kEmpty after them); `max`
  // splits them.
  uint64_t* first = put_for(ring, target_a, 0);
  for (uint64_t i = 1; i < 31; ++i) ASSERT_NE(put_for(ring, target_a, i), nullptr);
  EXPECT_EQ(put_for(ring, target_a, 31), nullptr);
  ring.publish();
  EXPECT_EQ(runs(ring, 10), (std::vector<RecordRun>{{&target_a, first, 2, 10}}));
  EXPECT_EQ(runs(ring, SIZE_MAX), (std::vector<RecordRun>{{&target_a, first + 20, 2, 21}}));
  ring.release();
  // One record fits before the buffer's end, the next ones start over: a run never spans the
  // end.
  for (uint64_t i = 0; i < 30; ++i) ASSERT_NE(put_for(ring, target_a, i), nullptr);
  ring.publish();
  EXPECT_EQ(runs(ring, SIZE_MAX),
            (std::vector<RecordRun>{{&target_a, first + 62, 2, 1}, {&target_a, first, 2, 29}}));
  ring.release();
  // 58 words used since the start: two records fit before the end; a three-word one does not
  // fit in the two words left, and starts over after a wrap marker.
  for (uint64_t i = 0; i < 2; ++i) ASSERT_NE(put_for(ring, target_a, i), nullptr);
  ASSERT_EQ(put_for(ring, target_b, 2), first);
  ring.publish();
  EXPECT_EQ(runs(ring, SIZE_MAX),
            (std::vector<RecordRun>{{&target_a, first + 58, 2, 2}, {&target_b, first, 3, 1}}));
  ring.release();
  EXPECT_EQ(ring.depth_words(), 0u);
}

// Run records: sends to one target between two publishes share one header, their payloads back
// to back; the run closes at a publish, at another record, at kMaxRun and before the buffer's end.

/// Appends a payload of `t` holding `value` to its open run, or starts a run record (counted
/// into `counter` when it closes).
uint64_t* put_run(Ring& ring, const bus::detail::Target& t, uint64_t value,
                  std::atomic<uint64_t>* counter = nullptr) {
  uint32_t pw = t.ops->words - 1;
  auto header = reinterpret_cast<uint64_t>(&t);
  if (uint64_t* at = ring.extend_at(header, pw)) {
    for (uint32_t k = 0; k < pw; ++k) at[k] = value;
    ring.extended(pw);
    return at;
  }
  ring.close_run();  // the new record goes after the open run's payloads
  uint64_t* at = ring.try_reserve(pw + 1);
  if (at == nullptr) return nullptr;
  for (uint32_t k = 1; k <= pw; ++k) at[k] = value;
  ring.commit_run(header, pw + 1, counter);
  return at + 1;
}

TEST(Ring, SendsToOneTargetShareARunRecordUntilThePublish) {
  Ring ring(1024, nullptr, nullptr);
  uint64_t* a = put_run(ring, target_a, 1);
  for (uint64_t v = 2; v <= 5; ++v) EXPECT_EQ(put_run(ring, target_a, v), a + (v - 1));
  uint64_t* b = put_run(ring, target_b, 6);  // another target: a new record
  put_run(ring, target_b, 7);
  uint64_t* a2 = put_run(ring, target_a, 8);  // back to a: a new record too
  ring.publish();
  uint64_t* a3 = put_run(ring, target_a, 9);  // after the publish: a new record, not yet visible
  EXPECT_NE(a3, a2 + 1);
  EXPECT_EQ(a[-1] >> bus::detail::kRunShift, 4u);  // the header counts the payloads beyond one
  EXPECT_EQ(runs(ring, SIZE_MAX),
            (std::vector<RecordRun>{
                {&target_a, a - 1, 1, 5}, {&target_b, b - 1, 2, 2}, {&target_a, a2 - 1, 2, 1}}));
  for (uint64_t v = 1; v <= 5; ++v) EXPECT_EQ(a[v - 1], v);
  EXPECT_EQ(b[2], 7u);
  EXPECT_EQ(b[3], 7u);
  ring.publish();
  EXPECT_EQ(runs(ring, SIZE_MAX), (std::vector<RecordRun>{{&target_a, a3 - 1, 2, 1}}));
  ring.release();
  EXPECT_EQ(ring.depth_words(), 0u);
}

TEST(Ring, ARunIsCountedOnceWhenItCloses) {
  Ring ring(1024, nullptr, nullptr);
  std::atomic<uint64_t> a_count{0}, b_count{0};
  uint64_t* a = put_run(ring, target_a, 1, &a_count);
  for (uint64_t v = 2; v <= 5; ++v) put_run(ring, target_a, v, &a_count);
  EXPECT_EQ(a_count.load(), 0u);                       // open: counted when it closes
  uint64_t* b = put_run(ring, target_b, 6, &b_count);  // another record closes a's run
  EXPECT_EQ(a_count.load(), 5u);
  put_run(ring, target_b, 7, &b_count);
  ring.claim_run(reinterpret_cast<uint64_t>(&target_b), &b_count);  // its own counter: stays open
  EXPECT_EQ(put_run(ring, target_b, 8, &b_count), b + 4);
  ring.claim_run(reinterpret_cast<uint64_t>(&target_b), nullptr);  // another one: it closes
  EXPECT_EQ(b_count.load(), 3u);
  uint64_t* b2 = put_run(ring, target_b, 9);  // a run without a counter
  put_run(ring, target_b, 10);
  ring.publish();
  EXPECT_EQ(b_count.load(), 3u);
  EXPECT_EQ(a[-1] >> bus::detail::kRunShift, 4u);  // (the first header is written at the publish)
  EXPECT_EQ(runs(ring, SIZE_MAX),
            (std::vector<RecordRun>{
                {&target_a, a - 1, 1, 5}, {&target_b, b - 1, 2, 3}, {&target_b, b2 - 1, 2, 2}}));
}

TEST(Ring, ARunClosesWithItsCountBeforeAWrapMarker) {
  Ring ring(1024, nullptr, nullptr);
  std::atomic<uint64_t> count{0};
  while (ring.tail() < 1016) {  // up to 8 words before the buffer's end
    ASSERT_NE(put_for(ring, target_a, 0), nullptr);
    ring.publish();
  }
  runs(ring, SIZE_MAX);
  ring.release();
  // A run in words 1016-1022: its header and six payloads.
  uint64_t* a = put_run(ring, target_a, 1, &count);
  for (uint64_t v = 2; v <= 6; ++v) put_run(ring, target_a, v, &count);
  // Three words do not fit in the one left: the run closes before the wrap marker moves on.
  uint64_t* b = put_run(ring, target_b, 7);
  EXPECT_EQ(b, a - 1 - 1016 + 1);  // the buffer's start
  EXPECT_EQ(count.load(), 6u);
  ring.publish();
  EXPECT_EQ(a[-1] >> bus::detail::kRunShift, 5u);
  EXPECT_EQ(runs(ring, SIZE_MAX),
            (std::vector<RecordRun>{{&target_a, a - 1, 1, 6}, {&target_b, b - 1, 3, 1}}));
}

TEST(Ring, ARunRecordEndsAtMaxRunAndBeforeTheBuffersEnd) {
  Ring ring(1024, nullptr, nullptr);
  uint64_t* first = put_run(ring, target_a, 0);
  for (uint64_t v = 1; v < bus::detail::kMaxRun + 3; ++v) put_run(ring, target_a, v);
  ring.publish();
  std::vector<RecordRun> r = runs(ring, SIZE_MAX);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], (RecordRun{&target_a, first - 1, 1, bus::detail::kMaxRun}));
  EXPECT_EQ(r[1].count, 3u);
  EXPECT_EQ(r[1].first[1], uint64_t{bus::detail::kMaxRun});
  ring.release();
  // 261 words used. A run from word 1001 on stops at the end; the next payload starts over.
  while (ring.tail() < 1000) {
    ASSERT_NE(put_for(ring, target_a, 0), nullptr);
    ring.publish();
  }
  (void)runs(ring, SIZE_MAX);
  ring.release();
  uint64_t start = ring.tail();
  for (uint64_t v = 0; v < 30; ++v) ASSERT_NE(put_run(ring, target_a, v), nullptr);
  ring.publish();
  r = runs(ring, SIZE_MAX);
  ASSERT_EQ(r.size(), 2u);
  // After its header, up to the word before the end: the producer last looked at the head when
  // it was at word 0, and keeps a word free for the kEmpty after the records. The next payload
  // takes a record of its own, after a wrap marker.
  EXPECT_EQ(r[0].count, 1024 - start % 1024 - 2);
  EXPECT_EQ(r[0].count + r[1].count, 30u);
  EXPECT_EQ(r[1].first[1], r[0].count);  // the values go on in order
  ring.release();
}

}  // namespace
