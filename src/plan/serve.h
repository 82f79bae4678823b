#pragma once
// `megatron plan --serve PORT`: the plan page with a live form. The page
// posts {"args": ["--flag", "value", ...]} to /api/plan; the C++ planner
// answers with the same JSON `megatron plan --json` prints. Loopback only.

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mt::plan {

using Replanner = std::function<nlohmann::json(const std::vector<std::string>& args)>;

// Blocks serving until the process is stopped. `port` 0 picks a free port.
// `on_listening(port)` runs once the socket is bound.
Status serve_plan(int port, const nlohmann::json& initial_plan, Replanner replan,
                  const std::function<void(int)>& on_listening);

// Parses a /api/plan request body into arguments; errors name what is wrong.
Result<std::vector<std::string>> parse_plan_request(const std::string& body);

}  // namespace mt::plan
