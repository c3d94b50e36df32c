#include "dist/agreement.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "dist/collective_timeout.h"
#include "dist/mpi_check.h"
#include "dist/runtime.h"

namespace tt::dist {

namespace {

using Settings = std::vector<std::pair<std::string, std::string>>;

// Values are shown as given, but a long one (a path, a summary) is cut so the message stays one line.
constexpr size_t kMaxShownChars = 120;
// Beyond this many different values of one setting the message only counts the rest.
constexpr size_t kMaxShownValues = 4;

void append_field(std::string& out, const std::string& text) {
  const uint64_t size = text.size();
  out.append(reinterpret_cast<const char*>(&size), sizeof(size));
  out += text;
}

// Length-prefixed, so that names and values may hold any bytes.
std::string encode(const Settings& settings) {
  std::string out;
  for (const auto& [name, value] : settings) {
    append_field(out, name);
    append_field(out, value);
  }
  return out;
}

Settings decode(const char* data, size_t size) {
  Settings settings;
  size_t at = 0;
  auto field = [&](std::string& text) {
    uint64_t length = 0;
    TT_ASSERT(size - at >= sizeof(length), "check_ranks_agree: a truncated settings list");
    std::memcpy(&length, data + at, sizeof(length));
    at += sizeof(length);
    TT_ASSERT(size - at >= length, "check_ranks_agree: a truncated settings list");
    text.assign(data + at, length);
    at += length;
  };
  while (at < size) {
    std::pair<std::string, std::string> setting;
    field(setting.first);
    field(setting.second);
    settings.push_back(std::move(setting));
  }
  return settings;
}

uint64_t fnv1a(const std::string& bytes) {
  uint64_t hash = 14695981039346656037ULL;
  for (const char c : bytes) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ULL;
  }
  return hash;
}

// "rank 3" or "ranks 0-2, 5".
std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

std::string shown(const std::string& value) {
  if (value.empty()) return "''";
  if (value.size() <= kMaxShownChars) return value;
  return value.substr(0, kMaxShownChars) + "...";
}

const std::string* find(const Settings& settings, const std::string& name) {
  for (const auto& [n, v] : settings) {
    if (n == name) return &v;
  }
  return nullptr;
}

// "ranks disagree on NAME: rank 0 has A, ranks 1-2 have B, rank 3 lacks it", the ranks grouped by what
// they hold (nullptr: the setting is missing), rank 0's group first.
std::string describe_setting(const std::string& name, const std::vector<const std::string*>& held) {
  std::vector<std::pair<const std::string*, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(held.size()); ++r) {
    auto same = [&](const auto& group) {
      return group.first == nullptr || held[r] == nullptr ? group.first == held[r] : *group.first == *held[r];
    };
    auto it = std::find_if(groups.begin(), groups.end(), same);
    if (it == groups.end()) {
      groups.push_back({held[r], {r}});
    } else {
      it->second.push_back(r);
    }
  }
  std::string out = "ranks disagree on " + name + ": ";
  for (size_t g = 0; g < groups.size() && g < kMaxShownValues; ++g) {
    const auto& [value, ranks] = groups[g];
    if (g > 0) out += ", ";
    out += rank_list(ranks);
    if (value == nullptr) {
      out += ranks.size() == 1 ? " lacks it" : " lack it";
    } else {
      out += (ranks.size() == 1 ? " has " : " have ") + shown(*value);
    }
  }
  if (groups.size() > kMaxShownValues)
    out += " (and " + std::to_string(groups.size() - kMaxShownValues) + " more values)";
  return out;
}

}  // namespace

