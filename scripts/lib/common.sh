# Shared by scripts/*.sh: repository root, Debian packages, build configuration.
# Sourced, not run.

KILN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# OpenMP threads that sleep between parallel regions: much faster when the cores are
# shared (kiln sets this itself too; tests and tools built on its libraries need it here).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
KILN_BUILD="${KILN_BUILD_DIR:-$KILN_ROOT/build}"

# Debian packages kiln builds and tests with (all from Debian 12).
KILN_BUILD_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git rsync
  libdnnl-dev ocl-icd-opencl-dev libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libfmt-dev
  libsentencepiece-dev libicu-dev zlib1g-dev libzstd-dev libpng-dev libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev
)
# Only for the tests: headless Chromium renders `kiln report`'s page for a screenshot;
# python3 reads JSON in the shell tests and checks the golden file's header; Debian's
# PyTorch (python3-torch, under /usr/bin/python3) checks exported Hugging Face folders
# against the golden logits (golden_hf_reference, which skips without it); Jinja
# (python3-jinja2) renders the published chat templates for chat_sft_test.
KILN_TEST_PACKAGES=(chromium python3 python3-torch python3-jinja2)
# Only for the fuzzers (scripts/fuzz.sh, run by test.sh): clang 14, its libFuzzer and
# sanitizer runtimes (libclang-rt-14-dev, which Debian only recommends beside clang-14)
# and its OpenMP (libomp-14-dev: the fuzz build compiles the OpenMP kernels with clang).
KILN_FUZZ_PACKAGES=(clang-14 libclang-rt-14-dev libomp-14-dev)
# Only for the Slurm launch tests (scripts/slurm/local-cluster.sh): a one-node cluster.
KILN_SLURM_PACKAGES=(slurmctld slurmd slurm-client munge)
# Only for the demo: the King James Bible (the `bible` program and its text).
KILN_DEMO_PACKAGES=(bible-kjv)
# Only for the vision demo (demo.sh --arch vit): Fashion-MNIST's IDX files.
KILN_VIT_DEMO_PACKAGES=(dataset-fashion-mnist)

# Installs whatever of "$@" is missing, with apt-get (as root, or through sudo).
kiln_apt_install() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "kiln: installing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# node + npm for the GPT-2 tokenizer reference test (the machine image may already
# have them outside Debian's packages; only install Debian's when none is present).
kiln_ensure_node() {
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    kiln_apt_install nodejs npm
  fi
}

# Configures and builds kiln in $KILN_BUILD. Extra arguments go to cmake. The output
# goes to $KILN_BUILD/build.log and ninja's progress ([done/total] and a percentage) to
# one line of the terminal; on failure the log's end is printed.
kiln_build() {
  mkdir -p "$KILN_BUILD"
  # ccache hashes paths below the checkout relative to the build folder, so that another
  # clone (CI's fresh one, a user's second) hits the same cache.
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$KILN_ROOT}"
  local log="$KILN_BUILD/build.log" first=""
  [ -f "$KILN_BUILD/build.ninja" ] || first=" (a first build on 2 cores: up to 15 minutes without a compiler cache, a few with a warm one)"
  echo "kiln: building in $KILN_BUILD$first; log: $log"
  if ! cmake -S "$KILN_ROOT" -B "$KILN_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >"$log" 2>&1; then
    kiln_build_failed "$log"
    return 1
  fi
  local rc=0
  { cmake --build "$KILN_BUILD" -j "$(nproc)" 2>&1 | kiln_show_progress "$log"; rc=${PIPESTATUS[0]}; } || true
  if [ "$rc" -ne 0 ]; then
    kiln_build_failed "$log"
    return 1
  fi
}

kiln_build_failed() {
  tail -n 40 "$1" >&2
  echo "kiln: the build failed (full log: $1)" >&2
}

# Reads ninja's output, appends it to the log "$1" and shows its [done/total] status: on
# one rewritten line when stderr is a terminal, else a line at every tenth of the build.
# (A shell loop, not awk: Debian's mawk reads a pipe in blocks, which stalls the display.)
kiln_show_progress() {
  local log=$1 tty=0 shown=0 next=0 line n t pct
  [ -t 2 ] && tty=1
  while IFS= read -r line; do
    printf '%s\n' "$line" >> "$log"
    [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]] || continue
    n=${BASH_REMATCH[1]} t=${BASH_REMATCH[2]}
    pct=$(( 100 * n / t ))
    if [ "$tty" = 1 ]; then
      printf '\rkiln: building [%d/%d] %d%%' "$n" "$t" "$pct" >&2
      shown=1
    elif [ "$pct" -ge "$next" ]; then
      printf 'kiln: building [%d/%d] %d%%\n' "$n" "$t" "$pct" >&2
      next=$(( pct - pct % 10 + 10 ))
    fi
  done
  [ "$shown" = 0 ] || printf '\n' >&2
}

# Links bin/kiln in the checkout to the program just built in $KILN_BUILD, so that every
# script leaves the same documented path behind (the README uses bin/kiln).
kiln_link_bin() {
  mkdir -p "$KILN_ROOT/bin"
  ln -sfn "$KILN_BUILD/apps/kiln/kiln" "$KILN_ROOT/bin/kiln"
  echo "kiln: the program is $KILN_ROOT/bin/kiln (-> $KILN_BUILD/apps/kiln/kiln); add it to PATH with: export PATH=\"$KILN_ROOT/bin:\$PATH\""
}
