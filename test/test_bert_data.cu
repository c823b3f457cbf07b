// test/test_bert_data.cu — BERT's data path: dev/data/bert_data.cpp (text -> shards) on small temp
// TSV / JSONL / aclImdb / MLM inputs, its token ids against llmc/wordpiece.h's encoding (itself
// checked against transformers' BertTokenizer by test_wordpiece) and its refusals of bad input (which
// leave an earlier run's shards byte-identical); the shard format's checks; and
// llmc/bert_dataloader.h: rank split, padding to a multiple of 8, length bucketing, dynamic masking
// statistics and reproducibility, eval passes, seek/resume, and the bundled default task
// (dev/data/bert/genre_*), which the tool must rebuild byte for byte.
#define BERT_DATA_NO_MAIN
#include "../dev/data/bert_data.cpp"
#include "harness.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <set>

namespace bd = bert_data;

const char* VOCAB = "dev/data/bert/vocab.txt";
std::string dir;  // the temp folder

void write_text(const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(text.data(), 1, text.size(), f);
    fclose(f);
}

// The files matching a glob pattern, sorted.
std::vector<std::string> glob_files_sorted(const std::string& pattern) {
    std::vector<std::string> files;
    glob_t g;
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) files.push_back(g.gl_pathv[i]);
        globfree(&g);
    }
    std::sort(files.begin(), files.end());
    return files;
}

BertShard read_shard(const std::string& path) {
    BertShard s;
    std::string err;
    if (!read_bert_shard(path, &s, &err)) printf("  (%s)\n", err.c_str());
    return s;
}

std::vector<int> sequence(const BertShard& s, size_t i) {
    return std::vector<int>(s.tokens.begin() + s.offsets[i], s.tokens.begin() + s.offsets[i + 1]);
}

bd::Options classify_options(const std::string& input, const std::string& out, int max_len = 256) {
    bd::Options o;
    o.mode = bd::Mode::Classify;
    o.vocab = VOCAB;
    o.out = dir + "/" + out;
    o.inputs = {input};
    o.max_len = max_len;
    o.val_fraction = 0;
    o.quiet = true;
    return o;
}

bool run_tool(const bd::Options& o, std::string* error) {
    bd::Stats s;
    return bd::run(o, &s, error);
}

// The tool as a user runs it, `bert_data ARGS...` through its main in a child process, stdout
// discarded: exit status and stderr (its trailing newlines removed).
th::ChildOutput run_command_line(const std::vector<std::string>& args) {
    th::ChildOutput child = th::run_in_child([&] {
        std::vector<char*> argv = {(char*)"bert_data"};
        for (const std::string& a : args) argv.push_back((char*)a.c_str());
        if (!freopen("/dev/null", "w", stdout)) _exit(9);
        _exit(bd::main_entry((int)argv.size(), argv.data()));
    });
    while (!child.text.empty() && child.text.back() == '\n') child.text.pop_back();
    return child;
}

void expect_error(const char* name, const bd::Options& o, const std::string& reason) {
    std::string error;
    bool ok = run_tool(o, &error);
    th::report(!ok && error.find(reason) != std::string::npos, name, "%s", error.c_str());
}

// Whether shard s holds exactly texts (in order) with labels, as [CLS] text [SEP] truncated to max_len.
bool shard_matches(const WordPiece& wp, const BertShard& s, const std::vector<std::string>& texts,
                   const std::vector<int>& labels, int max_len) {
    if (s.num_sequences() != texts.size() || s.kind != BertShardKind::Classify || s.max_len != max_len) return false;
    for (size_t i = 0; i < texts.size(); i++)
        if (sequence(s, i) != wp.encode_single(texts[i], max_len).ids || s.labels[i] != labels[i]) return false;
    return true;
}

// ---------------------------------------------------------------------------------------------
// The tool: classification

void test_classify_tool(const WordPiece& wp) {
    std::string error;
    std::string long_text;
    for (int i = 0; i < 60; i++) long_text += "the quick brown fox jumps over the lazy dog ";
    std::vector<std::string> texts = {"A great movie!", "Terrible, awful acting.\tReally.", "It was fine, I guess.",
                                      long_text, "Ünïcödé café — 中文 naïve", "Loved it."};
    std::vector<std::string> labels = {"pos", "neg", "neutral", "pos", "neutral", "pos"};
    std::vector<int> ids = {2, 0, 1, 2, 1, 2};  // sorted: neg, neutral, pos
    std::string tsv;
    for (size_t i = 0; i < texts.size(); i++) tsv += labels[i] + "\t" + texts[i] + (i == 2 ? "\r\n" : "\n");
    write_text(dir + "/plain.tsv", tsv);
    bd::Options o = classify_options(dir + "/plain.tsv", "plain", 32);
    bool ok = run_tool(o, &error);
    BertShard s = read_shard(dir + "/plain_train.bin");
    th::report(ok && shard_matches(wp, s, texts, ids, 32) && s.label_names == std::vector<std::string>{"neg", "neutral", "pos"} &&
                   !std::filesystem::exists(dir + "/plain_val.bin"),
               "bert_data classify: TSV -> ids of wordpiece.h, string labels in sorted order", "%s", error.c_str());
    th::report(ok && s.vocab_fingerprint == wp.fingerprint() && s.vocab_fingerprint != 0,
               "bert_data: the shard records the vocabulary's fingerprint", "%016llx",
               (unsigned long long)s.vocab_fingerprint);
    th::report(ok && s.lengths[3] == 32 && sequence(s, 3).back() == wp.sep_id() && s.lengths[0] < 32,
               "bert_data classify: a long text truncated to --max-len as BertTokenizer's truncation",
               "length %d", ok ? s.lengths[3] : -1);

    // A header may name the columns in another order (GLUE's SST-2: sentence<TAB>label).
    std::string sst = "\xEF\xBB\xBFsentence\tlabel\n";  // with a byte order mark, as some editors save
    for (size_t i = 0; i < texts.size(); i++)
        if (texts[i].find('\t') == std::string::npos) sst += texts[i] + "\t" + labels[i] + "\n";
    write_text(dir + "/sst.tsv", sst);
    ok = run_tool(classify_options(dir + "/sst.tsv", "sst", 32), &error);
    s = read_shard(dir + "/sst_train.bin");
    th::report(ok && shard_matches(wp, s, {texts[0], texts[2], texts[3], texts[4], texts[5]}, {1, 0, 1, 0, 1}, 32),
               "bert_data classify: TSV header 'sentence<TAB>label' (after a BOM) maps the columns", "%s", error.c_str());

    // JSONL with integer labels and a separate val file; --no-lower-case keeps case.
    std::string jsonl = "{\"label\": 2, \"text\": \"Third \\\"class\\\" \\u00e9t\\u00e9\"}\n"
                        "{\"text\": \"zero\", \"label\": 0}\n\n{\"label\": 0, \"text\": \"Also zero.\"}\n";
    write_text(dir + "/a.jsonl", jsonl);
    write_text(dir + "/b.jsonl", "{\"label\": 1, \"text\": \"one\"}\n");
    o = classify_options(dir + "/a.jsonl", "json", 64);
    o.val_input = dir + "/b.jsonl";
    ok = run_tool(o, &error);
    s = read_shard(dir + "/json_train.bin");
    BertShard v = read_shard(dir + "/json_val.bin");
    th::report(ok && shard_matches(wp, s, {"Third \"class\" \u00e9t\u00e9", "zero", "Also zero."}, {2, 0, 0}, 64) &&
                   shard_matches(wp, v, {"one"}, {1}, 64) &&
                   s.label_names == std::vector<std::string>{"0", "1", "2"} && v.label_names == s.label_names,
               "bert_data classify: JSONL, integer labels are class ids, --val file", "%s", error.c_str());
    {
        WordPiece cased(WordPiece::Options{false, std::nullopt, true, 100});
        cased.load(VOCAB, &error);
        o.lower_case = false;
        o.out = dir + "/json_cased";
        ok = run_tool(o, &error);
        s = read_shard(dir + "/json_cased_train.bin");
        th::report(ok && !s.lower_case && sequence(s, 0) == cased.encode_single(std::string("Third \"class\" \u00e9t\u00e9"), 64).ids &&
                       sequence(s, 0) != wp.encode_single(std::string("Third \"class\" \u00e9t\u00e9"), 64).ids,
                   "bert_data classify: --no-lower-case keeps case and accents (flag in the header)", "%s", error.c_str());
    }

    // aclImdb layout: train|test / pos|neg / *.txt, unsup skipped; test/ is val.
    std::map<std::string, std::string> imdb = {
        {"train/pos/0_9.txt", "One of the best films.<br /><br />Wonderful."}, {"train/pos/1_8.txt", "Great fun"},
        {"train/neg/0_2.txt", "Dull and long."},  {"train/unsup/0_0.txt", "unlabeled: skipped"},
        {"test/neg/0_1.txt", "Awful!"},           {"test/pos/0_10.txt", "A masterpiece."},
        {"train/urls_pos.txt", "http://not-a-review"}};
    for (const auto& kv : imdb) write_text(dir + "/aclImdb/" + kv.first, kv.second);
    ok = run_tool(classify_options(dir + "/aclImdb", "imdb"), &error);
    s = read_shard(dir + "/imdb_train.bin");
    v = read_shard(dir + "/imdb_val.bin");
    th::report(ok && shard_matches(wp, s, {imdb["train/neg/0_2.txt"], imdb["train/pos/0_9.txt"], imdb["train/pos/1_8.txt"]}, {0, 1, 1}, 256) &&
                   shard_matches(wp, v, {imdb["test/neg/0_1.txt"], imdb["test/pos/0_10.txt"]}, {0, 1}, 256) &&
                   s.label_names == std::vector<std::string>{"neg", "pos"},
               "bert_data classify: aclImdb folder -> _train.bin / _val.bin (test/), unsup skipped", "%s", error.c_str());

    // --val-fraction spreads val over the input: a file sorted by label gives a balanced val.
    std::string sorted_tsv;
    for (int i = 0; i < 20; i++) sorted_tsv += std::string(i < 10 ? "a" : "b") + "\tsentence number " + std::to_string(i) + "\n";
    write_text(dir + "/sorted.tsv", sorted_tsv);
    o = classify_options(dir + "/sorted.tsv", "sorted");
    o.val_fraction = 0.2;
    ok = run_tool(o, &error);
    s = read_shard(dir + "/sorted_train.bin");
    v = read_shard(dir + "/sorted_val.bin");
    th::report(ok && s.num_sequences() == 16 && v.num_sequences() == 4 && v.labels == std::vector<int32_t>{0, 0, 1, 1} &&
                   sequence(v, 0) == wp.encode_single(std::string("sentence number 4")).ids,
               "bert_data classify: --val-fraction 0.2 takes every 5th example (balanced val)", "%s", error.c_str());

    // --labels fixes the order.
    o = classify_options(dir + "/plain.tsv", "ordered", 32);
    o.labels = {"pos", "neg", "neutral"};
    ok = run_tool(o, &error);
    s = read_shard(dir + "/ordered_train.bin");
    th::report(ok && shard_matches(wp, s, texts, {0, 1, 2, 0, 2, 0}, 32) && s.label_names == o.labels,
               "bert_data classify: --labels gives the ids", "%s", error.c_str());
}

