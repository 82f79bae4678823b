#pragma once
// Test helper: plan from a command line, exactly as `megatron plan` parses it.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "core/flags.h"
#include "plan/plan.h"

namespace mt::plan::testing {

inline std::vector<std::string> split_args(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string t; in >> t;) out.push_back(t);
  return out;
}

// Parses `args` with the job and planner flags; fails the test on a flag error.
inline PlanReport plan_from(const std::string& args) {
  JobConfig job;
  PlanOptions opts;
  FlagSet flags("megatron plan");
  register_job_flags(flags, job);
  register_megatron_compat_flags(flags, job);  // as megatron train (and plan) take them
  register_plan_option_flags(flags, opts);
  Status st = flags.parse(split_args(args));
  EXPECT_TRUE(st.is_ok()) << st.message();
  return make_plan(job, opts);
}

inline std::string rules_of(const PlanReport& r) {
  std::string s;
  for (const auto& e : r.errors) s += e.rule + " ";
  return s;
}

}  // namespace mt::plan::testing
