// sim/functional/in_process_communicator.h: moved to sim/transport/in_process_communicator.h (the
// transports have their own folder). Kept only while sim/train/trainer.cpp, which is being changed
// elsewhere, still includes this path; delete it once that include says sim/transport/.
#pragma once

#include "sim/transport/in_process_communicator.h"
