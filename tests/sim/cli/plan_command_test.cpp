// tests/sim/cli/plan_command_test.cpp: `tpusim plan` end to end through the built tpusim: bad
// input exits 2 naming the key and value; the JSON, CSV and HTML outputs; and the price file
// feeding `explore --objective tokens_per_dollar` (sim/cli/plan_command.cpp, explore_command.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/run_command.h"
#include "tests/sim/cli/cli_test_support.h"

namespace tpusim {
namespace {

using testing::run_tpusim;

std::string write_temp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

const std::vector<std::string> kToy = {"plan",
                                       "model_name=tiny-llama",
                                       "remat_policy=full",
                                       "attention=dot_product",
                                       "ici_tensor_parallelism=1",
                                       "ici_context_parallelism=1",
                                       "--tokens",
                                       "1e9",
                                       "--hardware",
                                       "v5e,v6e",
                                       "--max-chips",
                                       "8",
                                       "--global-batch-tokens",
                                       "65536",
                                       "--threads",
                                       "1"};

std::vector<std::string> toy_with(const std::vector<std::string>& more) {
  std::vector<std::string> args = kToy;
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST(PlanCommand, BadInputExitsTwoNamingTheValue) {
  expect_user_error({"plan", "model_name=tiny-llama", "--tokens", "1e9", "--hardware", "v5e,v9z"},
                    "'v9z'");
  expect_user_error({"plan", "model_name=tiny-llama", "--tokens", "-5"}, "--tokens");
  expect_user_error({"plan", "model_name=tiny-llama", "--tokens", "lots"}, "'lots'");
  expect_user_error({"plan", "model_name=tiny-llama", "--tokens", " 5"}, "' 5'");
  expect_user_error(
      {"plan", "model_name=tiny-llama", "--tokens", "1e9", "--global-batch-tokens", "0.5"},
      "0.5-0.5 holds no whole number");
  expect_user_error(toy_with({"--deadline", "soon"}), "'soon'");
  expect_user_error(toy_with({"--deadline", "30y"}), "'30y'");
  expect_user_error(toy_with({"--objective", "speed"}), "'speed'");
  expect_user_error(toy_with({"--objective", "cost"}), "--prices");
  expect_user_error(toy_with({"--consumption", "reserved"}), "'reserved'");
  expect_user_error(
      {"plan", "model_name=tiny-llama", "--tokens", "1e9", "--global-batch-tokens", "8M-1M"},
      "8M-1M");
  expect_user_error(toy_with({"compile_topology=v5e-8"}), "compile_topology");
  const std::string malformed = write_temp("plan_bad_prices.yml", "hardware: [v5e\n");
  expect_user_error(toy_with({"--prices", malformed}), malformed);
  const std::string negative =
      write_temp("plan_negative_prices.yml", "hardware:\n  v5e: {per: chip_hour, spot: -1}\n");
  expect_user_error(toy_with({"--prices", negative}), "hardware.v5e.spot");
  // A prices file that cannot be read names the option ("cannot read file" alone did not).
  expect_user_error(toy_with({"--prices", "/nonexistent/prices.yml"}),
                    "--prices: cannot read file '/nonexistent/prices.yml'");
  // Search limits are refused before any slice is searched (not noted slice by slice, exit 0).
  expect_user_error(toy_with({"--min-hbm-headroom", "1.5"}), "--min-hbm-headroom: 1.5");
  expect_user_error(toy_with({"--max-per-device-batch", "-1"}), "--max-per-device-batch: -1");
}

// A deadline under a day was written "within 0 days"; a token budget below one global batch
// planned a fraction of a step (tiny-llama, 1e6 tokens against 8.39M per step: 5.9e-07 days).
TEST(RedTeam, S60_PlanDeadlineInHoursAndBudgetBelowOneBatch) {
  const auto hour = run_tpusim({"plan", "model_name=llama3.1-8b", "--tokens", "1e11", "--deadline",
                                "1h", "--hardware", "v5e", "--max-chips", "16"});
  ASSERT_EQ(hour.exit_code, 0) << hour.err;
  EXPECT_NE(hour.out.find("trains 100G tokens within 1 hour "), std::string::npos) << hour.out;
  expect_user_error(
      {"plan", "model_name=tiny-llama", "--tokens", "1e6", "--hardware", "v5e", "--max-chips", "4"},
      "--tokens: 1M is less than one global batch (8.39M tokens");
}

// --consumption without --prices changed nothing, exit 0 (explore did not even check the value).
TEST(RedTeam, S60_ConsumptionNeedsPrices) {
  expect_user_error(
      {"explore", "model_name=tiny-llama", "compile_topology=v5e-4", "--consumption", "foo"},
      "--consumption: unknown 'foo'");
  expect_user_error(
      {"explore", "model_name=tiny-llama", "compile_topology=v5e-4", "--consumption", "spot"},
      "--consumption spot: picks a column of --prices");
  expect_user_error({"plan", "model_name=tiny-llama", "--tokens", "1e9", "--hardware", "v5e",
                     "--max-chips", "4", "--consumption", "spot"},
                    "--consumption spot: picks a column of --prices");
}

// plan chooses the slice count: num_slices (which must equal compile_topology_num_slices) was
// refused for the first slice plan tried, advising compile_topology_num_slices, which plan
// refuses; and compile_topology_num_slices was refused as "compile_topology".
TEST(RedTeam, S60_PlanRefusesTheSliceCountKeysByName) {
  const std::vector<std::string> plan = {
      "plan", "model_name=tiny-llama", "--tokens", "1e9", "--hardware", "v5e", "--max-chips", "4"};
  for (const std::string key : {"num_slices", "compile_topology_num_slices"}) {
    std::vector<std::string> args = plan;
    args.push_back(key + "=2");
    expect_user_error(args, "plan: " + key + " is what plan chooses");
  }
}

// A trillion tokens, the README's --tokens 1e12, was written "1e+03G tokens".
TEST(RedTeam, S60_ATrillionTokensIsWritten1T) {
  const auto result =
      testing::run_tpusim({"plan", "model_name=llama3.1-8b", "--tokens", "1e12", "--deadline",
                           "30d", "--hardware", "v6e", "--max-chips", "8"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("trains 1T tokens within 30 days"), std::string::npos) << result.out;
  const std::string first_line = result.out.substr(0, result.out.find('\n'));
  EXPECT_EQ(first_line.find("e+"), std::string::npos) << first_line;
}

TEST(PlanCommand, JsonCsvAndHtml) {
  const std::string prices =
      write_temp("plan_toy_prices.yml",
                 "currency: TOY\nhardware:\n  v5e: {per: chip_hour, on_demand: 1}\n  v6e: {per: "
                 "chip_hour, on_demand: 3}\n");
  const std::string html = ::testing::TempDir() + "/tpusim_plan.html";
  const auto json_run = run_tpusim(toy_with({"--prices", prices, "--json", "--html", html}));
  ASSERT_EQ(json_run.exit_code, 0) << json_run.err;
  const nlohmann::json json = nlohmann::json::parse(json_run.out);
  EXPECT_EQ(json["objective"], "cost");  // the default with --prices
  EXPECT_EQ(json["front_against"], "cost");
  EXPECT_EQ(json["global_batch"]["sequences"], 32);
  EXPECT_EQ(json["global_batch"]["source"], "--global-batch-tokens");
  ASSERT_FALSE(json["points"].empty());
  ASSERT_TRUE(json["pick"].is_number_integer());
  for (const auto& point : json["points"]) {
    const double price = point["hardware"] == "v5e" ? 1.0 : 3.0;
    EXPECT_DOUBLE_EQ(point["cost"].get<double>(), point["chip_hours"].get<double>() * price);
    EXPECT_NE(point["maxtext_command"].get<std::string>().find("MaxText.train"), std::string::npos);
  }
  EXPECT_NE(json["recommendation"].get<std::string>().find("Recommendation"), std::string::npos);
  std::ifstream page(html);
  const std::string text((std::istreambuf_iterator<char>(page)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("tpusim plan: tiny-llama"), std::string::npos);
  EXPECT_NE(text.find("front_against"), std::string::npos);

  const auto csv = run_tpusim(toy_with({"--prices", prices, "--csv"}));
  ASSERT_EQ(csv.exit_code, 0) << csv.err;
  std::istringstream lines(csv.out);
  std::string header;
  std::getline(lines, header);
  EXPECT_EQ(header.rfind("slice,hardware,chips,days,chip_hours,cost,", 0), 0U);
  int rows = 0;
  for (std::string line; std::getline(lines, line);) {
    ++rows;
  }
  EXPECT_EQ(rows, static_cast<int>(json["front"].size()));
}

TEST(PlanCommand, PricesFeedExploreTokensPerDollar) {
  const std::vector<std::string> explore = {"explore",
                                            "model_name=tiny-llama",
                                            "compile_topology=v5e-8",
                                            "remat_policy=full",
                                            "attention=dot_product",
                                            "--objective",
                                            "tokens_per_dollar",
                                            "--top",
                                            "1",
                                            "--json"};
  expect_user_error(explore, "--prices");
  const std::string prices =
      write_temp("explore_toy_prices.yml", "hardware:\n  v5e: {per: chip_hour, spot: 2}\n");
  std::vector<std::string> args = explore;
  args.insert(args.end(), {"--prices", prices, "--consumption", "spot"});
  const auto run = run_tpusim(args);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json json = nlohmann::json::parse(run.out);
  EXPECT_EQ(json["objective"], "tokens_per_dollar");
  ASSERT_EQ(json["top"].size(), 1U);
  // Ranked as tokens/s/chip: the same #1 as the default objective.
  std::vector<std::string> plain = {"explore",
                                    "model_name=tiny-llama",
                                    "compile_topology=v5e-8",
                                    "remat_policy=full",
                                    "attention=dot_product",
                                    "--top",
                                    "1",
                                    "--json"};
  const nlohmann::json by_rate = nlohmann::json::parse(run_tpusim(plain).out);
  EXPECT_EQ(json["top"][0]["args"], by_rate["top"][0]["args"]);
  // No price for the slice's kind: refused, naming it.
  args = explore;
  args.insert(args.end(), {"--prices", prices});  // on_demand: none given
  expect_user_error(args, "on_demand");
}

}  // namespace
}  // namespace tpusim
