#!/usr/bin/env python3
"""make_io_fixtures.py - writes the safetensors fixtures of the "io" test suite with PyTorch and
the reference safetensors package, so tests/test_io.c can check nabla against them without
either installed. Run from the repository root after changing it:

    python3 -m venv --system-site-packages /tmp/stvenv      # Debian's python3-torch + numpy
    /tmp/stvenv/bin/pip install safetensors
    /tmp/stvenv/bin/python tools/make_io_fixtures.py

It writes into tests/fixtures/io/:

  torch_mixed.safetensors   tensors of every nabla dtype (bf16, f16, f32, f64, i64, i32, u8,
                            bool), a 0-dim and an empty tensor, NaN/inf/-0.0 and extreme
                            integers, and a __metadata__ map, saved by safetensors.torch.
  torch_mixed.expected      what the test must read back, one line per tensor:
                                name|DTYPE|d0,d1,...|v0 v1 ...|hex
                            values are exact (floats as Python float.hex(), integers in
                            decimal); hex is the tensor's raw little-endian bytes. Lines
                            starting with "meta|" give key|value of the metadata.
  layout.safetensors        the reference writer's bytes for a fixed set of small tensors;
                            the test writes the same tensors with nabla and compares the
                            files byte for byte (header layout, ordering, padding, data).
"""
import os

import torch
from safetensors.torch import save_file

OUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                   "fixtures", "io"))

DTYPE_NAMES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL",
}


def mixed():
    f32 = torch.float32
    return {
        "emb.weight": torch.tensor([[1.0, -2.5, 0.1, 3.0e38], [1e-40, -0.0, 65504.0, 7.0],
                                    [-1.0 / 3, 2.0 ** -130, 100.25, -7.75]], dtype=f32)
                      .to(torch.bfloat16),
        "layers.0.bias": torch.tensor([65504.0, -0.0, 6.0e-5, 0.1, -1.0 / 3, 1e-7], dtype=f32)
                         .to(torch.float16),
        "layers.0.weight": torch.tensor([[0.1, -0.2, 1e-45], [3.4028234e38, -1.5, 2.0 / 3]],
                                        dtype=f32),
        "scale": torch.tensor(3.141592653589793, dtype=torch.float64),
        "steps": torch.tensor([0, -1, 2 ** 62 + 1, -(2 ** 63)], dtype=torch.int64),
        "ids": torch.tensor([[-(2 ** 31), 2 ** 31 - 1], [0, 12345]], dtype=torch.int32),
        "mask": torch.tensor([True, False, False, True, True], dtype=torch.bool),
        "pixels": torch.tensor([[0, 1, 127], [128, 254, 255]], dtype=torch.uint8),
        "empty": torch.zeros((0, 3), dtype=f32),
        "special": torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=f32),
        "deep": torch.arange(2 * 1 * 2 * 1 * 1 * 2 * 1 * 2, dtype=torch.float64)
                .reshape(2, 1, 2, 1, 1, 2, 1, 2) / 8,
    }


def value_text(t):
    flat = t.reshape(-1)
    if t.dtype.is_floating_point:
        return " ".join(float(v).hex() for v in flat.to(torch.float64).tolist())
    return " ".join(str(int(v)) for v in flat.tolist())


def raw_hex(t):
    t = t.contiguous()
    if t.dtype == torch.bool:
        return bytes(t.to(torch.uint8).reshape(-1).tolist()).hex()
    if t.dtype == torch.bfloat16:  # numpy has no bf16: go through its int16 bits
        return t.view(torch.int16).numpy().tobytes().hex()
    return t.numpy().tobytes().hex()


def write_mixed():
    ts = mixed()
    meta = {"format": "pt", "producer": "tools/make_io_fixtures.py \u2713"}
    save_file(ts, os.path.join(OUT, "torch_mixed.safetensors"), metadata=meta)
    with open(os.path.join(OUT, "torch_mixed.expected"), "w", encoding="utf-8") as f:
        f.write("# written by tools/make_io_fixtures.py (torch %s); see its docstring\n"
                % torch.__version__)
        for k, v in meta.items():
            f.write("meta|%s|%s\n" % (k, v))
        for name in sorted(ts):
            t = ts[name]
            f.write("%s|%s|%s|%s|%s\n" % (name, DTYPE_NAMES[t.dtype],
                                          ",".join(str(d) for d in t.shape), value_text(t),
                                          raw_hex(t)))


def layout():
    # Mirrored in tests/test_io.c (test_layout_matches_reference): change both together.
    return {
        "b.weight": (torch.arange(6, dtype=torch.float32) * 0.5 - 1).reshape(2, 3),
        "a.bias": torch.tensor([1.0, -2.0, 0.5], dtype=torch.float16),
        "z": torch.tensor(7, dtype=torch.int64),
        "count": torch.tensor([1, -1], dtype=torch.int32),
        "flag": torch.tensor([True, False, True]),
        "emb": torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16),
        "bytes": torch.tensor([1, 2, 255], dtype=torch.uint8),
        "w64": torch.tensor([0.25], dtype=torch.float64),
        "empty": torch.zeros(0, dtype=torch.float32),
        "na\u00efve \"q\"\\": torch.tensor([1.0], dtype=torch.float32),
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    write_mixed()
    save_file(layout(), os.path.join(OUT, "layout.safetensors"), metadata={"format": "pt"})
    for name in sorted(os.listdir(OUT)):
        print("%s: %d bytes" % (os.path.join(OUT, name), os.path.getsize(os.path.join(OUT, name))))


if __name__ == "__main__":
    main()
