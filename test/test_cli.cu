// test/test_cli.cu — the command-line parser (llmc/cli.h): long options and llm.c's short flags
// (one or two letters, switches taking an optional 0/1), --help listing every option with its
// default, one error line naming the option, exit status 2, for every kind of bad input, and
// options bound to fields (written by parse(), "auto" ones when resolved).
#include "../llmc/cli.h"
#include "harness.h"

#include <csignal>
#include <sys/wait.h>

// The trainer-like table the tests parse against.
// error_line_exit with status 1, as the loaders' data errors call it.
[[noreturn]] void error_line(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_line_exit(1, fmt, ap);
}

Cli make_cli() {
    Cli cli("prog", "A test program.");
    cli.add("train-data", "i", "GLOB", "data/*.bin", "training shards");
    cli.add("batch-size", "b", "INT", "4", "micro-batch size");
    cli.add("lr", "l", "FLOAT", "3e-4", "learning rate");
    cli.add("keep-checkpoints", "nk", "K", "0", "checkpoints to keep");
    cli.add("label", nullptr, "NAME", "", "a name");
    cli.add_flag("resume", "y", "resume");
    cli.add_flag("shuffle", nullptr, "shuffle");
    return cli;
}

// Options bound to fields, as the trainers declare them (llmc/run_options.h).
enum class Fruit { Apple, Pear };
struct Bound {
    int steps = -7;
    long long tokens = -7;
    float lr = -7;
    double warmup = -7;
    std::string name = "unset";
    bool fused = false, resume = false;
    Fruit fruit = Fruit::Pear;
};

// Parses args with a table whose options are bound to *b; "steps" defaults to auto, resolved to 9
// after the parse unless given.
void parse_bound(std::vector<std::string> args, Bound* b) {
    args.insert(args.begin(), "prog");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(&a[0]);
    Cli cli("prog", "A test program.");
    cli.add("steps", "x", "INT", "auto", "steps", &b->steps, -1, 100);
    cli.add("tokens", "d", "TOKENS", "-1", "tokens", &b->tokens, -1, 1ll << 40);
    cli.add("lr", "l", "FLOAT", "3e-4", "learning rate", &b->lr, 0, 1);
    cli.add("warmup", "u", "FRACTION|STEPS", "0.1", "warmup", &b->warmup, 0, 1e9);
    cli.add("name", nullptr, "NAME", "", "a name", &b->name);
    cli.add("fused", "ge", "1", "fusion", &b->fused);
    cli.add_flag("resume", "y", "resume", &b->resume);
    cli.add_choice("fruit", nullptr, "NAME", "apple", "apple | pear", &b->fruit,
                   {{"apple", Fruit::Apple}, {"pear", Fruit::Pear}});
    cli.parse((int)argv.size(), argv.data());
    cli.resolve_auto("steps", "9");
}

// Parses args (argv[0] added) with the table above.
Cli parse(std::vector<std::string> args) {
    args.insert(args.begin(), "prog");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(&a[0]);
    Cli cli = make_cli();
    cli.parse((int)argv.size(), argv.data());
    return cli;
}

// The parse (and value reads) must stop with status 2 and `expect` in the message.
template <class F>
void expect_error(const char* name, const char* expect, F body) {
    th::ChildOutput child = th::run_in_child(body);
    std::string& err = child.text;
    while (!err.empty() && err.back() == '\n') err.pop_back();
    bool one_line = err.find('\n') == std::string::npos;
    bool ok = WIFEXITED(child.status) && WEXITSTATUS(child.status) == 2 && err.find(expect) != std::string::npos &&
              one_line;
    th::report(ok, name, "exit %d, stderr: %s", WIFEXITED(child.status) ? WEXITSTATUS(child.status) : -1, err.c_str());
}

