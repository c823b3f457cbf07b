// test/test_hf_gpt2.cu — GPT-2 checkpoints of Hugging Face transformers, in and out (llmc/gpt2_io.h's
// load_hf_gpt2 / export_hf_gpt2), against transformers itself: the fixture test/fixtures/hf_gpt2_tiny
// is what GPT2LMHeadModel.save_pretrained wrote and hf_gpt2_tiny_logits.safetensors its logits for
// one batch (test/oracle_hf_gpt2.py). Checks: the imported model's logits in fp32 and bf16, the name
// and file variants transformers and the hub use (sharded too), an export/import round trip, and every
// refusal (one clear line and a non-zero exit), files that are not what the loader expects included.
//
// `test_hf_gpt2 --export DIR` instead writes what test/hf_gpt2_roundtrip.py hands to transformers:
// DIR/fp32 and DIR/bf16 (exports of the fixture model) and DIR/ours_fp32.safetensors,
// DIR/ours_bf16.safetensors ("tokens" and our "logits" for the fixture batch, computed in fp32 from
// exactly the weights each export holds). `test_hf_gpt2 --import DIR OUT` imports the checkpoint
// transformers saved in DIR (hf_gpt2_roundtrip.py's fp16 and bf16 sharded saves) and writes our
// fp32 logits for the fixture batch to OUT.
#include "gpt2_trainer.h"
#include "harness.h"
#include "program_runs.h"

#include <sys/wait.h>

#include <functional>

