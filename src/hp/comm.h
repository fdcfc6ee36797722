// hp/comm.h: the public header of the comm layer.
#pragma once

#include "hp/base/error.h"
#include "hp/comm/autograd.h"
#include "hp/comm/collectives.h"
#include "hp/comm/collective_log.h"
#include "hp/comm/device_mesh.h"
#include "hp/comm/fake_backend.h"
#include "hp/comm/local_ranks.h"
#include "hp/comm/symm/symm.h"
#include "hp/comm/trace.h"
#include "hp/comm/world.h"

namespace hp {
using comm::init_distributed;
}