// ---------------------------------------------------------------------------------------------
// The tool: MLM

void test_mlm_tool(const WordPiece& wp) {
    std::string error;
    // Documents: blank lines separate them; every file ends one. One line longer than a sequence.
    std::string long_line;
    for (int i = 0; i < 12; i++) long_line += "internationalization of unbelievably interchangeable words ";
    std::vector<std::vector<std::string>> docs = {  // each document's lines, in input order
        {"The first document has two lines.", "Here is its second line, a little longer than the first."},
        {"A second document in the same file."},
        {"Third: one short line."},
        {long_line, "After the long line comes a short one."},
        {"Tiny."}};
    write_text(dir + "/mlm/a.txt", docs[0][0] + "\n" + docs[0][1] + "\n\n  \n" + docs[1][0] + "\n");
    write_text(dir + "/mlm/b/c.txt", docs[2][0]);  // no final newline
    write_text(dir + "/mlm/d.txt", "\n" + docs[3][0] + "\n" + docs[3][1] + "\r\n\n");
    write_text(dir + "/mlm/e.txt", docs[4][0] + "\n");
    write_text(dir + "/mlm/notes.md", "not a .txt file: skipped");
    bd::Options o;
    o.mode = bd::Mode::MLM;
    o.vocab = VOCAB;
    o.out = dir + "/mlmout/x";
    o.inputs = {dir + "/mlm"};
    o.max_len = 16;
    o.val_fraction = 0;
    o.quiet = true;
    bd::Stats st;
    bool ok = bd::run(o, &st, &error);
    std::vector<std::string> shards = {dir + "/mlmout/x_train_000000.bin"};
    BertShard s = read_shard(shards[0]);
    // The bodies, concatenated, must be the documents' tokens, with a [SEP] only between two
    // documents that share a sequence; a line that fits a sequence must not be cut.
    std::vector<int> body, want;
    std::vector<size_t> seq_end;  // where each sequence's body ends in `body`
    bool framed = s.num_sequences() > 0;
    for (size_t i = 0; i < s.num_sequences(); i++) {
        std::vector<int> q = sequence(s, i);
        framed &= q.size() >= 3 && q.size() <= 16 && q.front() == wp.cls_id() && q.back() == wp.sep_id();
        for (size_t t = 1; t + 1 < q.size(); t++)
            if (q[t] != wp.sep_id()) body.push_back(q[t]);
        seq_end.push_back(body.size());
    }
    size_t lines_whole = 0, lines_fit = 0, pos = 0;
    for (const auto& d : docs)
        for (const std::string& line : d) {
            std::vector<int> ids = wp.encode(line);
            want.insert(want.end(), ids.begin(), ids.end());
            if (ids.size() <= 14) {
                lines_fit++;
                bool cut = false;
                for (size_t e : seq_end) cut |= e > pos && e < pos + ids.size();
                lines_whole += !cut;
            }
            pos += ids.size();
        }
    size_t inner_seps = s.tokens.size() - body.size() - 2 * s.num_sequences();
    th::report(ok && framed && body == want && lines_whole == lines_fit && inner_seps >= 1 && inner_seps <= 4 &&
                   st.documents == 5 && st.files == 4,
               "bert_data mlm: documents packed into [CLS] ... [SEP] <= max-len, whole lines, [SEP] between documents",
               "%zu sequences, %zu tokens, %zu inner [SEP], %zu/%zu short lines whole %s", s.num_sequences(),
               s.tokens.size(), inner_seps, lines_whole, lines_fit, error.c_str());
    // The long line: cut into full pieces, none starting inside a word when avoidable.
    size_t starts_mid_word = 0;
    for (size_t i = 0; i < s.num_sequences(); i++) starts_mid_word += wp.token(sequence(s, i)[1]).compare(0, 2, "##") == 0;
    th::report(ok && starts_mid_word == 0, "bert_data mlm: a long line is cut between words", "%zu pieces start with ##",
               starts_mid_word);

    // --val-fraction: the lines starting in the first half of the bytes go to val; several shards.
    o.val_fraction = 0.5;
    o.shard_tokens = 40;
    o.out = dir + "/mlmout/y";
    st = bd::Stats();
    ok = bd::run(o, &st, &error);
    std::vector<int> all;
    size_t nshards = 0;
    bool small = true;
    for (const char* split : {"val", "train"})
        for (const std::string& f : glob_files_sorted(dir + "/mlmout/y_" + split + "_*.bin")) {
            BertShard q = read_shard(f);
            nshards++;
            small &= q.tokens.size() <= 40;
            for (size_t i = 0; i < q.tokens.size(); i++)
                if (q.tokens[i] != wp.cls_id() && q.tokens[i] != wp.sep_id()) all.push_back(q.tokens[i]);
        }
    th::report(ok && all == want && st.val.sequences > 0 && st.train.sequences > 0 && small && nshards == st.shards.size() &&
                   nshards > 2,
               "bert_data mlm: --val-fraction 0.5 (val first), --shard-tokens 40 -> numbered shards",
               "val %zu + train %zu sequences in %zu shards %s", st.val.sequences, st.train.sequences, nshards,
               error.c_str());
}