namespace test_hf_gpt2 {

static const char* kModelDir = "test/fixtures/hf_gpt2_tiny";
static const char* kBatchFile = "test/fixtures/hf_gpt2_tiny_logits.safetensors";

// The oracle's batch and transformers' logits for it.
struct Batch {
    int B = 0, T = 0;
    std::vector<int> tokens;    // (B,T)
    std::vector<float> logits;  // (B,T,V)
};

Batch load_batch() {
    SafeTensors st;
    std::string err;
    if (!st.load(kBatchFile, &err)) data_error("%s (run: /usr/bin/python3 test/oracle_hf_gpt2.py)", err.c_str());
    const SafeTensor* tokens = st.find("tokens");
    const SafeTensor* logits = st.find("logits");
    if (!tokens || tokens->dtype != "I32" || tokens->shape.size() != 2 || !logits)
        data_error("%s: expected \"tokens\" I32 (B, T) and \"logits\" F32", kBatchFile);
    Batch b;
    b.B = (int)tokens->shape[0];
    b.T = (int)tokens->shape[1];
    b.tokens.resize(tokens->numel);
    memcpy(b.tokens.data(), tokens->data, tokens->numel * 4);  // I32 little-endian, as the host's int
    if (!SafeTensors::to_float(*logits, &b.logits, &err)) data_error("%s", err.c_str());
    return b;
}

// Our logits (B,T,V) for the batch's tokens from fp32 parameters, with storage type floatX.
template <class floatX>
std::vector<float> our_logits(const GPT2Config& c, const std::vector<float>& params, const Batch& b) {
    GPT2<floatX> model;
    model.build(c, params);
    model.allocate_activations(b.B, b.T);
    std::vector<int> targets(b.tokens.size(), 0);
    model.set_batch(b.tokens.data(), targets.data(), false);
    model.forward(false, 0.f);
    size_t BT = (size_t)b.B * b.T, V = c.vocab_size, Vp = c.padded_vocab_size;
    auto padded = th::to_host(model.acts.logits, BT * Vp);
    model.free_all();
    std::vector<float> logits(BT * V);
    for (size_t r = 0; r < BT; r++)
        for (size_t v = 0; v < V; v++) logits[r * V + v] = to_float(padded[r * Vp + v]);
    return logits;
}

// The largest |x|: the scale the logit budgets are relative to.
double max_abs(const std::vector<float>& x) {
    double m = 0;
    for (float v : x) m = std::max(m, (double)std::fabs(v));
    return m;
}

// Logit budget, fp32. Both sides compute the same network in fp32 with different summation orders
// (and transformers' GELU/softmax/layernorm formulations): each matmul, layernorm and the attention
// add a few roundings relative to the scale of their outputs, and the 2 layers (5 such ops each) and
// the LM head compound them, mostly cancelling: k = 16 fp32 roundings of the logits' scale (as
// test_gpt2 allows its gradients).
constexpr double kFp32LogitK = 16;
// Logit budget, bf16 storage vs transformers' fp32: every parameter and activation is rounded to bf16
// (relative error eps/2 each); the logits sit behind about a dozen such roundings (embeddings,
// residual stream, layernorm outputs, attention and MLP outputs) that mostly cancel (they are
// independent): 2 eps of the logits' scale.
constexpr double kBf16LogitK = 2;

// One file's name/values/shape transformation for make_variant: returns false to drop a tensor.
using Edit = std::function<bool(std::string* name, std::vector<float>* values, std::vector<size_t>* shape)>;

// A tensor to add to a variant (zeros when values is empty).
struct Extra {
    std::string name;
    std::vector<size_t> shape;
    std::vector<float> values;
};

// The fixture's tensor called name, as fp32.
std::vector<float> fixture_tensor(const std::string& name) {
    SafeTensors st;
    std::string err;
    std::vector<float> v;
    if (!st.load(std::string(kModelDir) + "/model.safetensors", &err) || !st.find(name) ||
        !SafeTensors::to_float(*st.find(name), &v, &err))
        data_error("fixture tensor %s: %s", name.c_str(), err.c_str());
    return v;
}

// Writes dir/model.safetensors: the fixture's tensors (F32, or BF16 when bf16) passed through edit
// (nullptr: unchanged), plus extra tensors.
void write_variant(const std::string& dir, const Edit& edit, bool bf16 = false, const std::vector<Extra>& extra = {}) {
    SafeTensors st;
    std::string err;
    if (!st.load(std::string(kModelDir) + "/model.safetensors", &err)) data_error("%s", err.c_str());
    SafeTensorsWriter w;
    for (const SafeTensor& t : st.tensors()) {
        std::string name = t.name;
        std::vector<float> values;
        std::vector<size_t> shape = t.shape;
        if (!SafeTensors::to_float(t, &values, &err)) data_error("%s", err.c_str());
        if (edit && !edit(&name, &values, &shape)) continue;
        w.add(name, values.data(), shape, bf16);
    }
    for (const Extra& e : extra) {
        size_t n = 1;
        for (size_t d : e.shape) n *= d;
        std::vector<float> values = e.values.empty() ? std::vector<float>(n, 0.f) : e.values;
        w.add(e.name, values.data(), e.shape);
    }
    mkdir(dir.c_str(), 0755);
    if (!w.write(dir + "/model.safetensors", &err)) data_error("%s", err.c_str());
}

// Writes dir as save_pretrained writes a sharded checkpoint: the fixture's tensors dealt over three
// shards (model-0000k-of-00003.safetensors) and model.safetensors.index.json mapping each to its shard.
void write_sharded(const std::string& dir) {
    SafeTensors st;
    std::string err;
    if (!st.load(std::string(kModelDir) + "/model.safetensors", &err)) data_error("%s", err.c_str());
    SafeTensorsWriter shards[3];
    std::string map;
    for (size_t i = 0; i < st.tensors().size(); i++) {
        const SafeTensor& t = st.tensors()[i];
        std::vector<float> values;
        if (!SafeTensors::to_float(t, &values, &err)) data_error("%s", err.c_str());
        shards[i % 3].add(t.name, values.data(), t.shape);
        map += std::string(i ? ", " : "") + json::quote(t.name) + ": \"model-0000" + std::to_string(i % 3 + 1) +
               "-of-00003.safetensors\"";
    }
    mkdir(dir.c_str(), 0755);
    for (int k = 0; k < 3; k++)
        if (!shards[k].write(dir + "/model-0000" + std::to_string(k + 1) + "-of-00003.safetensors", &err))
            data_error("%s", err.c_str());
    std::string index = "{\"metadata\": {}, \"weight_map\": {" + map + "}}";
    if (!write_file_atomic(dir + "/model.safetensors.index.json", {{index.data(), index.size()}}, &err))
        data_error("%s", err.c_str());
}

std::string read_text(const std::string& path) {
    std::string s;
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) data_error("cannot open %s", path.c_str());
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, got);
    fclose(f);
    return s;
}

// Writes dir/config.json: the fixture's, with `from` replaced by `to` (nothing replaced if from is empty).
void write_config(const std::string& dir, const std::string& from = "", const std::string& to = "") {
    std::string s = read_text(std::string(kModelDir) + "/config.json");
    if (!from.empty()) {
        size_t at = s.find(from);
        if (at == std::string::npos) data_error("config.json has no %s", from.c_str());
        s.replace(at, from.size(), to);
    }
    FILE* f = fopen((dir + "/config.json").c_str(), "wb");
    if (!f) data_error("cannot write %s/config.json", dir.c_str());
    fputs(s.c_str(), f);
    fclose(f);
}

