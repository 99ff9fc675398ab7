"""Which OpenBLAS kernels PyTorch runs here, and which OPENBLAS_CORETYPE gives it the best.

    python3 openblas_core.py detect    # the core OpenBLAS picks by itself, e.g. "Haswell"
    python3 openblas_core.py choose    # "" (leave OpenBLAS alone) or a core to force

OpenBLAS reads OPENBLAS_CORETYPE once, when it loads; `detect` reports the core of the
OpenBLAS that torch itself loaded (found in /proc/self/maps), as openblas_get_corename()
names it. `choose` forces a core only where OpenBLAS misdetects a CPU that has the
instructions: AVX-512 (avx512f in /proc/cpuinfo) without an AVX-512 core picked ->
SkylakeX; AVX2 + FMA with a pre-AVX2 core picked -> Haswell (the kernels OpenBLAS uses for
AMD Zen too). Otherwise it prints nothing and OpenBLAS keeps its own choice.
"""
import ctypes
import sys

AVX512_CORES = {"skylakex", "cooperlake", "sapphirerapids"}
AVX2_CORES = AVX512_CORES | {"haswell", "zen", "skylake"}


def detect():
    import torch  # noqa: F401  (loads the BLAS torch uses)

    paths = set()
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1]
            if "openblas" in p and ".so" in p:
                paths.add(p)
    for p in sorted(paths):
        try:
            fn = ctypes.CDLL(p).openblas_get_corename
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_char_p
        return fn().decode()
    return "none (torch did not load OpenBLAS)"


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def choose(core):
    c, flags = core.lower(), cpu_flags()
    if c.startswith("none"):
        return ""
    if "avx512f" in flags and c not in AVX512_CORES:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags and c not in AVX2_CORES:
        return "Haswell"
    return ""


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "detect"
    core = detect()
    print(core if what == "detect" else choose(core))
