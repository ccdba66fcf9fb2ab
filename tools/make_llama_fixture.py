#!/usr/bin/env python3
"""make_llama_fixture.py - the Hugging Face round trip of the Llama (nabla/llama.h), both ways,
against transformers' LlamaForCausalLM on the CPU. Writes the fixtures of the "llama" test
suite (tests/test_llama.c) into tests/fixtures/llama/, which make test reads without PyTorch:

  hf_tiny.safetensors   a tiny LlamaForCausalLM saved by transformers (save_pretrained's
                        model.safetensors, as is): the transformers -> nabla direction
  hf_tiny_io.safetensors  idx (2, 16) i64 and the logits (2, 16, 64) f32 transformers gives
  nabla_tiny_hf.safetensors  idx and the logits transformers gives for the model nabla builds
                        with seed 1234 (tests/test_llama.c, test_hf_export), loaded from the
                        file nabla saved with strict loading: the nabla -> transformers direction

The second direction runs the test binary to have nabla write its model:

    python3 tools/make_llama_fixture.py [BUILD_DIR]     (default: build)

with a Python that has torch, transformers and safetensors (CI does not need them: the files
are committed). It prints the largest logits differences both ways.

The tiny config (shared with tests/test_llama.c): vocab 64, hidden 32, intermediate 48, 2
layers, 4 heads on 2 key/value heads (grouped-query), 32 positions, rope_theta 500, rms eps
1e-5, untied head, no biases. The transformers model is initialized from N(0, 0.3) (not 0.02)
and its norms' weights drawn around 1, so attention is far from uniform and every weight
matters for the logits.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "llama")


def config():
    return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                       rope_theta=500.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                       attention_bias=False, mlp_bias=False, attn_implementation="eager")


def logits_of(model, idx):
    model.eval()
    with torch.no_grad():
        return model(input_ids=idx).logits.float().contiguous()


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(33)
    # ---- transformers -> nabla
    model = LlamaForCausalLM(config())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        shutil.copy(os.path.join(d, "model.safetensors"), os.path.join(OUT, "hf_tiny.safetensors"))
    idx = torch.randint(0, 64, (2, 16), dtype=torch.int64)
    save_file({"idx": idx, "logits": logits_of(model, idx)}, os.path.join(OUT, "hf_tiny_io.safetensors"),
              metadata={"made_by": "tools/make_llama_fixture.py", "torch": torch.__version__})
    # ---- nabla -> transformers: nabla saves its model (seed 1234) and its logits
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, NB_LLAMA_EXPORT=d, NB_SUITE="llama", CK_RUN_CASE="hf")
        subprocess.run([os.path.join(build, "tests", "nabla_tests")], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        state = load_file(os.path.join(d, "nabla_tiny.safetensors"))
        io = load_file(os.path.join(d, "nabla_tiny_io.safetensors"))
    theirs = LlamaForCausalLM(config())
    theirs.load_state_dict(state, strict=True)  # every name and shape exactly transformers'
    hf = logits_of(theirs, io["idx"])
    print("nabla -> transformers: max |logits diff| %.3g (max |logit| %.3g)"
          % ((hf - io["logits"]).abs().max().item(), hf.abs().max().item()))
    save_file({"idx": io["idx"], "logits": hf}, os.path.join(OUT, "nabla_tiny_hf.safetensors"),
              metadata={"made_by": "tools/make_llama_fixture.py", "torch": torch.__version__})
    print("wrote", OUT)


if __name__ == "__main__":
    main()
