"""Re-quantizes the weight matrices of a GGUF file to one 32-element block type with gguf-py's
reference quantizers (the `quantize_row_*_ref` algorithms of ggml: Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0), every other tensor copied as it is. Gives a real model's weights in a type its file
does not use, for speed checks of that type's kernels (bench/RESULTS.md, "every block type").
It is not llama.cpp's quantizer (no importance matrix, no per-tensor type mix): issue 17's
benchmark matrix wants llama.cpp's.

Usage: python bench/requant_gguf.py IN.gguf OUT.gguf TYPE     (needs `pip install gguf numpy`)
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

if len(sys.argv) != 4:
    sys.exit(__doc__)
src, dst, type_name = sys.argv[1:]
TARGETS = {"Q4_0": T.Q4_0, "Q4_1": T.Q4_1, "Q5_0": T.Q5_0, "Q5_1": T.Q5_1, "Q8_0": T.Q8_0}
if type_name not in TARGETS:
    sys.exit(f"TYPE {type_name!r}: expected one of {', '.join(TARGETS)}")
target = TARGETS[type_name]
# Block types whose matrices are re-quantized (dequantized by gguf-py first).
SOURCES = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.F16, T.BF16}

r = gguf.GGUFReader(src)
arch = r.fields["general.architecture"].contents()
w = gguf.GGUFWriter(dst, arch=arch)
for field in r.fields.values():
    if field.name == "general.architecture" or field.name.startswith("GGUF."):
        continue
    vtype = field.types[0]
    sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
    w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
converted = 0
for t in r.tensors:
    cols = int(t.shape[0])
    if t.tensor_type in SOURCES and len(t.shape) == 2 and cols % 32 == 0:
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
print(f"{dst}: {converted} matrices as {type_name}", file=sys.stderr)
