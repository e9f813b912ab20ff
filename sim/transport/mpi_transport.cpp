// MpiTransport: MPI start-up and shut-down, the process-level exchanges, the bounded waits, and
// the failure reports (see mpi_transport.h).
#include "sim/transport/mpi_transport.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <set>
#include <stdexcept>
#include <thread>

#include "common/error.h"
#include "sim/transport/mpi_communicator.h"

namespace tpusim {
namespace {

// --- What each thread waits for, for the SIGTERM report (async-signal-safe reads). ---

constexpr int kWaitNotes = 128;
constexpr size_t kWaitNoteBytes = 480;

struct WaitNote {
  std::atomic<int> state = 0;  // 0 free, 1 being written, 2 readable
  size_t length = 0;
  std::array<char, kWaitNoteBytes> text{};
};

std::array<WaitNote, kWaitNotes> g_wait_notes;
int g_rank = -1;

int note_wait(const std::string& text) {
  for (int index = 0; index < kWaitNotes; ++index) {
    WaitNote& note = g_wait_notes[static_cast<size_t>(index)];
    int expected = 0;
    if (note.state.compare_exchange_strong(expected, 1)) {
      note.length = std::min(text.size(), kWaitNoteBytes);
      std::memcpy(note.text.data(), text.data(), note.length);
      note.state.store(2);
      return index;
    }
  }
  return -1;  // more waits than notes: this one goes unreported
}

void clear_wait(int index) {
  if (index >= 0) {
    g_wait_notes[static_cast<size_t>(index)].state.store(0);
  }
}

void write_all(const char* text, size_t length) {
  while (length > 0) {
    const ssize_t count = ::write(STDERR_FILENO, text, length);
    if (count <= 0) {
      return;
    }
    text += count;
    length -= static_cast<size_t>(count);
  }
}

// Formats a non-negative integer without allocating.
size_t format_int(int value, char* out) {
  char digits[16];
  size_t count = 0;
  do {
    digits[count++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value > 0 && count < sizeof(digits));
  for (size_t index = 0; index < count; ++index) {
    out[index] = digits[count - 1 - index];
  }
  return count;
}

extern "C" void report_sigterm(int signal_number) {
  const char* start = "tpusim: rank ";
  write_all(start, std::strlen(start));
  char digits[16];
  write_all(digits, format_int(g_rank, digits));
  const char* stopped =
      ": stopped by SIGTERM (mpirun ends the job when a rank fails or it is interrupted)";
  write_all(stopped, std::strlen(stopped));
  bool any = false;
  for (size_t index = 0; index < g_wait_notes.size(); ++index) {
    const WaitNote& note = g_wait_notes[index];
    if (note.state.load() != 2) {
      continue;
    }
    bool repeated = false;  // several groups of one collective wait for the same ranks
    for (size_t earlier = 0; earlier < index && !repeated; ++earlier) {
      const WaitNote& other = g_wait_notes[earlier];
      repeated = other.state.load() == 2 && other.length == note.length &&
                 std::memcmp(other.text.data(), note.text.data(), note.length) == 0;
    }
    if (!repeated) {
      write_all(any ? "; and in " : " while waiting in ", any ? 9 : 18);
      write_all(note.text.data(), note.length);
      any = true;
    }
  }
  write_all("\n", 1);
  ::_exit(128 + signal_number);
}

std::string describe_seconds(std::chrono::milliseconds duration) {
  const auto milliseconds = duration.count();
  if (milliseconds % 1000 == 0) {
    return std::to_string(milliseconds / 1000) + " s";
  }
  return std::to_string(milliseconds / 1000) + "." + std::to_string(milliseconds % 1000 / 100) +
         std::to_string(milliseconds % 100 / 10) + std::to_string(milliseconds % 10) + " s";
}

std::string list_ranks(const std::set<int>& ranks) {
  std::string text;
  for (const int rank : ranks) {
    text += (text.empty() ? "" : ", ") + std::to_string(rank);
  }
  return text;
}

int64_t environment_int(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return -1;
  }
  char* end = nullptr;
  const long long parsed = std::strtoll(value, &end, 10);
  if (end == nullptr || *end != '\0' || parsed < 0) {
    throw UserError(std::string(name) + ": '" + value + "' is not a non-negative integer");
  }
  return parsed;
}

void check(int code, const char* call) {
  if (code != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw std::runtime_error(std::string(call) + " failed: " + std::string(text, length));
  }
}

int to_count(size_t size, const char* what) {
  if (size > static_cast<size_t>(std::numeric_limits<int>::max())) {
    throw std::runtime_error(std::string(what) + ": " + std::to_string(size) +
                             " elements exceed an MPI count");
  }
  return static_cast<int>(size);
}

}  // namespace

bool MpiTransport::launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
         std::getenv("PMI_RANK") != nullptr;
}

