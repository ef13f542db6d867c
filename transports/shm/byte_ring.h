// A single-producer, single-consumer byte stream in shared memory: the ring one rank writes
// its messages into and one peer reads them out of (shm_transport.h). Torch-free, UCX-free.
//
// The control words and the bytes live in the consumer's segment (inbox.h); both processes
// hold a view of them. Positions count bytes since the ring was made and never wrap, so
// "empty" (head == tail) and "full" (tail - head == capacity) need no spare byte. The
// producer publishes bytes with a store of `tail` after copying them; the consumer frees them
// with a store of `head` after copying them out. Both positions are stored and loaded
// sequentially consistent, not merely release/acquire: the sleep and wake-up handshakes
// (shm_transport.cpp) store a flag and then load the other side's position, and only a total
// order over those stores and loads makes sure one side sees the other (a fence would do
// the same, but ThreadSanitizer does not model fences).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ucxb::shm {

// One ring's control words. Each position gets a cache line of its own, so that the producer
// publishing and the consumer freeing do not take the same line from each other.
struct RingControl {
  alignas(64) std::atomic<uint64_t> tail;  // written by the producer
  // Set by a producer that found the ring full and sleeps: the consumer rings its doorbell
  // after freeing room (shm_transport.cpp).
  std::atomic<uint32_t> producerWaiting;
  // Set once by the consumer when it can read the producer's memory directly (cross-memory
  // attach, process_vm_readv): the producer may then send a large message by reference.
  std::atomic<uint32_t> consumerReadsProducer;
  // Set by a producer that is done with the consumer (ShmTransport: it cut the consumer off,
  // could not populate this ring's pages, or left): the messages it sent that no receive took
  // yet are void, as a closed ucx endpoint's announcements are; nothing more comes.
  std::atomic<uint32_t> abandoned;
  alignas(64) std::atomic<uint64_t> head;  // written by the consumer
};
static_assert(sizeof(RingControl) == 128, "two cache lines per ring");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");

// A view of one ring; `capacity` is a power of two.
class ByteRing {
 public:
  ByteRing() = default;
  ByteRing(RingControl* control, uint8_t* bytes, size_t capacity)
      : control_(control), bytes_(bytes), capacity_(capacity) {}

  bool valid() const { return control_ != nullptr; }
  RingControl& control() const { return *control_; }

  // Producer side. How many bytes fit now.
  size_t writable() const;
  // Copies up to `length` bytes of `data` (what fits) and publishes them; returns how many.
  size_t write(const void* data, size_t length);

  // Consumer side. How many published bytes wait to be read.
  size_t readable() const;
  // Copies `length` bytes at the read position into `out` without taking them
  // (length <= readable()).
  void peek(void* out, size_t length) const;
  // Copies `length` bytes into `out` (null: drops them) without publishing the new head;
  // release() publishes it, so that one store frees everything a pass took.
  void take(void* out, size_t length);
  // Publishes the consumer's position; true if it freed anything since the last call.
  bool release();

 private:
  RingControl* control_ = nullptr;
  uint8_t* bytes_ = nullptr;
  size_t capacity_ = 0;
  uint64_t readPos_ = 0;   // consumer: where the next take() starts (head once released)
  uint64_t released_ = 0;  // consumer: the head last published
};

}  // namespace ucxb::shm
