"""dev/torch_bench.py — the same work in PyTorch on the same GPU, for scripts/gpu_check.sh to print
beside ours: a GPT-2 124M training step (Hugging Face's GPT2LMHeadModel with SDPA attention, bf16
autocast, torch.compile, fused AdamW), SDPA forward+backward through the flash and cuDNN backends at
our attention benchmark's shape, and a bf16 GEMM at our matmul benchmark's shape. A benchmark, not an
oracle: nothing here checks correctness.

    python3 dev/torch_bench.py [--batch B] [--seq T] [--steps N]

Prints one line per figure and, last, one line `TORCH_JSON {...}` with all of them.
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F


def cuda_time_ms(fn, reps, warmup=3):
    """Median time of fn() in ms over reps calls, timed with CUDA events after warm-up calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def gpt2_step(batch, seq, steps):
    """tokens/s of GPT-2 124M training steps (vocabulary padded to 50304, as ours)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=50304, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                        attn_implementation="sdpa")
    model = GPT2LMHeadModel(config).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    compiled = torch.compile(model)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randint(0, 50257, (batch, seq), device="cuda", generator=gen)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.time()
    step()  # compiles
    torch.cuda.synchronize()
    compile_s = time.time() - t0
    ms = cuda_time_ms(step, steps, warmup=2)
    peak_mib = torch.cuda.max_memory_allocated() / 2**20
    return {"tokens_per_s": batch * seq / (ms / 1e3), "ms_per_step": ms, "compile_s": compile_s,
            "peak_mib": peak_mib, "batch": batch, "seq": seq}


def sdpa(B=8, T=1024, NH=12, HS=64):
    """TFLOP/s of causal SDPA forward and backward in bf16 per backend, with our benchmark's FLOP
    count: forward 4·B·NH·T²·HS halved by the mask, backward 2.5 times the forward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fwd_flops = 4.0 * B * NH * T * T * HS * 0.5
    q, k, v = (torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16)
    result = {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                fwd_ms = cuda_time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 20)
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                bwd_ms = cuda_time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), 20)
            result[name] = {"fwd_tflops": fwd_flops / (fwd_ms * 1e-3) / 1e12,
                            "bwd_tflops": 2.5 * fwd_flops / (bwd_ms * 1e-3) / 1e12}
        except RuntimeError as e:  # a backend this GPU or build lacks
            result[name] = {"error": str(e).splitlines()[0][:200]}
    return result


def gemm(N=8192, C=768, OC=3072):
    """TFLOP/s of out (N,OC) = inp (N,C) · Wᵀ in bf16 (GPT-2's MLP up-projection at B·T = 8192)."""
    inp = torch.randn(N, C, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(OC, C, device="cuda", dtype=torch.bfloat16)
    ms = cuda_time_ms(lambda: F.linear(inp, w), 50)
    return {"tflops": 2.0 * N * C * OC / (ms * 1e-3) / 1e12, "shape": [N, C, OC]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_bench: torch sees no CUDA GPU", file=sys.stderr)
        return 1
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    out["gemm_bf16"] = gemm()
    print(f"torch bf16 GEMM {out['gemm_bf16']['shape']}: {out['gemm_bf16']['tflops']:.1f} TFLOP/s", flush=True)
    out["sdpa_bf16_causal"] = sdpa()
    for name, r in out["sdpa_bf16_causal"].items():
        print(f"torch SDPA {name}: {r}", flush=True)
    try:
        out["gpt2_124m_step"] = gpt2_step(args.batch, args.seq, args.steps)
        print(f"torch GPT-2 124M step: {out['gpt2_124m_step']}", flush=True)
    except Exception as e:  # transformers missing or too old: the other figures still stand
        out["gpt2_124m_step"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        print(f"torch GPT-2 124M step: {out['gpt2_124m_step']['error']}", flush=True)
    print("TORCH_JSON " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
