"""test/oracle_hf_gpt2.py — writes the Hugging Face GPT-2 fixture test_hf_gpt2 imports: a tiny random
GPT2LMHeadModel saved by transformers itself, and transformers' logits for one fixed batch.

The model: 2 layers, 64 channels, 4 heads, 64 positions, vocabulary 500 (not a multiple of 128, so
the importer's vocabulary padding is exercised), biases and layernorm parameters perturbed away from
their (0, 1) initialization so that a mix-up between them shows in the logits.
  test/fixtures/hf_gpt2_tiny/                  save_pretrained(safe_serialization=True): config.json,
                                               generation_config.json, model.safetensors (F32,
                                               GPT2LMHeadModel names, lm_head left out as tied)
  test/fixtures/hf_gpt2_tiny_logits.safetensors  "tokens" I32 (B, T) and "logits" F32 (B, T, V) for
                                               B=2, T=64 (every position), written by safetensors'
                                               own save_file

Regenerate (needs torch and transformers; Debian's python3-torch + pip's transformers<4.46 work):
  /usr/bin/python3 test/oracle_hf_gpt2.py
"""
import os

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_DIR = os.path.join(HERE, "fixtures", "hf_gpt2_tiny")
LOGITS = os.path.join(HERE, "fixtures", "hf_gpt2_tiny_logits.safetensors")

L, C, NH, MAXT, V = 2, 64, 4, 64, 500
B, T = 2, 64


def main():
    torch.manual_seed(20250104)
    config = GPT2Config(vocab_size=V, n_positions=MAXT, n_embd=C, n_layer=L, n_head=NH,
                        activation_function="gelu_new", layer_norm_epsilon=1e-5)
    model = GPT2LMHeadModel(config).float()
    model.eval()  # no dropout
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(MODEL_DIR, safe_serialization=True)

    tokens = torch.randint(0, V, (B, T))
    with torch.no_grad():
        logits = model(tokens).logits  # (B, T, V)
    save_file({"tokens": tokens.to(torch.int32).contiguous(), "logits": logits.float().contiguous()}, LOGITS)
    print(f"wrote {MODEL_DIR} and {LOGITS}: logits mean |x| {logits.abs().mean():.4f}, "
          f"max |x| {logits.abs().max():.4f}; transformers {__import__('transformers').__version__}, "
          f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
