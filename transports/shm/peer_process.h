// A peer's process as the one-host transport knows it: the address record a rank publishes
// (localAddress), whether a pidfd still names the process that wrote it, and reading that
// process's memory (the by-reference path). Torch-free, used by shm_transport.cpp.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ucxb::shm {

// What every process of the backend has at the address its localAddress() names: a peer that
// reads it back proves that it may read this process's memory.
extern const uint64_t kReadableProbe;

// localAddress(): fields separated by newlines (none of them holds one).
struct ShmAddress {
  std::string host;
  uint64_t pidNamespace = 0;
  pid_t pid = 0;
  int ranks = 0;
  std::string segment;
  std::string doorbell;
  uint64_t probe = 0;       // the address of kReadableProbe in that process
  uint64_t pidfdInode = 0;  // ownPidfdInode() of that process
};

std::vector<uint8_t> packAddress(const ShmAddress& a);
// False where `bytes` is not an address of this version (its magic) or a field does not parse.
bool unpackAddress(const std::vector<uint8_t>& bytes, ShmAddress& a);

// pidfd_open(2); -1 with errno where it fails.
int pidfdOpen(pid_t pid);

// The inode number of this process's pidfds where they live in pidfs (Linux 6.9): every pidfd
// of a process has it, and the kernel gives it to no other process while the system runs.
// 0 elsewhere (before pidfs all pidfds shared one anonymous inode) or where a call fails:
// peers then check the start time in the inbox's name instead (wroteAddress).
uint64_t ownPidfdInode();

// Whether the process `pidfd` refers to is the one that wrote the address `a`; "" if so, else
// why not. Throws TransportError naming `peer` where fstat fails.
std::string wroteAddress(int pidfd, const ShmAddress& a, int peer);

// Copies `length` bytes at `remote` in process `pid` into `local`; "" or why not.
std::string readPeerMemory(pid_t pid, uint64_t remote, void* local, size_t length);

}  // namespace ucxb::shm
