// fuzz/standalone_driver.cpp: a main() for the fuzz targets without libFuzzer (gcc builds, the
// default test tier): replays files and runs a fixed-seed, deterministic mutation schedule.
//
//   <target>_fuzz [-runs=N] [-seed=S] [-max_len=B] [-dict=FILE] [-close_fd_mask=M] PATH...
//
// Every PATH (a file, or a directory of files: a seed corpus) is first run as it is, so
// `config_fuzz crash-1234` replays a libFuzzer crash reproducer under any compiler. Then N
// mutated inputs are run, each made from one seed (picked at random) by 1 to 4 mutations: bit
// flip, byte set, byte insert or erase, chunk erase or duplicate, splice with another seed,
// insertion or overwrite with a dictionary token (the built-in tokens: YAML/JSON punctuation,
// huge numbers, -1, 0, NaN, "\xff"; plus the -dict file, libFuzzer's format), an ASCII digit
// change. The schedule depends only on the seed, the inputs and N: a failure repeats.
// -close_fd_mask=1/2/3 silences the target's stdout/stderr as libFuzzer's flag does (this
// driver's own messages still show). Exit 0 when every input ran; a bug in the target aborts,
// and the input is saved as <-artifact_prefix>crash-input (default ./crash-input) for replay.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

using Bytes = std::string;

// Tokens that often break readers of YAML, JSON, key=value lists and binary headers.
const std::vector<Bytes>& builtin_tokens() {
  static const std::vector<Bytes> tokens = {
      ":",
      ": ",
      "\n",
      "- ",
      "[",
      "]",
      "{",
      "}",
      ",",
      "\"",
      "'",
      "=",
      "&a ",
      "*a",
      "!!str ",
      "---\n",
      "null",
      "~",
      "true",
      "-1",
      "0",
      "1e308",
      "-1e308",
      "NaN",
      ".nan",
      ".inf",
      "-.inf",
      "4294967296",
      "9223372036854775807",
      "9223372036854775808",
      "18446744073709551615",
      "-9223372036854775808",
      "99999999999999999999999",
      "1_000",
      "0x7fffffff",
      "\xff",
      "\xc3\x28",
      std::string("\0", 1),
      std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8),
      std::string("\x00\x00\x00\x00\x00\x00\x00\x00", 8),
  };
  return tokens;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

// libFuzzer's dictionary format: one token per line, `name="value"` or `"value"`, with \\, \" and
// \xAB escapes; '#' lines are comments.
std::vector<Bytes> read_dictionary(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "standalone_driver: cannot read dictionary %s\n", path.c_str());
    std::exit(2);
  }
  std::vector<Bytes> tokens;
  std::string line;
  while (std::getline(in, line)) {
    const size_t open = line.find('"');
    const size_t close = line.rfind('"');
    if (line.empty() || line[0] == '#' || open == std::string::npos || close <= open) {
      continue;
    }
    Bytes token;
    for (size_t i = open + 1; i < close; ++i) {
      if (line[i] == '\\' && i + 1 < close) {
        if (line[i + 1] == 'x' && i + 3 < close && hex_digit(line[i + 2]) >= 0 &&
            hex_digit(line[i + 3]) >= 0) {
          token += static_cast<char>(hex_digit(line[i + 2]) * 16 + hex_digit(line[i + 3]));
          i += 3;
        } else {
          token += line[i + 1];
          i += 1;
        }
      } else {
        token += line[i];
      }
    }
    tokens.push_back(token);
  }
  return tokens;
}

Bytes read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class Mutator {
 public:
  Mutator(uint64_t seed, const std::vector<Bytes>& seeds, const std::vector<Bytes>& tokens,
          size_t max_len)
      : random_(seed), seeds_(seeds), tokens_(tokens), max_len_(max_len) {}

  Bytes next() {
    Bytes input = seeds_.empty() ? Bytes() : seeds_[below(seeds_.size())];
    const size_t mutations = 1 + below(4);
    for (size_t m = 0; m < mutations; ++m) {
      mutate(input);
    }
    if (input.size() > max_len_) {
      input.resize(max_len_);
    }
    return input;
  }

 private:
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(random_() % n); }

  const Bytes& token() {
    const size_t builtin = builtin_tokens().size();
    const size_t index = below(builtin + tokens_.size());
    return index < builtin ? builtin_tokens()[index] : tokens_[index - builtin];
  }

  void mutate(Bytes& input) {
    const size_t pos = below(input.size() + 1);
    switch (below(10)) {
      case 0:  // bit flip
        if (!input.empty()) {
          input[below(input.size())] ^= static_cast<char>(1u << below(8));
        }
        break;
      case 1:  // byte set
        if (!input.empty()) {
          input[below(input.size())] = static_cast<char>(below(256));
        }
        break;
      case 2:  // byte insert
        input.insert(pos, 1, static_cast<char>(below(256)));
        break;
      case 3:  // chunk erase (a single byte most of the time)
        if (!input.empty()) {
          const size_t at = below(input.size());
          input.erase(at, below(4) == 0 ? 1 + below(input.size() - at) : 1);
        }
        break;
      case 4: {  // chunk duplicate
        if (!input.empty()) {
          const size_t at = below(input.size());
          const Bytes chunk = input.substr(at, 1 + below(std::min<size_t>(64, input.size() - at)));
          input.insert(below(input.size() + 1), chunk);
        }
        break;
      }
      case 5: {  // splice: this input's head, another seed's tail
        if (!seeds_.empty()) {
          const Bytes& other = seeds_[below(seeds_.size())];
          input = input.substr(0, pos) + other.substr(below(other.size() + 1));
        }
        break;
      }
      case 6:  // token insert
      case 7:
        input.insert(pos, token());
        break;
      case 8: {  // token overwrite
        const Bytes& word = token();
        input.replace(pos, std::min(word.size(), input.size() - pos), word);
        break;
      }
      default: {  // change an ASCII digit (sizes, offsets, counts)
        std::vector<size_t> digits;
        for (size_t i = 0; i < input.size(); ++i) {
          if (input[i] >= '0' && input[i] <= '9') {
            digits.push_back(i);
          }
        }
        if (!digits.empty()) {
          input[digits[below(digits.size())]] = static_cast<char>('0' + below(10));
        } else if (!input.empty()) {
          input[below(input.size())] = static_cast<char>('0' + below(10));
        }
        break;
      }
    }
  }

  std::mt19937_64 random_;
  const std::vector<Bytes>& seeds_;
  const std::vector<Bytes>& tokens_;
  size_t max_len_;
};