// ---------------------------------------------------------------------------------------------
// The tool: refusals

void test_tool_errors() {
    write_text(dir + "/err/empty_text.tsv", "pos\tfine\nneg\tgood\npos\t   \n");
    write_text(dir + "/err/no_tab.tsv", "pos\tfine\nthis line has no tab\n");
    write_text(dir + "/err/train.tsv", "pos\tfine\nneg\tgood\n");
    write_text(dir + "/err/val.tsv", "pos\tok\nmaybe\tunknown label\n");
    write_text(dir + "/err/bad.jsonl", "{\"label\": \"a\", \"text\": \"x\"}\n{\"label\": \"a\", \"text\": }\n");
    write_text(dir + "/err/nolabel.jsonl", "{\"text\": \"x\"}\n");
    write_text(dir + "/err/float.jsonl", "{\"label\": 1.5, \"text\": \"x\"}\n");
    write_text(dir + "/err/empty.tsv", "");
    write_text(dir + "/err/header_only.tsv", "label\ttext\n\n");
    write_text(dir + "/err/control.tsv", "a\t\x01\x02\n");
    write_text(dir + "/err/huge_label.tsv", "70000\tx\n");
    write_text(dir + "/err/blank/a.txt", "\n   \n\n");
    std::filesystem::create_directories(dir + "/err/nofiles/sub");
    std::filesystem::create_directories(dir + "/err/notrain/test/pos");

    {  // A --val-fraction that leaves validation nothing is said (train_bert's default -j expects one).
        write_text(dir + "/err/two.tsv", "pos\tfine\nneg\tbad\n");
        bd::Options two = classify_options(dir + "/err/two.tsv", "err/two");
        two.val_fraction = 0.1;
        two.quiet = false;
        th::ChildOutput c = th::run_in_child_with_stdout([&] {
            std::string e;
            run_tool(two, &e);
        });
        th::report(c.text.find("bert_data: warning: --val-fraction 0.1 of 2 examples is none: no _val.bin is "
                               "written") != std::string::npos &&
                       !std::filesystem::exists(dir + "/err/two_val.bin"),
                   "bert_data: a --val-fraction that gives validation no example is said, no _val.bin", "%s",
                   c.text.c_str());
    }
    bd::Options o = classify_options(dir + "/err/train.tsv", "err/out");
    o.vocab = dir + "/nope/vocab.txt";
    expect_error("bert_data refuses: missing vocab", o, "cannot open " + dir + "/nope/vocab.txt");
    expect_error("bert_data refuses: empty text (file:line)", classify_options(dir + "/err/empty_text.tsv", "err/out"),
                 "empty_text.tsv:3: empty text");
    expect_error("bert_data refuses: a line without a tab (file:line)", classify_options(dir + "/err/no_tab.tsv", "err/out"),
                 "no_tab.tsv:2: no tab");
    o = classify_options(dir + "/err/train.tsv", "err/out");
    o.val_input = dir + "/err/val.tsv";
    expect_error("bert_data refuses: unknown label in val (file:line)", o, "val.tsv:2: unknown label 'maybe'");
    o = classify_options(dir + "/err/train.tsv", "err/out");
    o.labels = {"neg", "neutral"};
    expect_error("bert_data refuses: a label not in --labels", o, "train.tsv:1: unknown label 'pos' (--labels: neg, neutral)");
    expect_error("bert_data refuses: invalid JSON (file:line)", classify_options(dir + "/err/bad.jsonl", "err/out"),
                 "bad.jsonl:2: invalid JSON");
    expect_error("bert_data refuses: JSON without label", classify_options(dir + "/err/nolabel.jsonl", "err/out"),
                 "nolabel.jsonl:1: no \"label\" field");
    expect_error("bert_data refuses: a fractional label", classify_options(dir + "/err/float.jsonl", "err/out"),
                 "\"label\" must be a string or a non-negative integer");
    expect_error("bert_data refuses: empty input file", classify_options(dir + "/err/empty.tsv", "err/out"), "no examples");
    expect_error("bert_data refuses: only a header", classify_options(dir + "/err/header_only.tsv", "err/out"), "no examples");
    expect_error("bert_data refuses: a text WordPiece drops whole", classify_options(dir + "/err/control.tsv", "err/out"),
                 "control.tsv:1: the text has no tokens");
    expect_error("bert_data refuses: an integer label too large", classify_options(dir + "/err/huge_label.tsv", "err/out"),
                 "huge_label.tsv:1: integer label 70000 is too large");
    expect_error("bert_data refuses: missing input", classify_options(dir + "/err/none.tsv", "err/out"), "cannot read");
    expect_error("bert_data refuses: a folder without train/", classify_options(dir + "/err/notrain", "err/out"), "has no train/");
    o = classify_options(dir + "/err/blank", "err/out");
    o.mode = bd::Mode::MLM;
    expect_error("bert_data refuses: mlm input of blank lines", o, "the inputs hold no text");
    o.inputs = {dir + "/err/nofiles"};
    expect_error("bert_data refuses: mlm folder without *.txt", o, "no input files");

    // The command line: bad ones refused; the exit status is 1 with one "error:" line, 0 for --help.
    auto parse = [](std::vector<const char*> args, std::string* error) {
        args.insert(args.begin(), "bert_data");
        bd::Options p;
        bool help;
        return bd::parse_args((int)args.size(), (char**)args.data(), &p, &help, error);
    };
    std::string e1, e2, e3, e4, e5;
    bool refused = !parse({"classify", "--vocab", "v", "--out", "o", "--max-len", "2", "a"}, &e1) &&
                   e1.find("--max-len must be") != std::string::npos;
    refused &= !parse({"tokenize", "--vocab", "v", "--out", "o", "a"}, &e2) && e2.find("unknown command 'tokenize'") != std::string::npos;
    refused &= !parse({"classify", "--vocab", "v", "--out", "o", "a", "b"}, &e3) && e3.find("classify takes one INPUT") != std::string::npos;
    refused &= !parse({"mlm", "--out", "o", "a"}, &e4) && e4.find("needs --vocab") != std::string::npos;
    refused &= !parse({"mlm", "--vocab", "v", "--out", "o", "--bogus", "a"}, &e5) && e5.find("unknown option --bogus") != std::string::npos;
    th::report(refused, "bert_data: bad command lines refused", "%s | %s | %s | %s | %s", e1.c_str(), e2.c_str(), e3.c_str(),
               e4.c_str(), e5.c_str());
    std::string empty_text = dir + "/err/empty_text.tsv", out = dir + "/err/out";
    th::ChildOutput child = run_command_line({"classify", "--vocab", VOCAB, "--out", out, empty_text});
    th::report(WIFEXITED(child.status) && WEXITSTATUS(child.status) == 1 && child.text.rfind("error: ", 0) == 0 &&
                   child.text.find('\n') == std::string::npos,
               "bert_data: an error exits with status 1 and one line", "exit=%d stderr: %s",
               WIFEXITED(child.status) ? WEXITSTATUS(child.status) : -1, child.text.c_str());
    child = run_command_line({"--help"});
    th::report(WIFEXITED(child.status) && WEXITSTATUS(child.status) == 0, "bert_data --help exits 0");
}

// ---------------------------------------------------------------------------------------------
// The tool: a refused run writes nothing (an earlier run's shards stay as they were)

