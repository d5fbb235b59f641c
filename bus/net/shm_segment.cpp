#include "shm_segment.hpp"

#include <absl/strings/str_cat.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace bus::net::detail {

namespace {
std::string errno_text(int e) { return std::strerror(e); }
}  // namespace

absl::StatusOr<std::unique_ptr<OwnedSegment>> OwnedSegment::create(const char* name,
                                                                   std::size_t bytes,
                                                                   ShmAccess access) {
  int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("bus.net: memfd_create failed: ", errno_text(errno)));
  }
  auto fail = [&](const char* what, int e) {
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("bus.net: cannot reserve ", bytes >> 10, " KiB of shared memory (", what, ": ",
                     errno_text(e),
                     "); the process's memory limit (a container's, say) must allow it, or lower "
                     "shm_ring_bytes / shm_heap_limit"));
  };
  // Owner only, or owner and a group: the mode matters to anyone who reopens the descriptor
  // through /proc, which the kernel checks against it.
  if (::fchmod(fd, access.group >= 0 ? 0640 : 0600) != 0) return fail("fchmod", errno);
  if (access.group >= 0 && ::fchown(fd, static_cast<uid_t>(-1), access.group) != 0) {
    return fail("fchown", errno);
  }
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail("ftruncate", errno);
  // Every page now, not at first touch: a page the kernel cannot find later would be a SIGBUS
  // in the middle of a write (or in a reader).
  if (::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) return fail("fallocate", errno);
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return fail("sealing", errno);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mmap", errno);
  return std::unique_ptr<OwnedSegment>(new OwnedSegment(fd, static_cast<char*>(p), bytes));
}

OwnedSegment::~OwnedSegment() {
  ::munmap(data_, size_);
  ::close(fd_);
}

int OwnedSegment::read_only_fd() const {
  // A new open file description, read-only: what a peer gets cannot write or map the memory
  // writable, whatever it does with it.
  return ::open(absl::StrCat("/proc/self/fd/", fd_).c_str(), O_RDONLY | O_CLOEXEC);
}

absl::StatusOr<std::shared_ptr<PeerSegment>> PeerSegment::map(int fd, std::size_t min_bytes,
                                                              std::size_t max_bytes) {
  struct stat st {};
  auto refuse = [&](std::string why) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("bus.net: a peer's segment: ", why));
  };
  if (::fstat(fd, &st) != 0) return refuse(errno_text(errno));
  if (!S_ISREG(st.st_mode)) return refuse("not a memory file");
  auto size = static_cast<std::size_t>(st.st_size);
  if (size < min_bytes || size > max_bytes) {
    return refuse(absl::StrCat(size, " bytes, expected ", min_bytes, " to ", max_bytes));
  }
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) return refuse("not sealed against shrinking");
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  int e = errno;
  ::close(fd);  // the mapping keeps the memory
  if (p == MAP_FAILED)
    return absl::InvalidArgumentError(absl::StrCat("bus.net: mmap: ", errno_text(e)));
  return std::shared_ptr<PeerSegment>(new PeerSegment(static_cast<const char*>(p), size));
}

PeerSegment::~PeerSegment() { ::munmap(const_cast<char*>(data_), size_); }

const HostIdentity& HostIdentity::self() {
  static const HostIdentity id = [] {
    HostIdentity h;
    std::ifstream boot("/proc/sys/kernel/random/boot_id");
    std::getline(boot, h.boot_id);
    struct stat st {};
    if (::stat("/proc/self/ns/ipc", &st) == 0) h.ipc_namespace = st.st_ino;
    if (::stat("/proc/self/ns/net", &st) == 0) h.net_namespace = st.st_ino;
    if (h.ipc_namespace == 0 || h.net_namespace == 0) h.boot_id.clear();
    return h;
  }();
  return id;
}

}  // namespace bus::net::detail
