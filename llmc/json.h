// llmc/json.h — a small, strict JSON reader (RFC 8259) for safetensors headers and Hugging Face
// config.json files, plus the string quoting and float formatting a JSON writer needs. Host C++17,
// standard library only.
//
// Strict means: one value, surrounded by nothing but whitespace; UTF-8 validated (no overlong forms,
// no surrogates, nothing above U+10FFFF); escapes checked, \uXXXX surrogate pairs joined and lone
// surrogates refused; numbers follow the grammar exactly (no leading zeros, no '+', no NaN); objects
// with a repeated key are refused (safetensors forbids duplicate tensor names, and a config with a
// key twice is ambiguous); nesting is limited to max_depth. Integers without fraction or exponent are
// parsed exactly (Value::is_int) up to 2^53, so file offsets never go through a double. Errors are
// one line with the byte offset where the problem is. Nothing here exits: callers decide.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace json {

// Integers up to 2^53 are exact both here and in every JSON reader that uses doubles.
constexpr uint64_t MAX_EXACT_INT = 1ull << 53;

struct Value {
    enum Type { Null, Bool, Number, String, Array, Object };
    Type type = Null;
    bool boolean = false;
    double number = 0;      // every Number
    bool is_int = false;    // a Number written without fraction or exponent, |value| <= 2^53
    int64_t integer = 0;    // its exact value when is_int
    std::string str;        // String (UTF-8); for a Number, the digits of an integer literal beyond 2^53
    std::vector<Value> items;                           // Array
    std::vector<std::pair<std::string, Value>> fields;  // Object, in file order (keys unique)
    size_t offset = 0;      // byte offset of the value in the text, for error messages

    // The value of key in an object, or nullptr (also when this is not an object).
    const Value* get(const std::string& key) const {
        if (type != Object) return nullptr;
        for (const auto& f : fields)
            if (f.first == key) return &f.second;
        return nullptr;
    }
};

// The name of a type, for error messages ("expected an array, got a string").
inline const char* type_name(Value::Type t) {
    switch (t) {
        case Value::Null: return "null";
        case Value::Bool: return "a boolean";
        case Value::Number: return "a number";
        case Value::String: return "a string";
        case Value::Array: return "an array";
        case Value::Object: return "an object";
    }
    return "?";
}

namespace detail {

// A recursive-descent parser over [p, end); the first error stops it.
class Parser {
  public:
    Parser(const char* text, size_t n, int max_depth) : begin_(text), p_(text), end_(text + n), max_depth_(max_depth) {}

    bool document(Value* out, std::string* err) {
        skip_ws();
        if (!value(out, 0)) return fail_out(err);
        skip_ws();
        if (p_ != end_) {
            fail("unexpected content after the JSON value");
            return fail_out(err);
        }
        return true;
    }

  private:
    bool fail(const char* what) {
        if (error_.empty()) {
            char buf[64];
            snprintf(buf, sizeof(buf), "JSON error at byte %zu: ", (size_t)(p_ - begin_));
            error_ = std::string(buf) + what;
        }
        return false;
    }

    bool fail_depth() {
        std::string what = "nesting deeper than the limit of " + std::to_string(max_depth_) + " levels";
        return fail(what.c_str());
    }

    bool fail_out(std::string* err) {
        if (err) *err = error_;
        return false;
    }

    void skip_ws() {
        while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) p_++;
    }

    bool literal(const char* word) {
        const char* start = p_;
        for (const char* w = word; *w; w++, p_++) {
            if (p_ == end_ || *p_ != *w) {
                p_ = start;
                return fail("invalid literal (expected true, false or null)");
            }
        }
        return true;
    }

    bool value(Value* v, int depth) {
        if (p_ == end_) return fail("unexpected end of input (expected a value)");
        v->offset = (size_t)(p_ - begin_);
        switch (*p_) {
            case '{': return object(v, depth + 1);
            case '[': return array(v, depth + 1);
            case '"': v->type = Value::String; return string(&v->str);
            case 't': v->type = Value::Bool; v->boolean = true; return literal("true");
            case 'f': v->type = Value::Bool; v->boolean = false; return literal("false");
            case 'n': v->type = Value::Null; return literal("null");
            default:
                if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9')) return number(v);
                if (*p_ == 'N' || *p_ == 'I') return fail(kNotANumber);
                return fail("unexpected character (expected a value)");
        }
    }

