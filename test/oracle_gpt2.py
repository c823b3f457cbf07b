"""test/oracle_gpt2.py — writes the reference tensors test_gpt2 compares against, computed by Hugging
Face transformers' GPT2LMHeadModel (PyTorch, CPU), the oracle for model-level correctness.

A tiny GPT-2 (2 layers, 64 channels, 4 heads, 64 positions, vocabulary 500 padded to 512) with
random weights and one random batch (B=4, T=64):
  test/fixtures/gpt2_tiny_model.bin   the weights, llm.c checkpoint format (magic 20240326, v3 fp32)
  test/fixtures/gpt2_tiny_debug.bin   llm.c debug state (magic 20240327, v2): x, y, logits, loss, and
                                      every parameter's gradient in llm.c order (wte padded to Vp)
  test/fixtures/gpt2_tiny_steps.txt   the losses of 10 AdamW steps on that batch, with the settings

Regenerate (needs torch and transformers; Debian's python3-torch + pip's transformers work):
  python3 test/oracle_gpt2.py
"""
import os
import struct

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")

L, C, NH, MAXT, V = 2, 64, 4, 64, 500
VP = (V + 127) // 128 * 128
B, T = 4, 64
STEPS, LR, BETAS, EPS, WD, CLIP = 10, 1e-3, (0.9, 0.95), 1e-8, 0.1, 1.0


def llmc_order(get):
    """The 16 parameter tensors in llm.c's order and layout, get(name) giving each HF tensor (weights
    or gradients): Conv1D weights transposed to (out, in), wte padded to Vp rows with zeros."""
    h = [f"transformer.h.{i}." for i in range(L)]
    wte = torch.zeros(VP, C)
    wte[:V] = get("transformer.wte.weight")
    stack = lambda name, transpose: torch.stack(
        [get(p + name).t() if transpose else get(p + name) for p in h])
    return [
        wte,
        get("transformer.wpe.weight"),
        stack("ln_1.weight", False), stack("ln_1.bias", False),
        stack("attn.c_attn.weight", True), stack("attn.c_attn.bias", False),
        stack("attn.c_proj.weight", True), stack("attn.c_proj.bias", False),
        stack("ln_2.weight", False), stack("ln_2.bias", False),
        stack("mlp.c_fc.weight", True), stack("mlp.c_fc.bias", False),
        stack("mlp.c_proj.weight", True), stack("mlp.c_proj.bias", False),
        get("transformer.ln_f.weight"), get("transformer.ln_f.bias"),
    ]


def write_floats(f, tensors):
    for t in tensors:
        f.write(t.detach().contiguous().to(torch.float32).numpy().tobytes())


def main():
    torch.manual_seed(20241122)
    config = GPT2Config(vocab_size=V, n_positions=MAXT, n_embd=C, n_layer=L, n_head=NH,
                        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, layer_norm_epsilon=1e-5)
    model = GPT2LMHeadModel(config).float()
    model.eval()  # no dropout (all probabilities are 0 anyway)
    # HF initializes biases to 0 and layernorms to (1, 0); perturb them so that their gradients and
    # their effect on the forward pass are tested too.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.05 * torch.randn_like(p))
    seq = torch.randint(0, V, (B, T + 1))
    x, y = seq[:, :T].contiguous(), seq[:, 1:].contiguous()

    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "gpt2_tiny_model.bin"), "wb") as f:
        header = [20240326, 3, MAXT, V, L, NH, C, VP] + [0] * 248
        f.write(struct.pack("<256i", *header))
        write_floats(f, llmc_order(model.state_dict().__getitem__))

    logits = model(x).logits  # (B, T, V)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, V), y.view(-1))
    loss.backward()
    with open(os.path.join(OUT, "gpt2_tiny_debug.bin"), "wb") as f:
        f.write(struct.pack("<256i", *([20240327, 2, B, T] + [0] * 252)))
        f.write(x.to(torch.int32).numpy().tobytes())
        f.write(y.to(torch.int32).numpy().tobytes())
        f.write(logits.detach().numpy().astype(np.float32).tobytes())
        f.write(struct.pack("<f", loss.item()))
        named = dict(model.named_parameters())  # the tied wte/lm_head gradient is already summed
        write_floats(f, llmc_order(lambda name: named[name].grad))

    # AdamW steps on the same batch: weight decay on the matrices only (as llm.c), clipping at 1.0.
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS, foreach=False)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=False)
        out = model(x).logits
        step_loss = torch.nn.functional.cross_entropy(out.view(-1, V), y.view(-1))
        step_loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(step_loss.item())
    with open(os.path.join(OUT, "gpt2_tiny_steps.txt"), "w") as f:
        f.write(f"# AdamW lr={LR} beta1={BETAS[0]} beta2={BETAS[1]} eps={EPS} weight_decay={WD} "
                f"(2-D tensors only) grad_clip={CLIP}; loss before each step; "
                f"transformers {__import__('transformers').__version__}, torch {torch.__version__}\n")
        for l in losses:
            f.write(f"{l:.9f}\n")
    print(f"wrote {OUT}: loss {loss.item():.6f}, 10-step losses {losses[0]:.6f} -> {losses[-1]:.6f}")


if __name__ == "__main__":
    main()
