// tpusim: TPU-topology simulator and MaxText performance model. See README.md.
#include "sim/cli/run_cli.h"

int main(int argc, char** argv) {
  return tpusim::run_cli(argc, argv);
}
