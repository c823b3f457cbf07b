"""test/hf_gpt2_roundtrip.py — does transformers load what export_hf_gpt2 writes, and compute our logits?

Runs the test binary's export mode (`BIN --export DIR`: the fixture model test/fixtures/hf_gpt2_tiny
exported as fp32 and bf16, plus our logits for the fixture batch from exactly the weights each export
holds), then loads each export with GPT2LMHeadModel.from_pretrained and checks:
  - it loads with no missing or unexpected tensors, and the config is the fixture's model;
  - the weights are the fixture's exactly (fp32), or the fixture's rounded to bf16 by torch (bf16);
  - transformers' logits equal ours within the fp32 budget test_hf_gpt2 uses: both sides compute in
    fp32 (transformers upcasts the bf16 weights to fp32 on load, and our bf16 logits come from our
    fp32 forward pass on the same bf16-rounded weights), so the bf16 check is as tight as the fp32 one.
And the other way: transformers saves the fixture model in fp16 and in bf16, sharded (max_shard_size
100KB: an index and several shards), the binary imports each (`BIN --import DIR OUT`: our fp32 logits
for the fixture batch), and transformers' logits and loss from the same save, loaded in fp32, must be
ours within the same fp32 budget (both compute in fp32 from the same 16-bit weights, widened exactly).
Prints "PASS name" / "FAIL name ..." per check and "N passed, N failed"; exits non-zero on a failure.

  /usr/bin/python3 test/hf_gpt2_roundtrip.py build/cpu/test_hf_gpt2
(needs Debian's python3-torch and transformers<4.46 for /usr/bin/python3; run from the repository root)
"""
import copy
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel
from transformers.utils import logging

from oracle_checks import EPS_FP32, check_logits, finish, report, run_export

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "fixtures", "hf_gpt2_tiny")
K = 16  # fp32 roundings of the logits' scale, as test_hf_gpt2's kFp32LogitK (reasoning there)



def check_export(variant, directory, reference):
    """Loads directory/variant with transformers and compares weights and logits."""
    path = os.path.join(directory, variant)
    try:
        model, info = GPT2LMHeadModel.from_pretrained(path, output_loading_info=True)
    except Exception as e:  # a failed load is this check's answer, reported like any other
        report(False, f"hf_gpt2 export {variant}: transformers loads it", f"{type(e).__name__}: {e}")
        return
    model.eval()
    problems = {k: v for k, v in info.items() if v}
    c = model.config
    shape = (c.n_layer, c.n_embd, c.n_head, c.n_positions, c.vocab_size, c.activation_function)
    want = (reference.config.n_layer, reference.config.n_embd, reference.config.n_head,
            reference.config.n_positions, reference.config.vocab_size, "gelu_new")
    report(not problems and shape == want and model.lm_head.weight is model.transformer.wte.weight,
           f"hf_gpt2 export {variant}: transformers loads it (all tensors, config, tied head)",
           f"loading info {problems}, config (L, C, NH, maxT, V, act) {shape}")

    ours_state = model.state_dict()
    worst = ""
    for name, ref in reference.state_dict().items():
        if name.endswith(".attn.bias") or name.endswith(".attn.masked_bias"):
            continue  # buffers, not weights
        expect = ref if variant == "fp32" else ref.to(torch.bfloat16).float()
        if not torch.equal(ours_state[name].float(), expect):
            worst = name
            break
    what = "the fixture's" if variant == "fp32" else "the fixture's rounded by torch to bf16"
    report(not worst, f"hf_gpt2 export {variant}: weights are exactly {what}", f"first difference: {worst}" if worst else "")

    ours = load_file(os.path.join(directory, f"ours_{variant}.safetensors"))
    tokens = ours["tokens"].long()
    with torch.no_grad():
        logits = model(tokens).logits.float()
    check_logits(f"hf_gpt2 export {variant}: transformers' logits vs ours (fp32 forward)", logits, ours["logits"], K)


def check_import(binary, directory, reference, dtype):
    """transformers saves the fixture model in dtype, sharded; our import must give its logits and loss."""
    name = str(dtype).replace("torch.", "")
    path = os.path.join(directory, f"saved_{name}")
    copy.deepcopy(reference).to(dtype).save_pretrained(path, max_shard_size="100KB")
    shards = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    out = os.path.join(directory, f"ours_saved_{name}.safetensors")
    run = subprocess.run([binary, "--import", path, out], capture_output=True, text=True)
    sharded = os.path.exists(os.path.join(path, "model.safetensors.index.json")) and len(shards) > 1
    report(run.returncode == 0 and sharded,
           f"hf_gpt2 import {name}: the binary imports transformers' sharded {name} save ({len(shards)} shards)",
           (run.stdout + run.stderr).strip().replace("\n", " | "))
    if run.returncode != 0:
        return
    model = GPT2LMHeadModel.from_pretrained(path, torch_dtype=torch.float32).eval()
    ours = load_file(out)
    tokens = ours["tokens"].long()
    with torch.no_grad():
        output = model(tokens, labels=tokens)
    check_logits(f"hf_gpt2 import {name}: transformers' logits vs ours (fp32 forward)", output.logits.float(),
                 ours["logits"], K)
    # the loss of the next-token targets, as transformers shifts them, from our logits
    loss = torch.nn.functional.cross_entropy(ours["logits"][:, :-1].reshape(-1, ours["logits"].shape[-1]),
                                             tokens[:, 1:].reshape(-1))
    err = abs(loss.item() - output.loss.item())
    budget = K * EPS_FP32 * output.loss.item()
    report(err <= budget, f"hf_gpt2 import {name}: transformers' loss vs ours",
           f"{output.loss.item():.7f} vs {loss.item():.7f}, err {err:.3g} budget {budget:.3g}")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: /usr/bin/python3 test/hf_gpt2_roundtrip.py PATH/TO/test_hf_gpt2")
    binary = sys.argv[1]
    logging.set_verbosity_error()
    reference = GPT2LMHeadModel.from_pretrained(FIXTURE).eval()
    with tempfile.TemporaryDirectory(prefix="llmc_hf_export_") as directory:
        if run_export(binary, directory, "hf_gpt2 export: the test binary writes the exports"):
            for variant in ("fp32", "bf16"):
                check_export(variant, directory, reference)
        for dtype in (torch.float16, torch.bfloat16):
            check_import(binary, directory, reference, dtype)
    finish()


if __name__ == "__main__":
    main()
