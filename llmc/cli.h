// llmc/cli.h — a small table-driven command-line parser shared by the trainers: long options for
// everything, llm.c's short flags as aliases, --help generated from the table with defaults, and
// one clear error (naming the option) for unknown options, missing values and bad values.
//
// llm.c's flags are a dash and one or two letters (-i, -nk), each followed by a value; its on/off
// flags take 0 or 1 (-y 1). Here switches are long options without a value (--resume), and their
// llm.c alias accepts an optional 0 or 1 after it, so llm.c command lines work unchanged.
//
// An option is declared once: a line of the table binds it to the field of the program's options
// that receives it, with its default, its range (or its names, for a choice) and its help. parse()
// then writes every bound field, so a program reads no option by hand unless its meaning depends
// on others. A default of "auto" (a value that depends on the machine or the model) is written when
// the program resolves it (resolve_auto), or at parse() when the user gave a value.
#pragma once
#include <cerrno>
#include <cstdarg>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fatal.h"

class Cli;

struct CliOption {
    const char* long_name;   // without the leading "--"
    const char* short_name;  // llm.c's flag without the dash ("i", "nk"), or nullptr
    const char* value_name;  // e.g. "INT"; nullptr for a switch (no value)
    std::string help;
    std::string value;       // current value as text (the default until parsed)
    bool given = false;
    bool auto_default = false;                 // the default is "auto"
    std::function<void(const Cli&)> store;     // writes the value into the bound field (empty: unbound)
};

class Cli {
  public:
    // program also names the program in every fatal error line (llmc/fatal.h), not only in the parser's.
    explicit Cli(const char* program, const char* summary) : program_(program), summary_(summary) {
        fatal_error_program = program;
    }

    // Text --help prints after the options (e.g. the exit statuses).
    void set_epilog(const char* text) { epilog_ = text; }

    // Declares an option taking a value, with its default (shown in --help), read by name.
    void add(const char* long_name, const char* short_name, const char* value_name, const char* default_value,
             const std::string& help) {
        std::string def = default_value ? default_value : "";
        options_.push_back({long_name, short_name, value_name, help, def, false, def == "auto", {}});
    }
    // Declares a switch (no value); its value is "1" when given, "0" otherwise.
    void add_flag(const char* long_name, const char* short_name, const std::string& help) {
        options_.push_back({long_name, short_name, nullptr, help, "0", false, false, {}});
    }