// Runs o twice: first as it is (a good run), then with `spoil` applied, which must be refused with
// `reason` and leave the folder of o.out byte-identical to what the first run left (no new shard
// beside an old one, no .tmp file).
void expect_untouched(const char* name, bd::Options o, const std::function<void(bd::Options*)>& spoil,
                      const std::string& reason) {
    std::string error;
    bool first_ok = run_tool(o, &error);
    std::string folder = std::filesystem::path(o.out).parent_path().string();
    std::map<std::string, std::string> before = th::folder_files(folder);
    spoil(&o);
    std::string why;
    bool refused = !run_tool(o, &why) && why.find(reason) != std::string::npos;
    std::map<std::string, std::string> after = th::folder_files(folder);
    std::string names;
    for (const auto& kv : after) names += " " + kv.first;
    th::report(first_ok && before.size() >= 2 && refused && after == before, name, "%zu files before, %zu after:%s | %s %s",
               before.size(), after.size(), names.c_str(), error.c_str(), why.c_str());
}

// --out is a path prefix, never a folder; an input that is one of the run's own outputs, or clearly
// not text (a shard, NUL bytes), is refused when named and skipped with a warning in a folder.
void test_inputs_and_out() {
    write_text(dir + "/io/a.txt", "One document of a few words.\n\nAnd a second document here.\n");
    write_text(dir + "/io/t.tsv", "pos\tgood\nneg\tbad\npos\tfine\n");
    std::filesystem::create_directories(dir + "/io/folder");
    bd::Options mlm = classify_options(dir + "/io/a.txt", "io/folder");
    mlm.mode = bd::Mode::MLM;
    expect_error("bert_data refuses: --out an existing folder", mlm, "--out " + dir + "/io/folder is a folder");
    mlm.out = dir + "/io/new/";
    expect_error("bert_data refuses: --out ending in /", mlm, "--out " + dir + "/io/new/ is a folder");
    th::report(!std::filesystem::exists(dir + "/io/new") && std::filesystem::is_empty(dir + "/io/folder"),
               "bert_data: a refused folder --out creates and writes nothing", "");

    std::string error;
    mlm.out = dir + "/io/m";
    bool made = run_tool(mlm, &error);
    const std::string shard = dir + "/io/m_train_000000.bin";
    std::vector<uint8_t> before, after;
    std::string e2;
    made = made && read_whole_file(shard, &before, &e2);
    mlm.inputs = {shard, dir + "/io/a.txt"};
    expect_error("bert_data refuses: mlm input that is its own output shard", mlm,
                 "--out " + dir + "/io/m would overwrite its input " + shard + ": choose another --out");
    std::filesystem::create_symlink(shard, dir + "/io/link.txt");
    mlm.inputs = {dir + "/io/link.txt"};
    expect_error("bert_data refuses: mlm input linked to its own output shard", mlm,
                 "would overwrite its input " + dir + "/io/link.txt (" + shard + ")");
    th::report(made && read_whole_file(shard, &after, &e2) && after == before,
               "bert_data: a refused self-overwrite leaves the shard byte-identical", "%s", error.c_str());

    std::filesystem::copy_file(shard, dir + "/io/shard_copy.txt");
    mlm.out = dir + "/io/m2";
    mlm.inputs = {dir + "/io/shard_copy.txt"};
    expect_error("bert_data refuses: a named mlm input that is a BERT shard", mlm,
                 dir + "/io/shard_copy.txt is not text: a BERT shard");
    write_text(dir + "/io/texts/a.txt", "Some text of a document.\n");
    std::filesystem::copy_file(shard, dir + "/io/texts/b.txt");
    write_text(dir + "/io/texts/c.txt", std::string("utf-16\0t\0e\0x\0t\0", 15));
    mlm.inputs = {dir + "/io/texts"};
    mlm.quiet = false;
    th::ChildOutput c = th::run_in_child_with_stdout([&] {
        bd::Stats st;
        std::string e;
        bool ok = bd::run(mlm, &st, &e) && st.files == 1;
        fflush(stdout);
        _exit(ok ? 0 : 1);
    });
    th::report(c.status == 0 &&
                   c.text.find("bert_data: warning: skipped " + dir + "/io/texts/b.txt, not text: a BERT shard") !=
                       std::string::npos &&
                   c.text.find("bert_data: warning: skipped " + dir + "/io/texts/c.txt, not text: it holds NUL bytes") !=
                       std::string::npos,
               "bert_data: mlm skips a folder's non-text files with a warning each, and reads the rest", "%s",
               c.text.c_str());

    bd::Options cls = classify_options(dir + "/io/t.tsv", "io/c");
    if (!run_tool(cls, &error)) th::report(false, "bert_data: classify of t.tsv", "%s", error.c_str());
    cls.inputs = {dir + "/io/c_train.bin"};
    expect_error("bert_data refuses: classify input that is its own output", cls,
                 dir + "/io/c_train.bin is not text: a BERT shard");
    write_text(dir + "/io/nul.tsv", std::string("pos\tgood\0\n", 10));
    cls.inputs = {dir + "/io/t.tsv"};
    cls.val_input = dir + "/io/nul.tsv";
    expect_error("bert_data refuses: a --val file with NUL bytes", cls, dir + "/io/nul.tsv is not text: it holds NUL bytes");
    std::filesystem::copy_file(dir + "/io/t.tsv", dir + "/io/c_val.bin.tmp");
    cls.val_input = dir + "/io/c_val.bin.tmp";
    expect_error("bert_data refuses: a --val file that the run writes (its pending .tmp)", cls,
                 "--out " + dir + "/io/c would overwrite its input " + dir + "/io/c_val.bin.tmp");

    write_text(dir + "/io/imdb/train/pos/1.txt", "A good film.");
    write_text(dir + "/io/imdb/train/neg/1.txt", "A bad film.");
    write_text(dir + "/io/imdb/train/neg/2.txt", std::string("b\0a\0d\0", 6));
    cls = classify_options(dir + "/io/imdb", "io/imdb_shards");
    cls.quiet = false;
    c = th::run_in_child_with_stdout([&] {
        bd::Stats st;
        std::string e;
        bool ok = bd::run(cls, &st, &e) && st.train.sequences == 2;
        fflush(stdout);
        _exit(ok ? 0 : 1);
    });
    th::report(c.status == 0 && c.text.find("bert_data: warning: skipped " + dir +
                                            "/io/imdb/train/neg/2.txt, not text: it holds NUL bytes") != std::string::npos,
               "bert_data: classify skips a label folder's non-text file with a warning", "%s", c.text.c_str());
}

