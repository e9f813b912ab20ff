// tests/sim/cli/divisibility_command_test.cpp: splits a mesh cannot make evenly (issue 35, items
// 1 and 2), end to end through the built tpusim. estimate and train refuse what explore prunes
// as axis_does_not_divide (sharding/divisibility.h) with exit 2 naming the key, the size and the
// mesh axis; train also refuses a fractional batch that XLA would pad, which it cannot compute.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "support/run_command.h"
#include "tests/sim/cli/cli_test_support.h"

namespace tpusim {
namespace {

using testing::run_tpusim;

// The reproducer (TR) without max_target_length, on synthetic data; train's own keys
// and flags (steps, num_threads, --verify, --quiet) only for train.
std::vector<std::string> tiny_run(const std::string& command,
                                  const std::vector<std::string>& extra) {
  const bool train = command == "train";
  std::vector<std::string> args = {command, "model_name=tiny-llama", "compile_topology=v5e-4",
                                   "dataset_type=synthetic"};
  if (train) {
    args.insert(args.end(), {"num_threads=1", "steps=3"});
  }
  for (const std::string& item : extra) {
    if (train || item.rfind("--", 0) != 0) {
      args.push_back(item);
    }
  }
  return args;
}

// Exit 2 with one line on stderr naming every one of `named`, and no step run.
void expect_refused(const std::vector<std::string>& args, const std::vector<std::string>& named) {
  const auto result = run_tpusim(args);
  EXPECT_EQ(result.exit_code, 2) << result.err;
  for (const std::string& part : named) {
    EXPECT_NE(result.err.find(part), std::string::npos) << part << " in: " << result.err;
  }
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  EXPECT_EQ(result.out.find("loss"), std::string::npos) << result.out;
}

// 1.25 x 4 devices = 5 sequences over fsdp=4: MaxText loads 5 and cannot shard them; train used
// to compute a loss of 10.07 instead of ~6.1.
TEST(RedTeam, Item1_NonDividingBatchIsRefused) {
  for (const char* command : {"train", "estimate"}) {
    SCOPED_TRACE(command);
    expect_refused(tiny_run(command, {"ici_fsdp_parallelism=4", "per_device_batch_size=1.25",
                                      "max_target_length=64", "--verify"}),
                   {"per_device_batch_size", "1.25", "5 sequences", "ici_fsdp_parallelism=4"});
  }
}

// The same over data parallelism.
TEST(RedTeam, Item1_NonDividingBatchOverDataIsRefused) {
  for (const char* command : {"train", "estimate"}) {
    SCOPED_TRACE(command);
    expect_refused(tiny_run(command, {"ici_data_parallelism=4", "ici_fsdp_parallelism=1",
                                      "per_device_batch_size=1.25", "max_target_length=64"}),
                   {"per_device_batch_size", "5 sequences", "ici_data_parallelism=4"});
  }
}

// 0.75 x 4 = 3 sequences: MaxText loads 4 (one per device) and keeps 3, which XLA pads over
// fsdp=4. estimate models that padding; train cannot compute it and refuses before any step.
TEST(RedTeam, Item1_FractionalBatchTrainCannotSplitIsRefusedByTrain) {
  expect_refused(tiny_run("train", {"ici_fsdp_parallelism=4", "per_device_batch_size=0.75",
                                    "max_target_length=64", "--verify"}),
                 {"per_device_batch_size", "0.75", "3 sequences", "ici_fsdp_parallelism=4"});
  const auto estimate =
      run_tpusim(tiny_run("estimate", {"ici_fsdp_parallelism=4", "per_device_batch_size=0.75",
                                       "max_target_length=64"}));
  EXPECT_EQ(estimate.exit_code, 0) << estimate.err;
}

// max_target_length=65 over context=4: the inputs' length does not split (train used to compute
// a wrong loss; estimate accepted what explore prunes).
TEST(RedTeam, Item2_LengthNotAMultipleOfContextIsRefused) {
  for (const char* command : {"train", "estimate"}) {
    SCOPED_TRACE(command);
    expect_refused(tiny_run(command, {"ici_context_parallelism=4", "ici_fsdp_parallelism=1",
                                      "per_device_batch_size=4", "max_target_length=65"}),
                   {"max_target_length", "65", "ici_context_parallelism=4"});
  }
}

// A parameter dim is a jit argument too: tiny-llama's 2 kv heads over tensor=4 (which train
// used to compute by gathering the kv heads) is refused, as explore prunes it.
TEST(DivisibilityCommand, TensorWiderThanTheKvHeadsIsRefused) {
  for (const char* command : {"train", "estimate"}) {
    SCOPED_TRACE(command);
    expect_refused(
        tiny_run(command, {"ici_tensor_parallelism=4", "ici_fsdp_parallelism=1",
                           "per_device_batch_size=1", "max_target_length=64"}),
        {"ici_tensor_parallelism", "kv_heads", "base_num_kv_heads", "2 is not a multiple of 4"});
  }
}

// A split that divides still trains: the same mesh with max_target_length=64.
TEST(DivisibilityCommand, LengthThatDividesContextStillTrains) {
  const auto result =
      run_tpusim(tiny_run("train", {"ici_context_parallelism=4", "ici_fsdp_parallelism=1",
                                    "per_device_batch_size=4", "max_target_length=64", "--quiet"}));
  EXPECT_EQ(result.exit_code, 0) << result.err;
}

// I-19 of validation/published.csv (per_device_batch_size=0.125 on 256 chips: 32 sequences over
// fsdp=32, context=8), which MaxText ran, still estimates.
TEST(DivisibilityCommand, PublishedFractionalBatchStillEstimates) {
  const auto result = run_tpusim(
      {"estimate", "model_name=llama3.1-70b", "compile_topology=tpu7x-512",
       "compile_topology_num_slices=1", "max_target_length=131072", "per_device_batch_size=0.125",
       "ici_context_parallelism=8", "ici_fsdp_parallelism=-1", "remat_policy=custom",
       "attention=flash", "opt_type=adam_pax", "quantization=fp8_full"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
}

}  // namespace
}  // namespace tpusim
