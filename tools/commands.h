#pragma once
// One entry point per `megatron` subcommand; each returns the exit code
// (0 success, 1 runtime failure, 2 bad input or invalid configuration).

#include <string>
#include <vector>

namespace mt::tools {

int plan_main(const std::vector<std::string>& args);
int preprocess_main(const std::vector<std::string>& args);
int tokenize_main(const std::vector<std::string>& args);
int train_main(const std::vector<std::string>& args);
int generate_main(const std::vector<std::string>& args);
int export_main(const std::vector<std::string>& args);
int import_main(const std::vector<std::string>& args);

}  // namespace mt::tools
