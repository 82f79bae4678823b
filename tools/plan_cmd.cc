// megatron plan: validity, derived sizes, rank grid, memory, bubble, FLOPs.

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "commands.h"
#include "core/file.h"
#include "core/flags.h"
#include "plan/plan.h"
#include "plan/render.h"
#include "plan/serve.h"
#include "train/train_config.h"

namespace mt::tools {

namespace {

struct PlanCli {
  train::TrainConfig train;  // every flag `megatron train` takes; the planner reads train.job
  plan::PlanOptions options;
  bool json = false, help = false;
  std::string html;
  std::optional<int64_t> serve;
};

// Registers every flag of `megatron plan` on a fresh FlagSet bound to `cli`.
std::unique_ptr<FlagSet> plan_flags(PlanCli& cli) {
  auto f = std::make_unique<FlagSet>(
      "megatron plan",
      "Checks a tensor x pipeline x data (x context x expert) parallel layout against Megatron-LM's\n"
      "rules and reports the rank grid, memory per rank, pipeline bubble, FLOPs and throughput.\n"
      "Takes every flag `megatron train` takes (training-only flags are accepted and do not change the plan),\n"
      "plus the device profile and output flags below. Exit code 0: valid; 2: invalid or bad flags.");
  train::register_train_flags(*f, cli.train, /*with_device=*/false);
  plan::register_plan_option_flags(*f, cli.options);
  f->section("output");
  f->add_switch("json", &cli.json, "print the plan as JSON instead of text");
  f->add_string("html", &cli.html, "write a self-contained HTML page with the picture to this file");
  f->add_int("serve", &cli.serve, "serve the page with a live form on 127.0.0.1:PORT (0: any free port)", 0, 65535);
  f->add_switch("help", &cli.help, "show this help");
  return f;
}

nlohmann::json replan_json(const std::vector<std::string>& args) {
  PlanCli cli;
  auto flags = plan_flags(cli);
  if (Status st = flags->parse(args); !st) {
    return {{"valid", false}, {"warnings", nlohmann::json::array()}, {"form", nlohmann::json::object()},
            {"errors", {{{"rule", "flag"},
                         {"flags", flags->error_flag().empty() ? nlohmann::json::array() : nlohmann::json::array({flags->error_flag()})},
                         {"message", st.message()},
                         {"suggestion", fmt::format("see `megatron plan --help`")}}}}};
  }
  return plan::to_json(plan::make_plan(cli.train.job, cli.options));
}

}  // namespace

// Under mpirun every rank runs the planner; only rank 0 speaks.
bool is_nonzero_launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK"}) {
    const char* v = std::getenv(var);
    if (v && *v) return std::string(v) != "0";
  }
  return false;
}

int plan_main(const std::vector<std::string>& argv) {
  PlanCli cli;
  auto flags = plan_flags(cli);
  auto args = train::expand_config_files(argv);  // --config: the YAML file's flags, as `megatron train` reads them
  if (!args) {
    std::fprintf(stderr, "megatron plan: error: %s\n", args.status().message().c_str());
    return 2;
  }
  if (Status st = flags->parse(*args); !st) {
    std::fprintf(stderr, "megatron plan: error: %s\n", st.message().c_str());
    return 2;
  }
  if (cli.help) {
    std::fputs(flags->help().c_str(), stdout);
    return 0;
  }
  if (cli.train.use_checkpoint_args) {
    std::fprintf(stderr, "megatron plan: error: --use-checkpoint-args: the planner does not read checkpoints; give the "
                         "model flags (a checkpoint's are the \"argv\" list in its common.json)\n");
    return 2;
  }
  plan::PlanReport report = plan::make_plan(cli.train.job, cli.options);
  if (is_nonzero_launcher_rank() && !cli.serve) return report.valid() ? 0 : 2;
  nlohmann::json j;
  if (cli.json || !cli.html.empty() || cli.serve) j = plan::to_json(report);
  if (cli.json) std::cout << j.dump(1) << "\n";
  else std::cout << plan::render_text(report);
  if (!cli.html.empty()) {
    if (Status st = write_file_atomic(cli.html, plan::render_html(j, false)); !st) {
      std::fprintf(stderr, "megatron plan: error: --html: %s\n", st.message().c_str());
      return 1;
    }
    if (!cli.json) std::cout << "\nwrote " << cli.html << "\n";
  }
  if (cli.serve) {
    Status st = plan::serve_plan(static_cast<int>(*cli.serve), j, replan_json, [](int port) {
      std::cout << "serving the plan page on http://127.0.0.1:" << port << "/ (Ctrl-C to stop)" << std::endl;
    });
    if (!st) {
      std::fprintf(stderr, "megatron plan: error: %s\n", st.message().c_str());
      return 1;
    }
    return 0;
  }
  std::cout.flush();
  return report.valid() ? 0 : 2;
}

}  // namespace mt::tools
