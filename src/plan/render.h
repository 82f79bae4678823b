#pragma once
// Renderers for a PlanReport: readable text tables, JSON (the contract the
// HTML page and the --serve endpoint share), and one self-contained HTML page.

#include <string>

#include <nlohmann/json.hpp>

#include "plan/plan.h"

namespace mt::plan {

std::string render_text(const PlanReport& r);
nlohmann::json to_json(const PlanReport& r);
// The page (web/plan.html with its CSS and JS inlined) showing `plan`.
// `serve_mode` makes the form live (it posts to /api/plan).
std::string render_html(const nlohmann::json& plan, bool serve_mode);

// "1,234,567"
std::string group_digits(double v);

}  // namespace mt::plan
