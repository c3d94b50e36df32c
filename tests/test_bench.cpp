// The benchmark timing protocol: warm-up iterations are excluded and the phases add up to the step.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "apps/lib/bench.h"

using namespace tt::app;

TEST_CASE("time_phases excludes warm-up and its phases add up to the step") {
  int calls = 0, syncs = 0;
  auto sleep_ms = [](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  const std::vector<Phase> phases = {
      {"a", [&] { sleep_ms(calls++ < 2 ? 60 : 2); }},  // slow first (warm-up) calls
      {"b", [&] { sleep_ms(3); }}};
  const StepTimings t = time_phases(2, 5, phases, [&] { ++syncs; });
  REQUIRE(t.step_ms.size() == 5);
  REQUIRE(t.phase_ms[0].size() == 5);
  CHECK(calls == 7);
  CHECK(syncs == 7 * 3);                         // before the step and after each phase
  for (double a : t.phase_ms[0]) CHECK(a < 40);  // the 60 ms warm-up calls are not in the samples
  const Summary step = summarize(t.step_ms), a = summarize(t.phase_ms[0]), b = summarize(t.phase_ms[1]);
  CHECK(a.mean + b.mean == doctest::Approx(step.mean).epsilon(1e-9));
  CHECK(step.mean >= 5.0);
}

TEST_CASE("summary statistics") {
  const Summary s = summarize({1.0, 2.0, 3.0, 4.0});
  CHECK(s.mean == doctest::Approx(2.5));
  CHECK(s.std == doctest::Approx(1.2909944487));
  CHECK(s.min == 1.0);
  CHECK(s.count == 4);
}
