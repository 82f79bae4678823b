#include <string>

#include "plan/render.h"

namespace mt::web {
extern const std::string_view plan_html, plan_css, plan_js;
}

namespace mt::plan {

namespace {

void replace_once(std::string& s, const std::string& what, std::string_view with) {
  auto pos = s.find(what);
  if (pos != std::string::npos) s.replace(pos, what.size(), with);
}

}  // namespace

std::string render_html(const nlohmann::json& plan, bool serve_mode) {
  std::string page(web::plan_html);
  // JSON inside <script>: escape "</" so no string can close the element.
  std::string data = plan.dump(-1, ' ', /*ensure_ascii=*/true);
  std::string safe;
  safe.reserve(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] == '<') safe += "\\u003c";
    else safe += data[i];
  }
  // The plan goes in last: its strings come from the user and must never be
  // searched for markers.
  replace_once(page, "/*@MODE@*/", serve_mode ? "true" : "false");
  replace_once(page, "/*@CSS@*/", web::plan_css);
  replace_once(page, "/*@JS@*/", web::plan_js);
  replace_once(page, "/*@PLAN@*/", safe);
  return page;
}

}  // namespace mt::plan