// The input being run, written to <artifact_prefix>crash-input by the signal handler when the
// target aborts or crashes (only async-signal-safe calls there).
const Bytes* current_input = nullptr;
std::string crash_path = "crash-input";

extern "C" void save_crash_input(int signal_number) {
  if (current_input != nullptr) {
    const int fd = open(crash_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      [[maybe_unused]] const ssize_t written =
          write(fd, current_input->data(), current_input->size());
      close(fd);
    }
    static const char kMessage[] = "standalone_driver: the input is saved for replay as ";
    [[maybe_unused]] ssize_t ignored =
        write(tpusim::fuzz::report_fd, kMessage, sizeof(kMessage) - 1);
    ignored = write(tpusim::fuzz::report_fd, crash_path.data(), crash_path.size());
    ignored = write(tpusim::fuzz::report_fd, "\n", 1);
  }
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

void run_one(const Bytes& input) {
  current_input = &input;
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  current_input = nullptr;
}

bool flag(const char* argument, const char* name, long long& value) {
  const size_t length = std::strlen(name);
  if (std::strncmp(argument, name, length) != 0 || argument[length] != '=') {
    return false;
  }
  value = std::atoll(argument + length + 1);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  long long runs = 0;
  long long seed = 1;
  long long max_len = 4096;
  long long close_fd_mask = 0;
  std::vector<Bytes> tokens;
  std::vector<fs::path> paths;
  for (int i = 1; i < argc; ++i) {
    if (flag(argv[i], "-runs", runs) || flag(argv[i], "-seed", seed) ||
        flag(argv[i], "-max_len", max_len) || flag(argv[i], "-close_fd_mask", close_fd_mask)) {
      continue;
    }
    if (std::strncmp(argv[i], "-artifact_prefix=", 17) == 0) {
      crash_path = std::string(argv[i] + 17) + "crash-input";
      continue;
    }
    if (std::strncmp(argv[i], "-dict=", 6) == 0) {
      const std::vector<Bytes> more = read_dictionary(argv[i] + 6);
      tokens.insert(tokens.end(), more.begin(), more.end());
      continue;
    }
    if (argv[i][0] == '-') {
      std::fprintf(stderr, "standalone_driver: ignoring libFuzzer flag %s\n", argv[i]);
      continue;
    }
    paths.emplace_back(argv[i]);
  }
  std::vector<Bytes> seeds;
  for (const fs::path& path : paths) {
    if (fs::is_directory(path)) {
      std::vector<fs::path> files;
      for (const auto& entry : fs::directory_iterator(path)) {
        if (entry.is_regular_file()) {
          files.push_back(entry.path());
        }
      }
      std::sort(files.begin(), files.end());  // the schedule must not depend on readdir order
      for (const fs::path& file : files) {
        seeds.push_back(read_file(file));
      }
    } else if (fs::is_regular_file(path)) {
      seeds.push_back(read_file(path));
    } else {
      std::fprintf(stderr, "standalone_driver: no such file or directory: %s\n", path.c_str());
      return 2;
    }
  }
  // The driver's own messages and the targets' contract reports keep a copy of stderr.
  tpusim::fuzz::report_fd = dup(2);
  FILE* report = fdopen(dup(2), "w");
  const int null_fd = open("/dev/null", O_WRONLY);
  if ((close_fd_mask & 1) != 0) {
    dup2(null_fd, 1);
  }
  if ((close_fd_mask & 2) != 0) {
    dup2(null_fd, 2);
  }
  for (const int signal_number : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) {
    std::signal(signal_number, save_crash_input);
  }
  const auto start = std::chrono::steady_clock::now();
  for (const Bytes& input : seeds) {
    run_one(input);
  }
  Mutator mutator(static_cast<uint64_t>(seed), seeds, tokens, static_cast<size_t>(max_len));
  for (long long run = 0; run < runs; ++run) {
    run_one(mutator.next());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(report,
               "standalone_driver: %zu seed inputs and %lld mutated inputs (seed %lld) ran in %.1f "
               "s, no failure\n",
               seeds.size(), runs, seed, seconds);
  std::fclose(report);
  return 0;
}