// Runs body in a child process, which must exit non-zero with `expect` in its stderr (the loader's
// one line). The temporary directory is shown as <tmp> so that the report is the same every run.
template <class F>
void expect_refused(const char* name, const std::string& tmp, const char* expect, F body) {
    th::ChildOutput child = th::run_in_child(body);
    std::string& err = child.text;
    bool ok = WIFEXITED(child.status) && WEXITSTATUS(child.status) != 0 && err.find(expect) != std::string::npos;
    while (!err.empty() && err.back() == '\n') err.pop_back();
    for (size_t at = err.find(tmp); at != std::string::npos; at = err.find(tmp)) err.replace(at, tmp.size(), "<tmp>");
    th::report(ok, name, "exit=%d stderr: %s", WIFEXITED(child.status) ? WEXITSTATUS(child.status) : -1, err.c_str());
}

// The fixture's parameters rounded to bf16 (nearest even) and widened back: what a BF16 file holds.
std::vector<float> bf16_rounded(const std::vector<float>& p) {
    std::vector<float> r(p.size());
    for (size_t i = 0; i < p.size(); i++) r[i] = SafeTensors::bf16_to_float(SafeTensorsWriter::float_to_bf16(p[i]));
    return r;
}

// Writes an f32 "tokens" and "logits" file for hf_gpt2_roundtrip.py.
void write_logits(const std::string& path, const Batch& b, const std::vector<float>& logits, int V) {
    SafeTensorsWriter w;
    std::vector<float> tokens(b.tokens.begin(), b.tokens.end());  // exact: ids < 2^24
    w.add("tokens", tokens.data(), {(size_t)b.B, (size_t)b.T});
    w.add("logits", logits.data(), {(size_t)b.B, (size_t)b.T, (size_t)V});
    std::string err;
    if (!w.write(path, &err)) data_error("%s", err.c_str());
}