int main() {
    {
        Cli cli = parse({"--train-data", "x.bin", "-b", "8", "--lr=0.01", "-nk", "3", "-y", "1", "--shuffle"});
        bool ok = cli.str("train-data") == "x.bin" && cli.integer("batch-size") == 8 && cli.number("lr") == 0.01 &&
                  cli.integer("keep-checkpoints") == 3 && cli.flag("resume") && cli.flag("shuffle") &&
                  !cli.given("label") && cli.str("label").empty();
        th::report(ok, "long options, --name=value, one- and two-letter llm.c flags, switches", "");
    }
    {
        Cli off = parse({"-y", "0", "-b", "2"}), bare = parse({"-y", "-b", "2"});
        bool ok = !off.flag("resume") && off.given("resume") && off.integer("batch-size") == 2 && bare.flag("resume") &&
                  bare.integer("batch-size") == 2;
        th::report(ok, "llm.c switch values: -y 0 off, -y 1 on, bare -y on", "");
    }
    {
        Cli defaults = parse({});
        bool ok = defaults.integer("batch-size") == 4 && defaults.number("lr") == 3e-4 && !defaults.flag("resume");
        th::report(ok, "defaults when nothing is given", "");
    }
    {
        th::ChildOutput child = th::run_in_child([] {
            dup2(2, 1);  // --help prints to stdout; the harness captures stderr
            parse({"--help"});
        });
        const std::string& out = child.text;
        bool every = true;
        for (const char* want : {"-i,  --train-data GLOB", "[data/*.bin]", "-b,  --batch-size INT", "[4]", "-nk, --keep-checkpoints K",
                                 "[3e-4]", "--label NAME", "[none]", "-y,  --resume", "--shuffle"})
            every = every && out.find(want) != std::string::npos;
        th::report(WIFEXITED(child.status) && WEXITSTATUS(child.status) == 0 && every,
                   "--help lists every option, its llm.c flag and its default, exit 0", "%zu bytes", out.size());
    }
    {  // help_if_asked (before the device is touched): -h anywhere prints the help and exits 0; no -h, nothing.
        th::ChildOutput asked = th::run_in_child([] {
            dup2(2, 1);
            Cli cli = make_cli();
            char prog[] = "prog", b[] = "-b", eight[] = "8", h[] = "-h";
            char* argv[] = {prog, b, eight, h};
            cli.help_if_asked(4, argv);
            exit(3);  // not reached
        });
        th::ChildOutput not_asked = th::run_in_child([] {
            dup2(2, 1);
            Cli cli = make_cli();
            char prog[] = "prog", b[] = "-b", eight[] = "8";
            char* argv[] = {prog, b, eight};
            cli.help_if_asked(3, argv);
            exit(3);
        });
        th::report(WIFEXITED(asked.status) && WEXITSTATUS(asked.status) == 0 &&
                       asked.text.rfind("usage: prog", 0) == 0 && WIFEXITED(not_asked.status) &&
                       WEXITSTATUS(not_asked.status) == 3 && not_asked.text.empty(),
                   "help_if_asked: -h after other options prints the help (exit 0); without it, nothing", "");
    }
    {  // A later fatal error (a file the run cannot read, an option found wrong after parsing) names the
       // program as the parser's own errors do.
        th::ChildOutput child = th::run_in_child([] {
            dup2(2, 1);
            Cli cli = make_cli();
            error_line("%s: cannot open", "data/x.bin");
        });
        bool ok = WIFEXITED(child.status) && WEXITSTATUS(child.status) == 1 &&
                  child.text == "prog: error: data/x.bin: cannot open\n";
        th::report(ok, "a fatal error line after the parser names the program too (prog: error: ...)", "%s",
                   ok ? "" : child.text.c_str());
    }
    {  // The epilog comes after the options, as given.
        th::ChildOutput child = th::run_in_child([] {
            dup2(2, 1);
            Cli cli = make_cli();
            cli.set_epilog("exit status: 0 done\n2 a bad option");
            char prog[] = "prog", help[] = "--help";
            char* argv[] = {prog, help};
            cli.parse(2, argv);
        });
        const std::string& out = child.text;
        const std::string epilog = "\nexit status: 0 done\n2 a bad option\n";
        size_t last_option = out.rfind("--shuffle"), at = out.find(epilog);
        th::report(WIFEXITED(child.status) && WEXITSTATUS(child.status) == 0 && last_option != std::string::npos &&
                       at != std::string::npos && at > last_option && out.size() == at + epilog.size(),
                   "--help ends with the epilog (set_epilog), after the options", "%s",
                   out.substr(out.size() > 200 ? out.size() - 200 : 0).c_str());
    }
    {  // A reader bound after another option's declaration stops the program at the binding.
        th::ChildOutput child = th::run_in_child([] {
            Cli cli("t", "test");
            std::string seen;
            cli.add("recompute", "r", "WHAT", "none", "what to recompute");
            cli.add("seed", nullptr, "INT", "42", "the seed");
            cli.on_value("recompute", [&seen](const Cli& c) { seen = c.str("recompute"); });
        });
        bool ok = WIFSIGNALED(child.status) && WTERMSIG(child.status) == SIGABRT &&
                  child.text.find("Cli::on_value(\"recompute\"): the option declared last is --seed") !=
                      std::string::npos;
        th::report(ok, "on_value for an option other than the one declared last: stops with a message", "%s",
                   child.text.c_str());
    }
    expect_error("unknown long option", "unknown option '--batchsize'", [] { parse({"--batchsize", "4"}); });
    expect_error("unknown short flag", "unknown option '-z'", [] { parse({"-z", "1"}); });
    expect_error("stray argument", "unexpected argument 'data.bin'", [] { parse({"data.bin"}); });
    expect_error("missing value", "option --batch-size needs a value (INT)", [] { parse({"-b"}); });
    expect_error("switch given a value", "option --shuffle takes no value", [] { parse({"--shuffle=1"}); });
    // A value left out takes no option as the value; a negative number or other dash text is a value.
    expect_error("value left out before a short flag",
                 "option --train-data needs a value (GLOB), but the next argument is the option '-y' (to give that "
                 "as the value, write --train-data=-y)",
                 [] { parse({"-i", "-y"}); });
    expect_error("value left out before a long option", "but the next argument is the option '--shuffle'",
                 [] { parse({"--label", "--shuffle"}); });
    expect_error("value left out before --name=value", "but the next argument is the option '--lr=0.1'",
                 [] { parse({"--label", "--lr=0.1"}); });
    {
        Cli c = parse({"--label=-y", "-nk", "-1", "--train-data", "-data.bin"});
        th::report(c.str("label") == "-y" && c.integer("keep-checkpoints") == -1 && c.str("train-data") == "-data.bin",
                   "values starting with a dash: --name=-y, a negative number, a file name", "label '%s', nk %s, "
                   "train-data '%s'", c.str("label").c_str(), c.str("keep-checkpoints").c_str(),
                   c.str("train-data").c_str());
    }
    expect_error("not an integer", "option --batch-size: '4x' is not an integer",
                 [] { parse({"-b", "4x"}).integer("batch-size", 1, 100); });
    expect_error("integer out of range", "option --batch-size: 0 is out of range [1, 100]",
                 [] { parse({"-b", "0"}).integer("batch-size", 1, 100); });
    expect_error("integer overflow", "is not an integer",
                 [] { parse({"-b", "99999999999999999999"}).integer("batch-size", 1, 100); });
    expect_error("not a number", "option --lr: 'fast' is not a number", [] { parse({"-l", "fast"}).number("lr", 0, 1); });
    expect_error("nan is not a number", "option --lr: 'nan' is not a number", [] { parse({"-l", "nan"}).number("lr", 0, 1); });
    expect_error("number out of range", "option --lr: 5 is out of range [0, 1]", [] { parse({"-l", "5"}).number("lr", 0, 1); });
    expect_error("empty value", "option --batch-size: '' is not an integer",
                 [] { parse({"--batch-size="}).integer("batch-size", 1, 100); });
    {
        Bound d, g;
        parse_bound({}, &d);
        parse_bound({"-x", "5", "-d", "4096", "--lr=0.5", "-u", "20", "--name", "run", "-ge", "0", "-y", "--fruit",
                     "pear"}, &g);
        bool defaults = d.steps == 9 && d.tokens == -1 && d.lr == 3e-4f && d.warmup == 0.1 && d.name.empty() &&
                        d.fused && !d.resume && d.fruit == Fruit::Apple;
        bool given = g.steps == 5 && g.tokens == 4096 && g.lr == 0.5f && g.warmup == 20 && g.name == "run" &&
                     !g.fused && g.resume && g.fruit == Fruit::Pear;
        th::report(defaults && given, "bound options: parse() writes every field, defaults included; auto on resolve",
                   "");
    }
    expect_error("bound integer out of range", "option --steps: 101 is out of range [-1, 100]", [] {
        Bound b;
        parse_bound({"-x", "101"}, &b);
    });
    expect_error("an auto option given a value is checked at parse", "option --steps: 'many' is not an integer", [] {
        Bound b;
        parse_bound({"--steps", "many"}, &b);
    });
    expect_error("bound 0|1 value", "option --fused: 2 is out of range [0, 1]", [] {
        Bound b;
        parse_bound({"-ge", "2"}, &b);
    });
    expect_error("bound choice names the choices", "option --fruit: 'plum' is not one of apple, pear", [] {
        Bound b;
        parse_bound({"--fruit", "plum"}, &b);
    });
    return th::finish();
}
