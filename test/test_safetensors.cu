// test/test_safetensors.cu — the safetensors reader/writer (llmc/safetensors.h) and the JSON reader
// under it (llmc/json.h): round trips (F32 exact, BF16 rounded to nearest even, checked against an
// independent rounding and CUDA's), F16 widening of all 65536 values against CUDA's, files written by
// the reference implementation, every malformed file refused with the reason named, sharded
// checkpoints (an index and its shards) and save_pretrained directories (hf_weights_file), PyTorch
// pickles named as such.
#include "../llmc/cuda_common.h"
#include "../llmc/safetensors.h"
#include "harness.h"

#include <unistd.h>

// A safetensors file from a header text (its length field computed unless `length` is given) and
// data_bytes bytes of data (0, 1, 2, ...).
std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes, uint64_t length = UINT64_MAX) {
    uint64_t n = length == UINT64_MAX ? header.size() : length;
    std::vector<uint8_t> f(8 + header.size() + data_bytes);
    memcpy(f.data(), &n, 8);
    memcpy(f.data() + 8, header.data(), header.size());
    for (size_t i = 0; i < data_bytes; i++) f[8 + header.size() + i] = (uint8_t)i;
    return f;
}

// The parser must refuse the file with an error containing reason.
void expect_refused(const char* name, const std::vector<uint8_t>& file, const std::string& reason) {
    SafeTensors st;
    std::string err;
    bool parsed = st.parse(file.data(), file.size(), &err);
    th::report(!parsed && err.find(reason) != std::string::npos, name, "%s", parsed ? "(parsed!)" : err.c_str());
}

// The JSON reader must refuse text with an error containing reason.
void expect_json_refused(const char* name, const std::string& text, const std::string& reason) {
    json::Value v;
    std::string err;
    bool parsed = json::parse(text.data(), text.size(), &v, &err);
    th::report(!parsed && err.find(reason) != std::string::npos, name, "%s", parsed ? "(parsed!)" : err.c_str());
}

// Round to nearest even into bf16, computed independently of the bit trick under test: the two bf16
// neighbours of x and their exact distances to x in double (the one above the largest finite bf16
// is 2^128, which rounds to infinity as IEEE specifies).
uint16_t bf16_reference(float x) {
    uint32_t w;
    memcpy(&w, &x, 4);
    if (std::isnan(x)) return (uint16_t)((w >> 16) | 0x40);
    if (std::isinf(x)) return (uint16_t)(w >> 16);
    uint32_t lo_bits = w & 0xFFFF0000u;
    float lo;
    memcpy(&lo, &lo_bits, 4);
    int biased = (int)((lo_bits >> 23) & 0xFF);
    double ulp = std::ldexp(1.0, (biased ? biased : 1) - 127 - 7);  // one bf16 step at lo's exponent
    double below = std::fabs((double)x - lo), above = ulp - below;
    bool up = above < below || (above == below && ((lo_bits >> 16) & 1));
    return (uint16_t)((lo_bits >> 16) + (up ? 1 : 0));
}

// Whether two parsed JSON values are the same value (numbers as doubles, and as exact integers when
// both are; object keys in order).
bool same_json(const json::Value& a, const json::Value& b) {
    if (a.type != b.type || a.boolean != b.boolean || a.str != b.str ||
        a.items.size() != b.items.size() || a.fields.size() != b.fields.size())
        return false;
    if (a.number != b.number || (a.is_int && b.is_int && a.integer != b.integer)) return false;
    for (size_t i = 0; i < a.items.size(); i++)
        if (!same_json(a.items[i], b.items[i])) return false;
    for (size_t i = 0; i < a.fields.size(); i++)
        if (a.fields[i].first != b.fields[i].first || !same_json(a.fields[i].second, b.fields[i].second)) return false;
    return true;
}

