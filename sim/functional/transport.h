// sim/functional/transport.h: moved to sim/transport/transport.h (the transports have their own
// folder). Kept only while sim/train/trainer.h, which is being changed elsewhere, still includes
// this path; delete it once that include says sim/transport/transport.h.
#pragma once

#include "sim/transport/transport.h"
