"""test/hf_bert_roundtrip.py — does transformers load what export_hf_bert writes, and compute our logits?

Runs the test binary's export mode (`BIN --export DIR`: the fixture models test/fixtures/bert_tiny_{mlm,cls}
after 3 of our AdamW steps, exported as fp32 and bf16 for BertForMaskedLM and BertForSequenceClassification,
plus the fixture batch and our logits computed from exactly the weights each export holds), then loads each
export with from_pretrained and checks:
  - it loads with no missing, unexpected or mismatched tensors, the config is the fixture's model, and the
    MLM decoder is tied to the word embeddings;
  - the bf16 export's weights are the fp32 export's rounded to bf16 by torch;
  - transformers' logits for the batch (MLM: at the masked positions; classification: per sequence) equal
    ours within the fp32 budget test_bert uses: both sides compute in fp32 (transformers upcasts the bf16
    weights on load, and our bf16-export logits come from our fp32 forward on the same bf16-rounded
    weights), so the bf16 check is as tight as the fp32 one.
And the other way: transformers saves the fixture models sharded (max_shard_size 100KB: an index and
several shards), the classification model in fp16 and the MLM model in bf16; the binary imports each
(`BIN --import cls|mlm DIR OUT`: our fp32 logits for the fixture batch), and transformers' logits from
the same save, loaded in fp32, must be ours within the same fp32 budget (both compute in fp32 from the
same 16-bit weights, widened exactly).
Prints "PASS name" / "FAIL name ..." per check and "N passed, N failed"; exits non-zero on a failure.

  /usr/bin/python3 test/hf_bert_roundtrip.py build/cpu/test_bert
(needs Debian's python3-torch and transformers<4.46 for /usr/bin/python3; run from the repository root)
"""
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import BertForMaskedLM, BertForSequenceClassification
from transformers.utils import logging

from oracle_checks import check_logits, finish, report, run_export

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
K = 16  # fp32 roundings of the logits' scale, as test_bert's logit budget (reasoning there)
CLASSES = {"mlm": BertForMaskedLM, "cls": BertForSequenceClassification}



def check_export(head, precision, directory):
    """Loads directory/{head}_{precision} with transformers and compares config, weights and logits."""
    variant = f"{head}_{precision}"
    cls = CLASSES[head]
    try:
        model, info = cls.from_pretrained(os.path.join(directory, variant), output_loading_info=True,
                                          attn_implementation="eager")
    except Exception as e:  # a failed load is this check's answer, reported like any other
        report(False, f"hf_bert export {variant}: transformers loads it", f"{type(e).__name__}: {e}")
        return
    model = model.float().eval()
    reference = cls.from_pretrained(os.path.join(FIXTURES, f"bert_tiny_{head}")).config
    problems = {k: v for k, v in info.items() if v}
    c = model.config
    fields = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
              "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_act", "num_labels",
              "hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout")
    got = tuple(getattr(c, f) for f in fields)
    want = tuple(getattr(reference, f) for f in fields)
    tied = head != "mlm" or (model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight)
    report(not problems and got == want and tied,
           f"hf_bert export {variant}: {cls.__name__} loads it (all tensors, config, tied decoder)",
           f"loading info {problems}, config {dict(zip(fields, got))}")

    if precision == "bf16":
        fp32 = load_file(os.path.join(directory, f"{head}_fp32", "model.safetensors"))
        bf16 = load_file(os.path.join(directory, variant, "model.safetensors"))
        differ = [n for n in fp32 if not torch.equal(bf16[n], fp32[n].to(torch.bfloat16))]
        report(not differ and set(fp32) == set(bf16),
               f"hf_bert export {variant}: weights are the fp32 export's rounded to bf16 by torch",
               f"first difference: {differ[0]}" if differ else "")

    ours = load_file(os.path.join(directory, f"ours_{variant}.safetensors"))
    check_logits(f"hf_bert export {variant}: transformers' logits vs ours (fp32 forward)",
                 batch_logits(model, ours, head), ours["logits"], K)


def batch_logits(model, ours, head):
    """transformers' logits for the batch in ours (MLM: at the masked positions, in (b, t) order)."""
    ids = ours["input_ids"].long()
    types = ours["token_type_ids"].long()
    valid = ours["valid_len"].long()
    mask = (torch.arange(ids.shape[1])[None, :] < valid[:, None]).long()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits.float()
    return logits[ours["mlm_labels"].long() != -100] if head == "mlm" else logits


def check_import(binary, directory, head, dtype):
    """transformers saves the fixture model of head in dtype, sharded; our import must give its logits."""
    name = f"{head}_{str(dtype).replace('torch.', '')}"
    path = os.path.join(directory, f"saved_{name}")
    cls = CLASSES[head]
    fixture = cls.from_pretrained(os.path.join(FIXTURES, f"bert_tiny_{head}"))
    fixture.to(dtype).save_pretrained(path, max_shard_size="100KB")
    shards = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    out = os.path.join(directory, f"ours_saved_{name}.safetensors")
    run = subprocess.run([binary, "--import", head, path, out], capture_output=True, text=True)
    sharded = os.path.exists(os.path.join(path, "model.safetensors.index.json")) and len(shards) > 1
    report(run.returncode == 0 and sharded,
           f"hf_bert import {name}: the binary imports transformers' sharded save ({len(shards)} shards)",
           (run.stdout + run.stderr).strip().replace("\n", " | "))
    if run.returncode != 0:
        return
    model = cls.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager").eval()
    ours = load_file(out)
    check_logits(f"hf_bert import {name}: transformers' logits vs ours (fp32 forward)",
                 batch_logits(model, ours, head), ours["logits"], K)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: /usr/bin/python3 test/hf_bert_roundtrip.py PATH/TO/test_bert")
    binary = sys.argv[1]
    logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="llmc_hf_bert_export_") as directory:
        if run_export(binary, directory, "hf_bert export: the test binary writes the exports"):
            for head in ("mlm", "cls"):
                for precision in ("fp32", "bf16"):
                    check_export(head, precision, directory)
        check_import(binary, directory, "cls", torch.float16)
        check_import(binary, directory, "mlm", torch.bfloat16)
    finish()


if __name__ == "__main__":
    main()