void test_no_half_written() {
    // classify --val: a val label the training file lacks (the check used to come after _train.bin
    // was written). The second run has other training data, so a rewritten _train.bin would differ.
    write_text(dir + "/keep/train.tsv", "pos\tgood\nneg\tbad\npos\tgreat\n");
    write_text(dir + "/keep/train2.tsv", "pos\tgood\nneg\tbad\nneg\tdreadful\n");
    write_text(dir + "/keep/val.tsv", "neg\tawful\npos\tfine\n");
    write_text(dir + "/keep/bad_val.tsv", "pos\tfine\nneg\tbad\nmaybe\tunknown label\n");
    bd::Options o = classify_options(dir + "/keep/train.tsv", "keep/tsv/P");
    o.val_input = dir + "/keep/val.tsv";
    expect_untouched("bert_data: an unknown val label leaves the earlier _train.bin and _val.bin byte-identical", o,
                     [&](bd::Options* p) {
                         p->inputs = {dir + "/keep/train2.tsv"};
                         p->val_input = dir + "/keep/bad_val.tsv";
                     },
                     "bad_val.tsv:3: unknown label 'maybe'");

    // aclImdb folder whose train/ gains a review and test/ a label train/ lacks.
    for (const char* f : {"train/pos/0.txt", "train/neg/0.txt", "test/pos/0.txt", "test/neg/0.txt"})
        write_text(dir + "/keep/imdb/" + f, std::string("review ") + f);
    o = classify_options(dir + "/keep/imdb", "keep/imdb_out/P");
    expect_untouched("bert_data: an aclImdb test/ label train/ lacks leaves the earlier shards byte-identical", o,
                     [&](bd::Options*) {
                         write_text(dir + "/keep/imdb/train/pos/1.txt", "another review");
                         write_text(dir + "/keep/imdb/test/meh/0.txt", "so-so");
                     },
                     "test/meh/0.txt: unknown label 'meh'");

    // mlm: the second run's val shards are complete (--shard-tokens 40) before it is refused for
    // having no training sequences; they must not replace the first run's.
    std::string text;
    for (int i = 0; i < 30; i++) text += "line number " + std::to_string(i) + " of a small corpus for the test\n";
    write_text(dir + "/keep/corpus.txt", text);
    o = classify_options(dir + "/keep/corpus.txt", "keep/mlm/P", 16);
    o.mode = bd::Mode::MLM;
    o.val_fraction = 0.5;
    o.shard_tokens = 40;
    expect_untouched("bert_data mlm: a refused run (val shards written, then no training) leaves the earlier shards "
                     "byte-identical",
                     o, [](bd::Options* p) { p->val_fraction = 1; }, "--val-fraction 1 leaves no training sequences");

    // One line of text: the first line always starts in val's bytes, so there is no training split.
    // Refused as classify refuses one, through the command line: exit 1, one line, no file or folder.
    write_text(dir + "/keep/one.txt", "one line only\n");
    std::string one = dir + "/keep/one.txt", out = dir + "/keep/one_out/o";
    th::ChildOutput child = run_command_line({"mlm", "--vocab", VOCAB, "--out", out, one});
    th::report(WIFEXITED(child.status) && WEXITSTATUS(child.status) == 1 &&
                   child.text.rfind("error: --val-fraction 0.1 leaves no training sequences", 0) == 0 &&
                   child.text.find('\n') == std::string::npos && !std::filesystem::exists(dir + "/keep/one_out"),
               "bert_data mlm: one line of text refused (no training sequences), nothing written",
               "exit=%d stderr: %s", WIFEXITED(child.status) ? WEXITSTATUS(child.status) : -1, child.text.c_str());

    // A good run leaves no .tmp file behind.
    size_t tmp = 0;
    for (const char* sub : {"tsv", "imdb_out", "mlm"})
        for (const auto& kv : th::folder_files(dir + "/keep/" + sub)) tmp += kv.first.find(".tmp") != std::string::npos;
    th::report(tmp == 0 && th::folder_files(dir + "/keep/mlm").size() > 2,
               "bert_data: shards are renamed into place, no .tmp file is left", "%zu .tmp files", tmp);
}

// ---------------------------------------------------------------------------------------------
// Synthetic shards for the loader. Vocabulary: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4, then
// ordinary ids up to V. Each sequence's first two body tokens spell its index, so every sequence
// differs; a few carry an inner [SEP] or an [UNK].
constexpr int V = 1000;
bool is_special(int id) { return id <= 4; }

BertShard synthetic(BertShardKind kind, size_t n, int max_len, size_t first, uint64_t seed, int num_labels = 0) {
    BertShard s;
    s.kind = kind;
    s.max_len = max_len;
    s.vocab_size = V;
    s.pad_id = 0, s.unk_id = 1, s.cls_id = 2, s.sep_id = 3, s.mask_id = 4;
    BertRng rng({seed});
    for (size_t i = 0; i < n; i++) {
        int len = 4 + (int)rng.below(max_len - 3);
        size_t g = first + i;
        s.tokens.push_back(2);
        s.tokens.push_back((uint16_t)(5 + g % 995));
        s.tokens.push_back((uint16_t)(5 + g / 995));
        for (int t = 3; t < len - 1; t++) {
            uint64_t r = rng.below(100);
            s.tokens.push_back((uint16_t)(r == 0 ? 3 : r == 1 ? 1 : 5 + rng.below(V - 5)));
        }
        s.tokens.push_back(3);
        s.lengths.push_back(len);
        if (kind == BertShardKind::Classify) s.labels.push_back((int32_t)rng.below(num_labels));
    }
    for (int k = 0; k < num_labels; k++) s.label_names.push_back("class_" + std::to_string(k));
    s.offsets.assign(1, 0);
    for (int32_t l : s.lengths) s.offsets.push_back(s.offsets.back() + l);
    return s;
}

// The current batch of a loader, for comparisons.
struct Snap {
    int T = 0, num_real = 0, masked = 0;
    std::vector<int> inputs, types, valid, targets;
    std::vector<long long> ids;
    bool operator==(const Snap& o) const {
        return T == o.T && num_real == o.num_real && masked == o.masked && inputs == o.inputs && types == o.types &&
               valid == o.valid && targets == o.targets && ids == o.ids;
    }
};
Snap snap(const BertDataLoader& l) {
    Snap s;
    s.T = l.T();
    s.num_real = l.num_real();
    s.masked = l.masked_rows();
    size_t BT = (size_t)l.B() * l.T();
    s.inputs.assign(l.inputs(), l.inputs() + BT);
    s.types.assign(l.token_types(), l.token_types() + BT);
    s.valid.assign(l.valid_len(), l.valid_len() + l.B());
    s.targets.assign(l.targets(), l.targets() + (l.is_mlm() ? BT : (size_t)l.B()));
    for (int b = 0; b < l.B(); b++) s.ids.push_back(l.sequence_id(b));
    return s;
}

BertDataLoader::Options loader_options(int B, int T, int rank = 0, int world = 1) {
    BertDataLoader::Options o;
    o.B = B;
    o.T = T;
    o.rank = rank;
    o.world = world;
    o.seed = 1234;
    o.vocab_size = V;
    return o;
}