void test_json() {
    json::Value v;
    std::string err;
    std::string text = R"(  {"s": "q\"b\\s\/ \b\f\n\r\t \u00e9 \ud83d\ude00 é", "t": true, "f": false, "n": null,)"
                       R"( "a": [1, -0, 2.5, 1e3, 9007199254740992, 9007199254740993, -9007199254740992], "o": {}} )";
    bool ok = json::parse(text.data(), text.size(), &v, &err);
    const json::Value* s = v.get("s");
    const json::Value* a = v.get("a");
    ok = ok && s && s->str == "q\"b\\s/ \b\f\n\r\t \xC3\xA9 \xF0\x9F\x98\x80 \xC3\xA9";
    ok = ok && v.get("t")->boolean && !v.get("f")->boolean && v.get("n")->type == json::Value::Null;
    ok = ok && v.get("o")->type == json::Value::Object && v.get("o")->fields.empty();
    th::report(ok, "json: strings with every escape (incl. a surrogate pair) and raw UTF-8, literals", "%s", err.c_str());
    ok = a && a->items.size() == 7 && a->items[0].is_int && a->items[0].integer == 1 && a->items[1].is_int &&
         a->items[1].integer == 0 && !a->items[2].is_int && a->items[2].number == 2.5 && !a->items[3].is_int &&
         a->items[3].number == 1000 && a->items[4].is_int && a->items[4].integer == (int64_t)1 << 53 &&
         !a->items[5].is_int && a->items[6].is_int && a->items[6].integer == -((int64_t)1 << 53);
    th::report(ok, "json: integers exact up to 2^53 (is_int), beyond and with fraction/exponent as doubles");
    std::string odd = std::string("ctl \x01\x1f \"q\" \\ /\n\t") + "\xE2\x9C\x93";
    std::string quoted = json::quote(odd);
    ok = json::parse(quoted.data(), quoted.size(), &v, &err) && v.type == json::Value::String && v.str == odd;
    th::report(ok, "json: quote() round-trips control characters, quotes, backslashes, UTF-8", "%s", quoted.c_str());
    // write(): parse(write(v)) is v again, and the layout is Python's json.dumps(v, indent=2) (the
    // text below is what Python 3 prints for this value), which transformers' config.json files use.
    json::Value back;
    ok = json::parse(text.data(), text.size(), &v, &err);
    std::string written = json::write(v);
    ok = ok && json::parse(written.data(), written.size(), &back, &err) && same_json(v, back);
    th::report(ok, "json: write() then parse() gives the same value (escapes, exact integers, doubles)", "%s",
               ok ? "" : written.c_str());
    std::string dumps = "{\n  \"a\": [\n    1,\n    0.1,\n    1e-05,\n    -2.5e+20,\n    0.0,\n    -100.0,\n"
                        "    0.0001,\n    1e+16,\n    123.456,\n    1000000000000000.0,\n    5e-324,\n"
                        "    1.7976931348623157e+308,\n    -18446744073709551615\n  ],\n  \"b\": {},\n  \"c\": [],\n"
                        "  \"d\": {\n    \"e\": null,\n    \"f\": true,\n    \"s\": \"x\\\"y\"\n  }\n}";
    std::string compact = R"({"a": [1, 0.1, 1e-5, -2.5e20, 0.0, -1e2, 1e-4, 1e16, 123.456, 1e15, 5e-324,)"
                          R"( 1.7976931348623157e308, -18446744073709551615], "b": {}, "c": [], "d": {"e": null, "f": true, "s": "x\"y"}})";
    ok = json::parse(compact.data(), compact.size(), &v, &err);
    std::string got = ok ? json::write(v) : err;
    th::report(got == dumps, "json: write() lays out as json.dumps(indent=2), shortest doubles, big integers exact", "%s",
               got == dumps ? "" : got.c_str());
    std::string deep64 = std::string(64, '[') + std::string(64, ']');
    th::report(json::parse(deep64.data(), deep64.size(), &v, &err), "json: 64 nested arrays parse (the depth limit)");

    expect_json_refused("json refuses: 65 nested arrays", std::string(65, '[') + std::string(65, ']'),
                        "nesting deeper than the limit of 64 levels");
    expect_json_refused("json refuses: a bad literal, with its byte offset", R"({"a": tru})", "at byte 6: invalid literal");
    expect_json_refused("json refuses: leading zero", "[01]", "leading zero");
    expect_json_refused("json refuses: '1.'", "[1.]", "expected a digit after '.'");
    expect_json_refused("json refuses: '+1'", "[+1]", "unexpected character");
    expect_json_refused("json refuses: '-'", "[-]", "expected a digit");
    expect_json_refused("json refuses: exponent without digits", "[1e]", "exponent");
    expect_json_refused("json refuses: NaN, saying what it is", "[NaN]", "NaN and Infinity are not JSON numbers");
    expect_json_refused("json refuses: -Infinity, saying what it is", "[-Infinity]", "NaN and Infinity are not JSON");
    expect_json_refused("json refuses: trailing comma", "[1,]", "unexpected character");
    expect_json_refused("json refuses: a duplicate key", R"({"a": 1, "a": 2})", "duplicate key \"a\"");
    expect_json_refused("json refuses: a lone high surrogate", R"(["\ud800x"])", "high surrogate");
    expect_json_refused("json refuses: a lone low surrogate", R"(["\udc00"])", "lone low surrogate");
    expect_json_refused("json refuses: a bad escape", R"(["\x"])", "invalid escape");
    expect_json_refused("json refuses: a raw control character", "[\"a\x01\"]", "unescaped control character");
    expect_json_refused("json refuses: invalid UTF-8", "[\"\xff\"]", "invalid UTF-8 byte");
    expect_json_refused("json refuses: overlong UTF-8", "[\"\xc0\xaf\"]", "invalid UTF-8 byte");
    expect_json_refused("json refuses: overlong 3-byte UTF-8", "[\"\xe0\x80\xaf\"]", "overlong");
    expect_json_refused("json refuses: UTF-8-encoded surrogate", "[\"\xed\xa0\x80\"]", "surrogate");
    expect_json_refused("json refuses: truncated UTF-8", "[\"\xe2\x9c", "truncated UTF-8");
    expect_json_refused("json refuses: unterminated string", "[\"abc", "unterminated string");
    expect_json_refused("json refuses: content after the value", "{} x", "unexpected content after the JSON value");
    expect_json_refused("json refuses: empty input", "  ", "unexpected end of input");
}