    // Declares an option bound to *field: an integer in [lo, hi].
    template <class Int, std::enable_if_t<std::is_integral<Int>::value && !std::is_same<Int, bool>::value, int> = 0>
    void add(const char* long_name, const char* short_name, const char* value_name, const char* default_value,
             const std::string& help, Int* field, long long lo, long long hi) {
        add(long_name, short_name, value_name, default_value, help);
        options_.back().store = [=](const Cli& c) { *field = (Int)c.integer(long_name, lo, hi); };
    }
    // Bound to *field: a finite number in [lo, hi].
    template <class Real, std::enable_if_t<std::is_floating_point<Real>::value, int> = 0>
    void add(const char* long_name, const char* short_name, const char* value_name, const char* default_value,
             const std::string& help, Real* field, double lo, double hi) {
        add(long_name, short_name, value_name, default_value, help);
        options_.back().store = [=](const Cli& c) { *field = (Real)c.number(long_name, lo, hi); };
    }
    // Bound to *field: text.
    void add(const char* long_name, const char* short_name, const char* value_name, const char* default_value,
             const std::string& help, std::string* field) {
        add(long_name, short_name, value_name, default_value, help);
        options_.back().store = [=](const Cli& c) { *field = c.str(long_name); };
    }
    // Bound to *field: 0 or 1, given as a value (llm.c's -f 1).
    void add(const char* long_name, const char* short_name, const char* default_value, const std::string& help,
             bool* field) {
        add(long_name, short_name, "0|1", default_value, help);
        options_.back().store = [=](const Cli& c) { *field = c.integer(long_name, 0, 1) == 1; };
    }
    // A switch bound to *field.
    void add_flag(const char* long_name, const char* short_name, const std::string& help, bool* field) {
        add_flag(long_name, short_name, help);
        options_.back().store = [=](const Cli& c) { *field = c.flag(long_name); };
    }
    // Binds option `long_name` to a reader of its own, for a value whose meaning needs more than a
    // range (e.g. "auto" or several fields set from one name). It must be the option declared last:
    // a reader placed after another declaration would take that option over silently, so the
    // program stops there instead (a mistake in the program, not in its command line).
    void on_value(const char* long_name, std::function<void(const Cli&)> store) {
        if (options_.empty() || std::strcmp(options_.back().long_name, long_name) != 0) {
            fprintf(stderr, "Cli::on_value(\"%s\"): the option declared last is --%s; declare the reader right "
                    "after its option\n", long_name, options_.empty() ? "(none)" : options_.back().long_name);
            abort();
        }
        options_.back().store = std::move(store);
    }
    // Bound to *field: one of the named values of `choices` (an error lists them).
    template <class T>
    void add_choice(const char* long_name, const char* short_name, const char* value_name, const char* default_value,
                    const std::string& help, T* field, std::vector<std::pair<const char*, T>> choices) {
        add(long_name, short_name, value_name, default_value, help);
        options_.back().store = [=](const Cli& c) {
            const std::string& v = c.str(long_name);
            std::string names;
            for (const auto& [name, value] : choices) {
                if (v == name) {
                    *field = value;
                    return;
                }
                names += std::string(names.empty() ? "" : ", ") + name;
            }
            c.fail("option --%s: '%s' is not one of %s", long_name, v.c_str(), names.c_str());
        };
    }

