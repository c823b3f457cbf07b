"""test/test_bert_to_safetensors.py — scripts/bert_to_safetensors.py: a transformers BERT saved as
pytorch_model.bin (BertForMaskedLM, whose decoder is tied to the word embeddings) converts to a
model.safetensors that holds every tensor bit for bit (the tied ones once), that transformers loads with
the same logits as from the .bin, and that train_bert reads (the test binary's --train-bert mode, a
--bench run from the converted checkpoint); a sharded save converts from its index, a lone shard is
refused; bad inputs give one error line and exit 1.
Prints "PASS name" / "FAIL name ..." per check and "N passed, N failed"; exits non-zero on a failure.

  /usr/bin/python3 test/test_bert_to_safetensors.py build/cpu/test_train_bert
(needs Debian's python3-torch and transformers<4.46 for /usr/bin/python3; run from the repository root)
"""
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import BertConfig, BertForMaskedLM
from transformers.utils import logging

from oracle_checks import finish, report

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "scripts", "bert_to_safetensors.py")


def convert(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: /usr/bin/python3 test/test_bert_to_safetensors.py PATH/TO/test_train_bert")
    binary = sys.argv[1]
    logging.set_verbosity_error()
    torch.manual_seed(0)
    # vocab >= 1000: train_bert --bench draws its synthetic tokens above bert-base-uncased's special ids
    config = BertConfig(vocab_size=1100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    model = BertForMaskedLM(config).eval()
    with tempfile.TemporaryDirectory(prefix="llmc_bert_to_safetensors_") as d:
        model.config.save_pretrained(d)
        state = model.state_dict()
        binfile = os.path.join(d, "pytorch_model.bin")
        torch.save(state, binfile)

        run = convert(binfile)
        out = os.path.join(d, "model.safetensors")
        report(run.returncode == 0 and os.path.isfile(out), "bert_to_safetensors: converts pytorch_model.bin",
               (run.stdout + run.stderr).strip())
        if run.returncode != 0:
            finish()
        tensors = load_file(out)
        tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}  # = word embeddings, bias
        same = all(torch.equal(tensors[n], state[n]) for n in tensors) and set(tensors) == set(state) - tied
        report(same, "bert_to_safetensors: every tensor bit for bit, the tied decoder (weight, bias) written once",
               f"{len(tensors)} of {len(state)} tensors")

        os.rename(binfile, binfile + ".moved")  # from_pretrained must read the safetensors now
        loaded, info = BertForMaskedLM.from_pretrained(d, output_loading_info=True)
        ids = torch.randint(0, config.vocab_size, (2, 12))
        with torch.no_grad():
            a, b = model(input_ids=ids).logits, loaded.eval()(input_ids=ids).logits
        problems = {k: v for k, v in info.items() if v}
        report(not problems and torch.equal(a, b), "bert_to_safetensors: transformers loads it, same logits",
               f"loading info {problems}, max diff {(a - b).abs().max().item():.3g}")

        bench = subprocess.run([binary, "--train-bert", "--bench", "--task", "mlm", "--init", d, "-b", "2", "-t", "16",
                                "--max-steps", "2"], capture_output=True, text=True)
        report(bench.returncode == 0 and "bench | mlm T=16" in bench.stdout,
               "bert_to_safetensors: train_bert --init reads the converted checkpoint",
               (bench.stdout.strip().splitlines() or [""])[-1] + bench.stderr.strip())

        run = convert(binfile + ".moved")
        report(run.returncode == 1 and "exists (--force overwrites it)" in run.stderr,
               "bert_to_safetensors: refuses to overwrite without --force", run.stderr.strip())
        run = convert(os.path.join(d, "nope.bin"))
        report(run.returncode == 1 and "no such file" in run.stderr, "bert_to_safetensors: a missing file, one line",
               run.stderr.strip())
        junk = os.path.join(d, "junk.bin")
        with open(junk, "wb") as f:
            f.write(b"not a pickle at all")
        run = convert(junk, "--out", os.path.join(d, "junk.safetensors"))
        report(run.returncode == 1 and "cannot be read as a PyTorch state dict" in run.stderr and
               run.stderr.count("\n") == 1, "bert_to_safetensors: a file that is no state dict, one line",
               run.stderr.strip())
        # An output that cannot be written: said in one line, not a traceback, and no .tmp left.
        folder_out = os.path.join(d, "a_folder")
        os.mkdir(folder_out)
        for what, out, force in (("in a missing folder", os.path.join(d, "no", "such", "model.safetensors"), []),
                                 ("in a folder that is a file", os.path.join(junk, "model.safetensors"), []),
                                 ("that is a folder (--force)", folder_out, ["--force"])):
            run = convert(binfile + ".moved", "--out", out, *force)
            report(run.returncode == 1 and run.stderr.startswith(f"error: cannot write {out}: ") and
                   run.stderr.count("\n") == 1 and not os.path.exists(out + ".tmp"),
                   f"bert_to_safetensors: an output {what}, one line", run.stderr.strip())
        # A sharded save: converted from its index, every shard into one file; one shard alone is refused.
        sharded = os.path.join(d, "sharded")
        model.save_pretrained(sharded, safe_serialization=False, max_shard_size="20KB")
        index = os.path.join(sharded, "pytorch_model.bin.index.json")
        shards = sorted(f for f in os.listdir(sharded) if f.startswith("pytorch_model-"))
        run = convert(index)
        out = os.path.join(sharded, "model.safetensors")
        tensors = load_file(out) if run.returncode == 0 and os.path.isfile(out) else {}
        same = bool(tensors) and all(torch.equal(tensors[n], state[n]) for n in tensors) and \
            set(tensors) == set(state) - tied
        report(len(shards) > 1 and same, f"bert_to_safetensors: a sharded save's index, its {len(shards)} shards "
               "into one model.safetensors, every tensor bit for bit", (run.stdout + run.stderr).strip())
        run = convert(os.path.join(sharded, shards[0]), "--out", os.path.join(d, "part.safetensors"))
        report(run.returncode == 1 and f"one shard (1 of {len(shards)}) of a sharded save" in run.stderr and
               index in run.stderr and run.stderr.count("\n") == 1 and
               not os.path.exists(os.path.join(d, "part.safetensors")),
               "bert_to_safetensors: one shard of a sharded save alone, refused in one line naming the index",
               run.stderr.strip())
    finish()


if __name__ == "__main__":
    main()