void test_round_trip() {
    // F32: exact, including a scalar, an empty tensor and a name that needs escaping.
    std::vector<float> a(6), scalar = {-3.25f}, big(1000);
    th::fill_uniform(a.data(), a.size(), 1);
    th::fill_uniform(big.data(), big.size(), 2, -100.f, 100.f);
    a[0] = -0.f;
    a[1] = INFINITY;
    std::string odd_name = "odd \"name\" \\ \xE2\x9C\x93";
    SafeTensorsWriter w;
    w.add("bf", a.data() + 2, {3}, true);  // 6 bytes: an F32 tensor right after it would be misaligned
    w.add("a", a.data(), {2, 3});
    w.add("scalar", scalar.data(), {});
    w.add("empty", nullptr, {0, 4});
    w.add(odd_name, big.data(), {10, 10, 10});
    w.set_metadata("note", "x\ty");
    std::vector<uint8_t> file = w.serialize();
    SafeTensors st;
    std::string err;
    bool ok = st.parse(file.data(), file.size(), &err);
    uint64_t n;
    memcpy(&n, file.data(), 8);
    bool padded = n % 8 == 0 && file[8 + n - 1] != 0;
    for (uint64_t i = n; i > 0 && file[8 + i - 1] != '}'; i--) padded &= file[8 + i - 1] == ' ';
    th::report(ok && padded && st.tensors().size() == 5, "safetensors: header padded with spaces to a multiple of 8",
               "header %llu bytes %s", (unsigned long long)n, err.c_str());
    const SafeTensor* ta = st.find("a");
    const SafeTensor* ts = st.find("scalar");
    const SafeTensor* te = st.find("empty");
    const SafeTensor* tb = st.find(odd_name);
    std::vector<float> ra, rs, rb, re;
    ok = ok && ta && ts && te && tb && ta->dtype == "F32" && ta->shape == std::vector<size_t>{2, 3} &&
         ts->shape.empty() && ts->numel == 1 && te->numel == 0 && te->shape == std::vector<size_t>{0, 4} &&
         SafeTensors::to_float(*ta, &ra, &err) && SafeTensors::to_float(*ts, &rs, &err) &&
         SafeTensors::to_float(*te, &re, &err) && SafeTensors::to_float(*tb, &rb, &err) && re.empty() &&
         memcmp(ra.data(), a.data(), 24) == 0 && rs[0] == -3.25f && memcmp(rb.data(), big.data(), 4000) == 0;
    ok = ok && st.metadata().size() == 3 && st.metadata().at("format") == "pt" && st.metadata().at("note") == "x\ty" &&
         st.metadata().count(SafeTensors::kChecksumKey);
    th::report(ok, "safetensors: F32 round trip is bit-exact (matrix, scalar, empty tensor, escaped name, metadata)",
               "%s", err.c_str());
    // The data's checksum (llmc_checksum, 16 hex digits): one bit flipped anywhere in the data is
    // refused by name; without the key (a file of transformers') nothing is checked.
    {
        const std::string recorded = st.metadata().count(SafeTensors::kChecksumKey)
                                         ? st.metadata().at(SafeTensors::kChecksumKey) : "";
        size_t refused = 0, flips = 0;
        std::string why;
        for (size_t at = 8 + n; at < file.size(); at += 397, flips++) {
            std::vector<uint8_t> bad = file;
            bad[at] ^= (uint8_t)(1u << (at % 8));
            SafeTensors check;
            if (!check.parse(bad.data(), bad.size(), &why) && why.find("checksum mismatch") != std::string::npos)
                refused++;
        }
        // The same file with the key renamed (same length, so the header still parses), then a flip.
        std::string header((const char*)file.data() + 8, n);
        size_t key = header.find(SafeTensors::kChecksumKey);
        std::vector<uint8_t> unkeyed = file;
        if (key != std::string::npos) unkeyed[8 + key] = 'L';
        unkeyed.back() ^= 0x01;
        SafeTensors plain;
        bool unchecked = key != std::string::npos && plain.parse(unkeyed.data(), unkeyed.size(), &why);
        th::report(recorded.size() == 16 && flips > 5 && refused == flips && unchecked,
                   "safetensors: llmc_checksum recorded; a flipped data bit refused; no key, no check",
                   "%zu of %zu flips refused (%s)", refused, flips, recorded.c_str());
    }
    ok = true;
    for (const SafeTensor& t : st.tensors()) ok &= (size_t)(t.data - file.data()) % t.elem_size == 0;
    th::report(ok, "safetensors: every tensor's data starts aligned to its element size in the file");

    // BF16: nearest even. Ties in both directions, values just off a tie, the largest finite values
    // (rounding up to infinity past the last bf16 step), subnormals, signed zeros, NaN, plus random.
    std::vector<uint32_t> bits = {0x3F808000u, 0x3F818000u, 0x3F808001u, 0x3F807FFFu, 0xBF808000u, 0xBF818000u,
                                  0x7F7FFFFFu, 0x7F7F7FFFu, 0x7F7F8000u, 0x00008000u, 0x00018000u, 0x00000001u,
                                  0x80000000u, 0x00000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFF800001u};
    std::vector<float> x(bits.size());
    memcpy(x.data(), bits.data(), bits.size() * 4);
    std::vector<float> r(20000);
    th::fill_uniform(r.data(), r.size(), 3, -4.f, 4.f);
    for (size_t i = 0; i < r.size(); i += 2) r[i] *= std::ldexp(1.f, (int)(i % 200) - 100);  // many exponents
    x.insert(x.end(), r.begin(), r.end());
    SafeTensorsWriter wb;
    wb.add("x", x.data(), {x.size()}, true);
    file = wb.serialize();
    ok = st.parse(file.data(), file.size(), &err) && st.find("x") && st.find("x")->dtype == "BF16";
    std::vector<float> back;
    ok = ok && SafeTensors::to_float(*st.find("x"), &back, &err);
    size_t bad_ref = 0, bad_cuda = 0, first_bad = 0;
    for (size_t i = 0; ok && i < x.size(); i++) {
        uint16_t got;
        memcpy(&got, st.find("x")->data + 2 * i, 2);
        __nv_bfloat16 cu = __float2bfloat16(x[i]);
        uint16_t cu_bits;
        memcpy(&cu_bits, &cu, 2);
        bool nan = std::isnan(x[i]);
        if (nan ? !std::isnan(back[i]) : got != bf16_reference(x[i])) { if (!bad_ref++) first_bad = i; }
        if (nan ? false : got != cu_bits) bad_cuda++;
        if (!nan && back[i] != SafeTensors::bf16_to_float(got)) bad_ref++;
    }
    th::report(ok && bad_ref == 0, "safetensors: BF16 writes round to nearest even (vs an independent reference)",
               "%zu values, %zu differ (first at %zu) %s", x.size(), bad_ref, first_bad, err.c_str());
    th::report(ok && bad_cuda == 0, "safetensors: BF16 writes equal CUDA's __float2bfloat16 (non-NaN)", "%zu differ",
               bad_cuda);

    // F16 read: all 65536 bit patterns widen as CUDA's __half2float does (NaN to NaN).
    std::vector<uint16_t> halves(65536);
    for (size_t i = 0; i < halves.size(); i++) halves[i] = (uint16_t)i;
    std::string header = "{\"h\":{\"dtype\":\"F16\",\"shape\":[65536],\"data_offsets\":[0,131072]}}";
    file = make_file(header, 131072);
    memcpy(file.data() + 8 + header.size(), halves.data(), 131072);
    ok = st.parse(file.data(), file.size(), &err) && SafeTensors::to_float(*st.find("h"), &back, &err);
    size_t bad = 0;
    for (size_t i = 0; ok && i < halves.size(); i++) {
        __half_raw raw;
        raw.x = halves[i];
        float want = __half2float(__half(raw));
        bool same = std::isnan(want) ? std::isnan(back[i]) : memcmp(&want, &back[i], 4) == 0;
        if (!same) bad++;
    }
    th::report(ok && bad == 0 && back[0x3C00] == 1.f && back[0x0001] == std::ldexp(1.f, -24) && back[0x7BFF] == 65504.f,
               "safetensors: F16 reads widen all 65536 values exactly (vs CUDA's __half2float)", "%zu differ %s", bad,
               err.c_str());
}