void test_loader() {
    std::string err;
    // Two MLM shards (350 + 250 sequences of 4..100 tokens) and a classification shard.
    std::vector<BertShard> mlm = {synthetic(BertShardKind::MLM, 350, 100, 0, 1), synthetic(BertShardKind::MLM, 250, 100, 350, 2)};
    std::filesystem::create_directories(dir + "/ld");
    bool written = write_bert_shard(dir + "/ld/m_train_000000.bin", mlm[0], &err) &&
              write_bert_shard(dir + "/ld/m_train_000001.bin", mlm[1], &err);
    BertShard cls = synthetic(BertShardKind::Classify, 300, 64, 0, 3, 3);
    written &= write_bert_shard(dir + "/ld/c_train.bin", cls, &err);
    th::report(written, "loader: synthetic shards written", "%s", err.c_str());
    const std::string pattern = dir + "/ld/m_train_*.bin";
    auto original = [&](long long id) -> std::vector<int> {  // sequence id -> its tokens
        size_t k = id < 350 ? 0 : 1, i = id < 350 ? id : id - 350;
        return sequence(mlm[k], i);
    };

    // Rank split: world 3 x B 4 reads what one rank with B 12 reads, row for row, masks included.
    {
        BertDataLoader one(pattern, loader_options(12, 128));
        std::vector<std::unique_ptr<BertDataLoader>> ranks;
        for (int r = 0; r < 3; r++) ranks.emplace_back(new BertDataLoader(pattern, loader_options(4, 128, r, 3)));
        size_t per_epoch = one.batches_per_epoch();
        bool same = ranks[0]->batches_per_epoch() == per_epoch && per_epoch == 350 / 12 + 250 / 12;
        std::set<long long> seen;
        size_t rows = 0, dup = 0;
        for (size_t p = 0; p < 2 * per_epoch; p++) {
            for (int r = 0; r < 3; r++)
                for (int b = 0; b < 4; b++) {
                    const BertDataLoader& x = *ranks[r];
                    int B1 = r * 4 + b, len = x.valid_len()[b];
                    same &= x.sequence_id(b) == one.sequence_id(B1) && len == one.valid_len()[B1] &&
                            std::equal(x.inputs() + b * x.T(), x.inputs() + b * x.T() + len, one.inputs() + B1 * one.T()) &&
                            std::equal(x.targets() + b * x.T(), x.targets() + b * x.T() + len, one.targets() + B1 * one.T());
                    if (p < per_epoch) {
                        dup += !seen.insert(x.sequence_id(b)).second;
                        rows++;
                    }
                }
            one.next_batch();
            for (auto& x : ranks) x->next_batch();
        }
        th::report(same && dup == 0 && rows == per_epoch * 12 && seen.size() == rows,
                   "loader: 3 ranks x B=4 are disjoint and together = 1 rank x B=12 (masks too)",
                   "%zu batches/epoch, %zu sequences an epoch, %zu repeated", per_epoch, rows, dup);
    }

    // Widths: a multiple of 8 of the longest row, never past T; a longer sequence cut to T with its [SEP].
    for (int T : {128, 50}) {
        BertDataLoader l(pattern, loader_options(12, T));
        bool ok = true;
        size_t cut = 0;
        for (size_t p = 0; p < l.batches_per_epoch(); p++, l.next_batch()) {
            int longest = *std::max_element(l.valid_len(), l.valid_len() + 12);
            ok &= l.T() <= T && l.T() >= longest && (l.T() % 8 == 0 || l.T() == T) && l.T() - longest < 8;
            for (int b = 0; b < 12; b++) {
                int len = l.valid_len()[b];
                std::vector<int> orig = original(l.sequence_id(b));
                ok &= len == std::min((int)orig.size(), T) && l.inputs()[b * l.T() + len - 1] == 3;
                for (int t = len; t < l.T(); t++) ok &= l.inputs()[b * l.T() + t] == 0 && l.targets()[b * l.T() + t] == -100;
                cut += (int)orig.size() > T;
            }
        }
        char name[128];
        snprintf(name, sizeof(name), "loader: T=%d: width = multiple of 8 of the longest (<= T), [PAD] after, cut rows end in [SEP]", T);
        th::report(ok && (T == 128 ? cut == 0 && !l.truncates() : cut > 0 && l.truncates()), name, "%zu rows cut to T", cut);
    }

    // Bucketing: padding over an epoch against batches in plain shuffled order.
    {
        double pad[2];
        for (int bucket = 0; bucket < 2; bucket++) {
            BertDataLoader::Options o = loader_options(12, 128);
            o.bucket = bucket;
            BertDataLoader l(pattern, o);
            size_t slots = 0, real = 0;
            for (size_t p = 0; p < l.batches_per_epoch(); p++, l.next_batch()) {
                slots += (size_t)12 * l.T();
                for (int b = 0; b < 12; b++) real += l.valid_len()[b];
            }
            pad[bucket] = 1.0 - (double)real / slots;
        }
        th::report(pad[1] < 0.5 * pad[0], "loader: length bucketing cuts the padding",
                   "padding %.1f%% of the batch tokens bucketed vs %.1f%% in random batches", 100 * pad[1], 100 * pad[0]);
    }

    // Masking statistics over 4 epochs (~2300 sequences, ~27000 maskable tokens).
    {
        BertDataLoader l(pattern, loader_options(12, 128));
        size_t maskable = 0, masked = 0, as_mask = 0, as_random = 0, unchanged = 0, bad = 0, over = 0;
        int cap = (int)std::ceil(0.15 * 98);
        std::map<long long, std::vector<int>> epoch0;  // sequence -> its masked positions in epoch 0
        size_t compared = 0, same_positions = 0;
        for (size_t p = 0; p < 4 * l.batches_per_epoch(); p++, l.next_batch()) {
            int count = 0;
            for (int b = 0; b < 12; b++) {
                std::vector<int> orig = original(l.sequence_id(b)), where;
                const int* in = l.inputs() + b * l.T();
                const int* tg = l.targets() + b * l.T();
                for (size_t t = 0; t < orig.size(); t++) {
                    if (is_special(orig[t])) {
                        bad += tg[t] != -100 || in[t] != orig[t];
                        continue;
                    }
                    maskable++;
                    if (tg[t] == -100) {
                        bad += in[t] != orig[t];
                        continue;
                    }
                    bad += tg[t] != orig[t];
                    where.push_back((int)t);
                    masked++;
                    as_mask += in[t] == 4;
                    unchanged += in[t] == orig[t];
                    as_random += in[t] != 4 && in[t] != orig[t];
                }
                over += (int)where.size() > cap;
                count += (int)where.size();
                if (l.epoch() == 0) epoch0[l.sequence_id(b)] = where;
                else if (l.epoch() == 1 && where.size() >= 5) {
                    compared++;
                    same_positions += epoch0[l.sequence_id(b)] == where;
                }
            }
            bad += count != l.masked_rows() || count > l.max_masked_rows();
        }
        double rate = (double)masked / maskable;
        // Bounds: 4 standard deviations of a binomial (the per-sequence counts vary less than that).
        double sd_rate = std::sqrt(0.15 * 0.85 / maskable);
        auto within = [&](size_t k, double p) { return std::fabs((double)k / masked - p) <= 4 * std::sqrt(p * (1 - p) / masked); };
        th::report(std::fabs(rate - 0.15) <= 4 * sd_rate && bad == 0 && over == 0 && l.max_masked_rows() == 12 * cap,
                   "loader: MLM masks 15% of the maskable tokens (4-sigma binomial bound), never a special, targets = originals",
                   "%zu of %zu = %.4f (bound %.4f), %zu inconsistent, max_masked_rows %d", masked, maskable, rate,
                   4 * sd_rate, bad, l.max_masked_rows());
        th::report(within(as_mask, 0.8) && within(unchanged, 0.1) && within(as_random, 0.1),
                   "loader: masked tokens 80% [MASK] / 10% random / 10% unchanged (4-sigma bounds)",
                   "%.4f / %.4f / %.4f of %zu", (double)as_mask / masked, (double)as_random / masked,
                   (double)unchanged / masked, masked);
        th::report(compared > 100 && same_positions * 20 < compared, "loader: masks differ from epoch to epoch",
                   "%zu of %zu sequences with the same positions in epochs 0 and 1", same_positions, compared);
        BertDataLoader a(pattern, loader_options(12, 128)), b(pattern, loader_options(12, 128));
        BertDataLoader::Options other = loader_options(12, 128);
        other.seed = 99;
        BertDataLoader c(pattern, other);
        a.seek(5);
        b.seek(5);
        th::report(snap(a) == snap(b) && !(snap(a) == snap(c)), "loader: batches reproducible from the seed, another seed differs");
    }

    // Seek/resume: position p recreated exactly, across shard and epoch boundaries.
    {
        BertDataLoader run(pattern, loader_options(12, 128)), resumed(pattern, loader_options(12, 128));
        size_t per_epoch = run.batches_per_epoch();
        std::vector<Snap> seq;
        for (size_t p = 0; p < 3 * per_epoch; p++, run.next_batch()) seq.push_back(snap(run));
        bool same = run.position() == 3 * per_epoch && run.epoch() == 3;
        size_t checked = 0;
        for (size_t p : {(size_t)0, (size_t)1, (size_t)28, (size_t)29, per_epoch - 1, per_epoch, per_epoch + 30,
                         2 * per_epoch + 7, (size_t)3}) {
            resumed.seek(p);
            for (size_t k = 0; k < 5 && p + k < seq.size(); k++, resumed.next_batch()) {
                same &= snap(resumed) == seq[p + k] && resumed.position() == p + k && resumed.epoch() == (p + k) / per_epoch;
                checked++;
            }
        }
        th::report(same, "loader: seek(p) gives bit-identical batches (shard and epoch boundaries, backwards too)",
                   "%zu batches compared", checked);
    }

    // Eval pass: every sequence exactly once, filler rows, fixed masks; the same on every pass.
    {
        std::set<long long> seen;
        size_t dup = 0, filler_ok = 0, filler = 0;
        bool passes_same = true, fixed = true;
        for (int r = 0; r < 2; r++) {
            BertDataLoader::Options o = loader_options(7, 128, r, 2);
            o.eval = true;
            BertDataLoader l(pattern, o);
            std::vector<Snap> first;
            for (size_t p = 0; p < l.batches_per_epoch(); p++, l.next_batch()) {
                first.push_back(snap(l));
                for (int b = 0; b < 7; b++) {
                    if (b < l.num_real()) {
                        dup += !seen.insert(l.sequence_id(b)).second;
                        continue;
                    }
                    filler++;
                    filler_ok += l.sequence_id(b) == -1 && l.valid_len()[b] == 2 && l.inputs()[b * l.T()] == 2 &&
                                 l.inputs()[b * l.T() + 1] == 3 && l.targets()[b * l.T()] == -100;
                }
            }
            for (size_t p = 0; p < first.size(); p++, l.next_batch()) passes_same &= snap(l) == first[p];
            l.reset();
            passes_same &= snap(l) == first[0];
            // Eval masks do not follow the loader's epoch: a second loader seeks past several passes.
            BertDataLoader m(pattern, o);
            m.seek(3 * first.size() + 2);
            fixed &= snap(m) == first[2];
        }
        th::report(seen.size() == 600 && dup == 0 && filler > 0 && filler_ok == filler && passes_same && fixed,
                   "loader: eval pass on 2 ranks x B=7 covers each of 600 sequences once, filler rows after num_real(), "
                   "identical passes and masks",
                   "%zu sequences, %zu repeated, %zu/%zu filler rows well-formed", seen.size(), dup, filler_ok, filler);
    }

    // Classification batches: the label of each row's sequence; names from the shard.
    {
        BertDataLoader l(dir + "/ld/c_train.bin", loader_options(8, 64));
        bool ok = !l.is_mlm() && l.num_labels() == 3 && l.label_name(2) == "class_2" && l.max_masked_rows() == 0;
        for (size_t p = 0; p < l.batches_per_epoch(); p++, l.next_batch())
            for (int b = 0; b < 8; b++) {
                size_t i = (size_t)l.sequence_id(b);
                ok &= l.targets()[b] == cls.labels[i] && l.valid_len()[b] == cls.lengths[i] &&
                      std::equal(l.inputs() + b * l.T(), l.inputs() + b * l.T() + cls.lengths[i], sequence(cls, i).begin());
            }
        th::report(ok, "loader: classification batches carry their sequences' labels and tokens");
    }

    // Refusals: each stops the program with one line naming the file and the problem.
    auto expect_exit = [&](const char* name, const std::string& pat, BertDataLoader::Options o, const std::string& want) {
        th::ChildOutput child = th::run_in_child([&] { BertDataLoader l(pat, o); });
        while (!child.text.empty() && child.text.back() == '\n') child.text.pop_back();
        th::report(WIFEXITED(child.status) && WEXITSTATUS(child.status) == 1 && child.text.find(want) != std::string::npos &&
                       child.text.find('\n') == std::string::npos,
                   name, "stderr: %s", child.text.c_str());
    };
    BertDataLoader::Options small = loader_options(8, 64);
    small.vocab_size = 500;
    expect_exit("loader refuses: shards from a larger vocabulary than the model's", dir + "/ld/c_train.bin", small,
                "c_train.bin: built with a vocabulary of 1000 tokens, the model has 500");
    expect_exit("loader refuses: MLM and classification shards under one pattern", dir + "/ld/*.bin",
                loader_options(8, 64), "m_train_000000.bin: its kind (MLM or classification) differs");
    expect_exit("loader refuses: too few sequences for one batch", dir + "/ld/c_train.bin", loader_options(400, 64),
                "c_train.bin: 300 sequences, too few for one batch (B=400 x 1 rank = 400)");
    expect_exit("loader refuses: no shard matches", dir + "/ld/none_*.bin", loader_options(8, 64), "no BERT shards match");
    write_text(dir + "/ld/short.bin", "BERT");
    expect_exit("loader refuses: a file too short for a header", dir + "/ld/short.bin", loader_options(8, 64),
                "short.bin: too short for a BERT shard header");
    // Shards of one pattern whose vocabularies have the same size and special ids but other tokens
    // (their fingerprints differ); a shard that records none goes with any.
    {
        std::string err;
        BertShard a = synthetic(BertShardKind::Classify, 300, 64, 0, 21, 3), b = a, c = a;
        a.vocab_fingerprint = 0x1111;
        b.vocab_fingerprint = 0x2222;
        c.vocab_fingerprint = 0;
        std::filesystem::create_directories(dir + "/fp");
        bool wrote = write_bert_shard(dir + "/fp/a.bin", a, &err) && write_bert_shard(dir + "/fp/c.bin", c, &err);
        BertDataLoader mixed(dir + "/fp/*.bin", loader_options(8, 64));
        th::report(wrote && mixed.vocab_fingerprint() == 0x1111,
                   "loader: a shard without a fingerprint goes with one that has it (the loader's is the recorded one)");
        write_bert_shard(dir + "/fp/b.bin", b, &err);
        expect_exit("loader refuses: shards of one pattern from vocabularies with other tokens", dir + "/fp/*.bin",
                    loader_options(8, 64), "b.bin: built with another vocabulary than " + dir + "/fp/a.bin (the same "
                    "size, other tokens: their fingerprints differ)");
    }
    // Beside a shard that holds batches, one with too few sequences for a batch (a dataset's last, say)
    // is skipped with one warning line; every shard short is the error.
    {
        std::string err;
        BertShard big = synthetic(BertShardKind::Classify, 300, 64, 0, 29, 3), small = big;
        small.lengths.resize(5);
        small.labels.resize(5);
        small.tokens.resize(std::accumulate(small.lengths.begin(), small.lengths.end(), (size_t)0));
        std::filesystem::create_directories(dir + "/skip");
        bool wrote = write_bert_shard(dir + "/skip/a.bin", big, &err) && write_bert_shard(dir + "/skip/b.bin", small, &err);
        th::ChildOutput child = th::run_in_child([&] {
            BertDataLoader l(dir + "/skip/*.bin", loader_options(8, 64));
            if (l.num_shards() != 1 || l.num_sequences() != 300) exit(3);
        });
        th::report(wrote && WIFEXITED(child.status) && WEXITSTATUS(child.status) == 0 &&
                       child.text == "warning: skipped " + dir + "/skip/b.bin: 5 sequences, too few for one batch (B=8 "
                                     "x 1 rank = 8)\n",
                   "loader: a shard with too few sequences for a batch beside others is skipped, with one warning",
                   "exit %d, stderr: %s", WEXITSTATUS(child.status), child.text.c_str());
        expect_exit("loader refuses: every shard of the pattern too short for a batch", dir + "/skip/*.bin",
                    loader_options(400, 64), "a.bin: 300 sequences, too few for one batch (B=400 x 1 rank = 400), as "
                    "every shard of the pattern");
    }
    // Classification shards of one pattern whose labels differ (other names, or the same in another
    // order): refused when the loader opens them, not when training first reaches the second shard.
    {
        std::string err;
        BertShard a = synthetic(BertShardKind::Classify, 300, 64, 0, 23, 3), b = a, c = a;
        std::swap(b.label_names[0], b.label_names[1]);
        c.label_names.back() = "other";
        std::filesystem::create_directories(dir + "/lab");
        bool wrote = write_bert_shard(dir + "/lab/a.bin", a, &err) && write_bert_shard(dir + "/lab/b.bin", b, &err) &&
                     write_bert_shard(dir + "/lab/c.bin", c, &err);
        th::report(wrote, "loader: shards with other labels written", "%s", err.c_str());
        expect_exit("loader refuses at once: shards of one pattern with the labels in another order",
                    dir + "/lab/[ab].bin", loader_options(8, 64),
                    "b.bin: its labels differ from " + dir + "/lab/a.bin's (the same names in the same order are needed)");
        expect_exit("loader refuses at once: shards of one pattern with another label name", dir + "/lab/[ac].bin",
                    loader_options(8, 64), "c.bin: its labels differ from " + dir + "/lab/a.bin's");
    }
}