// A transformers GPT-2 with settings of its own and tokenizer files goes out with them: the export's
// config.json has every key of the source's that does not describe the model (token ids, dropouts,
// task settings), the source's values; the model's own keys (n_embd for the source's alias
// hidden_size, torch_dtype for dtype); the tokenizer files byte for byte. The same from a resumed
// run (OUTDIR/hf_source) and from a run started from its llm.c checkpoint; a random init's run into a
// directory an earlier run left hf_source in removes it, and exports GPT-2's defaults.
void test_source_carried(const std::string& self, const std::string& tmp) {
    const std::string src = tmp + "/source", run = tmp + "/source_run";
    write_variant(src, nullptr);
    std::string config = read_text(std::string(kModelDir) + "/config.json");
    const std::pair<std::string, std::string> edits[] = {
        {"\"bos_token_id\": 50256", "\"bos_token_id\": 1"},
        {"\"eos_token_id\": 50256", "\"eos_token_id\": 2,\n  \"pad_token_id\": 3"},
        {"\"attn_pdrop\": 0.1", "\"attn_pdrop\": 0.0"},
        {"\"n_embd\": 64", "\"hidden_size\": 64"},
        {"\"torch_dtype\": \"float32\"", "\"dtype\": \"float32\",\n  \"task_specific_params\": "
                                          "{\"text-generation\": {\"do_sample\": true, \"max_length\": 50}}"}};
    for (const auto& e : edits) {
        size_t at = config.find(e.first);
        if (at == std::string::npos) data_error("config.json has no %s", e.first.c_str());
        config.replace(at, e.first.size(), e.second);
    }
    const std::vector<std::pair<std::string, std::string>> files = {
        {"config.json", config}, {"vocab.json", "{\"a\": 0, \"b\": 1}"}, {"merges.txt", "#version: 0.2\na b\n"},
        {"tokenizer_config.json", "{\"model_max_length\": 64}"}};
    for (const auto& f : files) {
        std::string err;
        if (!write_file_atomic(src + "/" + f.first, {{f.second.data(), f.second.size()}}, &err))
            data_error("%s", err.c_str());
    }
    json::Value source;
    std::string err;
    if (!json::parse(config.data(), config.size(), &source, &err)) data_error("source config: %s", err.c_str());
    const std::string shard = th::write_token_shard(tmp + "/source_train.bin", 4096, 500, 5);
    const std::string base = self + " --train-gpt2 -i " + shard + " -j '' -g 0 -t 16 -b 2 --precision fp32 ";

    // What is wrong with the export in dir ("" if nothing).
    auto problems = [&](const std::string& dir) {
        std::string text = read_text(dir + "/config.json"), why;
        json::Value out;
        if (!json::parse(text.data(), text.size(), &out, &err)) return "config.json: " + err;
        for (const auto& f : source.fields) {
            bool ours = f.first == "hidden_size" || f.first == "dtype" || f.first == "n_positions" ||
                        f.first == "n_head" || f.first == "n_layer" || f.first == "vocab_size" ||
                        f.first == "architectures" || f.first == "model_type" || f.first == "activation_function" ||
                        f.first == "layer_norm_epsilon" || f.first == "n_inner" || f.first.rfind("scale_attn", 0) == 0;
            const json::Value* v = out.get(f.first);
            if (!ours && (!v || json::write(*v) != json::write(f.second))) why += " " + f.first + " not carried;";
        }
        for (const char* gone : {"hidden_size", "dtype"})
            if (out.get(gone)) why += std::string(" ") + gone + " kept;";
        const json::Value* n_embd = out.get("n_embd");
        const json::Value* dtype = out.get("torch_dtype");
        if (!n_embd || n_embd->integer != 64 || !dtype || dtype->str != "float32") why += " n_embd/torch_dtype wrong;";
        for (const auto& f : files)
            if (f.first != "config.json" && read_text(dir + "/" + f.first) != f.second) why += " " + f.first + " differs;";
        return why;
    };
    th::ChildOutput c = th::run_command(base + "-e " + src + " -x 2 -n 1 -o " + run + " --export-hf " + tmp +
                                        "/carried 2>&1");
    std::string why = th::exited_ok(c) ? problems(tmp + "/carried") : th::last_lines(c.text);
    th::report(why.empty() && c.text.find("the settings of " + src + "/config.json") != std::string::npos,
               "train_gpt2 --export-hf of a transformers GPT-2: its settings and tokenizer files carried over", "%s",
               why.c_str());
    c = th::run_command(base + "-e " + src + " -x 3 -n 1 -o " + run + " --resume --export-hf " + tmp +
                        "/carried_resumed 2>&1");
    why = th::exited_ok(c) ? problems(tmp + "/carried_resumed") : th::last_lines(c.text);
    th::report(why.empty() && c.text.find(run + "/hf_source/config.json") != std::string::npos,
               "... and by a resumed run (from its output directory's hf_source)", "%s", why.c_str());
    c = th::run_command(base + "-e " + checkpoint_file(run, "model", 3) + " -x 0 --export-hf " + tmp +
                        "/carried_chain 2>&1");
    why = th::exited_ok(c) ? problems(tmp + "/carried_chain") : th::last_lines(c.text);
    th::report(why.empty(), "... and by a run started from one of its llm.c checkpoints", "%s", why.c_str());

    // An export into the source's own folder would replace its model: refused before anything runs.
    c = th::run_command(base + "-e " + src + "/ -x 0 --export-hf " + src + " 2>&1");
    th::report(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 2 &&
                   c.text.find("which --init reads: give another directory") != std::string::npos &&
                   read_text(src + "/config.json") == config,
               "train_gpt2 --export-hf into the folder -e reads is refused, its config.json untouched", "%s",
               th::last_lines(c.text).c_str());
    // ... also when -e names a folder of symlinks to the source's files.
    const std::string view = tmp + "/source_view";
    c = th::run_command("mkdir -p " + view + " && ln -s " + src + "/model.safetensors " + src + "/config.json " + view +
                        " && " + base + "-e " + view + " -x 0 --export-hf " + src + " 2>&1");
    th::report(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 2 &&
                   c.text.find("which --init reads: give another directory") != std::string::npos &&
                   read_text(src + "/config.json") == config,
               "... and into the folder that -e's symlinks point into", "%s", th::last_lines(c.text).c_str());

    // A run with no transformers source, into a directory with an earlier run's hf_source but no checkpoint.
    const std::string stale = tmp + "/stale_run";
    make_dirs(stale + "/hf_source", &err);
    write_file_atomic(stale + "/hf_source/config.json", {{config.data(), config.size()}}, &err);
    write_file_atomic(stale + "/hf_source/vocab.json", {{"{}", 2}}, &err);
    c = th::run_command(base + "-e d2 --channels 64 --heads 4 --max-seq-len 64 --vocab-size 500 -x 1 -o " + stale +
                        " --export-hf " + tmp + "/uncarried 2>&1");
    json::Value out;
    std::string text = th::exited_ok(c) ? read_text(tmp + "/uncarried/config.json") : "";
    bool ok = json::parse(text.data(), text.size(), &out, &err) && out.get("eos_token_id") &&
              out.get("eos_token_id")->integer == 499 && !out.get("pad_token_id") &&
              !is_directory(stale + "/hf_source") && access((tmp + "/uncarried/vocab.json").c_str(), F_OK) != 0;
    th::report(ok, "a random init's run removes an earlier run's hf_source and exports GPT-2's own settings", "%s",
               ok ? "" : th::exited_ok(c) ? "its hf_source kept, or the export has the source's settings"
                                          : th::last_lines(c.text).c_str());
    // Exported over the first export: that one's tokenizer files are named, and left in place.
    c = th::run_command(base + "-e d2 --channels 64 --heads 4 --max-seq-len 64 --vocab-size 500 -x 0 --export-hf " +
                        tmp + "/carried 2>&1");
    ok = th::exited_ok(c) &&
         c.text.find("warning: " + tmp + "/carried also holds tokenizer_config.json, vocab.json, merges.txt, "
                     "which this export did not write") != std::string::npos &&
         read_text(tmp + "/carried/vocab.json") == files[1].second;
    th::report(ok, "an export over another's names the tokenizer files it did not write, and leaves them", "%s",
               ok ? "" : th::last_lines(c.text).c_str());
}