void test_reference_files() {
    // Files written by the reference implementation (Python safetensors via transformers).
    SafeTensors st;
    std::string err;
    bool ok = st.load("test/fixtures/hf_gpt2_tiny/model.safetensors", &err);
    th::report(ok && st.tensors().size() == 28 && st.metadata().count("format") && st.metadata().at("format") == "pt",
               "safetensors: reads transformers' save_pretrained file", "%zu tensors %s", st.tensors().size(), err.c_str());
    ok = st.load("test/fixtures/hf_gpt2_tiny_logits.safetensors", &err) && st.find("tokens") && st.find("logits");
    std::vector<float> v;
    bool refused = ok && !SafeTensors::to_float(*st.find("tokens"), &v, &err) && err.find("dtype I32") != std::string::npos;
    th::report(ok && refused, "safetensors: an I32 tensor parses but to_float refuses it by dtype", "%s", err.c_str());
    // The reference serializer's output for no tensors: "{}" and 6 spaces, no data.
    std::vector<uint8_t> empty = make_file("{}      ", 0);
    th::report(st.parse(empty.data(), empty.size(), &err) && st.tensors().empty(), "safetensors: a file with no tensors");
    // Empty tensors take no bytes and may share an offset.
    std::vector<uint8_t> f = make_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                                       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                       R"("c":{"dtype":"BF16","shape":[3,0],"data_offsets":[4,4]}})", 4);
    err.clear();
    th::report(st.parse(f.data(), f.size(), &err) && st.tensors().size() == 3, "safetensors: empty tensors anywhere",
               "%s", err.c_str());

    ok = !st.load("/nonexistent/x.safetensors", &err) && err.find("/nonexistent/x.safetensors") != std::string::npos;
    th::report(ok, "safetensors: load() of a missing file names it", "%s", err.c_str());
    SafeTensorsWriter w;
    ok = !w.write("/nonexistent/dir/x.safetensors", &err) && err.find("cannot write /nonexistent/dir/x.safetensors.tmp") != std::string::npos;
    th::report(ok, "safetensors: write() to an impossible path fails with the path", "%s", err.c_str());
    char tmpl[] = "/tmp/llmc_safetensors_XXXXXX";
    std::string dir = mkdtemp(tmpl);
    std::string path = dir + "/t.safetensors";
    float one = 1.f;
    w.add("one", &one, {1});
    err.clear();
    ok = w.write(path, &err) && access((path + ".tmp").c_str(), F_OK) != 0 && st.load(path, &err) && st.find("one");
    th::report(ok, "safetensors: write() goes through PATH.tmp and renames it", "%s", err.c_str());
    remove(path.c_str());
    // A directory where the file should be: opening it succeeds, so the reader must ask first.
    std::string folder = dir + "/model.safetensors";
    ok = mkdir(folder.c_str(), 0700) == 0 && !st.load(folder, &err) && err == folder + " is a directory";
    th::report(ok, "safetensors: load() of a directory says so", "%s", err.c_str());
    rmdir(folder.c_str());
    rmdir(dir.c_str());
}