    // Prints help and exits 0 if argv holds -h or --help, before anything else runs: a program built for
    // the GPU answers --help on a machine without one (a login node).
    void help_if_asked(int argc, char** argv) const {
        for (int i = 1; i < argc; i++)
            if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
                print_help();
                exit(0);
            }
    }

    // Parses argv; prints help and exits 0 for -h/--help; exits 2 with one message on any error.
    void parse(int argc, char** argv) {
        for (int i = 1; i < argc; i++) {
            std::string arg = argv[i];
            if (arg == "-h" || arg == "--help") {
                print_help();
                exit(0);
            }
            CliOption* opt = nullptr;
            std::string inline_value;
            bool has_inline = false;
            if (arg.rfind("--", 0) == 0) {
                std::string name = arg.substr(2);
                size_t eq = name.find('=');
                if (eq != std::string::npos) {
                    inline_value = name.substr(eq + 1);
                    name = name.substr(0, eq);
                    has_inline = true;
                }
                opt = find_long(name);
                if (!opt) fail("unknown option '--%s' (see --help)", name.c_str());
            } else if (arg.size() >= 2 && arg[0] == '-') {
                opt = find_short(arg.substr(1));
                if (!opt) fail("unknown option '%s' (see --help)", arg.c_str());
                // llm.c style "-y 1" / "-y 0" for a switch
                if (!opt->value_name && i + 1 < argc && (!strcmp(argv[i + 1], "0") || !strcmp(argv[i + 1], "1"))) {
                    opt->value = argv[++i];
                    opt->given = true;
                    continue;
                }
            } else {
                fail("unexpected argument '%s' (options start with -- ; see --help)", arg.c_str());
            }
            if (!opt->value_name) {
                if (has_inline) fail("option --%s takes no value", opt->long_name);
                opt->value = "1";
            } else if (has_inline) {
                opt->value = inline_value;
            } else {
                if (i + 1 >= argc) fail("option --%s needs a value (%s)", opt->long_name, opt->value_name);
                // A value left out would take the next option as the value (-o -y: a directory "-y").
                // A value that spells one of this program's options is refused; --name=VALUE gives
                // such a value on purpose.
                std::string next = argv[i + 1];
                bool is_option = next.rfind("--", 0) == 0 ? find_long(next.substr(2, next.find('=') - 2)) != nullptr
                                 : next.size() >= 2 && next[0] == '-' && find_short(next.substr(1)) != nullptr;
                if (is_option)
                    fail("option --%s needs a value (%s), but the next argument is the option '%s' (to give "
                         "that as the value, write --%s=%s)",
                         opt->long_name, opt->value_name, next.c_str(), opt->long_name, next.c_str());
                opt->value = argv[++i];
            }
            opt->given = true;
        }
        for (const CliOption& o : options_)
            if (o.store && !(o.auto_default && o.value == "auto")) o.store(*this);
    }

    // Replaces the value "auto" (a default that depends on the machine) with a concrete one, and
    // writes it into the bound field.
    void resolve_auto(const char* long_name, const std::string& value) {
        CliOption& o = const_cast<CliOption&>(get(long_name));
        if (o.value != "auto") return;
        o.value = value;
        if (o.store) o.store(*this);
    }

    const std::string& str(const char* long_name) const { return get(long_name).value; }
    bool given(const char* long_name) const { return get(long_name).given; }
    bool flag(const char* long_name) const { return get(long_name).value == "1"; }

    // The value as an integer in [lo, hi]; anything else is an error naming the option.
    long long integer(const char* long_name, long long lo = LLONG_MIN, long long hi = LLONG_MAX) const {
        const CliOption& o = get(long_name);
        char* end = nullptr;
        errno = 0;
        long long v = strtoll(o.value.c_str(), &end, 10);
        if (o.value.empty() || *end || errno)
            fail("option --%s: '%s' is not an integer", o.long_name, o.value.c_str());
        if (v < lo || v > hi) fail("option --%s: %lld is out of range [%lld, %lld]", o.long_name, v, lo, hi);
        return v;
    }
    // The value as a finite number in [lo, hi].
    double number(const char* long_name, double lo = -INFINITY, double hi = INFINITY) const {
        const CliOption& o = get(long_name);
        char* end = nullptr;
        errno = 0;
        double v = strtod(o.value.c_str(), &end);
        if (o.value.empty() || *end || errno || !std::isfinite(v))
            fail("option --%s: '%s' is not a number", o.long_name, o.value.c_str());
        if (v < lo || v > hi) fail("option --%s: %g is out of range [%g, %g]", o.long_name, v, lo, hi);
        return v;
    }

    [[noreturn]] void fail(const char* fmt, ...) const __attribute__((format(printf, 2, 3))) {
        let_rank0_report_first();
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "%s: error: ", program_);
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, "\n");
        va_end(ap);
        exit(2);
    }

    void print_help() const {
        printf("usage: %s [options]\n%s\n\noptions (default in brackets):\n", program_, summary_);
        for (const CliOption& o : options_) {
            char left[80];
            std::string alias = o.short_name ? std::string("-") + o.short_name + "," : "";
            snprintf(left, sizeof(left), "%-4s --%s%s%s", alias.c_str(), o.long_name, o.value_name ? " " : "",
                     o.value_name ? o.value_name : "");
            printf("  %-36s %s", left, o.help.c_str());
            if (o.value_name) printf(" [%s]", o.value.empty() ? "none" : o.value.c_str());
            printf("\n");
        }
        if (epilog_) printf("\n%s\n", epilog_);
    }

  private:
    const CliOption& get(const char* long_name) const {
        for (const CliOption& o : options_)
            if (!strcmp(o.long_name, long_name)) return o;
        fprintf(stderr, "internal error: option --%s was never declared\n", long_name);
        exit(EXIT_FAILURE);
    }
    CliOption* find_long(const std::string& name) {
        for (CliOption& o : options_)
            if (name == o.long_name) return &o;
        return nullptr;
    }
    CliOption* find_short(const std::string& name) {
        for (CliOption& o : options_)
            if (o.short_name && name == o.short_name) return &o;
        return nullptr;
    }
    const char* program_;
    const char* summary_;
    const char* epilog_ = nullptr;
    std::vector<CliOption> options_;
};