std::string describe_disagreement(const std::vector<Settings>& lists) {
  if (lists.size() < 2) return "";
  const Settings& base = lists[0];
  auto held_by_each = [&](const std::string& name) {
    std::vector<const std::string*> held;
    for (const Settings& list : lists) held.push_back(find(list, name));
    return held;
  };
  auto all_same = [](const std::vector<const std::string*>& held) {
    for (const std::string* h : held) {
      if (h == nullptr || *h != *held[0]) return false;
    }
    return true;
  };
  // Rank 0's settings in its order, then those only other ranks have.
  for (const auto& [name, value] : base) {
    const auto held = held_by_each(name);
    if (!all_same(held)) return describe_setting(name, held);
  }
  for (const Settings& list : lists) {
    for (const auto& [name, value] : list) {
      if (find(base, name) == nullptr) return describe_setting(name, held_by_each(name));
    }
  }
  // Every name holds the same first value everywhere: the lists differ only in order or repetitions.
  for (size_t r = 1; r < lists.size(); ++r) {
    if (lists[r] == base) continue;
    size_t i = 0;
    while (i < base.size() && i < lists[r].size() && base[i] == lists[r][i]) ++i;
    const std::string where = " (setting " + std::to_string(i + 1) + ")";
    auto entry = [](const Settings& list, size_t k) {
      return k < list.size() ? list[k].first + " " + shown(list[k].second) : std::string("nothing");
    };
    return "ranks disagree on the list of settings" + where + ": rank 0 has " + entry(base, i) + ", rank " +
           std::to_string(r) + " has " + entry(lists[r], i);
  }
  return "";
}

void check_ranks_agree(const DistRuntime& runtime, const Settings& settings) {
  const int world = runtime.world_size();
  if (world == 1) return;
  const CollectiveWait wait("check_ranks_agree");
  const std::string mine = encode(settings);
  // The hash of each list first: in the usual case nothing more is sent.
  const uint64_t summary[2] = {mine.size(), fnv1a(mine)};
  std::vector<uint64_t> summaries(2 * static_cast<size_t>(world));
  TT_MPI_CHECK(MPI_Allgather(summary, 2, MPI_UINT64_T, summaries.data(), 2, MPI_UINT64_T, MPI_COMM_WORLD));
  bool same = true;
  uint64_t total = 0;
  for (int r = 0; r < world; ++r) {
    same = same && summaries[2 * r] == summaries[0] && summaries[2 * r + 1] == summaries[1];
    total += summaries[2 * r];
  }
  if (same) return;
  // Every rank got the same sizes, so every rank takes the same branch here and throws the same message.
  if (total > INT_MAX) {
    throw RanksDisagree("ranks disagree on their settings (" + std::to_string(total) +
                        " bytes of settings over all ranks are too many to compare)");
  }
  std::vector<int> counts(static_cast<size_t>(world)), displacements(static_cast<size_t>(world));
  int offset = 0;
  for (int r = 0; r < world; ++r) {
    counts[r] = static_cast<int>(summaries[2 * r]);
    displacements[r] = offset;
    offset += counts[r];
  }
  std::string all(static_cast<size_t>(total), '\0');
  TT_MPI_CHECK(MPI_Allgatherv(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, all.data(), counts.data(),
                              displacements.data(), MPI_CHAR, MPI_COMM_WORLD));
  std::vector<Settings> lists;
  for (int r = 0; r < world; ++r) lists.push_back(decode(all.data() + displacements[r], counts[r]));
  std::string why = describe_disagreement(lists);
  // Equal lists cannot hash differently; kept so that every rank still throws the same error.
  if (why.empty()) why = "ranks disagree on their settings";
  throw RanksDisagree(why);
}

int end_start_up_failure(const DistRuntime& runtime, const std::string& problem) {
  try {
    raise_if_any_rank_failed(runtime, problem);
  } catch (const SameOnEveryRank& same) {
    if (runtime.rank() == 0) std::fprintf(stderr, "error: %s\n", same.what());
  }
  return 1;
}

void raise_if_any_rank_failed(const DistRuntime& runtime, const std::string& problem) {
  const int world = runtime.world_size();
  if (world == 1) {
    if (!problem.empty()) throw SameOnEveryRank(problem);
    return;
  }
  const CollectiveWait wait("raise_if_any_rank_failed");
  const int mine = problem.empty() ? world : runtime.rank();
  int first = world;
  TT_MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (first == world) return;
  uint64_t size = problem.size();
  TT_MPI_CHECK(MPI_Bcast(&size, 1, MPI_UINT64_T, first, MPI_COMM_WORLD));
  TT_ASSERT(size <= INT_MAX, "raise_if_any_rank_failed: a problem of " + std::to_string(size) + " bytes");
  std::string text = problem;
  text.resize(size);
  TT_MPI_CHECK(MPI_Bcast(text.data(), static_cast<int>(size), MPI_CHAR, first, MPI_COMM_WORLD));
  throw SameOnEveryRank(first == 0 ? text : "rank " + std::to_string(first) + ": " + text);
}

}  // namespace tt::dist