// Writes text to path.
void write_text(const std::string& path, const std::string& text) {
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(text.data(), 1, text.size(), f);
    fclose(f);
}

// Sharded checkpoints: model.safetensors.index.json's weight_map and the shards it names, as
// save_pretrained writes them above max_shard_size; and which file of a directory is the weights.
void test_sharded() {
    char tmpl[] = "/tmp/llmc_safetensors_shards_XXXXXX";
    std::string dir = mkdtemp(tmpl), err;
    // Three tensors over two shards, and the index that maps them.
    float a[3] = {1, 2, 3}, b[2] = {4, 5}, c[1] = {6};
    SafeTensorsWriter s1, s2;
    s1.add("a", a, {3});
    s1.add("b", b, {2}, true);
    s2.add("c", c, {1});
    bool ok = s1.write(dir + "/model-00001-of-00002.safetensors", &err) &&
              s2.write(dir + "/model-00002-of-00002.safetensors", &err);
    const std::string map = R"({"metadata": {"total_size": 20}, "weight_map": {"a": "model-00001-of-00002.safetensors", )"
                            R"("b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})";
    write_text(dir + "/model.safetensors.index.json", map);
    SafeTensors st;
    std::vector<float> va, vb, vc;
    ok = ok && st.load(dir + "/model.safetensors.index.json", &err) && st.tensors().size() == 3 && st.find("a") &&
         st.find("b") && st.find("c") && SafeTensors::to_float(*st.find("a"), &va, &err) &&
         SafeTensors::to_float(*st.find("b"), &vb, &err) && SafeTensors::to_float(*st.find("c"), &vc, &err) &&
         va == std::vector<float>(a, a + 3) && vb == std::vector<float>(b, b + 2) && vc[0] == 6.f;
    th::report(ok, "safetensors: a sharded checkpoint's index loads every shard's tensors", "%s", err.c_str());
    std::string file;
    ok = hf_weights_file(dir, &file, &err) && file == dir + "/model.safetensors.index.json";
    th::report(ok, "safetensors: a sharded save_pretrained directory's weights are its index", "%s", file.c_str());
    err.clear();
    ok = !hf_weights_file(dir + "/model-00002-of-00002.safetensors", &file, &err) &&
         err == dir + "/model-00002-of-00002.safetensors: one shard (2 of 2) of a sharded save, a part of the model: "
                      "give its folder, " + dir + ", or its model.safetensors.index.json";
    th::report(ok, "safetensors: one shard of a sharded save given as the model is refused, naming the folder", "%s",
               err.c_str());
    ok = hf_weights_file(dir + "/model-00001-of-00001.safetensors", &file, &err) &&
         file == dir + "/model-00001-of-00001.safetensors";
    th::report(ok, "safetensors: a save of one shard (1 of 1) is the whole model", "%s", file.c_str());

    // The index must describe the shards exactly.
    auto refused = [&](const char* name, const std::string& index, const std::string& reason) {
        write_text(dir + "/bad.index.json", index);
        SafeTensors bad;
        std::string why;
        bool loaded = bad.load(dir + "/bad.index.json", &why);
        th::report(!loaded && why.find(reason) != std::string::npos && why.find(dir) != std::string::npos, name, "%s",
                   loaded ? "(loaded!)" : why.c_str());
    };
    const std::string one = "\"model-00001-of-00002.safetensors\"", two = "\"model-00002-of-00002.safetensors\"";
    refused("safetensors sharded refuses: a shard that is not there",
            R"({"weight_map": {"a": "nowhere.safetensors"}})", "nowhere.safetensors: cannot open");
    refused("safetensors sharded refuses: a tensor the map puts in a shard without it",
            "{\"weight_map\": {\"a\": " + one + ", \"b\": " + one + ", \"c\": " + one + ", \"d\": " + two + "}}",
            "weight_map puts tensor \"c\" in model-00001-of-00002.safetensors, which does not hold it");
    refused("safetensors sharded refuses: a shard's tensor the map leaves out",
            "{\"weight_map\": {\"a\": " + one + ", \"c\": " + two + "}}",
            "tensor \"b\" is not in the weight_map of");
    refused("safetensors sharded refuses: no weight_map", R"({"metadata": {}})", "no \"weight_map\" object");
    refused("safetensors sharded refuses: a shard outside the index's directory",
            R"({"weight_map": {"a": "../model-00001-of-00002.safetensors"}})", "is not a file name");
    SafeTensorsWriter s3;  // "c" again, in a third shard
    s3.add("c", c, {1});  // (the map cannot name "c" twice: it names the shard under another key)
    s3.write(dir + "/extra.safetensors", &err);
    refused("safetensors sharded refuses: a tensor in two shards",
            "{\"weight_map\": {\"a\": " + one + ", \"b\": " + one + ", \"c\": " + two + ", \"c \": \"extra.safetensors\"}}",
            "tensor \"c\" is in two shards, model-00002-of-00002.safetensors and extra.safetensors");

    // A directory: model.safetensors first; only pickles, or nothing, refused with the reason.
    std::string sub = dir + "/single";
    mkdir(sub.c_str(), 0755);
    s2.write(sub + "/model.safetensors", &err);
    write_text(sub + "/model.safetensors.index.json", map);
    ok = hf_weights_file(sub, &file, &err) && file == sub + "/model.safetensors";
    th::report(ok, "safetensors: a directory's model.safetensors is its weights", "%s", file.c_str());
    std::string pickles = dir + "/pickles";
    mkdir(pickles.c_str(), 0755);
    write_text(pickles + "/pytorch_model.bin", std::string("PK\x03\x04", 4) + "rest of a zip");
    ok = !hf_weights_file(pickles, &file, &err) && err.find("holds pytorch_model.bin") != std::string::npos &&
         err.find("safe_serialization=True") != std::string::npos;
    th::report(ok, "safetensors: a directory of pytorch_model.bin is refused, saying how to save safetensors", "%s",
               err.c_str());
    std::string empty = dir + "/empty";
    mkdir(empty.c_str(), 0755);
    ok = !hf_weights_file(empty, &file, &err) && err.find("holds no model.safetensors") != std::string::npos;
    th::report(ok, "safetensors: a directory without weights is refused", "%s", err.c_str());
    ok = !st.load(pickles + "/pytorch_model.bin", &err) && err.find("a PyTorch pickle") != std::string::npos &&
         err.find("pytorch_model.bin") != std::string::npos;
    th::report(ok, "safetensors: load() of a pytorch_model.bin (zip) names it a PyTorch pickle", "%s", err.c_str());
    th::run_command("rm -rf " + dir);
}

