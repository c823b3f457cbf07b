"""test/hf_train_bert_export.py — does transformers load what `train_bert --export-hf` writes after a run?

Runs the test binary's export mode (`BIN --export DIR`: two short train_bert runs from the tiny fixture
models — classification fine-tuning in fp32 exported to DIR/cls, MLM pretraining in bf16 exported to
DIR/mlm — and our fp32 logits for a batch from exactly the weights each export holds), then checks:
  - BertForSequenceClassification / BertForMaskedLM.from_pretrained loads each export with no missing,
    unexpected or mismatched tensors, the shard's label names in id2label, the MLM decoder tied;
  - the bf16 run's export is stored in bfloat16 (and config.json says so);
  - transformers' logits for the batch (classification: per sequence; MLM: at the masked positions) equal
    ours within the fp32 budget of test/hf_bert_roundtrip.py (both sides compute in fp32).
Prints "PASS name" / "FAIL name ..." per check and "N passed, N failed"; exits non-zero on a failure.

  /usr/bin/python3 test/hf_train_bert_export.py build/cpu/test_train_bert
(needs Debian's python3-torch and transformers<4.46 for /usr/bin/python3; run from the repository root)
"""
import os
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import BertForMaskedLM, BertForSequenceClassification
from transformers.utils import logging

from oracle_checks import check_logits, finish, report, run_export

K = 16  # fp32 roundings of the logits' scale, as test/hf_bert_roundtrip.py
CLASSES = {"cls": BertForSequenceClassification, "mlm": BertForMaskedLM}


def check_export(head, directory):
    """Loads directory/head with transformers and compares labels, dtype and logits with ours."""
    cls = CLASSES[head]
    try:
        model, info = cls.from_pretrained(os.path.join(directory, head), output_loading_info=True,
                                          attn_implementation="eager")
    except Exception as e:  # a failed load is this check's answer, reported like any other
        report(False, f"train_bert --export-hf {head}: transformers loads it", f"{type(e).__name__}: {e}")
        return
    problems = {k: v for k, v in info.items() if v}
    if head == "cls":
        extra = model.config.id2label == {0: "classa", 1: "classb", 2: "classc"}
        what = f"id2label {model.config.id2label}"
    else:
        stored = {t.dtype for t in load_file(os.path.join(directory, head, "model.safetensors")).values()}
        extra = (model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight and
                 stored == {torch.bfloat16} and model.config.torch_dtype == torch.bfloat16)
        what = f"stored dtypes {stored}, config torch_dtype {model.config.torch_dtype}"
    report(not problems and extra, f"train_bert --export-hf {head}: {cls.__name__} loads it "
           f"({'the shard' + chr(39) + 's label names' if head == 'cls' else 'bf16, tied decoder'})",
           f"loading info {problems}, {what}")

    model = model.float().eval()
    ours = load_file(os.path.join(directory, f"ours_{head}.safetensors"))
    ids = ours["input_ids"].long()
    valid = ours["valid_len"].long()
    mask = (torch.arange(ids.shape[1])[None, :] < valid[:, None]).long()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).logits.float()
    if head == "mlm":
        logits = logits[ours["labels"].long() != -100]  # the masked positions, (b, t) order
    check_logits(f"train_bert --export-hf {head}: transformers' logits vs ours (fp32 forward)", logits,
                 ours["logits"], K)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: /usr/bin/python3 test/hf_train_bert_export.py PATH/TO/test_train_bert")
    binary = sys.argv[1]
    logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="llmc_train_bert_export_") as directory:
        if run_export(binary, directory, "train_bert --export-hf: the test binary trains and exports"):
            for head in ("cls", "mlm"):
                check_export(head, directory)
    finish()


if __name__ == "__main__":
    main()
