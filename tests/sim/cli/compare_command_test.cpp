// tests/sim/cli/compare_command_test.cpp: `tpusim compare` (sim/cli/compare_command.cpp) against
// `tpusim estimate` of each side, an estimate that does not fit saying so first and exiting 3
// under --require-fit, and `--trace` of a large run keeping the trace-event format's rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/run_command.h"
#include "tests/sim/cli/cli_test_support.h"

namespace tpusim {
namespace {

using testing::run_tpusim;

// llama3.1-70b on v6e-256 at base.yml's batch needs ~44 GiB per device of a chip with ~31 GiB
// usable: it does not fit.
const std::vector<std::string> kOutOfMemory = {"estimate", "model_name=llama3.1-70b",
                                               "compile_topology=v6e-256"};

std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

TEST(EstimateCommand, OutOfMemorySaysSoFirstAndRequireFitExits3) {
  const auto plain = run_tpusim(kOutOfMemory);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_TRUE(first_line(plain.out).starts_with("OUT OF MEMORY: peak HBM per device "))
      << plain.out;
  std::vector<std::string> required = kOutOfMemory;
  required.emplace_back("--require-fit");
  const auto refused = run_tpusim(required);
  EXPECT_EQ(refused.exit_code, 3) << refused.err;
  EXPECT_EQ(refused.out, plain.out);  // the report is still printed
  EXPECT_NE(refused.err.find("--require-fit: OUT OF MEMORY"), std::string::npos) << refused.err;
  required.emplace_back("--json");
  const auto json = run_tpusim(required);
  EXPECT_EQ(json.exit_code, 3);
  EXPECT_FALSE(nlohmann::json::parse(json.out)["fits"].get<bool>());
  // A run that fits: no verdict line, and --require-fit exits 0.
  const auto fits =
      run_tpusim({"estimate", "model_name=tiny-llama", "compile_topology=v5e-4", "--require-fit"});
  EXPECT_EQ(fits.exit_code, 0) << fits.err;
  EXPECT_TRUE(first_line(fits.out).starts_with("model ")) << fits.out;
}

TEST(CompareCommand, EachSideIsItsEstimate) {
  const std::vector<std::string> shared = {"model_name=llama2-7b", "compile_topology=v5p-32"};
  std::vector<std::string> args = {"compare"};
  args.insert(args.end(), shared.begin(), shared.end());
  args.insert(args.end(), {"--a", "remat_policy=full", "--b",
                           "remat_policy=minimal per_device_batch_size=2", "--json"});
  const auto result = run_tpusim(args);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json comparison = nlohmann::json::parse(result.out);
  std::map<std::string, nlohmann::json> estimates;
  for (const auto& [side, extra] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"a", {"remat_policy=full"}},
           {"b", {"remat_policy=minimal", "per_device_batch_size=2"}}}) {
    std::vector<std::string> estimate_args = {"estimate"};
    estimate_args.insert(estimate_args.end(), shared.begin(), shared.end());
    estimate_args.insert(estimate_args.end(), extra.begin(), extra.end());
    estimate_args.emplace_back("--json");
    const auto estimate = run_tpusim(estimate_args);
    ASSERT_EQ(estimate.exit_code, 0) << estimate.err;
    estimates[side] = nlohmann::json::parse(estimate.out);
    EXPECT_EQ(comparison[side]["estimate"]["step_time_s"], estimates[side]["step_time_s"]);
    EXPECT_EQ(comparison[side]["estimate"]["mfu"], estimates[side]["mfu"]);
    EXPECT_EQ(comparison[side]["estimate"]["breakdown"], estimates[side]["breakdown"]);
  }
  EXPECT_DOUBLE_EQ(
      comparison["step_time_ratio"].get<double>(),
      estimates["b"]["step_time_s"].get<double>() / estimates["a"]["step_time_s"].get<double>());
  // Each breakdown row's seconds are the estimate's under that key.
  for (const auto& row : comparison["breakdown"]) {
    const std::string key = row["key"];
    EXPECT_EQ(row["a"].get<double>(), estimates["a"]["breakdown"].value(key, 0.0)) << key;
    EXPECT_EQ(row["b"].get<double>(), estimates["b"]["breakdown"].value(key, 0.0)) << key;
    EXPECT_EQ(row["label"].get<std::string>().find('_'), std::string::npos) << row["label"];
  }
  EXPECT_FALSE(comparison["op_changes"].empty());
  // The text table names both runs and shows step time and MFU side by side.
  args.pop_back();
  const auto table = run_tpusim(args);
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("A  tpusim estimate model_name=llama2-7b compile_topology=v5p-32 "
                           "remat_policy=full\n"),
            std::string::npos)
      << table.out;
  EXPECT_NE(table.out.find("\nstep time "), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("\nMFU "), std::string::npos) << table.out;
}