// ---------------------------------------------------------------------------------------------
// The format's checks

void test_format() {
    BertShard good = synthetic(BertShardKind::Classify, 5, 16, 0, 7, 2);
    std::string err;
    std::string path = dir + "/fmt.bin";
    write_bert_shard(path, good, &err);
    std::vector<uint8_t> bytes;
    read_whole_file(path, &bytes, &err);
    BertShard back;
    bool ok = parse_bert_shard(bytes.data(), bytes.size(), &back, &err);
    th::report(ok && back.tokens == good.tokens && back.lengths == good.lengths && back.labels == good.labels &&
                   back.label_names == good.label_names && back.offsets == good.offsets,
               "format: a shard reads back as written", "%s", err.c_str());

    const size_t H = 1024, tok = H, len = H + 2 * good.tokens.size(), lab = len + 4 * 5, names = lab + 4 * 5;
    auto put32 = [](std::vector<uint8_t>* b, size_t at, int32_t v) { memcpy(b->data() + at, &v, 4); };
    struct Case {
        const char* name;
        std::function<void(std::vector<uint8_t>*)> corrupt;
        const char* want;
    };
    std::vector<Case> cases = {
        {"bad magic", [&](auto* b) { put32(b, 0, 20240520); }, "a GPT-2 token shard"},
        {"version", [&](auto* b) { put32(b, 4, 2); }, "unsupported BERT shard version 2"},
        {"kind", [&](auto* b) { put32(b, 8, 3); }, "unknown kind 3"},
        {"truncated", [&](auto* b) { b->pop_back(); }, "truncated or corrupt"},
        {"reserved header int", [&](auto* b) { put32(b, 4 * 100, 1); }, "header int 100 is 1 (reserved"},
        {"special ids clash", [&](auto* b) { put32(b, 4 * 10, 2); }, "[CLS] and [SEP] have the same id 2"},
        {"token id >= vocab", [&](auto* b) { b->at(tok + 2) = 0xE8, b->at(tok + 3) = 0x03; }, "token id 1000 at position 1 is outside the vocabulary"},
        {"length < 2", [&](auto* b) { put32(b, len, 1); }, "sequence 0 has length 1"},
        {"length > max_len", [&](auto* b) { put32(b, len + 4, 17); }, "sequence 1 has length 17"},
        {"lengths sum", [&](auto* b) { put32(b, len, good.lengths[0] + 1); put32(b, len + 4, good.lengths[1] - 1); }, "does not end with [SEP]"},
        {"no [CLS]", [&](auto* b) { b->at(tok) = 5; }, "sequence 0 does not start with [CLS]"},
        {"label >= num_labels", [&](auto* b) { put32(b, lab + 8, 2); }, "label 2 of sequence 2 is outside [0, num_labels 2)"},
        {"negative label", [&](auto* b) { put32(b, lab, -1); }, "label -1 of sequence 0"},
        {"duplicate label names", [&](auto* b) { b->at(names + 14) = '0'; }, "label name 'class_0' appears twice"},
        {"names without newline", [&](auto* b) { b->back() = 'x'; }, "do not end with a newline"},
    };
    for (const Case& c : cases) {
        std::vector<uint8_t> b = bytes;
        c.corrupt(&b);
        BertShard s;
        std::string why;
        bool refused = !parse_bert_shard(b.data(), b.size(), &s, &why) && why.find(c.want) != std::string::npos;
        std::string name = std::string("format refuses: ") + c.name;
        th::report(refused, name.c_str(), "%s", why.c_str());
    }
    // The loader names the file.
    std::vector<uint8_t> b = bytes;
    put32(&b, len, 1);
    write_text(dir + "/fmt_bad.bin", std::string(b.begin(), b.end()));
    th::ChildOutput child = th::run_in_child([&] { BertDataLoader l(dir + "/fmt_bad.bin", loader_options(2, 16)); });
    while (!child.text.empty() && child.text.back() == '\n') child.text.pop_back();
    th::report(WIFEXITED(child.status) && WEXITSTATUS(child.status) == 1 &&
                   child.text.find("error: " + dir + "/fmt_bad.bin: sequence 0 has length 1") == 0,
               "loader refuses a corrupt shard with one line naming it", "%s", child.text.c_str());
    // A pipe matching the pattern is refused before it is opened (the open would block forever).
    std::string fifo = dir + "/fmt_pipe.bin";
    mkfifo(fifo.c_str(), 0600);
    child = th::run_in_child([&] { BertDataLoader l(fifo, loader_options(2, 16)); });
    while (!child.text.empty() && child.text.back() == '\n') child.text.pop_back();
    th::report(WIFEXITED(child.status) && WEXITSTATUS(child.status) == 1 &&
                   child.text.find(fifo + " is not a regular file (a pipe, socket or device): BERT shards are files") !=
                       std::string::npos,
               "loader refuses a pipe with one line naming it", "%s", child.text.c_str());
}

