// Checking that the ranks of a job were started alike. Ranks given different flags (a config file edited
// between starts, a launcher that passes arguments per host) otherwise hang in a collective that only some
// of them enter, or train silently wrong; this turns that into one error on every rank at start-up.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "base/error.h"

namespace tt::dist {

class DistRuntime;

// An error every rank raises at once, so a caller may end each rank normally (no MPI_Abort needed: no rank
// is left waiting) and print the message on rank 0 only: a bad value among settings check_ranks_agree has
// found equal on every rank.
class SameOnEveryRank : public Error {
 public:
  using Error::Error;
};

// Thrown by check_ranks_agree on every rank at once.
class RanksDisagree : public SameOnEveryRank {
 public:
  using SameOnEveryRank::SameOnEveryRank;
};

// Collective over MPI_COMM_WORLD: compares every rank's (name, value) list with rank 0's. When they differ,
// every rank throws the same RanksDisagree (a tt::Error), one line naming the first setting (in rank 0's
// order) on which some rank differs and which ranks hold which value:
//   "ranks disagree on --steps: rank 0 has 10, rank 1 has 12"
//   "ranks disagree on --steps: ranks 0-1, 3 have 10, rank 2 has 12"
//   "ranks disagree on --extra: rank 0 lacks it, rank 1 has 5"
// Lists may differ in length, names and order on any rank without hanging: all ranks exchange their whole
// lists (a hash first, the lists only when some hash differs) and decide from the same data.
// Names are printed as given, so pass them as the user would write them ("--steps").
void check_ranks_agree(const DistRuntime& runtime,
                       const std::vector<std::pair<std::string, std::string>>& settings);

// Collective over MPI_COMM_WORLD, at a point every rank reaches after checking something on its own: when
// any rank's `problem` is not empty, every rank throws the same SameOnEveryRank, the lowest such rank's
// problem ("rank R: " before it unless R is 0). Ranks that check the same settings against the same files
// find the same problem, so the job ends with rank 0's one line instead of an abort per rank.
void raise_if_any_rank_failed(const DistRuntime& runtime, const std::string& problem);

// A rank's failure while the ranks still run alike (start-up: a bad flag fails every rank), from its catch:
// meets the others in their raise_if_any_rank_failed, prints the lowest failing rank's problem on rank 0
// ("error: ..."), and returns 1, the exit code.
int end_start_up_failure(const DistRuntime& runtime, const std::string& problem);

// The comparison itself, for any set of lists (lists[r] is rank r's): the message check_ranks_agree throws,
// or an empty string when every list equals lists[0].
std::string describe_disagreement(const std::vector<std::vector<std::pair<std::string, std::string>>>& lists);

}  // namespace tt::dist
