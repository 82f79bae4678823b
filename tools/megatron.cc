// megatron: the one binary. `megatron <subcommand> [--flags]`.

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "commands.h"
#include "core/device.h"

namespace {

struct Subcommand {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>&);
};

const Subcommand kSubcommands[] = {
    {"plan", "check a parallel layout; show its rank grid, memory, pipeline bubble, FLOPs (text, --json, --html, --serve)",
     mt::tools::plan_main},
    {"preprocess", "turn JSONL text into Megatron's .bin/.idx dataset (byte-identical to tools/preprocess_data.py)",
     mt::tools::preprocess_main},
    {"tokenize", "text to token ids and back with any --tokenizer-type (one line of ids per document)", mt::tools::tokenize_main},
    {"train", "pre-train a GPT or LLaMA-style model with Megatron-LM's flags", mt::tools::train_main},
    {"generate", "continue a --prompt with a trained checkpoint (--load), KV cache, greedy/top-k/top-p", mt::tools::generate_main},
    {"export", "write a checkpoint (any layout) as a Hugging Face transformers model: GPT-2, LLaMA or Qwen2",
     mt::tools::export_main},
    {"import", "read a Hugging Face GPT-2, LLaMA or Qwen2 model directory as a checkpoint (--finetune, generate)",
     mt::tools::import_main},
};

void usage(FILE* out) {
  std::fprintf(out,
               "usage: megatron <subcommand> [--flag value ...]\n\n"
               "The Megatron-LM training system in C++. Flags keep Megatron-LM's names.\n\n"
               "subcommands:\n");
  for (const auto& s : kSubcommands) std::fprintf(out, "  %-12s %s\n", s.name, s.summary);
  std::fprintf(out, "\n`megatron <subcommand> --help` lists that subcommand's flags; `megatron --version` the backends.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  if (cmd == "--version") {
    mt::BackendInfo b = mt::backend_info();
    std::printf("megatron-cpp 0.1.0\nCPU backend: yes\nCUDA backend: %s%s\n", b.cuda_compiled ? "compiled, " : "",
                b.cuda_status.c_str());
#ifdef MT_HAVE_NCCL
    std::printf("NCCL groups: compiled (several ranks on GPUs)\n");
#else
    std::printf("NCCL groups: not compiled (several ranks on GPUs go through MPI, staged in host memory)\n");
#endif
    return 0;
  }
  for (const auto& s : kSubcommands) {
    if (cmd == s.name) return s.run(std::vector<std::string>(argv + 2, argv + argc));
  }
  std::fprintf(stderr, "megatron: unknown subcommand '%s'; run `megatron --help` for the list\n", cmd.c_str());
  return 2;
}
