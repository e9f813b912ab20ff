// fuzz/command_line_driver.cpp: runs many tpusim command lines in one process and reports every
// outcome that breaks the CLI's contract (exit 0; exit 2 with a one-line "tpusim: ..." message;
// exit 3 with the "tpusim: --require-fit: ..." verdict when --require-fit was given).
//
// Input: a file of command lines, one per line, written by fuzz/command_lines.py. A line is
// tab-separated tokens, the first a class label (what the generator tried), the rest argv after
// "tpusim". In tokens, "\t", "\n", "\\" and "\xHH" stand for a tab, a newline, a backslash and any
// byte, so a line can carry invalid UTF-8 and control characters.
//
// Each command runs through tpusim::run_cli with stdout and stderr sent to scratch files (read
// back to check the message); a wall-clock limit per command (SIGALRM) ends the process with
// exit 3 and names the line. Before each command the driver writes the line number to
// --progress-file, so a runner that sees the driver die (a crash) knows which line did it.
// At the end it prints one JSON object on its original stdout: per class the count, the exit codes
// seen and the slowest command; the violations (line number, exit code, stderr head); the peak RSS.
//
// Example:
//   command_line_driver --input lines.tsv --progress-file progress --timeout 30 > summary.json
// (--outcomes FILE also writes "line<TAB>exit code<TAB>seconds" for every command.)
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/cli/run_cli.h"

namespace {

int g_progress_fd = -1;
int64_t g_current_line = 0;

// Decodes one token of a line (see the header for the escapes); a malformed escape is kept as is.
std::string unescape(std::string_view token) {
  std::string out;
  for (size_t i = 0; i < token.size(); ++i) {
    if (token[i] != '\\' || i + 1 >= token.size()) {
      out += token[i];
      continue;
    }
    const char next = token[i + 1];
    if (next == 't') {
      out += '\t';
      ++i;
    } else if (next == 'n') {
      out += '\n';
      ++i;
    } else if (next == '\\') {
      out += '\\';
      ++i;
    } else if (next == 'x' && i + 3 < token.size()) {
      out += static_cast<char>(std::stoi(std::string(token.substr(i + 2, 2)), nullptr, 16));
      i += 3;
    } else {
      out += token[i];
    }
  }
  return out;
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> tokens;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    tokens.push_back(unescape(std::string_view(line).substr(start, tab - start)));
    if (tab == std::string::npos) {
      return tokens;
    }
    start = tab + 1;
  }
}

void on_alarm(int /*signal*/) {
  // Async-signal-safe: write the line number and end the process.
  char message[64];
  const int length = std::snprintf(message, sizeof(message), "hang at line %lld\n",
                                   static_cast<long long>(g_current_line));
  if (length > 0) {
    (void)!write(STDERR_FILENO, message, static_cast<size_t>(length));
  }
  _exit(3);
}

void record_progress(int64_t line) {
  g_current_line = line;
  if (g_progress_fd >= 0) {
    char text[32];
    const int length = std::snprintf(text, sizeof(text), "%020lld\n", static_cast<long long>(line));
    (void)!pwrite(g_progress_fd, text, static_cast<size_t>(length), 0);
  }
}

std::string read_head(int fd, size_t limit) {
  std::string text(limit, '\0');
  const ssize_t got = pread(fd, text.data(), limit, 0);
  text.resize(got > 0 ? static_cast<size_t>(got) : 0);
  return text;
}