// A key that --a or --b sets replaces the shared one (the later key wins, as the command's help
// says): each side is the estimate with its own value, not "given twice on the command line".
TEST(CompareCommand, ASideKeyReplacesTheSharedOne) {
  const auto result = run_tpusim({"compare", "model_name=tiny-llama", "compile_topology=v5e-4",
                                  "per_device_batch_size=2", "--a", "per_device_batch_size=1",
                                  "--b", "per_device_batch_size=4", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json comparison = nlohmann::json::parse(result.out);
  // 4 devices of one v5e-4: 1 and 4 sequences each.
  EXPECT_EQ(comparison["a"]["estimate"]["global_batch_sequences"], 4);
  EXPECT_EQ(comparison["b"]["estimate"]["global_batch_sequences"], 16);
  const auto table = run_tpusim({"compare", "model_name=tiny-llama", "compile_topology=v5e-4",
                                 "per_device_batch_size=2", "--a", "per_device_batch_size=1", "--b",
                                 "remat_policy=full"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("A  tpusim estimate model_name=tiny-llama compile_topology=v5e-4 "
                           "per_device_batch_size=1\n"),
            std::string::npos)
      << table.out;
}

// A side's config file beats the shared words too: --a a.yml setting per_device_batch_size was
// overridden by the shared per_device_batch_size=2 (a command-line key beats a file), silently.
TEST(CompareCommand, ASideConfigFileReplacesTheSharedKey) {
  const std::string file = ::testing::TempDir() + "/compare_side_batch.yml";
  std::ofstream(file) << "per_device_batch_size: 1\n";
  const auto result =
      run_tpusim({"compare", "model_name=tiny-llama", "compile_topology=v5e-4",
                  "per_device_batch_size=2", "--a", file, "--b", "remat_policy=full", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json comparison = nlohmann::json::parse(result.out);
  EXPECT_EQ(comparison["a"]["estimate"]["global_batch_sequences"], 4);
  EXPECT_EQ(comparison["b"]["estimate"]["global_batch_sequences"], 8);
}

TEST(CompareCommand, BadInputNamesTheSide) {
  expect_user_error({"compare", "model_name=llama2-7b", "--a", "remat_policy=full"}, "--b");
  expect_user_error({"compare", "model_name=llama2-7b", "compile_topology=v5p-32", "--a",
                     "remat_policy=nope", "--b", "remat_policy=full"},
                    "A (--a)");
}

// The trace-event format's rules (the JSON Perfetto and chrome://tracing load): every event has
// a phase; complete events ("X") carry name, numeric ts and dur >= 0, pid and tid; metadata
// names processes and threads; and on one thread complete events follow each other and never
// overlap (the simulator runs one op at a time per resource).
TEST(EstimateCommand, TraceOfALargeRunKeepsTheTraceEventRules) {
  const std::string path = ::testing::TempDir() + "/tpusim_70b_trace.json";
  std::vector<std::string> args = kOutOfMemory;
  args.insert(args.end(), {"--trace", path});
  const auto result = run_tpusim(args);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::ifstream stream(path);
  const nlohmann::json trace = nlohmann::json::parse(stream);
  ASSERT_TRUE(trace["traceEvents"].is_array());
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> spans;
  int threads_named = 0;
  for (const auto& event : trace["traceEvents"]) {
    ASSERT_TRUE(event.contains("ph")) << event;
    const std::string phase = event["ph"];
    ASSERT_TRUE(phase == "X" || phase == "M" || phase == "C" || phase == "s" || phase == "f")
        << event;
    ASSERT_TRUE(event["pid"].is_number_integer()) << event;
    if (phase == "M") {
      threads_named += event["name"] == "thread_name" ? 1 : 0;
      continue;
    }
    ASSERT_TRUE(event["ts"].is_number()) << event;
    if (phase != "X") {
      continue;
    }
    ASSERT_TRUE(event["name"].is_string()) << event;
    ASSERT_TRUE(event["tid"].is_number_integer()) << event;
    ASSERT_TRUE(event["dur"].is_number() && event["dur"].get<double>() >= 0) << event;
    const double start = event["ts"];
    spans[{event["pid"], event["tid"]}].push_back({start, start + event["dur"].get<double>()});
  }
  EXPECT_EQ(threads_named, static_cast<int>(spans.size()));
  for (auto& [lane, events] : spans) {
    std::sort(events.begin(), events.end());
    for (size_t index = 1; index < events.size(); ++index) {
      // 1 ns of slack for the microsecond conversion's rounding.
      EXPECT_GE(events[index].first, events[index - 1].second - 1e-3)
          << "lane " << lane.second << " event " << index;
    }
  }
}

}  // namespace
}  // namespace tpusim
