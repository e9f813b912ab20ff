#include "tests/sim/functional/kernels/kernel_test_support.h"

#include <cstdio>

namespace tpusim::kernel_test {
namespace {

// Prints the largest finite-difference error per check at the end of the run.
class FdReport : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& [name, error] : fd_errors()) {
      std::printf("[fd] %-34s max error %.2e\n", name.c_str(), error);
    }
  }
};
const auto* const kFdReport = ::testing::AddGlobalTestEnvironment(new FdReport);

}  // namespace
}  // namespace tpusim::kernel_test