// ---------------------------------------------------------------------------------------------
// The bundled default task

void test_default_task() {
    const std::string base = "dev/data/bert/genre";
    BertDataLoader::Options o = loader_options(32, 128);
    o.vocab_size = 30522;
    BertDataLoader train(base + "_train.bin", o);
    o.eval = true;
    BertDataLoader val(base + "_val.bin", o);
    size_t per_label[2][2] = {};
    for (int s = 0; s < 2; s++) {
        BertDataLoader& l = s ? val : train;
        l.reset();
        for (size_t p = 0; p < l.batches_per_epoch(); p++, l.next_batch())
            for (int b = 0; b < l.num_real(); b++) per_label[s][l.targets()[b]]++;
    }
    th::report(!train.is_mlm() && train.num_labels() == 2 && train.label_name(0) == "comedy" &&
                   train.label_name(1) == "tragedy" && train.num_sequences() == 4000 && val.num_sequences() == 1000 &&
                   per_label[1][0] == 500 && per_label[1][1] == 500 && per_label[0][0] + per_label[0][1] == 4000 - 4000 % 32,
               "default task: genre_train.bin / genre_val.bin load (comedy/tragedy, 4000 + 1000, balanced)",
               "train %zu/%zu per epoch, val %zu/%zu", per_label[0][0], per_label[0][1], per_label[1][0], per_label[1][1]);
    // The tool rebuilds them from the committed TSVs byte for byte.
    bd::Options t = classify_options(base + "_train.tsv", "genre", 128);
    t.val_input = base + "_val.tsv";
    std::string error;
    bool ok = run_tool(t, &error);
    bool same = ok;
    for (const char* split : {"_train.bin", "_val.bin"}) {
        std::vector<uint8_t> a, b;
        same &= read_whole_file(base + split, &a, &error) && read_whole_file(dir + "/genre" + split, &b, &error) && a == b;
    }
    th::report(same, "default task: bert_data rebuilds the committed shards from the TSVs byte for byte", "%s", error.c_str());
}

int main() {
    WordPiece wp;
    std::string error;
    if (!wp.load(VOCAB, &error)) {
        th::report(false, "bert-base-uncased vocab loads", "%s", error.c_str());
        return th::finish();
    }
    char tmpl[] = "/tmp/llmc_bert_data_XXXXXX";
    dir = mkdtemp(tmpl);
    test_classify_tool(wp);
    test_mlm_tool(wp);
    test_tool_errors();
    test_inputs_and_out();
    test_no_half_written();
    test_format();
    test_loader();
    test_default_task();
    std::string cmd = "rm -rf " + dir;
    if (system(cmd.c_str()) != 0) fprintf(stderr, "could not remove %s\n", dir.c_str());
    return th::finish();
}