MpiTransport::MpiTransport() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized != 0) {
    throw std::logic_error("MpiTransport: MPI is already initialized");
  }
  int provided = MPI_THREAD_SINGLE;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  // Errors come back as codes (turned into exceptions) instead of aborting inside MPI.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks_);
  MPI_Comm_dup(MPI_COMM_WORLD, &collective_comm_);
  MPI_Comm_dup(MPI_COMM_WORLD, &control_comm_);
  MPI_Comm host = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host);
  MPI_Comm_size(host, &ranks_on_host_);
  MPI_Comm_free(&host);
  int* tag_upper_bound = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_upper_bound, &found);
  if (found != 0 && tag_upper_bound != nullptr) {
    max_tag_ = *tag_upper_bound;
  }
  g_rank = rank_;
  struct sigaction action {};
  action.sa_handler = report_sigterm;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  kill_rank_ = environment_int("TPUSIM_FAULT_KILL_RANK");
  kill_step_ = environment_int("TPUSIM_FAULT_AT_STEP");
}

MpiTransport::~MpiTransport() {
  signal(SIGTERM, SIG_DFL);
  MPI_Comm_free(&collective_comm_);
  MPI_Comm_free(&control_comm_);
  MPI_Finalize();
}

std::unique_ptr<Communicator> MpiTransport::make_communicator(
    const std::array<int, kNumMeshAxes>& sizes, const std::vector<int>& owner,
    std::chrono::milliseconds timeout) {
  return std::make_unique<MpiCommunicator>(*this, sizes, owner, timeout);
}

void MpiTransport::note_failure(const std::string& /*message*/) {
  failed_.store(true);
}

void MpiTransport::wait_all(std::vector<MPI_Request>& requests, const std::vector<int>& peers,
                            std::chrono::milliseconds timeout, const std::string& what,
                            const std::shared_ptr<void>& buffers) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + timeout;
  std::set<int> expected;
  for (const int peer : peers) {
    if (peer >= 0) {
      expected.insert(peer);
    }
  }
  const int note =
      note_wait(what + (expected.empty() ? "" : " for rank(s) " + list_ranks(expected)));
  // Short waits spin (yielding), longer ones sleep, doubling up to a millisecond.
  constexpr int kSpins = 32;
  constexpr auto kFirstSleep = std::chrono::microseconds(20);
  constexpr auto kLongestSleep = std::chrono::microseconds(1000);
  auto sleep = kFirstSleep;
  int polls = 0;
  std::string failure;
  while (true) {
    bool done = true;
    {
      const std::lock_guard lock(mpi_mutex_);
      for (MPI_Request& request : requests) {
        if (request == MPI_REQUEST_NULL) {
          continue;
        }
        int flag = 0;
        const int code = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
        if (code != MPI_SUCCESS) {
          failure =
              "rank " + std::to_string(rank_) + ": " + what + ": MPI error " + std::to_string(code);
          break;
        }
        done = done && flag != 0;
      }
    }
    if (failure.empty() && done) {
      break;
    }
    if (failure.empty() && failed_.load()) {
      failure = "rank " + std::to_string(rank_) + ": " + what +
                " abandoned after an earlier failure on this rank";
    }
    if (failure.empty() && Clock::now() >= deadline) {
      std::set<int> missing;
      for (size_t index = 0; index < requests.size(); ++index) {
        if (requests[index] != MPI_REQUEST_NULL) {
          missing.insert(peers[index]);
        }
      }
      std::string waited_for;
      if (missing.contains(-1) || missing.empty()) {
        waited_for = " waiting for the other ranks";
      } else {
        waited_for = " waiting for rank(s) " + list_ranks(missing);
      }
      failure = "rank " + std::to_string(rank_) + ": " + what + " timed out after " +
                describe_seconds(timeout) + waited_for;
    }
    if (!failure.empty()) {
      clear_wait(note);
      failed_.store(true);
      const std::lock_guard lock(graveyard_mutex_);
      graveyard_.push_back(buffers);
      throw std::runtime_error(failure);
    }
    if (++polls < kSpins) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::duration_cast<decltype(sleep)>(kLongestSleep));
    }
  }
  clear_wait(note);
}