    bool object(Value* v, int depth) {
        if (depth > max_depth_) return fail_depth();
        v->type = Value::Object;
        p_++;  // '{'
        skip_ws();
        if (p_ < end_ && *p_ == '}') { p_++; return true; }
        std::unordered_set<std::string> seen;
        for (;;) {
            skip_ws();
            if (p_ == end_ || *p_ != '"') return fail("expected a string key in an object");
            const char* key_at = p_;
            std::string key;
            if (!string(&key)) return false;
            if (!seen.insert(key).second) {
                p_ = key_at;
                return fail(("duplicate key \"" + key + "\" in an object").c_str());
            }
            skip_ws();
            if (p_ == end_ || *p_ != ':') return fail("expected ':' after an object key");
            p_++;
            skip_ws();
            v->fields.emplace_back(std::move(key), Value());
            if (!value(&v->fields.back().second, depth)) return false;
            skip_ws();
            if (p_ == end_) return fail("unexpected end of input inside an object");
            if (*p_ == '}') { p_++; return true; }
            if (*p_ != ',') return fail("expected ',' or '}' in an object");
            p_++;
        }
    }

    bool array(Value* v, int depth) {
        if (depth > max_depth_) return fail_depth();
        v->type = Value::Array;
        p_++;  // '['
        skip_ws();
        if (p_ < end_ && *p_ == ']') { p_++; return true; }
        for (;;) {
            skip_ws();
            v->items.emplace_back();
            if (!value(&v->items.back(), depth)) return false;
            skip_ws();
            if (p_ == end_) return fail("unexpected end of input inside an array");
            if (*p_ == ']') { p_++; return true; }
            if (*p_ != ',') return fail("expected ',' or ']' in an array");
            p_++;
        }
    }

    static void append_utf8(std::string* s, uint32_t cp) {
        if (cp < 0x80) {
            s->push_back((char)cp);
        } else if (cp < 0x800) {
            s->push_back((char)(0xC0 | (cp >> 6)));
            s->push_back((char)(0x80 | (cp & 0x3F)));
        } else if (cp < 0x10000) {
            s->push_back((char)(0xE0 | (cp >> 12)));
            s->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
            s->push_back((char)(0x80 | (cp & 0x3F)));
        } else {
            s->push_back((char)(0xF0 | (cp >> 18)));
            s->push_back((char)(0x80 | ((cp >> 12) & 0x3F)));
            s->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
            s->push_back((char)(0x80 | (cp & 0x3F)));
        }
    }