// What the contract says an outcome must look like; "" when it does. `error_tail` is stderr from
// the last "tpusim: " on; `json_wanted`: --json was given, so stdout must end with one JSON object;
// `require_fit`: --require-fit was given, so a run that does not fit may exit 3 with its verdict.
std::string contract_violation(int code, const std::string& error_tail, bool json_wanted,
                               bool require_fit, const std::string& stdout_text) {
  if (code == 0) {
    return "";
  }
  if (code == 3 && require_fit) {
    return error_tail.rfind("tpusim: --require-fit: ", 0) == 0
               ? ""
               : "exit 3 without the 'tpusim: --require-fit: ' verdict on stderr";
  }
  if (code != 2) {
    return "exit " + std::to_string(code);
  }
  if (error_tail.rfind("tpusim: ", 0) != 0) {
    return "exit 2 without a 'tpusim: ' message on stderr";
  }
  const size_t newline = error_tail.find('\n');
  if (newline != std::string::npos && newline + 1 != error_tail.size()) {
    return "exit 2 message spans several lines";
  }
  if (json_wanted) {
    const size_t end = stdout_text.find_last_not_of('\n');
    const size_t start = end == std::string::npos ? 0 : stdout_text.rfind('\n', end);
    const std::string last_line =
        end == std::string::npos
            ? ""
            : stdout_text.substr(start == std::string::npos ? 0 : start + 1,
                                 end - (start == std::string::npos ? 0 : start + 1) + 1);
    const nlohmann::json error = nlohmann::json::parse(last_line, nullptr, false);
    if (!error.is_object() || error.value("exit", 0) != 2) {
      return "exit 2 under --json without an error object on stdout";
    }
  }
  return "";
}

// What the commands of one class (the input line's label) did.
struct ClassStats {
  int64_t count = 0;
  std::map<int, int64_t> exit_codes;
  double slowest_seconds = 0;
  int64_t slowest_line = 0;
};

// The run's summary: commands, peak memory, each class's exit codes and slowest command, and
// what broke the command-line contract.
nlohmann::json summarize(int64_t line_number, const std::map<std::string, ClassStats>& classes,
                         const nlohmann::json& violations, const nlohmann::json& memory_jumps) {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  nlohmann::json summary;
  summary["commands"] = line_number;
  summary["peak_rss_mib"] = static_cast<double>(usage.ru_maxrss) / 1024.0;
  for (const auto& [label, stats] : classes) {
    nlohmann::json codes;
    for (const auto& [code, count] : stats.exit_codes) {
      codes[std::to_string(code)] = count;
    }
    summary["classes"][label] = {{"count", stats.count},
                                 {"exit_codes", codes},
                                 {"slowest_seconds", stats.slowest_seconds},
                                 {"slowest_line", stats.slowest_line}};
  }
  summary["violations"] = violations;
  summary["memory_jumps"] = memory_jumps;
  return summary;
}

// The driver's command line: --input FILE [--progress-file F] [--outcomes F] [--timeout S].
struct DriverFlags {
  std::string input_path;
  std::string progress_path;
  std::string outcomes_path;
  int timeout_seconds = 60;
};

// False (after saying why) on an unknown flag.
bool parse_flags(int argc, char** argv, DriverFlags& flags) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--input") {
      flags.input_path = argv[i + 1];
    } else if (flag == "--progress-file") {
      flags.progress_path = argv[i + 1];
    } else if (flag == "--outcomes") {
      flags.outcomes_path = argv[i + 1];
    } else if (flag == "--timeout") {
      flags.timeout_seconds = std::atoi(argv[i + 1]);
    } else {
      std::cerr << "command_line_driver: unknown flag " << flag << "\n";
      return false;
    }
  }
  return true;
}