std::vector<std::vector<double>> MpiTransport::all_gather(const std::vector<double>& mine) {
  auto counts = std::make_shared<std::vector<int>>(static_cast<size_t>(ranks_));
  auto count = std::make_shared<int>(to_count(mine.size(), "all_gather"));
  std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
  {
    const std::lock_guard lock(mpi_mutex_);
    check(MPI_Iallgather(count.get(), 1, MPI_INT, counts->data(), 1, MPI_INT, control_comm_,
                         requests.data()),
          "MPI_Iallgather");
  }
  wait_all(requests, {-1}, timeout(), "all-gather of the step's results", counts);
  std::vector<int> offsets(static_cast<size_t>(ranks_), 0);
  size_t total = 0;
  for (size_t rank = 0; rank < counts->size(); ++rank) {
    offsets[rank] = to_count(total, "all_gather");
    total += static_cast<size_t>((*counts)[rank]);
  }
  auto gathered = std::make_shared<std::vector<double>>(total);
  auto sent = std::make_shared<std::vector<double>>(mine);
  {
    const std::lock_guard lock(mpi_mutex_);
    check(MPI_Iallgatherv(sent->data(), *count, MPI_DOUBLE, gathered->data(), counts->data(),
                          offsets.data(), MPI_DOUBLE, control_comm_, requests.data()),
          "MPI_Iallgatherv");
  }
  wait_all(requests, {-1}, timeout(), "all-gather of the step's results",
           std::make_shared<std::pair<decltype(gathered), decltype(sent)>>(gathered, sent));
  std::vector<std::vector<double>> by_rank(static_cast<size_t>(ranks_));
  for (size_t rank = 0; rank < by_rank.size(); ++rank) {
    const auto begin = gathered->begin() + offsets[rank];
    by_rank[rank].assign(begin, begin + (*counts)[rank]);
  }
  return by_rank;
}

std::vector<std::vector<float>> MpiTransport::gather_to_root(const std::vector<float>& mine) {
  auto counts = std::make_shared<std::vector<int>>(static_cast<size_t>(ranks_));
  auto count = std::make_shared<int>(to_count(mine.size(), "gather"));
  std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
  {
    const std::lock_guard lock(mpi_mutex_);
    check(MPI_Igather(count.get(), 1, MPI_INT, counts->data(), 1, MPI_INT, 0, control_comm_,
                      requests.data()),
          "MPI_Igather");
  }
  wait_all(requests, {-1}, timeout(), "gather of the model state to rank 0", counts);
  std::vector<int> offsets(static_cast<size_t>(ranks_), 0);
  size_t total = 0;
  if (rank_ == 0) {
    for (size_t rank = 0; rank < counts->size(); ++rank) {
      offsets[rank] = to_count(total, "gather");
      total += static_cast<size_t>((*counts)[rank]);
    }
  }
  auto gathered = std::make_shared<std::vector<float>>(total);
  auto sent = std::make_shared<std::vector<float>>(mine);
  {
    const std::lock_guard lock(mpi_mutex_);
    check(MPI_Igatherv(sent->data(), *count, MPI_FLOAT, gathered->data(), counts->data(),
                       offsets.data(), MPI_FLOAT, 0, control_comm_, requests.data()),
          "MPI_Igatherv");
  }
  wait_all(requests, {-1}, timeout(), "gather of the model state to rank 0",
           std::make_shared<std::pair<decltype(gathered), decltype(sent)>>(gathered, sent));
  if (rank_ != 0) {
    return {};
  }
  std::vector<std::vector<float>> by_rank(static_cast<size_t>(ranks_));
  for (size_t rank = 0; rank < by_rank.size(); ++rank) {
    const auto begin = gathered->begin() + offsets[rank];
    by_rank[rank].assign(begin, begin + (*counts)[rank]);
  }
  return by_rank;
}

std::string MpiTransport::broadcast_from_root(const std::string& bytes) {
  auto size = std::make_shared<uint64_t>(rank_ == 0 ? bytes.size() : 0);
  std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
  {
    const std::lock_guard lock(mpi_mutex_);
    check(MPI_Ibcast(size.get(), 1, MPI_UINT64_T, 0, control_comm_, requests.data()), "MPI_Ibcast");
  }
  wait_all(requests, {-1}, timeout(), "broadcast from rank 0", size);
  auto data = std::make_shared<std::string>(rank_ == 0 ? bytes : std::string(*size, '\0'));
  constexpr uint64_t kChunk = uint64_t{1} << 30;
  for (uint64_t offset = 0; offset < *size; offset += kChunk) {
    const int count = static_cast<int>(std::min(kChunk, *size - offset));
    {
      const std::lock_guard lock(mpi_mutex_);
      check(MPI_Ibcast(data->data() + offset, count, MPI_BYTE, 0, control_comm_, requests.data()),
            "MPI_Ibcast");
    }
    wait_all(requests, {-1}, timeout(), "broadcast from rank 0", data);
  }
  return *data;
}

void MpiTransport::at_step(int64_t step) {
  if (kill_rank_ == rank_ && kill_step_ == step) {
    // Stall first, so that the other ranks are waiting in a collective with this one when it dies.
    constexpr auto kStall = std::chrono::seconds(2);
    std::cerr << "tpusim: rank " << rank_ << ": TPUSIM_FAULT_KILL_RANK: stalls at step " << step
              << ", then kills itself (test hook)" << std::endl;
    std::this_thread::sleep_for(kStall);
    std::raise(SIGKILL);
  }
}

void MpiTransport::abort_run(const std::string& message, int exit_code) {
  if (rank_ != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  const std::string prefix = "rank " + std::to_string(rank_) + ": ";
  std::cerr << "tpusim: " << (message.starts_with(prefix) ? "" : prefix) << message << std::endl;
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this only satisfies [[noreturn]]
}

}  // namespace tpusim
