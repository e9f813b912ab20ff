// End-to-end tests of the tpusim command line: output contracts and exit codes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/csv.h"
#include "common/yaml_text.h"
#include "support/run_command.h"

namespace tpusim {
namespace {

using testing::run_tpusim;

// A bad input must exit 2 with exactly one line on stderr that names the bad value.
void expect_user_error(const std::vector<std::string>& args, const std::string& named) {
  const auto result = run_tpusim(args);
  std::string joined;
  for (const auto& arg : args) {
    joined += arg + " ";
  }
  EXPECT_EQ(result.exit_code, 2) << joined << "\n" << result.err;
  EXPECT_NE(result.err.find(named), std::string::npos) << joined << "\n" << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
}

TEST(TopologyCommand, JsonContract) {
  const auto result = run_tpusim({"topology", "tpu7x-128", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_EQ(json["chips"], 64);
  EXPECT_EQ(json["devices"], 128);
  EXPECT_EQ(json["shape"], nlohmann::json({4, 4, 4}));
  EXPECT_EQ(json["wraparound"], nlohmann::json({true, true, true}));
  EXPECT_EQ(json["hosts"], 16);
  EXPECT_EQ(json["chips_per_host"], 4);
}

TEST(TopologyCommand, MultisliceAndHumanOutput) {
  const auto json_result = run_tpusim({"topology", "v5e-256", "--num-slices", "2", "--json"});
  ASSERT_EQ(json_result.exit_code, 0) << json_result.err;
  EXPECT_EQ(nlohmann::json::parse(json_result.out)["chips"], 512);
  const auto human = run_tpusim({"topology", "v6e-256"});
  ASSERT_EQ(human.exit_code, 0);
  EXPECT_NE(human.out.find("16x16"), std::string::npos);
  EXPECT_NE(human.out.find("bisection"), std::string::npos);
  // The per-slice figures come from one slice's graph: the most slices give the same figures
  // (10,000 slices of a 256-chip pod took 1.4 GB as one graph of all of them).
  const auto many = run_tpusim({"topology", "v5e-256", "--num-slices", "10000", "--json"});
  ASSERT_EQ(many.exit_code, 0) << many.err;
  nlohmann::json many_json = nlohmann::json::parse(many.out);
  nlohmann::json two_json = nlohmann::json::parse(json_result.out);
  EXPECT_EQ(many_json["chips"], 2560000);
  for (const char* key : {"axes", "bisection_bandwidth_tbps", "ici_links_per_chip",
                          "dcn_bandwidth_per_slice_gbps", "chips_per_slice"}) {
    EXPECT_EQ(many_json[key], two_json[key]) << key;
  }
}

TEST(TopologyCommand, DotToStdout) {
  const auto result = run_tpusim({"topology", "v5p-8", "--dot"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out.rfind("graph", 0), 0u);
}

TEST(TopologyCommand, InvalidInputsExit2) {
  expect_user_error({"topology", "v5q-128"}, "v5q");
  expect_user_error({"topology", "v5p-100"}, "v5p-100");
  expect_user_error({"topology", "v6e-512"}, "v6e-512");
  expect_user_error({"topology", "v5p:3x3x3"}, "3x3x3");
  expect_user_error({"topology", "v5p-128", "--num-slices", "0"}, "num_slices");
  // A million slices used to take 26 s and 2.9 GB: the slice count is bounded.
  expect_user_error({"topology", "v5p-16", "--num-slices", "1000000"}, "1000000");
  expect_user_error({"topology"}, "slice");
  expect_user_error({"topology", "v5p-8", "--bogus"}, "--bogus");
  expect_user_error({"topology", "v5p-8", "--json", "--dot"}, "--dot");
  // Drawing every device of 300 pods is refused, not attempted.
  expect_user_error({"topology", "v5e-256", "--num-slices", "300", "--dot", "/tmp/never.dot"},
                    "65536");
}

TEST(HwCommand, ListsCatalogWithSources) {
  const auto result = run_tpusim({"hw", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  ASSERT_GE(json.size(), 5u);
  for (const auto& chip : json) {
    for (const auto& [key, spec] : chip["specs"].items()) {
      EXPECT_TRUE(spec.contains("source") != spec.contains("assumption")) << key;
      EXPECT_TRUE(spec["value"].is_number()) << key;
    }
  }
  expect_user_error({"hw", "v9z"}, "v9z");
  const auto one = run_tpusim({"hw", "v5p"});
  EXPECT_EQ(one.exit_code, 0);
  EXPECT_NE(one.out.find("hbm_bandwidth_gbps"), std::string::npos);
}

TEST(ConfigCommand, LoadingOrderAndMesh) {
  const auto result = run_tpusim({"config", "model_name=llama3.1-70b", "compile_topology=v6e-256",
                                  "per_device_batch_size=4", "ici_tensor_parallelism=4", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_EQ(json["config"]["base_emb_dim"], 8192);
  EXPECT_EQ(json["config"]["per_device_batch_size"], 4.0);
  EXPECT_EQ(json["mesh"]["fsdp"]["ici"], 64);
  EXPECT_EQ(json["mesh"]["tensor"]["ici"], 4);
  EXPECT_EQ(json["devices"], 256);
}

TEST(ConfigCommand, ReadsBaseFileFromDiskWithPresetsBesideIt) {
  const std::string base = testing::source_dir() + "/configs/base.yml";
  const auto result = run_tpusim({"config", base, "model_name=mistral-7b", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(nlohmann::json::parse(result.out)["config"]["base_mlp_dim"], 14336);
}

TEST(ConfigCommand, EveryBadInputClassExits2) {
  expect_user_error({"config", "ici_fsdp_paralelism=4"}, "ici_fsdp_parallelism");
  expect_user_error({"config", "base_emb_dim=abc"}, "base_emb_dim");
  expect_user_error({"config", "base_emb_dim=99999999999"}, "base_emb_dim");
  expect_user_error({"config", "per_device_batch_size=0"}, "per_device_batch_size");
  expect_user_error({"config", "model_name=llama9-1b"}, "llama9-1b");
  expect_user_error({"config", "compile_topology=v5p-100"}, "v5p-100");
  expect_user_error({"config", "compile_topology=v5p-128", "ici_tensor_parallelism=3"},
                    "ici_fsdp_parallelism");
  expect_user_error({"config", "ici_data_parallelism=-1"}, "-1");
  expect_user_error({"config", "compile_topology=v5p-128", "ici_fsdp_parallelism=8"}, "64");
  expect_user_error({"config", "mlp_activations=[silu"}, "mlp_activations");
  expect_user_error({"config", "notakeyvalue"}, "notakeyvalue");
  expect_user_error({"config", "/nonexistent/base.yml"}, "/nonexistent/base.yml");
  expect_user_error({"config", "remat_policy=fulll"}, "remat_policy");
}

// Pipelines: estimate shows the schedule and its bubble; MaxText's constraints on stages,
// layers, microbatches and repeats exit 2 naming the key; train runs stages, but refuses what its
// loop does not compute (delayed forwarding) and microbatches that would split a sequence.
TEST(EstimateCommand, PipelineScheduleAndItsConstraints) {
  const std::vector<std::string> pipelined = {"estimate",
                                              "model_name=llama3.1-70b",
                                              "compile_topology=v5e-256",
                                              "compile_topology_num_slices=4",
                                              "dcn_pipeline_parallelism=4",
                                              "ici_fsdp_parallelism=-1",
                                              "num_pipeline_microbatches=8"};
  const auto result = run_tpusim(pipelined);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("pipeline   4 stages x 1 layer, 20 repeats, 8 microbatches: 163 "
                            "iterations, bubble 1.8%"),
            std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("pipeline_bubble"), std::string::npos);
  EXPECT_NE(result.out.find("exposed_dcn_stage"), std::string::npos);
  auto with = [&](const std::string& extra) {
    std::vector<std::string> args = pipelined;
    if (extra.starts_with("num_pipeline_microbatches")) {
      args.pop_back();
    }
    args.push_back(extra);
    return args;
  };
  expect_user_error(with("num_pipeline_microbatches=6"), "num_pipeline_microbatches=6");
  expect_user_error(with("num_layers_per_pipeline_stage=3"), "num_layers_per_pipeline_stage=3");
  expect_user_error(with("num_pipeline_repeats=7"), "num_pipeline_repeats=7");
  expect_user_error(with("pipeline_parallel_layers=40"), "pipeline_parallel_layers=40");
  // Layers of two kinds (gpt-oss alternates sliding-window and global attention): refused. (Its
  // preset's keys with no effect on the estimate are listed on stderr first.)
  const auto mixed = run_tpusim({"estimate", "model_name=gpt-oss-20b", "compile_topology=v5p-16",
                                 "ici_pipeline_parallelism=2"});
  EXPECT_EQ(mixed.exit_code, 2);
  EXPECT_NE(mixed.err.find("ici_pipeline_parallelism=2: gpt-oss-20b has 2 kinds of decoder layer"),
            std::string::npos)
      << mixed.err;
  expect_user_error(
      {"train", "model_name=tiny-llama", "compile_topology=v5e-4", "ici_pipeline_parallelism=2",
       "pipeline_delay_activation_forwarding=true", "steps=1"},
      "pipeline_delay_activation_forwarding");
  expect_user_error(
      {"train", "model_name=tiny-llama", "compile_topology=v5e-4", "ici_pipeline_parallelism=2",
       "ici_fsdp_parallelism=2", "per_device_batch_size=1", "num_pipeline_microbatches=4",
       "max_target_length=32", "steps=1"},
      "num_pipeline_microbatches=4");
  // OLMo 3 is estimated, not trained (its YaRN rope is not in the functional engine).
  const auto olmo =
      run_tpusim({"train", "model_name=olmo3-7b", "compile_topology=v5e-4",
                  "override_model_config=true", "base_num_decoder_layers=1", "steps=1"});
  EXPECT_EQ(olmo.exit_code, 2);
  EXPECT_NE(olmo.err.find("decoder_block: olmo3 is not computed by tpusim train"),
            std::string::npos)
      << olmo.err;
}

TEST(EstimateCommand, JsonContract) {
  const auto result = run_tpusim({"estimate", "model_name=llama3.1-8b", "compile_topology=v5p-128",
                                  "per_device_batch_size=2", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_EQ(json["devices"], 64);
  EXPECT_EQ(json["chips"], 64);
  for (const char* key : {"model_tflop_per_device_step", "hardware_tflop_per_device_step",
                          "hbm_peak_bytes_per_device", "hbm_capacity_bytes"}) {
    EXPECT_TRUE(json[key].is_number()) << key;
    EXPECT_GT(json[key].get<double>(), 0) << key;
  }
  EXPECT_TRUE(json["fits"].is_boolean());
  EXPECT_TRUE(json["memory"].is_object());
  EXPECT_GE(json["hardware_tflop_per_device_step"].get<double>(),
            json["model_tflop_per_device_step"].get<double>());
}

TEST(EstimateCommand, PerformanceKeys) {
  const auto result = run_tpusim({"estimate", "model_name=llama3.1-8b", "compile_topology=v6e-8",
                                  "per_device_batch_size=2", "max_target_length=4096", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  for (const char* key : {"step_time_s", "mfu", "tflops_per_chip", "tokens_per_s_per_chip"}) {
    EXPECT_TRUE(json[key].is_number()) << key;
    EXPECT_GT(json[key].get<double>(), 0) << key;
  }
  EXPECT_TRUE(json["breakdown"].is_object());
  EXPECT_FALSE(json["breakdown"].empty());
}

TEST(EstimateCommand, TraceIsChromeTraceJson) {
  const std::string path = ::testing::TempDir() + "/tpusim_trace.json";
  const auto result =
      run_tpusim({"estimate", "model_name=tiny-llama", "compile_topology=v5p-8", "--trace", path});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::ifstream stream(path);
  const nlohmann::json trace = nlohmann::json::parse(stream);
  ASSERT_TRUE(trace["traceEvents"].is_array());
  EXPECT_GT(trace["traceEvents"].size(), 10u);
}

TEST(EstimateCommand, TraceHasALanePerLinkAndAxesAndTheHtmlPageTheSame) {
  // Multislice with tensor parallelism: compute, the fsdp and tensor rings, the DCN stages of the
  // hierarchical gathers and the combined gradient all-reduce each get a named lane.
  const std::string trace_path = ::testing::TempDir() + "/tpusim_multislice_trace.json";
  const std::string html_path = ::testing::TempDir() + "/tpusim_multislice.html";
  const auto result = run_tpusim({"estimate", "model_name=llama2-7b", "compile_topology=v5e-256",
                                  "compile_topology_num_slices=2", "ici_fsdp_parallelism=64",
                                  "ici_tensor_parallelism=4", "dcn_fsdp_parallelism=2", "--trace",
                                  trace_path, "--html", html_path});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::ifstream stream(trace_path);
  const nlohmann::json trace = nlohmann::json::parse(stream);
  std::vector<std::string> lanes;
  std::string process;
  int flow_starts = 0;
  int flow_ends = 0;
  int hbm_counters = 0;
  for (const auto& event : trace["traceEvents"]) {
    if (event["name"] == "thread_name") {
      lanes.push_back(event["args"]["name"]);
    } else if (event["name"] == "process_name") {
      process = event["args"]["name"];
    }
    flow_starts += event["ph"] == "s" ? 1 : 0;
    flow_ends += event["ph"] == "f" ? 1 : 0;
    hbm_counters += event["ph"] == "C" && event["name"] == "HBM GiB" ? 1 : 0;
  }
  EXPECT_GT(hbm_counters, 3);  // forward, backward and optimizer checkpoints
  // Tensor-parallel gathers are waited for: arrows from them to the ops that waited.
  EXPECT_GT(flow_starts, 0);
  EXPECT_EQ(flow_starts, flow_ends);
  EXPECT_NE(process.find("TPU v5e"), std::string::npos) << process;
  for (const char* lane : {"TensorCore", "ICI fsdp", "ICI tensor", "DCN fsdp"}) {
    EXPECT_NE(std::find(lanes.begin(), lanes.end(), lane), lanes.end()) << lane;
  }
  EXPECT_EQ(lanes.front(), "TensorCore");  // compute first, then links, DCN, host
  std::ifstream page_stream(html_path);
  const std::string page((std::istreambuf_iterator<char>(page_stream)),
                         std::istreambuf_iterator<char>());
  EXPECT_EQ(page.rfind("<!doctype html>", 0), 0u);
  EXPECT_EQ(page.find("http://"), page.find("http://www.w3.org/2000/svg"));  // no other URL
  EXPECT_EQ(page.find("https://"), std::string::npos);
  for (const char* lane : {"\"ICI fsdp\"", "\"DCN fsdp\""}) {
    EXPECT_NE(page.find(lane), std::string::npos) << lane;
  }
}

TEST(OpCommand, MatmulAndCollectives) {
  const auto matmul = run_tpusim(
      {"op", "matmul", "m=8192", "n=8192", "k=8192", "compile_topology=v5e-1", "--json"});
  ASSERT_EQ(matmul.exit_code, 0) << matmul.err;
  const nlohmann::json json = nlohmann::json::parse(matmul.out);
  EXPECT_GT(json["percent_of_peak"].get<double>(), 50);
  EXPECT_LT(json["percent_of_peak"].get<double>(), 100);
  const auto gather =
      run_tpusim({"op", "all_gather", "bytes=33554432", "axes=fsdp", "compile_topology=v5e-32",
                  "ici_fsdp_parallelism=4", "ici_data_parallelism=-1", "--json"});
  ASSERT_EQ(gather.exit_code, 0) << gather.err;
  EXPECT_EQ(nlohmann::json::parse(gather.out)["group_size"], 4);
}

TEST(OpCommand, BadInputExits2) {
  expect_user_error({"op", "matmull", "m=1", "n=1", "k=1"}, "matmull");
  expect_user_error({"op", "matmul", "m=0", "n=1", "k=1"}, "m");
  expect_user_error({"op", "matmul", "m=8", "n=8"}, "k");
  expect_user_error({"op", "matmul", "m=x", "n=1", "k=1"}, "m");
  expect_user_error({"op", "all_gather", "bytes=100", "axes=fsdpp"}, "fsdpp");
  expect_user_error({"op", "all_gather", "axes=fsdp"}, "bytes");
  expect_user_error({"op", "all_gather", "bytes=100", "axes=tensor"}, "tensor");
}

// Every public MaxText recipe (validation/recipes_public.json: args exactly as published) runs as
// pasted with its topology as xpk writes it, or, for a model tpusim does not build yet, exits 2
// naming the preset and what is missing. Nothing else: no unknown key, no exit 1.
TEST(EstimateCommand, PublishedRecipesRunAsPasted) {
  std::ifstream file(testing::source_dir() + "/validation/recipes_public.json");
  ASSERT_TRUE(file.good());
  const nlohmann::json recipes = nlohmann::json::parse(file);
  ASSERT_EQ(recipes.size(), 22u);
  int ran = 0;
  for (const auto& recipe : recipes) {
    SCOPED_TRACE(recipe["id"].get<std::string>());
    std::vector<std::string> args = {
        "estimate", "compile_topology=" + recipe["topology"].get<std::string>(),
        "compile_topology_num_slices=" + std::to_string(recipe["num_slices"].get<int>())};
    for (const auto& arg : recipe["args"]) {
      args.push_back(arg.get<std::string>());
    }
    args.emplace_back("--json");
    const auto result = run_tpusim(args);
    if (result.exit_code == 0) {
      const nlohmann::json json = nlohmann::json::parse(result.out);
      EXPECT_GT(json["step_time_s"].get<double>(), 0.0);
      EXPECT_TRUE(json["ignored_keys"].is_array());
      EXPECT_TRUE(json["not_modeled_keys"].is_object());
      ++ran;
    } else {
      EXPECT_EQ(result.exit_code, 2) << result.err;
      const nlohmann::json error = nlohmann::json::parse(result.out);
      EXPECT_EQ(error["key"], "model_name");
      EXPECT_NE(error["error"].get<std::string>().find("does not build yet"), std::string::npos)
          << result.err;
    }
  }
  // All 22 at this revision (gemma4-e2b since the gemma4_small block).
  EXPECT_EQ(ran, 22);
}

// MaxText's own base.yml (rebuilt from the key/value fixture) as the config file gives the
// estimate of tpusim's embedded base.yml: the same defaults, rules merged by name.
TEST(EstimateCommand, MaxTextBaseYmlGivesTheEmbeddedBasesEstimate) {
  const std::string fixture = testing::source_dir() + "/tests/data/maxtext/maxtext_keys.tsv";
  const CsvTable keys = parse_tsv(read_text_file(fixture), fixture);  // key, default, type
  const std::string path = ::testing::TempDir() + "/maxtext_base.yml";
  {
    std::ofstream yaml(path);
    for (const std::vector<std::string>& row : keys.rows) {
      yaml << row[0] << ": " << row[1] << "\n";
    }
  }
  for (const char* model : {"model_name=llama2-7b", "model_name=mixtral-8x7b"}) {
    const auto with_file =
        run_tpusim({"estimate", path, model, "compile_topology=v5p-64", "--json"});
    const auto embedded = run_tpusim({"estimate", model, "compile_topology=v5p-64", "--json"});
    ASSERT_EQ(with_file.exit_code, 0) << with_file.err;
    ASSERT_EQ(embedded.exit_code, 0) << embedded.err;
    const auto a = nlohmann::json::parse(with_file.out);
    const auto b = nlohmann::json::parse(embedded.out);
    EXPECT_EQ(a["step_time_s"], b["step_time_s"]) << model;
    EXPECT_EQ(a["hbm_peak_bytes_per_device"], b["hbm_peak_bytes_per_device"]) << model;
    EXPECT_GT(a["ignored_keys"].size(), 400u);
  }
  std::remove(path.c_str());
}

TEST(EstimateCommand, MaxTextKeysAreListedOnceByEffect) {
  const auto result = run_tpusim({"estimate", "compile_topology=v5p-8", "profiler=xplane",
                                  "use_random_routing=True", "skip_first_n_steps_for_profiler=5"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("2 MaxText keys with no effect on the estimate: profiler, "
                            "skip_first_n_steps_for_profiler"),
            std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("warning: MaxText keys not modeled (the estimate ignores them): "
                            "use_random_routing=True"),
            std::string::npos)
      << result.err;
}

TEST(EstimateCommand, JsonErrorsAreJsonOnStdout) {
  const auto result = run_tpusim({"estimate", "profilr=xplane", "--json"});
  EXPECT_EQ(result.exit_code, 2);
  const nlohmann::json error = nlohmann::json::parse(result.out);
  EXPECT_EQ(error["key"], "profilr");
  EXPECT_EQ(error["exit"], 2);
  EXPECT_NE(error["error"].get<std::string>().find("did you mean 'profiler'"), std::string::npos);
  const auto no_key = run_tpusim({"estimate", "compile_topology=v5p-100", "--json"});
  EXPECT_EQ(no_key.exit_code, 2);
  EXPECT_TRUE(nlohmann::json::parse(no_key.out).contains("error"));
}

// Recipes' XLA flags: the SparseCore offloads and async collective fusion set tpusim's switches
// (a key on the command line wins), tracing flags change nothing, the rest is listed as not
// modeled; LIBTPU_INIT_ARGS is read like --xla-flags.
TEST(EstimateCommand, XlaFlagsSetTheSwitchesTheyModel) {
  // The host's own flags (a TPU VM exports them) must not leak into what this test expects.
  ::unsetenv("LIBTPU_INIT_ARGS");
  ::unsetenv("XLA_FLAGS");
  const std::string flags =
      "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true "
      "--xla_tpu_enable_async_collective_fusion=false --xla_tpu_scoped_vmem_limit_kib=65536 "
      "--xla_tpu_enable_all_gather_offload_tracing=true";
  const auto result = run_tpusim({"estimate", "model_name=llama2-7b", "compile_topology=tpu7x-16",
                                  "--xla-flags", flags, "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out)["xla_flags"];
  EXPECT_EQ(json["overrides"],
            (nlohmann::json{"sparse_core_collective_offload=on", "collective_matmul=false"}));
  EXPECT_EQ(json["not_modeled"], (nlohmann::json{"xla_tpu_scoped_vmem_limit_kib"}));
  EXPECT_EQ(json["no_effect"], (nlohmann::json{"xla_tpu_enable_all_gather_offload_tracing"}));

  const auto pinned =
      run_tpusim({"estimate", "model_name=llama2-7b", "compile_topology=tpu7x-16",
                  "sparse_core_collective_offload=off", "--xla-flags", flags, "--json"});
  ASSERT_EQ(pinned.exit_code, 0) << pinned.err;
  EXPECT_EQ(nlohmann::json::parse(pinned.out)["xla_flags"]["overrides"],
            (nlohmann::json{"collective_matmul=false"}));

  ::setenv("LIBTPU_INIT_ARGS", "--xla_tpu_enable_async_collective_fusion=false", 1);
  const auto from_environment =
      run_tpusim({"estimate", "model_name=llama2-7b", "compile_topology=v5p-8", "--json"});
  const auto bad = run_tpusim({"estimate", "--xla-flags", "xla_oops"});
  ::unsetenv("LIBTPU_INIT_ARGS");
  ASSERT_EQ(from_environment.exit_code, 0) << from_environment.err;
  EXPECT_EQ(nlohmann::json::parse(from_environment.out)["xla_flags"]["sources"],
            (nlohmann::json{"LIBTPU_INIT_ARGS"}));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("xla_oops"), std::string::npos) << bad.err;
}

// An XLA flag name that is not UTF-8 could not be printed in --json (nlohmann's dump threw, exit
// 1): it is exit 2 naming where the flags came from. Found by fuzz/cli_fuzz.cpp.
TEST(EstimateCommand, XlaFlagsThatAreNotUtf8Exit2) {
  ::unsetenv("LIBTPU_INIT_ARGS");
  ::unsetenv("XLA_FLAGS");
  expect_user_error({"estimate", "model_name=tiny-llama", "--xla-flags",
                     "--x\xff"
                     "a_tpu_scoped_vmem_limit_kib=98304",
                     "--json"},
                    "--xla-flags: the flags are not valid UTF-8");
}

TEST(ValidateCommand, JsonContractOnThePublishedSet) {
  const std::string csv = testing::source_dir() + "/validation/published.csv";
  const auto result = run_tpusim({"validate", csv, "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  ASSERT_GE(json["rows"].size(), 10u);
  for (const auto& row : json["rows"]) {
    for (const char* key : {"predicted_step_s", "measured_step_s", "error"}) {
      EXPECT_TRUE(row[key].is_number()) << key;
    }
    EXPECT_TRUE(row["id"].is_string());
  }
  for (const char* key : {"median_abs_error", "mean_abs_error", "max_abs_error"}) {
    EXPECT_TRUE(json["summary"][key].is_number()) << key;
  }
}

TEST(EstimateCommand, GpuNodesRunAsMaxTextWritesThem) {
  // The JAX-Toolbox guide's command with compile_topology=a3 added (validation/gpu_published.csv).
  const auto guide = run_tpusim(
      {"estimate", "model_name=llama2-7b", "per_device_batch_size=2", "max_target_length=4096",
       "ici_fsdp_parallelism=8", "attention=cudnn_flash_te", "remat_policy=minimal_flash",
       "scan_layers=false", "hardware=gpu", "compile_topology=a3", "--json"});
  ASSERT_EQ(guide.exit_code, 0) << guide.err;
  const nlohmann::json json = nlohmann::json::parse(guide.out);
  EXPECT_EQ(json["chip"], "h100-sxm");
  EXPECT_EQ(json["devices"], 8);
  EXPECT_TRUE(json["fits"].get<bool>());
  EXPECT_DOUBLE_EQ(json["mfu_peak_tflops_per_device"].get<double>(), 989.0);
  // `hardware` must agree with the slice, as MaxText would not run a GPU config on a TPU.
  expect_user_error({"estimate", "model_name=llama2-7b", "compile_topology=a3"}, "hardware");
  expect_user_error({"estimate", "model_name=llama2-7b", "hardware=gpu", "compile_topology=v5p-8"},
                    "hardware");
  expect_user_error({"estimate", "hardware=gpu", "compile_topology=a3-8"},
                    "compile_topology_num_slices");
}

TEST(ValidateCommand, GpuRowsValidateFromTheirOwnCsv) {
  const std::string csv = testing::source_dir() + "/validation/gpu_published.csv";
  const auto result = run_tpusim({"validate", csv, "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  ASSERT_EQ(json["rows"].size(), 4u);
  for (const auto& row : json["rows"]) {
    EXPECT_EQ(row["hardware"], "h100-sxm-80g");
    EXPECT_TRUE(row["fits"].get<bool>()) << row["id"];
    EXPECT_FALSE(row.contains("measured_tokens_s_chip"));
  }
}

TEST(ValidateCommand, BadFilesExit2) {
  const std::string directory = ::testing::TempDir();
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(directory + "/" + name) << text;
    return directory + "/" + name;
  };
  expect_user_error({"validate", "/nonexistent/results.csv"}, "/nonexistent/results.csv");
  // A measured time of 0 or less gave an inf% error; empty args estimated the default model.
  expect_user_error({"validate", write("zero.csv",
                                       "id,hardware,args,measured_step_s,measured_tokens_s_chip\nA,"
                                       "v5e,compile_topology=v5e-8,0,\n")},
                    "row 2 (A) measured_step_s");
  expect_user_error({"validate", write("empty_args.csv",
                                       "id,hardware,args,measured_step_s,measured_tokens_s_chip\nA,"
                                       "v5e, ,1.0,\n")},
                    "row 2 (A) args");
  expect_user_error(
      {"validate",
       write("no_args.csv", "id,hardware,measured_step_s,measured_tokens_s_chip\nA,v5e,1,\n")},
      "args");
  expect_user_error(
      {"validate",
       write("ragged.csv", "id,hardware,args,measured_step_s,measured_tokens_s_chip\nA,v5e\n")},
      "fields");
  expect_user_error(
      {"validate",
       write("quote.csv", "id,hardware,args,measured_step_s,measured_tokens_s_chip\n\"A,v5e\n")},
      "quote");
  expect_user_error({"validate", write("bad_number.csv",
                                       "id,hardware,args,measured_step_s,measured_tokens_s_chip\nA,"
                                       "v5e,compile_topology=v5e-8,fast,\n")},
                    "fast");
  expect_user_error({"validate", write("bad_key.csv",
                                       "id,hardware,args,measured_step_s,measured_tokens_s_chip\nA,"
                                       "v5e,compile_topology=v5e-8 remat_polcy=full,1.0,\n")},
                    "remat_polcy");
}

TEST(TrainCommand, MetricsFileContract) {
  const std::string metrics = ::testing::TempDir() + "/tpusim_train_metrics.jsonl";
  const auto result = run_tpusim({"train", "model_name=tiny-llama", "compile_topology=v5e-4",
                                  "per_device_batch_size=1", "max_target_length=32", "steps=3",
                                  "eval_interval=2", "metrics_file=" + metrics, "--verify"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::ifstream stream(metrics);
  std::string line;
  int lines = 0;
  bool saw_eval = false;
  while (std::getline(stream, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    for (const char* key :
         {"step", "loss", "grad_norm", "learning_rate", "tokens_per_s", "verify_max_rel_diff"}) {
      EXPECT_TRUE(record.contains(key)) << key;
    }
    saw_eval = saw_eval || record.contains("eval_loss");
    ++lines;
  }
  EXPECT_EQ(lines, 3);
  EXPECT_TRUE(saw_eval);
}

// A diverging run (learning rate 1000) reaches a NaN loss at step 5: training stops with exit 2
// naming the step, as MaxText's abort_on_nan_loss does; switched off, it runs on.
TEST(TrainCommand, NonFiniteLossStopsTraining) {
  const std::vector<std::string> run = {"train",
                                        "model_name=tiny-llama",
                                        "compile_topology=v5e-1",
                                        "steps=6",
                                        "learning_rate=1000",
                                        "per_device_batch_size=1",
                                        "max_target_length=16",
                                        "--quiet"};
  const auto stopped = run_tpusim(run);
  EXPECT_EQ(stopped.exit_code, 2) << stopped.err;
  EXPECT_NE(stopped.err.find("the loss is NaN"), std::string::npos) << stopped.err;
  std::vector<std::string> allowed = run;
  allowed.emplace_back("abort_on_nan_loss=false");
  allowed.emplace_back("abort_on_inf_loss=false");
  EXPECT_EQ(run_tpusim(allowed).exit_code, 0);
}

TEST(TrainCommand, BadInputExits2) {
  expect_user_error({"train", "model_name=tiny-llama", "dataset_type=text"}, "dataset_path");
  expect_user_error({"train", "model_name=tiny-llama", "dataset_type=text",
                     "dataset_path=/nonexistent/corpus.txt"},
                    "/nonexistent/corpus.txt");
  expect_user_error({"train", "model_name=tiny-llama", "compile_topology=v5p-256"}, "v5p-256");
  expect_user_error({"train", "model_name=tiny-llama", "steps=many"}, "steps");
  // Inputs that are not regular files fail at once instead of failing late (a directory) or
  // never ending (/dev/zero); a value that is not UTF-8 cannot reach the JSON output.
  expect_user_error({"train", "model_name=tiny-llama", "dataset_type=text", "dataset_path=/tmp"},
                    "/tmp");
  expect_user_error(
      {"train", "model_name=tiny-llama", "dataset_type=text", "dataset_path=/dev/zero"},
      "/dev/zero");
  expect_user_error({"config", "run_name=\xff"}, "run_name");
  // A value with a newline or an escape stays on the error's one line, written as \n and \x1b.
  const auto newline = run_tpusim({"estimate", "model_name=tiny\nllama\x1b[31m"});
  EXPECT_EQ(newline.exit_code, 2);
  EXPECT_EQ(std::count(newline.err.begin(), newline.err.end(), '\n'), 1) << newline.err;
  EXPECT_NE(newline.err.find("tiny\\nllama\\x1b[31m"), std::string::npos) << newline.err;
  expect_user_error(
      {"train", "model_name=tiny-llama", "run_name=../..", "enable_checkpointing=true",
       "base_output_directory=/tmp/tpusim_cli_test_runs", "steps=1"},
      "run_name");
  expect_user_error(
      {"train", "model_name=llama2-7b", "vocab_size=100", "override_model_config=true",
       "dataset_type=text", "dataset_path=/usr/share/common-licenses/GPL-3"},
      "vocab_size");
  // A chunked head needs chunks that split each device's positions evenly.
  expect_user_error(
      {"train", "model_name=tiny-llama", "max_target_length=24", "num_vocab_tiling=4",
       "compile_topology=v5e-4", "ici_fsdp_parallelism=1", "ici_context_parallelism=4"},
      "num_vocab_tiling");
  // Dropless MoE keeps whole experts on each expert-parallel shard (tiny-moe has 4).
  expect_user_error({"train", "model_name=tiny-moe", "compile_topology=v5e-8",
                     "ici_fsdp_parallelism=1", "ici_expert_parallelism=8"},
                    "num_experts");
}

// MaxText switches the functional engine does not compute are refused, not silently ignored.
TEST(TrainCommand, RefusesSwitchesTheEngineDoesNotBuild) {
  // qk-norm is built as MaxText's Attention does it (qwen3), not llama4's L2 variant after RoPE.
  expect_user_error({"train", "model_name=tiny-llama", "override_model_config=true",
                     "decoder_block=llama4", "use_qk_norm=true"},
                    "use_qk_norm");
  expect_user_error({"train", "model_name=tiny-mla", "use_qk_norm=true"}, "use_qk_norm");
  // MaxText soft-caps only tied logits: a final cap on tiny-llama's untied ones is refused.
  expect_user_error({"train", "model_name=tiny-llama", "final_logits_soft_cap=30"},
                    "final_logits_soft_cap");
}

// export-hf writes model.safetensors and config.json from a checkpoint; load_parameters_path
// reads the directory back; bad input exits 2 naming the path, tensor or key.
TEST(ExportHfCommand, ExportsLoadsBackAndRefusesBadInput) {
  const std::string base = ::testing::TempDir() + "/tpusim_export_hf_" + std::to_string(::getpid());
  const std::vector<std::string> run = {"train",
                                        "compile_topology=v5e-1",
                                        "per_device_batch_size=1",
                                        "max_target_length=16",
                                        "steps=1",
                                        "enable_checkpointing=true",
                                        "base_output_directory=" + base,
                                        "--quiet"};
  for (const std::string model : {"tiny-llama", "tiny-moe", "tiny-qwen3"}) {
    std::vector<std::string> args = run;
    args.push_back("model_name=" + model);
    args.push_back("run_name=" + model);
    const auto trained = run_tpusim(args);
    ASSERT_EQ(trained.exit_code, 0) << trained.err;
  }
  const std::string out = base + "/hf";
  const auto exported = run_tpusim({"export-hf", base + "/tiny-llama/checkpoints/1", out});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  std::ifstream config_file(out + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(config_file);
  EXPECT_EQ(config.at("architectures"), nlohmann::json({"LlamaForCausalLM"}));
  EXPECT_EQ(config.at("num_hidden_layers"), 2);
  std::vector<std::string> load = {"train",
                                   "model_name=tiny-llama",
                                   "compile_topology=v5e-1",
                                   "per_device_batch_size=1",
                                   "max_target_length=16",
                                   "steps=1",
                                   "load_parameters_path=" + out,
                                   "--quiet"};
  const auto loaded = run_tpusim(load);
  EXPECT_EQ(loaded.exit_code, 0) << loaded.err;
  // Qwen3 (qk-norm): Qwen3ForCausalLM with its own head_dim, read back the same way.
  const std::string qwen3_out = base + "/qwen3-hf";
  const auto qwen3 = run_tpusim({"export-hf", base + "/tiny-qwen3/checkpoints/1", qwen3_out});
  ASSERT_EQ(qwen3.exit_code, 0) << qwen3.err;
  std::ifstream qwen3_file(qwen3_out + "/config.json");
  const nlohmann::json qwen3_config = nlohmann::json::parse(qwen3_file);
  EXPECT_EQ(qwen3_config.at("architectures"), nlohmann::json({"Qwen3ForCausalLM"}));
  EXPECT_EQ(qwen3_config.at("head_dim"), 32);
  std::vector<std::string> load_qwen3 = load;
  load_qwen3[1] = "model_name=tiny-qwen3";
  load_qwen3[6] = "load_parameters_path=" + qwen3_out;
  const auto qwen3_loaded = run_tpusim(load_qwen3);
  EXPECT_EQ(qwen3_loaded.exit_code, 0) << qwen3_loaded.err;
  // Bad input: a missing checkpoint, a family with no Transformers names, weights of another
  // model (tiny-gpt3's needs wte/wpe, not Llama's names).
  expect_user_error({"export-hf", base + "/nowhere", out}, base + "/nowhere");
  expect_user_error({"export-hf", base + "/tiny-moe/checkpoints/1", base + "/moe-hf"},
                    "decoder_block 'mixtral'");
  load[1] = "model_name=tiny-gpt3";
  expect_user_error(load, "transformer.wte.weight");
}

// The losses of a metrics file, in step order.
std::vector<double> losses_of(const std::string& path) {
  std::vector<double> losses;
  std::ifstream stream(path);
  std::string line;
  while (std::getline(stream, line)) {
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  }
  return losses;
}

// The first run tokenizes into the cache under base_output_directory, the second says it read
// the cache; a run with the cache that stops at step 2 and resumes to step 4 has bitwise the
// losses of one uncached, uninterrupted run. A corrupted chunk then exits 2 naming it.
TEST(TrainCommand, TokenCacheIsReusedAndChangesNoLoss) {
  const std::filesystem::path root =
      std::filesystem::path(::testing::TempDir()) / "tpusim_cli_token_cache";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  const std::vector<std::string> run = {"train",
                                        "model_name=tiny-llama",
                                        "compile_topology=v5e-4",
                                        "per_device_batch_size=1",
                                        "learning_rate_schedule_steps=4",
                                        "dataset_type=text",
                                        "dataset_path=/usr/share/common-licenses/GPL-3"};
  // The schedule does not follow `steps`: the run stopped at step 2 and resumed is the same run.
  auto with = [&](std::vector<std::string> extra) {
    if (std::none_of(extra.begin(), extra.end(), [](const std::string& key) {
          return key.starts_with("max_target_length=");
        })) {
      extra.emplace_back("max_target_length=32");
    }
    std::vector<std::string> args = run;
    args.insert(args.end(), extra.begin(), extra.end());
    return run_tpusim(args);
  };
  const std::string plain = (root / "plain.jsonl").string();
  ASSERT_EQ(with({"steps=4", "metrics_file=" + plain}).exit_code, 0);
  const std::vector<std::string> cached = {
      "base_output_directory=" + root.string(), "run_name=cached", "enable_checkpointing=true",
      "checkpoint_period=2", "metrics_file=" + (root / "cached.jsonl").string()};
  auto cached_run = [&](const std::string& steps) {
    std::vector<std::string> extra = cached;
    extra.push_back(steps);
    return with(extra);
  };
  const auto first = cached_run("steps=2");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.err.find("dataset: tokenized"), std::string::npos) << first.err;
  const auto resumed = cached_run("steps=4");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("read from the cache"), std::string::npos) << resumed.err;
  EXPECT_EQ(resumed.err.find("dataset: tokenized"), std::string::npos) << resumed.err;
  const std::vector<double> expected = losses_of(plain);
  ASSERT_EQ(expected.size(), 4U);
  EXPECT_EQ(losses_of((root / "cached.jsonl").string()), expected);
  // Another max_target_length reads the same cache.
  const auto longer =
      with({"steps=1", "max_target_length=64", "base_output_directory=" + root.string()});
  EXPECT_NE(longer.err.find("read from the cache"), std::string::npos) << longer.err;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root / "dataset_cache")) {
    if (entry.path().filename().string().starts_with("chunk-")) {
      std::filesystem::resize_file(entry.path(), 100);
    }
  }
  expect_user_error({"train", "model_name=tiny-llama", "dataset_type=text",
                     "dataset_path=/usr/share/common-licenses/GPL-3",
                     "base_output_directory=" + root.string(), "steps=1"},
                    "truncated");
  std::filesystem::remove_all(root);
}

TEST(TrainCommand, TokenCacheAndViewKeysExit2NamingTheKey) {
  const std::vector<std::string> text = {"train", "model_name=tiny-llama", "dataset_type=text",
                                         "dataset_path=/usr/share/common-licenses/GPL-3",
                                         "steps=1"};
  auto with = [&](const std::string& extra) {
    std::vector<std::string> args = text;
    args.push_back(extra);
    return args;
  };
  expect_user_error(with("dataset_cache_dir=/usr/share/common-licenses/GPL-3"),
                    "dataset_cache_dir");
  expect_user_error(with("token_viz_file=/tmp/tokens.html"), "token_viz_file");  // no eval
  std::vector<std::string> directory = with("token_viz_file=/tmp");
  directory.emplace_back("eval_interval=1");
  expect_user_error(directory, "token_viz_file");
}

TEST(ProgramCommand, PrintsLocalShapesAndCollectivesWithBytes) {
  const auto result =
      run_tpusim({"program", "model_name=tiny-llama", "compile_topology=v5e-4",
                  "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", "--layer", "0"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("region layer x2 (fwd)"), std::string::npos);
  EXPECT_NE(result.out.find("region layer/grad x2 (bwd)"), std::string::npos);
  EXPECT_NE(result.out.find("embed:32@tensor"), std::string::npos);  // a split dim, local size
  EXPECT_NE(result.out.find("reduce_scatter"), std::string::npos);
  EXPECT_NE(result.out.find("over {tensor} group 2 bytes"), std::string::npos);
  const auto whole = run_tpusim({"program", "model_name=tiny-llama", "compile_topology=v5e-4"});
  ASSERT_EQ(whole.exit_code, 0);
  EXPECT_NE(whole.out.find("region optimizer/layer"), std::string::npos);
}

TEST(EstimateCommand, EmbeddedDefaultConfigRuns) {
  const auto result = run_tpusim({"estimate"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("fits"), std::string::npos);
}

TEST(EstimateCommand, BadInputExits2) {
  expect_user_error({"estimate", "model_name=llama3.1-8b", "compile_topology=v5p-100"}, "v5p-100");
  expect_user_error({"estimate", "ici_tensor_parallelism=3"}, "ici_fsdp_parallelism");
  expect_user_error({"estimate", "logical_axis_rules=[[embed, [fsdpp]]]"}, "fsdpp");
  expect_user_error({"estimate", "gradient_accumulation_steps=0"}, "gradient_accumulation_steps");
  expect_user_error({"program", "--layer", "9"}, "--layer");
}

TEST(ExploreCommand, JsonContractAndTheArgsReproduceTheEstimate) {
  const auto result =
      run_tpusim({"explore", "model_name=tiny-llama", "compile_topology=v5e-8",
                  "max_target_length=256", "remat_policy=full", "--top", "3", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  ASSERT_TRUE(json["candidates_evaluated"].is_number_integer());
  ASSERT_TRUE(json["pruned"].is_object());
  ASSERT_TRUE(json["elapsed_s"].is_number());
  ASSERT_EQ(json["top"].size(), 3U);
  int64_t pruned = 0;
  for (const auto& [reason, count] : json["pruned"].items()) {
    pruned += count.get<int64_t>();
  }
  EXPECT_EQ(json["candidates_evaluated"].get<int64_t>() + pruned,
            json["candidates_in_space"].get<int64_t>());
  double previous = 1e300;
  for (const auto& item : json["top"]) {
    for (const char* key :
         {"step_time_s", "mfu", "tokens_per_s_per_chip", "hbm_peak_bytes_per_device"}) {
      EXPECT_TRUE(item[key].is_number()) << key;
    }
    EXPECT_TRUE(item["fits"].get<bool>());
    EXPECT_LE(item["tokens_per_s_per_chip"].get<double>(), previous);
    previous = item["tokens_per_s_per_chip"].get<double>();
  }
  // `args` alone reproduces the candidate through `tpusim estimate`.
  std::vector<std::string> estimate_args = {"estimate"};
  std::istringstream words(json["top"][0]["args"].get<std::string>());
  for (std::string word; words >> word;) {
    estimate_args.push_back(word);
  }
  estimate_args.push_back("--json");
  const auto estimate = run_tpusim(estimate_args);
  ASSERT_EQ(estimate.exit_code, 0) << estimate.err;
  const nlohmann::json reproduced = nlohmann::json::parse(estimate.out);
  EXPECT_DOUBLE_EQ(reproduced["step_time_s"].get<double>(),
                   json["top"][0]["step_time_s"].get<double>());
  EXPECT_EQ(reproduced["hbm_peak_bytes_per_device"], json["top"][0]["hbm_peak_bytes_per_device"]);
}

TEST(ExploreCommand, CsvAndHumanOutput) {
  const std::vector<std::string> base = {"explore",
                                         "model_name=tiny-llama",
                                         "compile_topology=v5e-4",
                                         "remat_policy=full",
                                         "attention=dot_product",
                                         "--top",
                                         "2"};
  auto csv_args = base;
  csv_args.push_back("--csv");
  const auto csv = run_tpusim(csv_args);
  ASSERT_EQ(csv.exit_code, 0) << csv.err;
  EXPECT_EQ(std::count(csv.out.begin(), csv.out.end(), '\n'), 3) << csv.out;
  EXPECT_EQ(csv.out.rfind("rank,step_time_s,mfu,tokens_per_s_per_chip", 0), 0U);
  const auto human = run_tpusim(base);
  ASSERT_EQ(human.exit_code, 0) << human.err;
  EXPECT_NE(human.out.find("tpusim estimate "), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("MaxText: "), std::string::npos) << human.out;
}

TEST(ExploreCommand, BadConstraintsExitTwo) {
  expect_user_error(
      {"explore", "model_name=tiny-llama", "compile_topology=v5e-8", "ici_tensor_parallelism=3"},
      "ici_tensor_parallelism=3");
  expect_user_error({"explore", "model_name=tiny-llama", "compile_topology=v5e-8",
                     "per_device_batch_size=3", "--global-batch-size", "8"},
                    "per_device_batch_size=3");
  expect_user_error({"explore", "model_name=tiny-llama", "compile_topology=v5e-8", "--objective",
                     "tokens_per_dollar"},
                    "tokens_per_dollar");
  expect_user_error(
      {"explore", "model_name=tiny-llama", "compile_topology=v5e-8", "--objective", "speed"},
      "speed");
  expect_user_error(
      {"explore", "model_name=tiny-llama", "compile_topology=v5e-8", "--min-hbm-headroom", "2"},
      "headroom");
  expect_user_error({"explore", "model_name=tiny-llama", "compile_topology=v9-8"}, "v9-8");
  // Pinned mesh sizes go through estimate's check: no division by zero, no int overflow, and a
  // negative size other than -1 is an error, not "nothing fits".
  for (const char* bad :
       {"ici_data_parallelism=0", "ici_data_parallelism=4294967296", "ici_data_parallelism=-3"}) {
    expect_user_error({"explore", "model_name=tiny-llama", "compile_topology=v5e-8", bad},
                      "ici_data_parallelism");
  }
  expect_user_error({"explore", "model_name=tiny-llama", "compile_topology=v5e-8",
                     "ici_data_parallelism=65536", "ici_fsdp_parallelism=65536"},
                    "ici_data_parallelism=65536");
  // Found by the command-line fuzz: 1e-30 searched no batch and crashed (SIGSEGV), 1e309 (inf)
  // never left the loop doubling the batch; NaN passed every comparison.
  for (const char* bad : {"1e-30", "1e309", "nan", "70000"}) {
    expect_user_error({"explore", "model_name=tiny-llama", "compile_topology=v5e-8",
                       "--max-per-device-batch", bad},
                      "--max-per-device-batch");
  }
  expect_user_error({"explore", "model_name=tiny-llama", "compile_topology=v5e-8",
                     "--max-per-device-batch", "0.015625"},
                    "no per_device_batch_size up to 0.015625");
  expect_user_error(
      {"explore", "model_name=tiny-llama", "compile_topology=v5e-8", "--min-hbm-headroom", "nan"},
      "--min-hbm-headroom");
  // Each listed candidate is estimated again: --top 65536 ran for minutes.
  expect_user_error(
      {"explore", "model_name=tiny-llama", "compile_topology=v5e-8", "--top", "65536"}, "--top");
}

TEST(ExploreCommand, NothingFitsSaysWhy) {
  const auto result = run_tpusim({"explore", "model_name=llama3.1-70b", "compile_topology=v5e-4",
                                  "max_target_length=2048", "--max-per-device-batch", "1"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("nothing fits: the smallest peak HBM found is"), std::string::npos)
      << result.out;
}

}  // namespace
}  // namespace tpusim
