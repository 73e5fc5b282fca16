// One shared-memory layout and everything that touches
// it - the segment's creation, mapping and name (orphans included), the
// per-rank flags with their futex barriers, and the peers' liveness - which
// a split would have to share through the private Header and Flag types.
#include "shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "lockstep/util/error.h"
#include "lockstep/util/units.h"

namespace lockstep {
namespace {

constexpr uint64_t kMagic = 0x31304d4853534c4bULL;  // "LKSSHM01"
constexpr std::size_t kHeaderBytes = 4096;
constexpr std::size_t kFlagBytes = 64;

std::size_t segment_bytes(int world, std::size_t chunk) {
  const std::size_t flags = ((world * kFlagBytes + 4095) / 4096) * 4096;
  return kHeaderBytes + flags + 2 * static_cast<std::size_t>(world + 1) * chunk;
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// /proc/<pid>/stat's state, after the command name's last ')'.
bool running_by_proc(int pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno != ENOENT && errno != ESRCH;  // unreadable: assume alive
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;  // it went while we read
  buf[n] = 0;
  const char* paren = std::strrchr(buf, ')');
  if (paren == nullptr || paren[1] != ' ') return true;
  return paren[2] != 'Z' && paren[2] != 'X';
}

// A pidfd (Linux 5.3+): readable once the process has ended, whether or not
// it was reaped, and never confused with a later process given the same pid.
int open_pidfd(int pid) {
#ifndef SYS_pidfd_open
  constexpr long SYS_pidfd_open = 434;  // the same number on every architecture
#endif
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
}

bool pidfd_ended(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

// A size for messages: whole MiB or KiB where exact (a chunk), else MiB to
// one decimal, rounded up (a segment: what it needs is never understated).
std::string mib(std::size_t bytes) {
  constexpr std::size_t kKiB = kMiB / 1024;
  if (bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
  if (bytes < kMiB && bytes % kKiB == 0) return std::to_string(bytes / kKiB) + " KiB";
  const std::size_t tenths = (bytes * 10 + kMiB - 1) / kMiB;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " MiB";
}

// "/dev/shm has F free of T" for messages, or "" when statvfs fails.
std::string dev_shm_space() {
  struct statvfs v {};
  if (statvfs("/dev/shm", &v) != 0) return "";
  return "/dev/shm has " + mib(static_cast<std::size_t>(v.f_bavail) * v.f_frsize) + " free of " +
         mib(static_cast<std::size_t>(v.f_blocks) * v.f_frsize);
}

// `value` has reached `generation` (wrapping counters).
bool reached(uint32_t value, uint32_t generation) {
  return static_cast<int32_t>(value - generation) >= 0;
}

}  // namespace

struct ShmSegment::Header {
  uint64_t magic;
  uint32_t world;
  uint32_t reserved;
  uint64_t chunk;
  std::atomic<int32_t> pids[kMaxRanks];
  std::atomic<uint32_t> departed[kMaxRanks];
};

ShmSegment::ShmSegment(void* base, std::size_t size, int world, std::size_t chunk)
    : base_(base), size_(size), world_(world), chunk_(chunk) {}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : base_(other.base_),
      size_(other.size_),
      world_(other.world_),
      chunk_(other.chunk_),
      pidfds_(std::move(other.pidfds_)) {
  other.base_ = nullptr;
  other.pidfds_.clear();
}

ShmSegment::~ShmSegment() {
  if (base_ != nullptr) munmap(base_, size_);
  for (int fd : pidfds_)
    if (fd >= 0) ::close(fd);
}

bool ShmSegment::process_running(int pid) {
  return running_by_proc(pid);
}

void ShmSegment::watch_peers(int me) {
  pidfds_.assign(world_, -1);
  for (int r = 0; r < world_; ++r) {
    if (r == me || pid_of(r) <= 0) continue;
    pidfds_[r] = open_pidfd(pid_of(r));
    if (pidfds_[r] < 0 && errno == ESRCH) pidfds_[r] = kGone;
  }
}

bool ShmSegment::peer_alive(int rank) const {
  if (rank < static_cast<int>(pidfds_.size())) {
    if (pidfds_[rank] == kGone) return false;
    if (pidfds_[rank] >= 0) return !pidfd_ended(pidfds_[rank]);
  }
  const int pid = pid_of(rank);
  return pid <= 0 || running_by_proc(pid);
}

ShmSegment ShmSegment::create(const std::string& name, int world, std::size_t chunk) {
  if (world < 1 || world > kMaxRanks)
    throw ConfigError("shm backend: " + std::to_string(world) + " ranks on one host (at most " +
                      std::to_string(kMaxRanks) + ")");
  const std::size_t size = segment_bytes(world, chunk);
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    throw CommError("shm backend: cannot create /dev/shm" + name + ": " + std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(size)) != 0 ||
      (errno = posix_fallocate(fd, 0, static_cast<off_t>(size))) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    const std::string space = dev_shm_space();
    throw ConfigError("shm backend: /dev/shm is too small: the segment needs " + mib(size) + " (" +
                      std::to_string(2 * (world + 1)) + " chunks of " + mib(chunk) + ") and " +
                      (space.empty() ? "/dev/shm could not hold it" : space) + " (" +
                      std::strerror(err) +
                      "); make /dev/shm larger (e.g. docker run --shm-size) or "
                      "dist.shm_chunk_mb smaller");
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    throw CommError("shm backend: cannot map /dev/shm" + name + ": " + std::strerror(errno));
  }
  ShmSegment segment(base, size, world, chunk);
  Header* h = segment.header();
  h->world = static_cast<uint32_t>(world);
  h->chunk = chunk;
  for (auto& pid : h->pids) pid.store(0);
  for (auto& d : h->departed) d.store(0);
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  return segment;
}

ShmSegment ShmSegment::open(const std::string& name, int world, std::size_t chunk) {
  const std::size_t size = segment_bytes(world, chunk);
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    throw CommError("shm backend: cannot open /dev/shm" + name + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != size) {
    close(fd);
    throw ConfigError("shm backend: /dev/shm" + name + " is " + mib(st.st_size) +
                      " where this rank expects " + mib(size) +
                      ": the ranks were given different dist.shm_chunk_mb");
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED)
    throw CommError("shm backend: cannot map /dev/shm" + name + ": " + std::strerror(errno));
  ShmSegment segment(base, size, world, chunk);
  const Header* h = segment.header();
  if (h->magic != kMagic || h->world != static_cast<uint32_t>(world) || h->chunk != chunk)
    throw CommError("shm backend: /dev/shm" + name + " was made for another world or chunk size");
  return segment;
}

void ShmSegment::unlink(const std::string& name) {
  shm_unlink(name.c_str());
}

int ShmSegment::remove_orphans() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind("lockstep-", 0) != 0) continue;
    const auto dash = name.rfind('-');
    const int pid = std::atoi(name.c_str() + dash + 1);
    if (pid > 0 && !running_by_proc(pid) && shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

// Note [Segment name]: between create and unlink the name is all that
// keeps the segment alive once every rank has unmapped it, so ShmName
// removes it on every exit path: its destructor (returns and exceptions),
// and a handler for the terminating signals a launcher sends (SIGTERM,
// SIGINT, SIGHUP), which unlinks, puts the previous action back and raises
// the signal again, so that it does what it would have done (the default:
// death; a program's own handler, SA_SIGINFO or not, runs). A signal the
// process ignores (nohup, a shell's background job) is left ignored: it
// must not break the set-up. The destructor restores only a handler that is
// still ours. Only SIGKILL is left, for ShmSegment::remove_orphans. One
// name is armed at a time (set-ups run one after another); a second,
// concurrent one is removed by its destructor only.
namespace {

constexpr int kNameSignals[] = {SIGTERM, SIGINT, SIGHUP};
char g_armed_path[256];             // "/dev/shm/<name>", or "" when disarmed
std::atomic<bool> g_arming{false};  // a name is armed (threads take turns)
struct sigaction g_previous[3];
bool g_installed[3];  // whether our handler went in for kNameSignals[i]

void unlink_then_chain(int sig) {
  const int saved = errno;
  if (g_armed_path[0] != 0) ::unlink(g_armed_path);  // async-signal-safe
  g_armed_path[0] = 0;
  for (int i = 0; i < 3; ++i) {
    if (kNameSignals[i] != sig) continue;
    // Pending until this handler returns, then delivered to the previous
    // action: the default (death) or the program's handler.
    sigaction(sig, &g_previous[i], nullptr);
    g_installed[i] = false;
    raise(sig);
  }
  errno = saved;
}

}  // namespace

ShmName::ShmName(std::string name) : name_(std::move(name)) {
  const std::string path = "/dev/shm" + name_;
  if (path.size() >= sizeof(g_armed_path) || g_arming.exchange(true)) return;  // one at a time
  std::memcpy(g_armed_path, path.c_str(), path.size() + 1);
  struct sigaction action {};
  action.sa_handler = unlink_then_chain;
  sigemptyset(&action.sa_mask);
  for (int i = 0; i < 3; ++i) {
    g_installed[i] = false;
    if (sigaction(kNameSignals[i], nullptr, &g_previous[i]) != 0) continue;
    if (g_previous[i].sa_handler == SIG_IGN && !(g_previous[i].sa_flags & SA_SIGINFO)) continue;
    g_installed[i] = sigaction(kNameSignals[i], &action, nullptr) == 0;
  }
  armed_ = true;
}

ShmName::~ShmName() {
  ShmSegment::unlink(name_);
  if (!armed_) return;
  g_armed_path[0] = 0;
  for (int i = 0; i < 3; ++i) {
    struct sigaction now {};
    // Put back what was there, unless someone installed another handler since.
    if (g_installed[i] && sigaction(kNameSignals[i], nullptr, &now) == 0 &&
        now.sa_handler == unlink_then_chain)
      sigaction(kNameSignals[i], &g_previous[i], nullptr);
    g_installed[i] = false;
  }
  g_arming.store(false);
}

ShmSegment::Header* ShmSegment::header() const {
  static_assert(sizeof(Header) <= kHeaderBytes, "the header fits its page");
  return static_cast<Header*>(base_);
}

ShmSegment::Flag* ShmSegment::flag(int rank) const {
  static_assert(sizeof(Flag) <= kFlagBytes, "a flag fits its cache line");
  return reinterpret_cast<Flag*>(static_cast<char*>(base_) + kHeaderBytes + rank * kFlagBytes);
}

char* ShmSegment::slot(int set, int rank) const {
  const std::size_t flags = ((world_ * kFlagBytes + 4095) / 4096) * 4096;
  return static_cast<char*>(base_) + kHeaderBytes + flags +
         (static_cast<std::size_t>(set) * (world_ + 1) + rank) * chunk_;
}

char* ShmSegment::result(int set) const {
  return slot(set, world_);
}

void ShmSegment::publish_pid(int rank) {
  header()->pids[rank].store(static_cast<int32_t>(getpid()));
}

int ShmSegment::pid_of(int rank) const {
  return header()->pids[rank].load();
}

void ShmSegment::depart(int rank) {
  header()->departed[rank].store(1, std::memory_order_seq_cst);
  for (int r = 0; r < world_; ++r) futex(&flag(r)->arrived, FUTEX_WAKE, INT32_MAX, nullptr);
}

// Note [A peer on the same core]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Spinning for a peer only pays while the peer runs on another CPU. Where
// two ranks share one (more ranks than cores; ranks started on one core
// and not yet spread by the scheduler; an affinity mask), the spinner holds
// the CPU the peer needs to arrive: each barrier costs the whole spin (the
// measurements: docs/lab/shm-allreduce.md, "Ranks sharing a core"). Each
// rank publishes the CPU of its arrival; a waiter on that CPU sleeps on the
// futex at once, which hands the CPU over.
// The CPU read may be stale (the peer has moved since): then one barrier
// spins for nothing or sleeps when it need not, and the next arrival
// corrects it. Where the kernel cannot say (sched_getcpu fails), spin.
// A CPU here is a logical one: two SMT siblings of a core are two CPUs,
// and a rank spinning on one does not stop the other from running.
namespace {
int32_t cpu_mark() {
  const int cpu = sched_getcpu();
  return cpu >= 0 ? cpu + 1 : 0;
}
}  // namespace

void ShmSegment::arrive(int rank, uint32_t generation) {
  Flag* f = flag(rank);
  f->cpu.store(cpu_mark(), std::memory_order_relaxed);
  f->arrived.store(generation, std::memory_order_seq_cst);
  if (f->sleepers.load(std::memory_order_seq_cst) > 0)
    futex(&f->arrived, FUTEX_WAKE, INT32_MAX, nullptr);
}

void ShmSegment::describe(int rank, const ShmDescriptor& d) {
  Flag* f = flag(rank);
  f->described[0].store(d.region, std::memory_order_relaxed);
  f->described[1].store(d.offset, std::memory_order_relaxed);
  f->described[2].store(d.bytes, std::memory_order_relaxed);
  f->described[3].store(d.kind, std::memory_order_relaxed);
  f->described[4].store(d.scale, std::memory_order_relaxed);
}

ShmDescriptor ShmSegment::described(int rank) const {
  const Flag* f = flag(rank);
  return {f->described[0].load(std::memory_order_relaxed),
          f->described[1].load(std::memory_order_relaxed),
          f->described[2].load(std::memory_order_relaxed),
          f->described[3].load(std::memory_order_relaxed),
          f->described[4].load(std::memory_order_relaxed)};
}

std::string ShmSegment::wait_all(uint32_t generation,
                                 std::chrono::steady_clock::time_point deadline,
                                 const std::atomic<bool>& stop, std::chrono::microseconds spin,
                                 int64_t* shared_core) const {
  for (int r = 0; r < world_; ++r) {
    Flag* f = flag(r);
    // Spin for `spin` (the peer is usually about to arrive), the clock read
    // every 64 pauses, then sleep on the futex in short slices, checking the
    // deadline and the peer's life. Not for a peer on this CPU (Note [A peer
    // on the same core]).
    if (!reached(f->arrived.load(std::memory_order_acquire), generation)) {
      const int32_t theirs = f->cpu.load(std::memory_order_relaxed);
      if (theirs != 0 && theirs == cpu_mark()) {
        if (shared_core != nullptr) ++*shared_core;
      } else {
        const auto until = std::chrono::steady_clock::now() + spin;
        bool arrived = false;
        do {
          for (int k = 0; k < 64 && !arrived; ++k) {
            arrived = reached(f->arrived.load(std::memory_order_acquire), generation);
            if (!arrived) __builtin_ia32_pause();
          }
        } while (!arrived && std::chrono::steady_clock::now() < until);
      }
    }
    while (true) {
      const uint32_t seen = f->arrived.load(std::memory_order_acquire);
      if (reached(seen, generation)) break;
      if (stop.load()) return "the process group is shutting down";
      if (header()->departed[r].load())
        return "rank " + std::to_string(r) + " left the process group";
      if (!peer_alive(r))
        return "rank " + std::to_string(r) + " (pid " + std::to_string(pid_of(r)) + ") died";
      if (std::chrono::steady_clock::now() >= deadline)
        return "rank " + std::to_string(r) + " did not arrive within the timeout";
      f->sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (!reached(f->arrived.load(std::memory_order_seq_cst), generation)) {
        const timespec slice{0, 5'000'000};  // 5 ms
        futex(&f->arrived, FUTEX_WAIT, seen, &slice);
      }
      f->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  return "";
}

}  // namespace lockstep
