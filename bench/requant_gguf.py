"""Re-quantizes a GGUF file to another weight type, with one of two quantizers:

--quantizer gguf-py (the default): the weight matrices to one 32-element block type with gguf-py's
  reference quantizers (the `quantize_row_*_ref` algorithms of ggml: Q4_0, Q4_1, Q5_0, Q5_1,
  Q8_0), every other tensor copied as it is. No importance matrix, no per-tensor type mix: a
  real model's weights in a type its file does not use, for speed checks of that type's kernels
  (bench/RESULTS.md, "every block type"). Needs `pip install gguf numpy`.
--quantizer llama.cpp: llama.cpp's own quantizer (`llama_model_quantize` of the llama-cpp-python
  build of scripts/setup-llama-reference.sh, with `allow_requantize`, since the input is already
  quantized), to any of its file types (Q4_0 … IQ4_XS, Q3_K_M, Q5_K_M: the per-tensor type mix
  llama.cpp's `llama-quantize` gives). This is what issue 17's benchmark matrix uses
  (`bench/gguf_speed.sh --matrix`). Run it with .venv-llama/bin/python.

Either way the output is written to OUT.part and renamed to OUT only when complete, so a killed
run never leaves a file that a later run would take as done.

Usage: python bench/requant_gguf.py IN.gguf OUT.gguf TYPE [--quantizer gguf-py|llama.cpp] [--nthread N]
"""
import argparse
import os
import sys

GGUF_PY_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
# llama.cpp file types (`LLAMA_FTYPE_MOSTLY_<name>`) that need no importance matrix.
LLAMA_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L",
               "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "F16", "BF16")


def requant_gguf_py(src, part, type_name):
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize, quantize

    target = getattr(T, type_name)
    # Block types whose matrices are re-quantized (dequantized by gguf-py first).
    sources = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.F16, T.BF16}
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(part, arch=arch)
    for field in r.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    converted = 0
    for t in r.tensors:
        cols = int(t.shape[0])
        if t.tensor_type in sources and len(t.shape) == 2 and cols % 32 == 0:
            f = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1, cols)
            w.add_tensor(t.name, quantize(f, target), raw_dtype=target)
            converted += 1
        elif t.tensor_type == T.F32:
            w.add_tensor(t.name, np.asarray(t.data, dtype=np.float32))
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return f"{converted} matrices as {type_name} (gguf-py reference quantizer)"


def requant_llama_cpp(src, part, type_name, nthread):
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name}")
    params.allow_requantize = True
    params.nthread = nthread
    rc = llama_cpp.llama_model_quantize(src.encode(), part.encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {type_name}) returned {rc} (its log is on stderr above)")
    return f"llama.cpp quantizer (llama-cpp-python {llama_cpp.__version__}, file type {type_name}, allow_requantize)"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="IN.gguf")
    p.add_argument("dst", metavar="OUT.gguf")
    p.add_argument("type", metavar="TYPE")
    p.add_argument("--quantizer", choices=("gguf-py", "llama.cpp"), default="gguf-py")
    p.add_argument("--nthread", type=int, default=0, help="llama.cpp quantizer threads (0: all cores)")
    a = p.parse_args()
    allowed = GGUF_PY_TYPES if a.quantizer == "gguf-py" else LLAMA_TYPES
    if a.type not in allowed:
        sys.exit(f"TYPE {a.type!r}: --quantizer {a.quantizer} takes one of {', '.join(allowed)}")
    if not os.path.isfile(a.src):
        sys.exit(f"IN.gguf {a.src!r}: no such file")
    if os.path.abspath(a.src) == os.path.abspath(a.dst):
        sys.exit(f"OUT.gguf {a.dst!r} is the input file")
    part = a.dst + ".part"
    try:
        if a.quantizer == "gguf-py":
            what = requant_gguf_py(a.src, part, a.type)
        else:
            what = requant_llama_cpp(a.src, part, a.type, a.nthread)
    except BaseException:
        if os.path.exists(part):
            os.remove(part)
        raise
    os.replace(part, a.dst)
    print(f"{a.dst}: {what}, {os.path.getsize(a.dst)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
