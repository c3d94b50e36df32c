// Adapts a Communicator to the collectives ZeRO needs (optim::ShardCollectives), so optim/ stays free of
// any dependency on dist/.
#pragma once

#include <memory>

#include "dist/communicator.h"
#include "optim/sharded_optimizer.h"

namespace tt::dist {

std::unique_ptr<optim::ShardCollectives> shard_collectives(Communicator& comm);
// A world of one (the same code path without MPI).
std::unique_ptr<optim::ShardCollectives> single_process_collectives();

}  // namespace tt::dist
