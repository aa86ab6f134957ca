"""Compile the CUDA C++ that `draftc emit --backend cuda` prints with NVRTC
(NVIDIA's runtime compiler, from PyPI: no GPU and no CUDA toolkit needed).

    python tools/nvrtc_check.py EMITTED.cu [more.cu ...] [--arch compute_90]

Each file may hold several kernels (`// ---- kernel i/n: …` sections, as
`draftc emit` prints them); every section is compiled on its own. Prints one
line per kernel and exits 1 if any fails, with NVRTC's log.
Needs `pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12`
(the slow test `emitted_cuda_compiles_with_nvrtc` sets up a virtualenv).
"""
import ctypes
import glob
import os
import re
import sys

import nvidia.cuda_nvrtc
import nvidia.cuda_runtime


def load_nvrtc():
    lib_dir = os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib")
    candidates = sorted(glob.glob(os.path.join(lib_dir, "libnvrtc.so*")))
    if not candidates:
        sys.exit(f"no libnvrtc.so under {lib_dir}")
    return ctypes.CDLL(candidates[0])


def compile_one(lib, source, arch):
    include = os.path.join(list(nvidia.cuda_runtime.__path__)[0], "include")
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source, b"kernel.cu", 0, None, None) != 0:
        return False, "nvrtcCreateProgram failed", []
    opts = [f"--gpu-architecture={arch}".encode(), f"-I{include}".encode()]
    status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if status != 0:
        return False, log.value.decode(errors="replace"), []
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    entries = [line.split()[-1].rstrip("(")
               for line in ptx.value.decode(errors="replace").splitlines() if ".entry" in line]
    return True, "", entries


def main():
    args = sys.argv[1:]
    arch = "compute_80"
    if "--arch" in args:
        i = args.index("--arch")
        arch = args[i + 1]
        del args[i:i + 2]
    if not args:
        sys.exit(__doc__)
    lib = load_nvrtc()
    failed = 0
    total = 0
    for path in args:
        text = open(path, encoding="utf-8").read()
        sections = re.split(r"(?m)^(?=// ---- kernel )", text)
        sections = [s for s in sections if s.startswith("// ---- kernel ")] or [text]
        for section in sections:
            total += 1
            title = section.splitlines()[0]
            ok, log, entries = compile_one(lib, section.encode(), arch)
            if ok:
                print(f"ok   {path}: {title[3:]} -> {', '.join(entries)}")
            else:
                failed += 1
                print(f"FAIL {path}: {title[3:]}\n{log}")
    print(f"{total - failed}/{total} kernels compiled ({arch})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