// --export DIR: the files hf_gpt2_roundtrip.py checks with transformers.
int export_for_python(const std::string& dir) {
    GPT2Config c;
    std::vector<float> params = load_hf_gpt2(kModelDir, &c);
    Batch b = load_batch();
    export_hf_gpt2(dir + "/fp32", c, params, false);
    export_hf_gpt2(dir + "/bf16", c, params, true);
    write_logits(dir + "/ours_fp32.safetensors", b, our_logits<float>(c, params, b), c.vocab_size);
    // transformers computes in fp32 from the bf16 weights it loads: so do we, from our own import of
    // the bf16 export (which also checks that import).
    GPT2Config cb;
    std::vector<float> pb = load_hf_gpt2(dir + "/bf16", &cb);
    write_logits(dir + "/ours_bf16.safetensors", b, our_logits<float>(cb, pb, b), cb.vocab_size);
    printf("exported %s/fp32, %s/bf16 and our logits for a (%d, %d) batch\n", dir.c_str(), dir.c_str(), b.B, b.T);
    return 0;
}

// --import DIR OUT: our fp32 logits for the fixture batch from the checkpoint in DIR.
int import_for_python(const std::string& dir, const std::string& out) {
    GPT2Config c;
    std::vector<float> params = load_hf_gpt2(dir, &c);
    Batch b = load_batch();
    write_logits(out, b, our_logits<float>(c, params, b), c.vocab_size);
    printf("imported %s (L=%d C=%d NH=%d V=%d) and wrote our logits to %s\n", dir.c_str(), c.num_layers, c.channels,
           c.num_heads, c.vocab_size, out.c_str());
    return 0;
}