    // Four hex digits after "\u".
    bool hex4(uint32_t* out) {
        if (end_ - p_ < 4) return fail("truncated \\u escape");
        uint32_t x = 0;
        for (int i = 0; i < 4; i++, p_++) {
            char c = *p_;
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) return fail("invalid hex digit in a \\u escape");
            x = x * 16 + (uint32_t)d;
        }
        *out = x;
        return true;
    }

    // One raw UTF-8 sequence starting at p_ (a byte >= 0x80), validated and appended.
    bool utf8_sequence(std::string* s) {
        const unsigned char* u = (const unsigned char*)p_;
        size_t left = (size_t)(end_ - p_);
        unsigned char c = u[0];
        int len;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; min = 0x80; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; min = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return fail("invalid UTF-8 byte in a string");
        if (left < (size_t)len) return fail("truncated UTF-8 sequence in a string");
        for (int i = 1; i < len; i++) {
            if ((u[i] & 0xC0) != 0x80) return fail("invalid UTF-8 continuation byte in a string");
            cp = (cp << 6) | (u[i] & 0x3F);
        }
        if (cp < min) return fail("overlong UTF-8 sequence in a string");
        if (cp >= 0xD800 && cp <= 0xDFFF) return fail("UTF-8-encoded surrogate in a string");
        if (cp > 0x10FFFF) return fail("UTF-8 code point above U+10FFFF in a string");
        s->append(p_, (size_t)len);
        p_ += len;
        return true;
    }

    bool string(std::string* s) {
        p_++;  // opening quote
        for (;;) {
            if (p_ == end_) return fail("unterminated string");
            unsigned char c = (unsigned char)*p_;
            if (c == '"') { p_++; return true; }
            if (c < 0x20) return fail("unescaped control character in a string");
            if (c >= 0x80) {
                if (!utf8_sequence(s)) return false;
                continue;
            }
            if (c != '\\') { s->push_back((char)c); p_++; continue; }
            p_++;
            if (p_ == end_) return fail("unterminated escape in a string");
            char e = *p_++;
            switch (e) {
                case '"': s->push_back('"'); break;
                case '\\': s->push_back('\\'); break;
                case '/': s->push_back('/'); break;
                case 'b': s->push_back('\b'); break;
                case 'f': s->push_back('\f'); break;
                case 'n': s->push_back('\n'); break;
                case 'r': s->push_back('\r'); break;
                case 't': s->push_back('\t'); break;
                case 'u': {
                    uint32_t cp = 0;
                    if (!hex4(&cp)) return false;
                    if (cp >= 0xDC00 && cp <= 0xDFFF) return fail("lone low surrogate in a \\u escape");
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        uint32_t lo = 0;
                        if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u')
                            return fail("high surrogate not followed by a low surrogate escape");
                        p_ += 2;
                        if (!hex4(&lo)) return false;
                        if (lo < 0xDC00 || lo > 0xDFFF) return fail("high surrogate not followed by a low surrogate escape");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    }
                    append_utf8(s, cp);
                    break;
                }
                default: p_--; return fail("invalid escape in a string");
            }
        }
    }

    // What Python's json module writes for a float nan or inf, which JSON has no numbers for.
    static constexpr const char* kNotANumber =
        "NaN and Infinity are not JSON numbers (Python's json module writes them for a float nan or inf)";

    bool number(Value* v) {
        const char* start = p_;
        v->type = Value::Number;
        bool negative = false;
        if (*p_ == '-') { negative = true; p_++; }
        if (p_ < end_ && *p_ == 'I') return fail(kNotANumber);
        if (p_ == end_ || *p_ < '0' || *p_ > '9') return fail("invalid number (expected a digit)");
        // Integer part: exact accumulation while it fits.
        uint64_t mag = 0;
        bool exact = true;
        if (*p_ == '0') {
            p_++;
            if (p_ < end_ && *p_ >= '0' && *p_ <= '9') return fail("invalid number (leading zero)");
        } else {
            while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
                if (mag > MAX_EXACT_INT) exact = false;
                else mag = mag * 10 + (uint64_t)(*p_ - '0');
                p_++;
            }
        }
        bool integral = true;
        if (p_ < end_ && *p_ == '.') {
            integral = false;
            p_++;
            if (p_ == end_ || *p_ < '0' || *p_ > '9') return fail("invalid number (expected a digit after '.')");
            while (p_ < end_ && *p_ >= '0' && *p_ <= '9') p_++;
        }
        if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
            integral = false;
            p_++;
            if (p_ < end_ && (*p_ == '+' || *p_ == '-')) p_++;
            if (p_ == end_ || *p_ < '0' || *p_ > '9') return fail("invalid number (expected a digit in the exponent)");
            while (p_ < end_ && *p_ >= '0' && *p_ <= '9') p_++;
        }
        // strtod needs a terminated string; the grammar above already fixed the extent.
        std::string text(start, (size_t)(p_ - start));
        v->number = strtod(text.c_str(), nullptr);
        if (integral && exact && mag <= MAX_EXACT_INT) {
            v->is_int = true;
            v->integer = negative ? -(int64_t)mag : (int64_t)mag;
        } else if (integral) {
            v->str = text;  // too large to be exact as a double: the digits, for write() to give back
        }
        return true;
    }

    const char* begin_;
    const char* p_;
    const char* end_;
    int max_depth_;
    std::string error_;
};

}  // namespace detail

