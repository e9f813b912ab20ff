// The typed names of timing results (sim/perf/timing_labels.h): each renders to the name reports
// have always printed, the breakdown is ordered by those names, the lanes group as traces show
// them, and no code in sim/ outside the render functions spells or parses those names.
#include "sim/perf/timing_labels.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "sim/estimate/trace_lanes.h"
#include "sim/perf/step_simulator.h"

namespace tpusim {
namespace {

TEST(StepTimingLabels, BreakdownKeysRenderToTheirReportNames) {
  EXPECT_EQ(breakdown_name(BreakdownKey::compute(CostCategory::kMxu)), "compute_mxu");
  EXPECT_EQ(breakdown_name(BreakdownKey::compute(CostCategory::kOverhead)), "compute_overhead");
  EXPECT_EQ(breakdown_name(BreakdownKey::of(BreakdownKind::kComputeSharedWithCollectives)),
            "compute_shared_with_collectives");
  EXPECT_EQ(breakdown_name(BreakdownKey::exposed(LinkKind::kIci, {"fsdp"})), "exposed_ici_fsdp");
  EXPECT_EQ(breakdown_name(BreakdownKey::exposed(LinkKind::kD2d, {"tensor", "fsdp"})),
            "exposed_d2d_tensor+fsdp");
  EXPECT_EQ(breakdown_name(BreakdownKey::exposed(LinkKind::kDcn, {"stage"})), "exposed_dcn_stage");
  EXPECT_EQ(breakdown_name(BreakdownKey::of(BreakdownKind::kExposedGradientReduction)),
            "exposed_dcn_gradient_reduction");
  EXPECT_EQ(breakdown_name(BreakdownKey::of(BreakdownKind::kHostTransfers)), "host_transfers");
  EXPECT_EQ(breakdown_name(BreakdownKey::of(BreakdownKind::kPipelineBubble)), "pipeline_bubble");
  EXPECT_EQ(breakdown_name(BreakdownKey::of(BreakdownKind::kIdle)), "idle");
}

TEST(StepTimingLabels, StageHandOversAreCollectivesOverTheStageAxisAlone) {
  EXPECT_TRUE(BreakdownKey::exposed(LinkKind::kDcn, {"stage"}).exposed_over("stage"));
  EXPECT_FALSE(BreakdownKey::exposed(LinkKind::kDcn, {"data", "stage"}).exposed_over("stage"));
  EXPECT_FALSE(BreakdownKey::exposed(LinkKind::kIci, {"fsdp"}).exposed_over("stage"));
  EXPECT_FALSE(BreakdownKey::of(BreakdownKind::kPipelineBubble).exposed_over("stage"));
}

TEST(StepTimingLabels, BreakdownIsOrderedByName) {
  Breakdown breakdown;
  breakdown[BreakdownKey::of(BreakdownKind::kIdle)] = 1;
  breakdown[BreakdownKey::exposed(LinkKind::kIci, {"fsdp"})] = 2;
  breakdown[BreakdownKey::compute(CostCategory::kVpu)] = 3;
  breakdown[BreakdownKey::of(BreakdownKind::kComputeSharedWithCollectives)] = 4;
  breakdown[BreakdownKey::compute(CostCategory::kHbm)] = 5;
  std::vector<std::string> names;
  for (const auto& [key, seconds] : breakdown) {
    names.push_back(breakdown_name(key));
  }
  EXPECT_EQ(names, (std::vector<std::string>{"compute_hbm", "compute_shared_with_collectives",
                                             "compute_vpu", "exposed_ici_fsdp", "idle"}));
  EXPECT_EQ(rendered_breakdown(breakdown).at("exposed_ici_fsdp"), 2);
}

TEST(StepTimingLabels, LanesRenderAndGroupAsTracesShowThem) {
  EXPECT_EQ(lane_name({LaneKind::kTensorCore, {}, 0, false}), "TensorCore");
  EXPECT_EQ(lane_name({LaneKind::kGpuSms, {}, 0, false}), "GPU SMs");
  EXPECT_EQ(lane_name({LaneKind::kStage, {}, 3, false}), "Stage 3");
  EXPECT_EQ(lane_name({LaneKind::kIci, {"fsdp", "tensor"}, 0, false}), "ICI fsdp+tensor");
  EXPECT_EQ(lane_name({LaneKind::kSparseCoreReduce, {"fsdp"}, 0, false}), "SparseCore reduce fsdp");
  EXPECT_EQ(lane_name({LaneKind::kDcn, {}, 0, true}), "DCN gradients");
  EXPECT_EQ(lane_name({LaneKind::kInfiniBand, {"data"}, 0, false}), "InfiniBand data");
  EXPECT_EQ(lane_name({LaneKind::kHost, {}, 0, false}), "Host link");
  StepTiming timing;
  timing.lanes = {
      {LaneKind::kHost, {}, 0, false},       {LaneKind::kDcn, {"data"}, 0, false},
      {LaneKind::kTensorCore, {}, 0, false}, {LaneKind::kSparseCore, {"fsdp"}, 0, false},
      {LaneKind::kIci, {"fsdp"}, 0, false},  {LaneKind::kStage, {}, 0, false}};
  for (int lane = 0; lane < 6; ++lane) {
    timing.trace.push_back({"op", lane, "region", 0, 1, ""});
  }
  EXPECT_EQ(ordered_lanes(timing), (std::vector<int>{2, 5, 4, 3, 1, 0}));
  EXPECT_EQ(lane_rows(timing, ordered_lanes(timing)), (std::vector<int>{5, 4, 0, 3, 2, 1}));
}

// Breakdown and lane names are spelled only by the render functions: no code in sim/ composes
// them or tests a label by prefix or suffix (a rename in one place once broke the other).
TEST(StepTimingLabels, NoCodeOutsideTheRenderersSpellsOrParsesLabels) {
  const std::filesystem::path root = std::filesystem::path(TPUSIM_DEFAULT_SOURCE_DIR) / "sim";
  const std::regex spelled(
      R"re("(exposed_|compute_|_stage|pipeline_bubble|host_transfers|exposed_dcn_gradient_reduction|TensorCore|GPU SMs|Stage |ICI|D2D|NVLink|SparseCore|SparseCore reduce|DCN|InfiniBand|Host link|DCN gradients|InfiniBand gradients)")re");
  const std::regex parsed(R"re((starts_with|ends_with|rfind|find)\("(exposed|compute_|_stage))re");
  int files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    const std::string extension = entry.path().extension().string();
    if (extension != ".cpp" && extension != ".h") {
      continue;
    }
    if (entry.path().filename() == "timing_labels.cpp") {
      continue;  // the render functions
    }
    ++files;
    std::ifstream stream(entry.path());
    std::string line;
    int number = 0;
    while (std::getline(stream, line)) {
      ++number;
      const size_t code = line.find_first_not_of(' ');
      if (code != std::string::npos && line.compare(code, 2, "//") == 0) {
        continue;
      }
      EXPECT_FALSE(std::regex_search(line, spelled) || std::regex_search(line, parsed))
          << entry.path() << ":" << number << ": " << line;
    }
  }
  EXPECT_GT(files, 50);
}

}  // namespace
}  // namespace tpusim