int main(int argc, char** argv) {
    if (argc >= 2 && std::string(argv[1]) == "--train-gpt2") return train_gpt2_main(argc - 1, argv + 1);
    if (argc == 4 && std::string(argv[1]) == "--import") {
        matmul_init();
        int rc = import_for_python(argv[2], argv[3]);
        matmul_destroy();
        return rc;
    }
    if (argc == 3 && std::string(argv[1]) == "--export") {
        matmul_init();
        int rc = export_for_python(argv[2]);
        matmul_destroy();
        return rc;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--export DIR | --import DIR OUT]\n", argv[0]);
        return 2;
    }
    char tmpl[] = "/tmp/llmc_hf_gpt2_XXXXXX";
    std::string tmp = mkdtemp(tmpl);

    // The refusals first, before the CPU backend starts anything a forked child could trip on.
    write_variant(tmp + "/missing", [](std::string* n, std::vector<float>*, std::vector<size_t>*) {
        return *n != "transformer.h.1.mlp.c_fc.bias";
    });
    write_config(tmp + "/missing");
    expect_refused("hf_gpt2 refuses: a missing tensor", tmp, "missing tensor transformer.h.1.mlp.c_fc.bias", [&] {
        GPT2Config c;
        load_hf_gpt2(tmp + "/missing", &c);
    });
    write_variant(tmp + "/shape", [](std::string* n, std::vector<float>*, std::vector<size_t>* s) {
        if (*n == "transformer.h.0.attn.c_attn.weight") std::swap((*s)[0], (*s)[1]);  // (out, in): not Conv1D's
        return true;
    });
    write_config(tmp + "/shape");
    expect_refused("hf_gpt2 refuses: a wrong shape", tmp,
                   "tensor transformer.h.0.attn.c_attn.weight has shape [192, 64], expected [64, 192]", [&] {
                       GPT2Config c;
                       load_hf_gpt2(tmp + "/shape", &c);
                   });
    std::vector<float> wte = fixture_tensor("transformer.wte.weight");
    std::vector<float> head = wte;
    head[7] += 0.5f;  // one entry differs
    write_variant(tmp + "/untied", nullptr, false, {{"lm_head.weight", {500, 64}, head}});
    write_config(tmp + "/untied");
    expect_refused("hf_gpt2 refuses: an untied lm_head", tmp, "an untied LM head cannot be represented", [&] {
        GPT2Config c;
        load_hf_gpt2(tmp + "/untied", &c);
    });
    write_variant(tmp + "/noconfig", nullptr);
    expect_refused("hf_gpt2 refuses: no config.json (heads unknown)", tmp,
                   "needed for the number of attention heads", [&] {
                       GPT2Config c;
                       load_hf_gpt2(tmp + "/noconfig/model.safetensors", &c);
                   });
    write_variant(tmp + "/erf", nullptr);
    write_config(tmp + "/erf", "\"gelu_new\"", "\"gelu\"");
    expect_refused("hf_gpt2 refuses: erf GELU", tmp, "activation_function \"gelu\" cannot be represented", [&] {
        GPT2Config c;
        load_hf_gpt2(tmp + "/erf", &c);
    });
    write_variant(tmp + "/eps", nullptr);
    write_config(tmp + "/eps", "1e-05", "1e-12");
    expect_refused("hf_gpt2 refuses: layer_norm_epsilon 1e-12", tmp, "layer_norm_epsilon", [&] {
        GPT2Config c;
        load_hf_gpt2(tmp + "/eps", &c);
    });
    write_variant(tmp + "/layers", nullptr);
    write_config(tmp + "/layers", "\"n_layer\": 2", "\"n_layer\": 3");
    expect_refused("hf_gpt2 refuses: config.json disagreeing with the tensors", tmp,
                   "n_layer (h.* blocks) is 2 in the tensors but 3 in", [&] {
                       GPT2Config c;
                       load_hf_gpt2(tmp + "/layers", &c);
                   });
    write_variant(tmp + "/extra", nullptr, false, {{"transformer.h.0.mlp.gate.weight", {4}, {}}});
    write_config(tmp + "/extra");
    expect_refused("hf_gpt2 refuses: a tensor the model does not have", tmp,
                   "unexpected tensor transformer.h.0.mlp.gate.weight", [&] {
                       GPT2Config c;
                       load_hf_gpt2(tmp + "/extra", &c);
                   });
    expect_refused("hf_gpt2 refuses: a path that does not exist", tmp, "cannot open", [&] {
        GPT2Config c;
        load_hf_gpt2(tmp + "/nowhere", &c);
    });
    // A config.json without the shape keys takes GPT2Config's defaults, as transformers does: said.
    write_variant(tmp + "/sparse", nullptr);
    write_config(tmp + "/sparse", "\"n_embd\": 64,", "");
    expect_refused("hf_gpt2 refuses: a config.json without n_embd (the default 768), saying it is the default", tmp,
                   "sparse/config.json (config.json gives no n_embd: GPT2Config's defaults)", [&] {
                       GPT2Config c;
                       load_hf_gpt2(tmp + "/sparse", &c);
                   });
    // Other architectures are named by their config.json, before their tensors are looked at.
    write_variant(tmp + "/llama", nullptr);
    write_config(tmp + "/llama", "\"model_type\": \"gpt2\"", "\"model_type\": \"llama\"");
    expect_refused("hf_gpt2 refuses: another architecture (config.json's model_type)", tmp,
                   "config.json: model_type is \"llama\", not \"gpt2\"", [&] {
                       GPT2Config c;
                       load_hf_gpt2(tmp + "/llama", &c);
                   });
    // transformers reads num_attention_heads as n_head: two different values are ambiguous.
    write_variant(tmp + "/heads2", nullptr);
    write_config(tmp + "/heads2", "\"n_head\": 4", "\"n_head\": 4, \"num_attention_heads\": 2");
    expect_refused("hf_gpt2 refuses: n_head and num_attention_heads that disagree", tmp,
                   "\"n_head\" 4 and \"num_attention_heads\" 2 disagree", [&] {
                       GPT2Config c;
                       load_hf_gpt2(tmp + "/heads2", &c);
                   });
    // save_pretrained(safe_serialization=False) writes pytorch_model.bin, a pickle (a zip archive).
    mkdir((tmp + "/pickle").c_str(), 0755);
    write_config(tmp + "/pickle");
    {
        FILE* f = fopen((tmp + "/pickle/pytorch_model.bin").c_str(), "wb");
        fputs("PK\x03\x04 and the rest of a zip archive", f);
        fclose(f);
    }
    expect_refused("hf_gpt2 refuses: a directory with pytorch_model.bin only, saying what to do", tmp,
                   "/pickle: holds pytorch_model.bin, a PyTorch pickle, and no model.safetensors: this project "
                   "reads safetensors only (unpickling can run code): save the model with save_pretrained(DIR, "
                   "safe_serialization=True)", [&] {
                       GPT2Config c;
                       load_hf_gpt2(tmp + "/pickle", &c);
                   });
    // A run's output directory (-o) holds llm.c checkpoints, not a Hugging Face one: its model file is named.
    mkdir((tmp + "/run").c_str(), 0755);
    for (const char* name : {"/run/model_00000005.bin", "/run/DONE_00000005", "/run/model_00000010.bin", "/run/DONE_00000010"})
        fclose(fopen((tmp + name).c_str(), "wb"));
    expect_refused("hf_gpt2 refuses: a run's output directory, naming its newest model file", tmp,
                   "/run: a run's output directory, not a Hugging Face checkpoint: give its model file, ", [&] {
                       GPT2Config c;
                       load_hf_gpt2(tmp + "/run", &c);
                   });
    // The same files given to -e as llm.c checkpoints (not a directory, not *.safetensors) are named, and
    // so is what a clone of a hub repository without git-lfs holds in place of gpt2_124M.bin.
    {
        FILE* f = fopen((tmp + "/lfs.bin").c_str(), "wb");
        fputs("version https://git-lfs.github.com/spec/v1\noid sha256:4ef1\nsize 497759232\n", f);
        fclose(f);
        th::run_command("cp " + std::string(kModelDir) + "/model.safetensors " + tmp + "/weights.bin");
    }
    struct { const char* name; std::string path; const char* expect; } not_llmc[] = {
        {"llm.c loader: a pytorch_model.bin is named a PyTorch pickle", tmp + "/pickle/pytorch_model.bin",
         "pytorch_model.bin: not a llm.c model checkpoint: a PyTorch pickle"},
        {"llm.c loader: a config.json or index is named a JSON file", tmp + "/pickle/config.json",
         "config.json: not a llm.c model checkpoint: a JSON file"},
        {"llm.c loader: a safetensors file under another name is named", tmp + "/weights.bin",
         "weights.bin: not a llm.c model checkpoint: a safetensors file"},
        {"llm.c loader: a Git LFS pointer is named", tmp + "/lfs.bin",
         "lfs.bin: not a llm.c model checkpoint: a Git LFS pointer, not the file itself"},
        {"llm.c loader: a tokenizer file is named", "dev/data/shakespeare/gpt2_tokenizer.bin",
         "not a llm.c model checkpoint: a llm.c tokenizer file"},
        {"llm.c loader: a token shard is named", "dev/data/shakespeare/shakespeare_val.bin",
         "not a llm.c model checkpoint: a llm.c token shard"},
    };
    for (const auto& k : not_llmc)
        expect_refused(k.name, tmp, k.expect, [&] {
            GPT2Config c;
            load_checkpoint(k.path, &c);
        });
    {
        FILE* f = fopen((tmp + "/plainfile").c_str(), "wb");
        fclose(f);
    }
    expect_refused("hf_gpt2 export refuses: a directory it cannot create", tmp, "cannot create directory", [&] {
        GPT2Config c;
        std::vector<float> p = load_hf_gpt2(kModelDir, &c);
        export_hf_gpt2(tmp + "/plainfile/out", c, p, false);
    });

    // Import: transformers' own file.
    matmul_init();
    GPT2Config c;
    std::vector<float> params = load_hf_gpt2(kModelDir, &c);
    th::report(c.num_layers == 2 && c.channels == 64 && c.num_heads == 4 && c.max_seq_len == 64 &&
                   c.vocab_size == 500 && c.padded_vocab_size == 512,
               "hf_gpt2: config from config.json", "L=%d C=%d NH=%d maxT=%d V=%d Vp=%d", c.num_layers, c.channels,
               c.num_heads, c.max_seq_len, c.vocab_size, c.padded_vocab_size);
    bool pad_zero = true;
    for (size_t i = (size_t)c.vocab_size * c.channels; i < (size_t)c.padded_vocab_size * c.channels; i++)
        pad_zero &= params[i] == 0.f;
    th::report(pad_zero, "hf_gpt2: padded vocabulary rows V..Vp-1 of wte are zero");

    Batch b = load_batch();
    std::vector<float> ours = our_logits<float>(c, params, b);
    double scale = max_abs(b.logits);
    th::check_close("hf_gpt2<fp32> logits vs transformers", b.logits.data(), ours.data(), ours.size(),
                    th::Tol{kFp32LogitK * th::EPS_FP32 * scale, kFp32LogitK * th::EPS_FP32});
    std::vector<float> ours_bf16 = our_logits<__nv_bfloat16>(c, params, b);
    th::check_close("hf_gpt2<bf16> logits vs transformers (fp32)", b.logits.data(), ours_bf16.data(), ours_bf16.size(),
                    th::Tol{kBf16LogitK * th::EPS_BF16 * scale, kBf16LogitK * th::EPS_BF16});

    // Variants that load to the same parameters.
    auto same_params = [&](const char* name, const std::string& path, const std::vector<float>& expect) {
        GPT2Config cv;
        std::vector<float> p = load_hf_gpt2(path, &cv);
        th::check_bitwise(name, expect.data(), p.data(), std::min(p.size(), expect.size()) * sizeof(float));
    };
    write_variant(tmp + "/model", [](std::string* n, std::vector<float>*, std::vector<size_t>*) {
        n->erase(0, n->compare(0, 12, "transformer.") == 0 ? 12 : 0);
        return true;
    });
    write_config(tmp + "/model");
    same_params("hf_gpt2: GPT2Model names (no transformer. prefix) load the same parameters", tmp + "/model", params);
    write_variant(tmp + "/buffers", nullptr, false,
                  {{"transformer.h.0.attn.bias", {1, 1, 64, 64}, {}}, {"transformer.h.1.attn.masked_bias", {}, {}}});
    write_config(tmp + "/buffers");
    same_params("hf_gpt2: attn.bias / attn.masked_bias buffers are ignored", tmp + "/buffers", params);
    same_params("hf_gpt2: a .safetensors path (config.json beside it) loads the same parameters",
                std::string(kModelDir) + "/model.safetensors", params);
    // lm_head.weight present and equal to wte (an older save, or a state dict saved as is).
    write_variant(tmp + "/tied", nullptr, false, {{"lm_head.weight", {500, 64}, wte}});
    write_config(tmp + "/tied");
    same_params("hf_gpt2: a tied lm_head.weight (equal to wte) is accepted", tmp + "/tied", params);
    // safetensors' save_model(model) keeps the tied embedding as lm_head.weight and drops wte.
    write_variant(tmp + "/save_model", [](std::string* n, std::vector<float>*, std::vector<size_t>*) {
        if (*n == "transformer.wte.weight") *n = "lm_head.weight";
        return true;
    });
    write_config(tmp + "/save_model");
    same_params("hf_gpt2: the tied embedding stored as lm_head.weight alone (save_model) loads as wte",
                tmp + "/save_model", params);
    write_variant(tmp + "/bf16", nullptr, true);
    write_config(tmp + "/bf16");
    same_params("hf_gpt2: a BF16 file loads the bf16-rounded parameters", tmp + "/bf16", bf16_rounded(params));
    write_sharded(tmp + "/sharded");
    write_config(tmp + "/sharded");
    same_params("hf_gpt2: a sharded checkpoint (index + 3 shards) loads the same parameters", tmp + "/sharded", params);
    same_params("hf_gpt2: its model.safetensors.index.json path loads the same parameters",
                tmp + "/sharded/model.safetensors.index.json", params);
    {  // train_gpt2 -e takes the index's path as a Hugging Face checkpoint (converted here with -x 0, in
       // fp32: a GPU's default, bf16, would export the bf16-rounded parameters)
        th::ChildOutput c = th::run_command(th::self_path(argv[0]) + " --train-gpt2 -e " + tmp +
                                            "/sharded/model.safetensors.index.json -x 0 -t 8 -b 1 -g 0 -j '' "
                                            "--precision fp32 --export-hf " + tmp + "/sharded_export 2>&1");
        th::report(th::exited_ok(c), "train_gpt2 -e .../model.safetensors.index.json: read as Hugging Face's", "%s",
                   th::last_lines(c.text).c_str());
        if (th::exited_ok(c))
            same_params("... and exported (-x 0 --export-hf) with the same parameters", tmp + "/sharded_export", params);
    }
    test_source_carried(th::self_path(argv[0]), tmp);
    // GPT2Config's attribute_map: num_attention_heads is n_head (ignored, the 12 heads of the default
    // would have been taken: silently, for a model whose channels they divide).
    write_variant(tmp + "/alias", nullptr);
    write_config(tmp + "/alias", "\"n_head\": 4", "\"num_attention_heads\": 4");
    {
        GPT2Config ca;
        std::vector<float> p = load_hf_gpt2(tmp + "/alias", &ca);
        th::report(ca.num_heads == 4 && p == params, "hf_gpt2: config.json's num_attention_heads is read as n_head",
                   "NH=%d", ca.num_heads);
    }

    // Export and import again: fp32 exactly; bf16 as nearest-even rounding.
    export_hf_gpt2(tmp + "/export/fp32", c, params, false);
    same_params("hf_gpt2: export fp32 then import gives the same parameters", tmp + "/export/fp32", params);
    export_hf_gpt2(tmp + "/export/bf16", c, params, true);
    same_params("hf_gpt2: export bf16 then import gives the bf16-rounded parameters", tmp + "/export/bf16",
                bf16_rounded(params));

    std::string cmd = "rm -rf " + tmp;
    if (system(cmd.c_str()) != 0) fprintf(stderr, "could not remove %s\n", tmp.c_str());
    matmul_destroy();
    return th::finish();
}

}  // namespace test_hf_gpt2
TH_MAIN(test_hf_gpt2)
