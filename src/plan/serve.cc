#include "plan/serve.h"

#include <fmt/format.h>
#include <httplib.h>

#include "plan/render.h"

namespace mt::plan {

constexpr size_t kMaxBody = 64 * 1024, kMaxArgs = 512;

Result<std::vector<std::string>> parse_plan_request(const std::string& body) {
  if (body.size() > kMaxBody) return Status::invalid("request body larger than 64 KiB");
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("args") || !j["args"].is_array())
    return Status::invalid(R"(expected a JSON object {"args": ["--flag", "value", ...]})");
  if (j["args"].size() > kMaxArgs) return Status::invalid("more than 512 arguments");
  std::vector<std::string> args;
  for (const auto& a : j["args"]) {
    if (a.is_string()) args.push_back(a.get<std::string>());
    else if (a.is_number_integer()) args.push_back(std::to_string(a.get<int64_t>()));
    else return Status::invalid("every argument must be a string");
  }
  return args;
}

Status serve_plan(int port, const nlohmann::json& initial_plan, Replanner replan,
                  const std::function<void(int)>& on_listening) {
  httplib::Server server;
  server.set_payload_max_length(kMaxBody);
  const std::string page = render_html(initial_plan, /*serve_mode=*/true);
  server.Get("/", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(page, "text/html; charset=utf-8");
  });
  server.Post("/api/plan", [&](const httplib::Request& req, httplib::Response& res) {
    auto args = parse_plan_request(req.body);
    nlohmann::json out;
    if (!args) {
      res.status = 400;
      out = {{"valid", false}, {"warnings", nlohmann::json::array()},
             {"errors", {{{"rule", "request"}, {"flags", nlohmann::json::array()}, {"message", args.status().message()}, {"suggestion", ""}}}}};
    } else {
      out = replan(*args);
    }
    res.set_content(out.dump(), "application/json");
  });
  server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    res.status = 500;
    res.set_content(R"({"valid":false,"errors":[{"rule":"internal","flags":[],"message":"internal error","suggestion":""}],"warnings":[]})",
                    "application/json");
  });
  int bound = port == 0 ? server.bind_to_any_port("127.0.0.1") : (server.bind_to_port("127.0.0.1", port) ? port : -1);
  if (bound < 0)
    return Status::io_error(fmt::format("--serve: cannot listen on 127.0.0.1:{} (in use? try another port, or 0 for any)", port));
  on_listening(bound);
  if (!server.listen_after_bind()) return Status::io_error("--serve: the server stopped unexpectedly");
  return Status::ok();
}

}  // namespace mt::plan