// The driver itself (main below only turns what escapes it into exit 70).
int run_driver(int argc, char** argv) {
  DriverFlags flags;
  if (!parse_flags(argc, argv, flags)) {
    return 64;
  }
  const std::string& input_path = flags.input_path;
  const std::string& progress_path = flags.progress_path;
  const std::string& outcomes_path = flags.outcomes_path;
  const int timeout_seconds = flags.timeout_seconds;
  std::ifstream input(input_path);
  if (input_path.empty() || !input) {
    std::cerr << "command_line_driver: --input FILE is required and must be readable\n";
    return 64;
  }
  if (!progress_path.empty()) {
    g_progress_fd = open(progress_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  // The summary goes to the original stdout; the commands' output to scratch files.
  const int summary_fd = dup(STDOUT_FILENO);
  std::ofstream outcomes;
  if (!outcomes_path.empty()) {
    outcomes.open(outcomes_path);
  }
  char out_name[] = "/tmp/tpusim-cli-fuzz-out-XXXXXX";
  char err_name[] = "/tmp/tpusim-cli-fuzz-err-XXXXXX";
  const int out_fd = mkstemp(out_name);
  const int err_fd = mkstemp(err_name);
  if (summary_fd < 0 || out_fd < 0 || err_fd < 0) {
    std::perror("command_line_driver");
    return 64;
  }
  unlink(out_name);
  unlink(err_name);
  signal(SIGALRM, on_alarm);

  std::map<std::string, ClassStats> classes;
  nlohmann::json violations = nlohmann::json::array();
  // Commands after which the peak resident memory rose by more than 256 MiB.
  nlohmann::json memory_jumps = nlohmann::json::array();
  double peak_mib = 0;
  std::string line;
  int64_t line_number = 0;
  while (std::getline(input, line)) {
    ++line_number;
    if (line.empty()) {
      continue;
    }
    std::vector<std::string> tokens = split_tabs(line);
    const std::string label = tokens.front();
    tokens.front() = "tpusim";
    std::vector<char*> args;
    args.reserve(tokens.size() + 1);
    for (std::string& token : tokens) {
      args.push_back(token.data());
    }
    args.push_back(nullptr);

    std::cout.flush();
    std::cerr.flush();
    for (const int fd : {out_fd, err_fd}) {
      (void)!ftruncate(fd, 0);
      lseek(fd, 0, SEEK_SET);
    }
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    record_progress(line_number);
    alarm(static_cast<unsigned>(timeout_seconds));
    const auto start = std::chrono::steady_clock::now();
    const int code = tpusim::run_cli(static_cast<int>(tokens.size()), args.data());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    alarm(0);
    std::cout.flush();
    std::cerr.flush();
    std::fflush(stdout);
    std::fflush(stderr);

    rusage after{};
    getrusage(RUSAGE_SELF, &after);
    const double now_mib = static_cast<double>(after.ru_maxrss) / 1024.0;
    if (now_mib > peak_mib + 256 && memory_jumps.size() < 100) {
      memory_jumps.push_back({{"line", line_number}, {"class", label}, {"peak_mib", now_mib}});
    }
    peak_mib = std::max(peak_mib, now_mib);
    if (outcomes.is_open()) {
      outcomes << line_number << '\t' << code << '\t' << seconds << '\n';
    }
    ClassStats& stats = classes[label];
    ++stats.count;
    ++stats.exit_codes[code];
    if (seconds > stats.slowest_seconds) {
      stats.slowest_seconds = seconds;
      stats.slowest_line = line_number;
    }
    // Only a failing exit needs its output: the error message is the last "tpusim: " on stderr.
    if (code != 0) {
      const std::string errors = read_head(err_fd, 1 << 20);
      const size_t error_at = errors.rfind("tpusim: ");
      const std::string tail =
          error_at == std::string::npos ? errors.substr(0, 400) : errors.substr(error_at);
      bool json_wanted = false;
      bool require_fit = false;
      for (const std::string& token : tokens) {
        json_wanted = json_wanted || token == "--json";
        require_fit = require_fit || token == "--require-fit";
      }
      const std::string problem =
          contract_violation(code, tail, json_wanted, require_fit,
                             json_wanted ? read_head(out_fd, 1 << 20) : std::string());
      if (!problem.empty() && violations.size() < 1000) {
        violations.push_back({{"line", line_number},
                              {"class", label},
                              {"problem", problem},
                              {"exit", code},
                              {"stderr", tail.substr(0, 400)}});
      }
    }
  }
  const nlohmann::json summary = summarize(line_number, classes, violations, memory_jumps);
  const std::string text =
      summary.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  (void)!write(summary_fd, text.data(), text.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_driver(argc, argv);
  } catch (const std::exception& error) {
    std::cerr << "command_line_driver: " << error.what() << "\n";
    return 70;
  }
}
