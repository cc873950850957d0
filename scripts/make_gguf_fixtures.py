"""Writes fixtures/gguf/quant-reference.gguf with the reference `gguf` Python package (the
gguf-py that ships with llama.cpp): one metadata entry of every GGUF value type (scalars,
arrays, a nested array), a non-default alignment, and for every block format FrogNano reads
(Q4_0 … Q6_K, IQ4_NL, IQ4_XS) random blocks `q.<TYPE>` next to `deq.<TYPE>`, their dequantization by
gguf.quants (which mirrors ggml's dequantize_row_*). Also `q8_0.src` (f32) and `q8_0.ref`,
gguf.quants' Q8_0 quantization of it.

Usage: python scripts/make_gguf_fixtures.py   (needs `pip install gguf numpy`;
the committed file was written with gguf 0.19.0)
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "gguf", "quant-reference.gguf")
rng = np.random.default_rng(1234)

# Byte offsets of the f16 scale fields inside one block, per type.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0],
}
ROWS, COLS = 3, 512

w = gguf.GGUFWriter(OUT, arch="quanttest")
w.data_alignment = 64
w.add_custom_alignment(64)
w.add_uint8("test.u8", 200)
w.add_int8("test.i8", -100)
w.add_uint16("test.u16", 60000)
w.add_int16("test.i16", -30000)
w.add_uint32("test.u32", 4000000000)
w.add_int32("test.i32", -2000000000)
w.add_float32("test.f32", 1.5)
w.add_bool("test.bool", True)
w.add_string("test.string", "héllo ✓")
w.add_uint64("test.u64", 2**63 + 5)
w.add_int64("test.i64", -(2**62))
w.add_float64("test.f64", -2.25)
w.add_array("test.array_i32", [1, -2, 3])
w.add_array("test.array_str", ["a", "", "ccc"])
w.add_array("test.array_f32", [0.5, -1.0])
w.add_array("test.array_nested", [[1, 2], [3]])

for ty, fields in F16_FIELDS.items():
    bs, bb = gguf.GGML_QUANT_SIZES[ty]
    nblocks = ROWS * COLS // bs
    raw = rng.integers(0, 256, size=(nblocks, bb), dtype=np.uint8)
    for o in fields:
        scale = rng.uniform(-0.05, 0.05, size=nblocks).astype(np.float16)
        raw[:, o:o + 2] = scale.view(np.uint8).reshape(nblocks, 2)
    raw = raw.reshape(ROWS, COLS // bs * bb)
    w.add_tensor(f"q.{ty.name}", raw, raw_dtype=ty)
    w.add_tensor(f"deq.{ty.name}", dequantize(raw, ty).astype(np.float32))

src = rng.normal(0, 1, size=(ROWS, COLS)).astype(np.float32)
src[0, :32] = 0.0  # an all-zero block
w.add_tensor("q8_0.src", src)
w.add_tensor("q8_0.ref", quantize(src, T.Q8_0), raw_dtype=T.Q8_0)

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes) with gguf {getattr(gguf, '__version__', '?')}", file=sys.stderr)