void test_malformed() {
    const std::string t1 = R"("t":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";
    expect_refused("safetensors refuses: an empty file", {}, "too short for the 8-byte header length");
    expect_refused("safetensors refuses: 5 bytes", {1, 2, 3, 4, 5}, "too short");
    // torch.save's zip, and its legacy pickle (protocol 2, then its magic number as a LONG1)
    expect_refused("safetensors refuses: a PyTorch pickle (zip)", {'P', 'K', 3, 4, 20, 0, 0, 0, 8, 0},
                   "a PyTorch pickle (as pytorch_model.bin), not a safetensors file");
    const std::string lfs = "version https://git-lfs.github.com/spec/v1\noid sha256:4ef1\nsize 13274688\n";
    expect_refused("safetensors refuses: a Git LFS pointer, named as such", std::vector<uint8_t>(lfs.begin(), lfs.end()),
                   "a Git LFS pointer, not the file itself (a clone without git-lfs): fetch it with git lfs pull");
    expect_refused("safetensors refuses: a PyTorch pickle (legacy)", {0x80, 2, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9},
                   "a PyTorch pickle");
    expect_refused("safetensors refuses: header length beyond the file", make_file("{" + t1 + "}", 24, 1000),
                   "header length 1000 is beyond the file");
    expect_refused("safetensors refuses: a header length near 2^64", make_file("{}", 0, UINT64_MAX - 1),
                   "is absurd");
    expect_refused("safetensors refuses: absurd header length (> 100 MB)", make_file("{}", 0, 200000000),
                   "header length 200000000 is absurd");
    expect_refused("safetensors refuses: invalid JSON", make_file("{\"t\":", 0), "header: JSON error at byte 5");
    const std::string config = "{\n  \"architectures\": [\"BertModel\"],\n  \"hidden_size\": 384\n}\n";
    expect_refused("safetensors refuses: a config.json, named as such", std::vector<uint8_t>(config.begin(), config.end()),
                   "a JSON file (config.json?), not a safetensors file: for a Hugging Face checkpoint give its directory");
    // The project's data shards given as a model: a GPT-2 token shard (magic 20240520, version 1) and a
    // BERT shard ("BERT", version 1), each with a few bytes after its header's start.
    std::vector<uint8_t> gpt2_shard(1024 + 8, 0), bert_shard(1024 + 8, 0);
    const int32_t gpt2_head[2] = {20240520, 1}, bert_version = 1;
    memcpy(gpt2_shard.data(), gpt2_head, 8);
    memcpy(bert_shard.data(), "BERT", 4);
    memcpy(bert_shard.data() + 4, &bert_version, 4);
    expect_refused("safetensors refuses: a GPT-2 token shard, named as such", gpt2_shard,
                   "a GPT-2 token shard (train_gpt2's -i), not a safetensors file");
    expect_refused("safetensors refuses: a BERT data shard, named as such", bert_shard,
                   "a BERT data shard (train_bert's -i), not a safetensors file");
    {  // a real header of 123 bytes: its length's first byte is '{' too
        std::vector<uint8_t> f = make_file("{}" + std::string(121, ' '), 0);
        SafeTensors st;
        std::string err;
        th::report(f[0] == '{' && st.parse(f.data(), f.size(), &err), "safetensors: a 123-byte header (length byte "
                   "'{') is not taken for a JSON file", "%s", err.c_str());
    }
    expect_refused("safetensors refuses: invalid UTF-8 in a name",
                   make_file("{\"\xff\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4), "invalid UTF-8");
    expect_refused("safetensors refuses: a header that is not an object", make_file("[1, 2]", 0),
                   "header is an array, not a JSON object");
    expect_refused("safetensors refuses: trailing bytes after the JSON (not spaces)", make_file("{} x", 0),
                   "unexpected content after the JSON value");
    expect_refused("safetensors refuses: missing dtype", make_file(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4),
                   "tensor \"t\": missing field \"dtype\"");
    expect_refused("safetensors refuses: missing shape", make_file(R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", 4),
                   "missing field \"shape\"");
    expect_refused("safetensors refuses: missing data_offsets", make_file(R"({"t":{"dtype":"F32","shape":[1]}})", 4),
                   "missing field \"data_offsets\"");
    expect_refused("safetensors refuses: a tensor entry that is not an object", make_file(R"({"t":[1]})", 0),
                   "tensor \"t\" is described by an array, not an object");
    expect_refused("safetensors refuses: dtype not a string",
                   make_file(R"({"t":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4), "dtype is a number");
    expect_refused("safetensors refuses: unknown dtype",
                   make_file(R"({"t":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4), "unknown dtype \"F33\"");
    expect_refused("safetensors refuses: shape * dtype size != end - begin",
                   make_file(R"({"t":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20),
                   "shape [2, 3] of F32 is 24 bytes but data_offsets [0, 20] hold 20");
    expect_refused("safetensors refuses: offsets out of range", make_file("{" + t1 + "}", 16),
                   "data_offsets [0, 24] are out of range (the data is 16 bytes: a truncated file?)");
    expect_refused("safetensors refuses: end before begin",
                   make_file(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8), "end before they begin");
    expect_refused("safetensors refuses: overlapping tensors",
                   make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                   "tensors \"a\" and \"b\" overlap");
    expect_refused("safetensors refuses: a hole between tensors",
                   make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20),
                   "bytes 8..12 of the data belong to no tensor");
    expect_refused("safetensors refuses: data not starting at offset 0",
                   make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                   "bytes 0..4 of the data belong to no tensor");
    expect_refused("safetensors refuses: data the tensors do not cover",
                   make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12),
                   "bytes 8..12 of the data belong to no tensor");
    expect_refused("safetensors refuses: duplicate tensor names",
                   make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                   "duplicate key \"a\"");
    expect_refused("safetensors refuses: a negative dimension",
                   make_file(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "shape[0] is negative");
    expect_refused("safetensors refuses: a negative offset",
                   make_file(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4),
                   "data_offsets begin is negative");
    expect_refused("safetensors refuses: a fractional dimension",
                   make_file(R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
                   "shape[0] is not an integer");
    expect_refused("safetensors refuses: a dimension that is a string",
                   make_file(R"({"t":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", 4),
                   "shape[0] is a string, not an integer");
    expect_refused("safetensors refuses: an offset above 2^53",
                   make_file(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,9007199254740996]}})", 4),
                   "data_offsets end is not an integer in [0, 2^53]");
    expect_refused("safetensors refuses: a shape of more than 2^53 elements",
                   make_file(R"({"t":{"dtype":"F32","shape":[67108864,67108864,67108864],"data_offsets":[0,4]}})", 4),
                   "shape has more than 2^53 elements");
    expect_refused("safetensors refuses: data_offsets with 3 numbers",
                   make_file(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 4),
                   "data_offsets must be an array [begin, end]");
    expect_refused("safetensors refuses: a non-string __metadata__ value",
                   make_file(R"({"__metadata__":{"format":1}})", 0), "__metadata__ value of \"format\" is a number");
    expect_refused("safetensors refuses: __metadata__ not an object", make_file(R"({"__metadata__":"pt"})", 0),
                   "__metadata__ is a string, not an object");
    expect_refused("safetensors refuses: JSON nested too deep",
                   make_file("{\"__metadata__\":" + std::string(100, '[') + std::string(100, ']') + "}", 0),
                   "nesting deeper than the limit");
}

int main() {
    test_json();
    test_round_trip();
    test_reference_files();
    test_malformed();
    test_sharded();
    return th::finish();
}
