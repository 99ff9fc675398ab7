#!/usr/bin/env bash
# Every file the build read and every program the tests run must come from a Debian
# package that scripts/ install (or from one of their dependencies, or from the base
# system that debootstrap makes): otherwise a fresh machine fails where this one passes.
#   check_packages.sh SOURCE_DIR BUILD_DIR
# What it looks at:
#   configure  the CMake files configure read (build.ninja's RERUN_CMAKE inputs: also the
#              ones read inside other packages' config files, e.g. dnnl-config.cmake ->
#              FindOpenCL.cmake) and the files CMakeCache.txt points to (libraries,
#              headers, programs found by find_*);
#   compile    every header the compiler read (ninja's dependency log);
#   link       the libraries named by path on link lines;
#   programs   the programs that scripts and tests run (PROGRAMS below), found on PATH.
# Files that belong to no package (the CUDA toolkit in /usr/local, this repository) are
# not checked: CUDA is optional and detected. Fails with one line per offending file;
# exits 77 (skipped) where there is no dpkg (not Debian).
set -euo pipefail
src="${1:?source dir}"; build="${2:?build dir}"
source "$src/scripts/lib/common.sh"
# Programs run by scripts/ and tests/ (besides the compiler and the kiln binaries).
# (python3 by its full path: the tests run Debian's, not whatever python3 PATH finds first.)
PROGRAMS=(cmake ninja ccache pkg-config git rsync c++ /usr/bin/python3 mpirun chromium node npm bible
          munged mungekey slurmctld slurmd srun sbatch scontrol squeue sinfo)
declared=("${KILN_BUILD_PACKAGES[@]}" "${KILN_TEST_PACKAGES[@]}" "${KILN_DEMO_PACKAGES[@]}"
          "${KILN_SLURM_PACKAGES[@]}" nodejs npm)

# Off Debian there is nothing to check: exit 77, which ctest reports as skipped
# (SKIP_RETURN_CODE), not passed.
command -v dpkg-query >/dev/null || { echo "check_packages: not a Debian system, skipped"; exit 77; }

# The packages scripts/ install, closed under Depends/PreDepends, plus the base system.
allowed=$(mktemp); files=$(mktemp); owners=$(mktemp)
trap 'rm -f "$allowed" "$files" "$owners"' EXIT
{
  dpkg-query -W -f='${Package} ${Priority} ${Essential}\n' | awk '$2=="required" || $2=="important" || $3=="yes" {print $1}'
  printf '%s\n' "${declared[@]}" apt git ca-certificates
} | sort -u > "$allowed.seed"
apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances --installed $(cat "$allowed.seed") 2>/dev/null |
  awk '/^[a-z0-9]/ {print $1} /Depends:/ {print $2}' | tr -d '<>' | sed 's/:any$//' |
  cat - "$allowed.seed" | sort -u > "$allowed"
rm -f "$allowed.seed"
# Virtual packages (e.g. libc-dev) resolve to whichever real package provides them.
dpkg-query -W -f='${Package}\t${Provides}\n' |
  awk -F'\t' 'NR==FNR {ok[$1]=1; next} $2!="" {n=split($2, v, /, */); for (i=1;i<=n;i++) {split(v[i], w, " "); if (w[1] in ok) print $1}}' "$allowed" - >> "$allowed"
sort -u -o "$allowed" "$allowed"

{
  sed -n 's/^build build.ninja: RERUN_CMAKE | //p' "$build/build.ninja" | tr ' ' '\n'
  sed -n 's/^[A-Za-z0-9_]*:\(FILEPATH\|PATH\|STRING\)=\(\/.*\)$/\2/p' "$build/CMakeCache.txt" | tr ';' '\n'
  ninja -C "$build" -t deps 2>/dev/null | awk '/^    \// {print $1}'
  grep -o '/usr/[^ ]*\.\(so\|a\)\(\.[0-9.]*\)\?' "$build/build.ninja" || true
  for p in "${PROGRAMS[@]}"; do if [ -x "$p" ]; then echo "$p"; else command -v "$p" || true; fi; done
} | grep '^/' | grep -v "^$src/\|^$build/\|^/usr/local/" | sort -u |
  while read -r f; do [ -f "$f" ] && readlink -f "$f"; echo "$f"; done | sort -u > "$files"

# dpkg -S prints "pkg[, pkg2]: path" for owned files (usrmerge: try /usr/X for /X too).
xargs -a "$files" -d '\n' dpkg-query -S 2>/dev/null | grep -v "^diversion" | sed "s/:[a-z0-9]*: /: /" > "$owners" || true
# "pkg[, pkg2]: path" -> the paths none of whose owners is allowed.
bad=$(awk 'NR==FNR {ok[$1]=1; next} {
         i=index($0, ": "); pkgs=substr($0, 1, i-1); path=substr($0, i+2)
         n=split(pkgs, p, /, */); good=0
         for (j=1;j<=n;j++) { sub(/:.*/, "", p[j]); if (p[j] in ok) good=1 }
         if (!good) printf "check_packages: %s comes from package %s, which scripts/lib/common.sh does not install (add it to its package lists)\n", path, pkgs
       }' "$allowed" "$owners")
[ -z "$bad" ] || { echo "$bad"; exit 1; }
n=$(wc -l < "$files"); m=$(wc -l < "$owners")
echo "check_packages: $m of $n files the build and tests use come from packages scripts/ install; the rest belong to no package"