// Parses text[0, n) as one JSON value into *out; on failure returns false with a one-line reason
// ("JSON error at byte N: ...") in *err.
inline bool parse(const char* text, size_t n, Value* out, std::string* err, int max_depth = 64) {
    *out = Value();
    return detail::Parser(text, n, max_depth).document(out, err);
}

// x in its shortest form that reads back as the same float (1e-12, not 9.99999996e-13); finite x.
inline std::string shortest_float(float x) {
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof(buf), "%.*g", digits, x);
        if (strtof(buf, nullptr) == x) break;
    }
    return buf;
}

// s as a JSON string literal: quotes added; quote, backslash and control characters escaped;
// well-formed UTF-8 passes through, and a byte that is not part of one becomes U+FFFD, so the
// result is valid JSON whatever s holds (a sample cut inside a multi-byte character, a file name).
inline std::string quote(const std::string& s) {
    std::string out = "\"";
    for (size_t i = 0; i < s.size();) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            out += '\\';
            out += (char)c;
            i++;
        } else if (c < 0x20) {
            char esc[8];
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            out += esc;
            i++;
        } else if (c < 0x80) {
            out += (char)c;
            i++;
        } else {  // copy one well-formed UTF-8 sequence, or replace the bad byte
            int len = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
            bool ok = len > 0 && i + len <= s.size();
            for (int k = 1; ok && k < len; k++) ok = ((unsigned char)s[i + k] & 0xC0) == 0x80;
            if (ok && len == 3) {  // no overlong forms, no surrogates
                unsigned char c1 = (unsigned char)s[i + 1];
                ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0);
            }
            if (ok && len == 4) {
                unsigned char c1 = (unsigned char)s[i + 1];
                ok = !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
            }
            if (ok) {
                out.append(s, i, len);
                i += len;
            } else {
                out += "\xEF\xBF\xBD";
                i++;
            }
        }
    }
    return out + "\"";
}

// value as JSON text, objects and arrays spread over lines indented by two spaces per level (as
// Python's json.dumps(indent=2) writes them; an empty one stays "{}" or "[]"), object keys in their
// order; integers exactly, other numbers as Python writes floats (the shortest form that reads back
// as the same double).
inline std::string write(const Value& value, int depth = 0) {
    const std::string pad(2 * (depth + 1), ' '), end_pad(2 * depth, ' ');
    switch (value.type) {
        case Value::Null: return "null";
        case Value::Bool: return value.boolean ? "true" : "false";
        case Value::Number: {
            if (value.is_int) return std::to_string(value.integer);
            if (!value.str.empty()) return value.str;  // an integer beyond 2^53, as written
            // As Python's repr: the fewest significant digits that read back as the same double, in
            // exponent form below 1e-4 and from 1e16 on, else in fixed form with at least ".0".
            char buf[48];
            int digits = 1;
            for (; digits < 17; digits++) {
                snprintf(buf, sizeof(buf), "%.*e", digits - 1, value.number);
                if (strtod(buf, nullptr) == value.number) break;
            }
            snprintf(buf, sizeof(buf), "%.*e", digits - 1, value.number);
            int exponent = atoi(strchr(buf, 'e') + 1);
            if (exponent < -4 || exponent >= 16) return buf;
            snprintf(buf, sizeof(buf), "%.*f", std::max(1, digits - 1 - exponent), value.number);
            return buf;
        }
        case Value::String: return quote(value.str);
        case Value::Array: {
            if (value.items.empty()) return "[]";
            std::string out = "[\n";
            for (size_t i = 0; i < value.items.size(); i++)
                out += pad + write(value.items[i], depth + 1) + (i + 1 < value.items.size() ? ",\n" : "\n");
            return out + end_pad + "]";
        }
        case Value::Object: {
            if (value.fields.empty()) return "{}";
            std::string out = "{\n";
            for (size_t i = 0; i < value.fields.size(); i++)
                out += pad + quote(value.fields[i].first) + ": " + write(value.fields[i].second, depth + 1) +
                       (i + 1 < value.fields.size() ? ",\n" : "\n");
            return out + end_pad + "}";
        }
    }
    return "null";
}

}  // namespace json
